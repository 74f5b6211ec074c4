//! Long work beside the loop.
//!
//! Reading the deployments (with bootc a `bootc status` unit, up to 120 s), preflight (registry
//! reads), the on-disk check of a staged deployment (the helper, up to 120 s), removing a staged
//! deployment and finalizing (rpm-ostree transactions, `bootc switch`) each run in a task whose
//! result comes back to the loop as an event, as the staging transaction does. Meanwhile the loop
//! keeps taking node updates, patching the status, answering D-Bus and pinging the watchdog, so
//! `WATCHDOG=1` measures the loop, not the network. One piece of work runs at a time; a
//! reconcile asked for meanwhile runs once it is done.

use std::collections::BTreeMap;

use tokio::task::JoinHandle;

use crate::agent::gather::{Prepared, Transient};
use crate::backend::{BackendError, Deployment, StagePlan};
use crate::cluster::protocol::{Desired, Readiness};
use crate::host::attempt::Record;
use crate::host::verify::Expectation;

/// What a piece of work is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Reading the deployments for a decision.
    Observe,
    /// Preflight of a request.
    Preflight,
    /// The on-disk check of what a transaction staged.
    Verify,
    /// Removing a staged deployment.
    Cleanup,
    /// Finalizing and rebooting.
    Apply,
    /// Readiness checks (preflight only, nothing staged).
    Readiness,
    /// The bootloader update before finalizing a major move (Secure Boot).
    Bootloader,
}

/// A running piece of work.
pub(super) struct Work {
    pub(super) kind: Kind,
    /// The request it serves (observed-desired hash), when it serves one.
    pub(super) request: Option<String>,
    task: JoinHandle<Outcome>,
}

impl Work {
    /// Starts `work` in a task.
    pub(super) fn spawn(
        kind: Kind,
        request: Option<String>,
        work: impl std::future::Future<Output = Outcome> + Send + 'static,
    ) -> Work {
        Work {
            kind,
            request,
            task: tokio::spawn(work),
        }
    }

    /// Stops it; only for work that changes nothing (reading, preflight, readiness).
    pub(super) fn abort(self) {
        self.task.abort();
    }
}

/// A preflight's request and what acting on its result needs.
pub(super) struct PreflightRun {
    pub(super) desired: Desired,
    /// A staged deployment streamd did not create.
    pub(super) foreign: Option<Deployment>,
    /// `reboot-approved` when the preflight started.
    pub(super) approved: Option<String>,
    /// Whether the stage will be locked from the start (else it waits for the approval).
    pub(super) locks: bool,
    pub(super) record: Record,
}

/// A staging about to start once a foreign staged deployment is gone.
pub(super) struct StageStart {
    pub(super) plan: StagePlan,
    pub(super) hash: String,
    pub(super) expect: Option<(Expectation, String)>,
    pub(super) record: Record,
}

/// A finalization on its way: what to restore when it fails.
pub(super) struct Applying {
    /// The record before this attempt was written.
    pub(super) record: Record,
    pub(super) digest: String,
    pub(super) attempt: u32,
}

/// A finished readiness run.
pub(super) struct ReadinessRun {
    /// The key of the plan it ran (readiness's `Plan::key`): its results are dropped when the
    /// plan changed meanwhile.
    pub(super) key: String,
    /// The deployments it read (they also update the reported current stream and image).
    pub(super) deployments: Result<Vec<Deployment>, BackendError>,
    pub(super) entries: BTreeMap<String, Readiness>,
    /// Some check could not run and is to be retried soon.
    pub(super) transient: bool,
}

/// How a piece of work ended.
pub(super) enum Outcome {
    Observed(Result<Vec<Deployment>, BackendError>),
    Prepared(Box<PreflightRun>, Result<Prepared, Transient>),
    ForeignRemoved(Box<StageStart>, Result<(), BackendError>),
    /// The checksum of the staged deployment that passed the on-disk check, or why not.
    Verified(Result<String, String>),
    CleanedUp(Box<Record>, Result<(), BackendError>),
    Applied(Box<Applying>, Result<(), BackendError>),
    /// What the readiness checks found.
    Checked(Box<ReadinessRun>),
    /// The bootloader update before finalizing this digest ended.
    BootloaderUpdated(String, Result<(), crate::host::bootloader::BootloaderError>),
}

/// Waits for the running work to end; pending when there is none. A task that panicked comes
/// back as `Err` with what was running.
pub(super) async fn finished(work: &mut Option<Work>) -> Result<Outcome, String> {
    let result = match work {
        Some(w) => (&mut w.task)
            .await
            .map_err(|e| format!("{:?} task failed: {e}", w.kind)),
        None => std::future::pending().await,
    };
    *work = None;
    result
}
