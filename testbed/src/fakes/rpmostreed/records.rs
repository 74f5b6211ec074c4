//! The transaction log: one record per transaction method call, what the `transactions`
//! control command returns.

use serde::Serialize;
use serde_json::Value;

/// How a transaction ended (the `Finished` parameters).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TxnResult {
    pub(crate) ok: bool,
    pub(crate) message: String,
}

/// One transaction method call and what became of it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TxnRecord {
    /// Transaction id; 0 when the call was refused and no transaction was created.
    pub(crate) id: u64,
    pub(crate) method: String,
    pub(crate) sender: String,
    pub(crate) title: String,
    pub(crate) modifiers: Value,
    pub(crate) options: Value,
    /// Other positional arguments (`Rebase`'s refspec and packages, `Cleanup`'s elements).
    pub(crate) args: Value,
    /// File descriptors attached to the method call.
    pub(crate) fds: u32,
    /// `Start()` was called.
    pub(crate) started: bool,
    /// When `Start()` was first called (Unix milliseconds): with `finished_ms`, what the fleet
    /// bench counts concurrent transactions across nodes by.
    pub(crate) started_ms: Option<u64>,
    /// When the transaction finished (Unix milliseconds).
    pub(crate) finished_ms: Option<u64>,
    /// Identical calls that joined this transaction.
    pub(crate) joined: u32,
    pub(crate) result: Option<TxnResult>,
    pub(crate) cancelled: bool,
    /// The caller left the bus before `Start()`, so the transaction was dropped.
    pub(crate) dropped: bool,
    /// The daemon "crashed" during it (`exit-mid-transaction`).
    pub(crate) crashed: bool,
    pub(crate) reboot_requested: bool,
    /// The D-Bus error the method call got (`name: message`), if it was refused.
    pub(crate) error: Option<String>,
    /// What the real daemon would have logged to the journal only (e.g. a child's stderr).
    pub(crate) journal: Vec<String>,
    /// The transaction imported an image (layers a real host downloads).
    pub(crate) pulled: bool,
}
