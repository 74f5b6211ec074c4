//! The rpm-ostree client: `rpm-ostreed` on the system bus, transactions over its peer-to-peer socket.
//!
//! This is an edge: it turns D-Bus replies into typed values ([`crate::backend::deployment`]) and typed errors
//! ([`RpmOstreeError`]) and holds no policy. What to stage is decided by the planner.

pub(crate) mod runstate;
mod transaction;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

pub use transaction::TxnEvent;

use crate::backend::{Deployment, StagePlan};

/// Well-known bus name of rpm-ostreed.
pub const BUS_NAME: &str = "org.projectatomic.rpmostree1";
/// The client id streamd registers with (shown in rpm-ostree's journal and `InitiatingClientDescription`).
pub const CLIENT_ID: &str = "streamd";
/// The D-Bus error name of `G_IO_ERROR_BUSY`, which rpm-ostreed uses for "Transaction in progress"
/// and "System transaction in progress" (GIO errors are not a registered D-Bus error domain).
pub const BUSY_ERROR: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code26";
/// How rpm-ostreed's message starts when a shutdown inhibitor in `block` mode stops a reboot.
const INHIBITED_PREFIX: &str = "Reboot blocked by a systemd inhibitor lock";
/// How rpm-ostreed's `FinalizeDeployment` says the checksum it was given is not the staged
/// deployment's (every version: "Expected staged base checksum %s, but found %s").
const MISMATCH_PREFIX: &str = "Expected staged base checksum ";
/// Raised when the daemon caught a call while exiting for idleness.
const NO_REPLY_ERROR: &str = "org.freedesktop.DBus.Error.NoReply";

/// How long a method call may take; rpm-ostree's own client uses 5 minutes because the daemon
/// can be slow to load a large sysroot.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest wait for the end of a transaction that neither pulls nor deploys a tree:
/// `Cleanup` (a stale or foreign stage) and `FinalizeDeployment` (unlock, then the daemon's
/// reboot). Seconds on a healthy host; past this the state says rpm-ostreed did not finish.
const SHORT_TRANSACTION_LIMIT: Duration = Duration::from_secs(600);

/// A system bus connection whose method calls may take as long as rpm-ostreed's do.
pub async fn system_bus() -> zbus::Result<zbus::Connection> {
    zbus::connection::Builder::system()?
        .method_timeout(CALL_TIMEOUT)
        .build()
        .await
}

/// The failure of a `FinalizeDeployment` with `sent` when the staged deployment's value is
/// `found`.
fn mismatch(sent: &str, found: &str) -> String {
    format!("{MISMATCH_PREFIX}{sent}, but found {found}")
}

/// Errors the agent branches on.
#[derive(Debug, thiserror::Error)]
pub enum RpmOstreeError {
    /// Another transaction holds the daemon or the sysroot lock; retry later.
    #[error("rpm-ostreed is busy: {0}")]
    Busy(String),
    /// The transaction ran and failed; the message is rpm-ostree's.
    #[error("{0}")]
    Failed(String),
    /// The transaction was cancelled at streamd's request.
    #[error("the transaction was cancelled because the request changed")]
    Cancelled,
    /// The transaction connection closed without a result (the daemon exited or was restarted).
    #[error("rpm-ostreed closed the transaction without a result; the deployments will be re-read")]
    Interrupted,
    /// A reply did not have the documented shape.
    #[error("unexpected reply from rpm-ostreed: {0}")]
    Protocol(String),
    /// rpm-ostreed took the call but reported no end within the limit (hung, or stuck in a
    /// hook): the transaction is left to it and the step is tried again.
    #[error(
        "rpm-ostreed did not finish {call} within {after_s} s; the deployments will be re-read and it is tried again"
    )]
    Stalled {
        /// The method.
        call: &'static str,
        /// The limit, in seconds.
        after_s: u64,
    },
    /// A systemd inhibitor lock blocks the reboot; the message names who holds it and why.
    #[error("{0}")]
    Inhibited(String),
    /// `FinalizeDeployment` found another staged deployment than the one it was asked to
    /// finalize, by digest and by base commit: the same call fails the same way.
    #[error(
        "rpm-ostreed's staged deployment is not the one streamd staged and checked ({0}); it is checked again"
    )]
    StagedMismatch(String),
    /// rpm-ostreed answered the call with an error of its own (polkit said no, a reboot is
    /// under way, bad arguments): the same call gets the same answer, so it is not retried.
    #[error("rpm-ostreed refused {call}: {message}")]
    Refused {
        /// The method.
        call: &'static str,
        /// What rpm-ostreed said, and the D-Bus error name.
        message: String,
    },
    /// The daemon could not be reached (not running, restarting, exiting for idleness, a
    /// timeout or a dropped connection).
    #[error("rpm-ostreed call {call} failed: {message}")]
    Call {
        /// The method.
        call: &'static str,
        /// What D-Bus said, explained.
        message: String,
    },
}

/// D-Bus errors that say the call never reached a working rpm-ostreed: the bus could not
/// start or reach it, it was exiting, or the reply did not come in time. Any other error reply
/// is the daemon's own answer to this request.
const UNREACHED_ERRORS: &[&str] = &[
    NO_REPLY_ERROR,
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.TimedOut",
    "org.freedesktop.DBus.Error.Timeout",
    "org.freedesktop.DBus.Error.LimitsExceeded",
    "org.freedesktop.DBus.Error.NoMemory",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
    "org.freedesktop.DBus.Error.Spawn.Failed",
];

/// Phrases of the Go and Rust network stacks under rpm-ostree (skopeo / containers-image,
/// ostree-ext) that say a fetch failed on the way, not that the image is wrong.
const NETWORK_PHRASES: &[&str] = &[
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "i/o timeout",
    "tls handshake timeout",
    "context deadline exceeded",
    "client.timeout exceeded",
    "request canceled",
    "no such host",
    "temporary failure in name resolution",
    "network is unreachable",
    "unexpected eof",
    "502 bad gateway",
    "503 service unavailable",
    "504 gateway timeout",
    "429 too many requests",
    "toomanyrequests",
];

/// Phrases that say the image or the host is at fault even when a network phrase is present.
const PERMANENT_PHRASES: &[&str] = &[
    "unauthorized",
    "authentication required",
    "denied",
    "manifest unknown",
    "no space left on device",
    "min-free-space",
];

/// Whether a failed transaction's `message` reads as a network failure while fetching the
/// image (see [`RpmOstreeError::is_network_failure`]).
pub fn network_failure(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    NETWORK_PHRASES.iter().any(|p| m.contains(p))
        && !PERMANENT_PHRASES.iter().any(|p| m.contains(p))
}

impl RpmOstreeError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RpmOstreeError::Busy(_) => "rpm-ostree-busy",
            RpmOstreeError::Failed(_) => "rpm-ostree-failed",
            RpmOstreeError::Cancelled => "rpm-ostree-cancelled",
            RpmOstreeError::Interrupted => "rpm-ostree-interrupted",
            RpmOstreeError::Protocol(_) => "rpm-ostree-protocol",
            RpmOstreeError::Stalled { .. } => "rpm-ostree-stalled",
            RpmOstreeError::Inhibited(_) => "rpm-ostree-inhibited",
            RpmOstreeError::StagedMismatch(_) => "rpm-ostree-staged-mismatch",
            RpmOstreeError::Refused { .. } => "rpm-ostree-refused",
            RpmOstreeError::Call { .. } => "rpm-ostree-call",
        }
    }

    /// A transaction that failed because the image could not be fetched over the network (a
    /// reset connection, a timeout, DNS, a registry 5xx or 429): the same request may well
    /// succeed later, unlike a broken image or a failed depsolve, so it gets a few retries.
    pub fn is_network_failure(&self) -> bool {
        matches!(self, RpmOstreeError::Failed(m) if network_failure(m))
    }

    /// Transient errors are retried with backoff instead of ending in `Degraded`.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RpmOstreeError::Busy(_)
                | RpmOstreeError::Interrupted
                | RpmOstreeError::Call { .. }
                | RpmOstreeError::Stalled { .. }
        )
    }

    fn from_call(call: &'static str, e: zbus::Error) -> Self {
        if let zbus::Error::MethodError(name, msg, _) = &e {
            let msg = msg.clone().unwrap_or_default();
            if name.as_str() == BUSY_ERROR {
                return RpmOstreeError::Busy(crate::text::one_line_reason(&msg));
            }
            let message = format!("{} ({})", crate::text::one_line_reason(&msg), name.as_str());
            if UNREACHED_ERRORS.contains(&name.as_str()) {
                return RpmOstreeError::Call { call, message };
            }
            return RpmOstreeError::Refused { call, message };
        }
        RpmOstreeError::Call {
            call,
            message: e.to_string(),
        }
    }
}

#[zbus::proxy(
    interface = "org.projectatomic.rpmostree1.Sysroot",
    default_service = "org.projectatomic.rpmostree1",
    default_path = "/org/projectatomic/rpmostree1/Sysroot"
)]
trait Sysroot {
    fn register_client(&self, options: HashMap<&str, Value<'_>>) -> zbus::Result<()>;
    fn reload(&self) -> zbus::Result<()>;
    /// The booted OS object (`/` when nothing is booted). `GetOS("")`, which should answer the
    /// same, makes rpm-ostreed v2025.5 … v2026.2 segfault (`handle_get_os` completes the call
    /// and returns FALSE, so the generated code answers the freed invocation again; seen on
    /// the real daemon), so it is never called; rpm-ostree's own client reads this property.
    #[zbus(property)]
    fn booted(&self) -> zbus::Result<OwnedObjectPath>;
    #[zbus(property)]
    fn deployments(&self) -> zbus::Result<Vec<HashMap<String, OwnedValue>>>;
}

#[zbus::proxy(
    interface = "org.projectatomic.rpmostree1.OS",
    default_service = "org.projectatomic.rpmostree1"
)]
trait OS {
    fn update_deployment(
        &self,
        modifiers: BTreeMap<&str, Value<'_>>,
        options: BTreeMap<&str, Value<'_>>,
    ) -> zbus::Result<String>;
    fn cleanup(&self, elements: &[&str]) -> zbus::Result<String>;
    fn finalize_deployment(&self, options: BTreeMap<&str, Value<'_>>) -> zbus::Result<String>;
}

/// A value in an `UpdateDeployment` dictionary, kept serialisable so `streamctl plan` can show the
/// exact call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum CallValue {
    /// `s`
    Str(String),
    /// `b`
    Bool(bool),
    /// `as`
    Strs(Vec<String>),
    /// `ah`: files opened read-only and passed as descriptors in the message's fd list.
    Files(Vec<std::path::PathBuf>),
}

impl CallValue {
    /// The D-Bus value; `fds` holds the descriptors of `Files` values (in order) and must
    /// outlive the call.
    fn to_value<'a>(&'a self, fds: &'a [std::os::fd::OwnedFd], next_fd: &mut usize) -> Value<'a> {
        match self {
            CallValue::Str(s) => Value::from(s.as_str()),
            CallValue::Bool(b) => Value::Bool(*b),
            CallValue::Strs(v) => Value::from(v.iter().map(String::as_str).collect::<Vec<_>>()),
            CallValue::Files(paths) => {
                let start = *next_fd;
                *next_fd += paths.len();
                let handles: Vec<zbus::zvariant::Fd<'a>> = fds
                    .get(start..*next_fd)
                    .unwrap_or_default()
                    .iter()
                    .map(zbus::zvariant::Fd::from)
                    .collect();
                Value::from(handles)
            }
        }
    }
}

/// One `UpdateDeployment(a{sv} modifiers, a{sv} options)` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpdateDeploymentCall {
    /// Modifiers (what the new deployment is).
    pub modifiers: BTreeMap<&'static str, CallValue>,
    /// Options (how the transaction runs).
    pub options: BTreeMap<&'static str, CallValue>,
}

impl UpdateDeploymentCall {
    /// The call that stages `plan`: one transaction producing the complete target.
    pub fn for_plan(plan: &StagePlan) -> Self {
        let mut modifiers = BTreeMap::new();
        // A signature requirement or a signed booted origin: the verifying origin
        // (src/host/sigpolicy.rs).
        let refspec = if plan.signed {
            plan.os_image.signed_refspec()
        } else {
            plan.os_image.ostree_refspec()
        };
        modifiers.insert("set-refspec", CallValue::Str(refspec));
        // The old-major builds go and the target's come in the same transaction, so no staged
        // state ever has a variant node on the default kernel.
        if !plan.uninstall.is_empty() {
            modifiers.insert(
                "uninstall-packages",
                CallValue::Strs(plan.uninstall.clone()),
            );
        }
        if !plan.override_remove.is_empty() {
            modifiers.insert(
                "override-remove-packages",
                CallValue::Strs(plan.override_remove.clone()),
            );
        }
        if !plan.local_rpms.is_empty() {
            modifiers.insert(
                "install-local-packages",
                CallValue::Files(plan.local_rpms.clone()),
            );
        }
        let mut options = BTreeMap::new();
        // Locked: an unplanned reboot must not apply a major change nobody approved.
        options.insert("lock-finalization", CallValue::Bool(plan.lock_finalization));
        options.insert("reboot", CallValue::Bool(false));
        // Absent, rpm-ostree allows an older base for a rebase; `false` would turn on its
        // build-time check (coreos/rpm-ostree:src/daemon/rpmostreed-transaction-types.cxx
        // `deploy_transaction_execute`, src/daemon/rpmostree-sysroot-upgrader.cxx
        // `rpmostree_sysroot_upgrader_pull_base`), which refuses a newer major built before
        // the booted image (a later z-stream of the old major). streamd's own `direction`
        // check is what keeps older majors out, so the key is sent only when the admin allows
        // a downgrade, to say so in the daemon's journal.
        if plan.allow_downgrade {
            options.insert("allow-downgrade", CallValue::Bool(true));
        }
        options.insert(
            "initiating-command-line",
            CallValue::Str(format!("streamd rebase to stream {}", plan.stream)),
        );
        UpdateDeploymentCall { modifiers, options }
    }

    /// Opens every file the call passes as a descriptor, in dictionary order.
    fn open_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, RpmOstreeError> {
        let mut fds = Vec::new();
        for v in self.modifiers.values().chain(self.options.values()) {
            if let CallValue::Files(paths) = v {
                for p in paths {
                    let f = std::fs::File::open(p).map_err(|e| {
                        RpmOstreeError::Protocol(format!("opening {}: {e}", p.display()))
                    })?;
                    fds.push(std::os::fd::OwnedFd::from(f));
                }
            }
        }
        Ok(fds)
    }

    /// Sorted dictionaries: rpm-ostreed joins an identical request only when the serialized
    /// parameters are byte-identical, so a retry must send the same order.
    fn dicts<'a>(
        &'a self,
        fds: &'a [std::os::fd::OwnedFd],
    ) -> (BTreeMap<&'a str, Value<'a>>, BTreeMap<&'a str, Value<'a>>) {
        let mut next = 0;
        let m = to_dict(&self.modifiers, fds, &mut next);
        let o = to_dict(&self.options, fds, &mut next);
        (m, o)
    }
}

fn to_dict<'a>(
    m: &'a BTreeMap<&'static str, CallValue>,
    fds: &'a [std::os::fd::OwnedFd],
    next: &mut usize,
) -> BTreeMap<&'static str, Value<'a>> {
    m.iter().map(|(k, v)| (*k, v.to_value(fds, next))).collect()
}

/// A connection to rpm-ostreed.
#[derive(Debug, Clone)]
pub struct Client {
    conn: zbus::Connection,
    sysroot: SysrootProxy<'static>,
    /// This rpm-ostreed compares `FinalizeDeployment`'s checksum with the base commit (before
    /// v2025.7), learnt from its answer (see [`Client::finalize_deployment`]).
    finalize_by_commit: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The booted OS object, looked up once: the stateroot does not change under a running agent.
    os: std::sync::Arc<tokio::sync::OnceCell<OSProxy<'static>>>,
    /// The host's root, where libostree's `run/ostree/staged-deployment` records the lock.
    host_root: std::path::PathBuf,
    /// The unique bus name of the rpm-ostreed that streamd last registered with.
    registered_with: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Client {
    /// Registers with rpm-ostreed over an existing system bus connection, so the daemon does
    /// not idle-exit while streamd cares about it; `host_root` is where the host's `/run` is.
    pub async fn with_connection(
        conn: zbus::Connection,
        host_root: &std::path::Path,
    ) -> Result<Self, RpmOstreeError> {
        let sysroot = SysrootProxy::builder(&conn)
            // Always read fresh values: the cache can lag behind a just-finished transaction.
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(|e| RpmOstreeError::from_call("proxy", e))?;
        let client = Client {
            conn,
            sysroot,
            finalize_by_commit: Default::default(),
            os: Default::default(),
            host_root: host_root.to_path_buf(),
            registered_with: Default::default(),
        };
        client.register().await?;
        Ok(client)
    }

    /// The underlying bus connection (shared with streamd's own D-Bus API).
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    async fn os(&self) -> Result<&OSProxy<'static>, RpmOstreeError> {
        self.os
            .get_or_try_init(|| async {
                let path = self
                    .sysroot
                    .booted()
                    .await
                    .map_err(|e| RpmOstreeError::from_call("Booted", e))?;
                if path.as_str() == "/" {
                    return Err(RpmOstreeError::Refused {
                        call: "Booted",
                        message: "rpm-ostreed reports no booted deployment".into(),
                    });
                }
                OSProxy::builder(&self.conn)
                    .path(path)
                    .map_err(|e| RpmOstreeError::from_call("proxy", e))?
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await
                    .map_err(|e| RpmOstreeError::from_call("proxy", e))
            })
            .await
    }

    async fn register(&self) -> Result<(), RpmOstreeError> {
        let sysroot = &self.sysroot;
        let mut attempt = 0;
        loop {
            let opts = HashMap::from([("id", Value::from(CLIENT_ID))]);
            match sysroot.register_client(opts).await {
                Ok(()) => {
                    let owner = self.daemon_owner().await;
                    *self
                        .registered_with
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = owner;
                    return Ok(());
                }
                // The daemon was exiting for idleness when the call arrived; activation restarts it.
                Err(zbus::Error::MethodError(name, _, _))
                    if name.as_str() == NO_REPLY_ERROR && attempt < 3 =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(RpmOstreeError::from_call("RegisterClient", e)),
            }
        }
    }

    /// The OS object on a bus connection of its own, for one transaction method call. The
    /// daemon drops a transaction that never started only when its caller leaves the bus; on
    /// the shared connection an unstarted one (its socket unreachable, `Start()` failed) would
    /// block every rpm-ostree client (the MCO too) until streamd exits, and a retry with the
    /// same parameters would join it. Closing this connection drops it.
    async fn transaction_os(&self) -> Result<(zbus::Connection, OSProxy<'static>), RpmOstreeError> {
        let path = self.os().await?.inner().path().to_owned();
        let conn = system_bus()
            .await
            .map_err(|e| RpmOstreeError::from_call("connect", e))?;
        let os = OSProxy::builder(&conn)
            .path(path)
            .map_err(|e| RpmOstreeError::from_call("proxy", e))?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(|e| RpmOstreeError::from_call("proxy", e))?;
        // Registered too, so the daemon's journal names streamd as the initiating client.
        let sysroot = SysrootProxy::new(&conn)
            .await
            .map_err(|e| RpmOstreeError::from_call("proxy", e))?;
        sysroot
            .register_client(HashMap::from([("id", Value::from(CLIENT_ID))]))
            .await
            .map_err(|e| RpmOstreeError::from_call("RegisterClient", e))?;
        Ok((conn, os))
    }

    /// The unique name that owns rpm-ostreed's well-known name now, if any.
    async fn daemon_owner(&self) -> Option<String> {
        let dbus = zbus::fdo::DBusProxy::new(&self.conn).await.ok()?;
        let name = zbus::names::BusName::try_from(BUS_NAME).ok()?;
        dbus.get_name_owner(name).await.ok().map(|o| o.to_string())
    }

    /// Registers again when another rpm-ostreed owns the name than the one registered with:
    /// the daemon idle-exits (then D-Bus activates a new one) or is restarted, and a new
    /// daemon knows no clients, so it could idle-exit under streamd.
    async fn register_if_restarted(&self) -> Result<(), RpmOstreeError> {
        let Some(owner) = self.daemon_owner().await else {
            return Ok(());
        };
        let known = self
            .registered_with
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if known.as_deref() == Some(owner.as_str()) {
            return Ok(());
        }
        tracing::info!(owner = %owner, "rpm-ostreed was restarted; registering again");
        self.register().await
    }

    /// Reloads the sysroot and reads every deployment (boot order: staged first). The staged
    /// deployment's lock is the D-Bus key (hosts before rpm-ostree v2024.6) or libostree's
    /// record in `/run` (every later host, where the key is never set; see [`runstate`]).
    pub async fn deployments(&self) -> Result<Vec<Deployment>, RpmOstreeError> {
        let sysroot = &self.sysroot;
        sysroot
            .reload()
            .await
            .map_err(|e| RpmOstreeError::from_call("Reload", e))?;
        // Reload activated the daemon if it had exited: the owner is current now.
        self.register_if_restarted().await?;
        let raw = sysroot
            .deployments()
            .await
            .map_err(|e| RpmOstreeError::from_call("Deployments", e))?;
        let mut all =
            Deployment::parse_all(&raw).map_err(|e| RpmOstreeError::Protocol(e.to_string()))?;
        for d in all
            .iter_mut()
            .filter(|d| d.staged && !d.finalization_locked)
        {
            d.finalization_locked = runstate::staged_locked(&self.host_root, d)
                .map_err(|e| RpmOstreeError::Protocol(e.to_string()))?;
        }
        Ok(all)
    }

    /// Removes the pending (staged) deployment: `Cleanup(["pending-deploy"])`.
    pub async fn cleanup_pending(&self) -> Result<(), RpmOstreeError> {
        let address = self
            .os()
            .await?
            .cleanup(&["pending-deploy"])
            .await
            .map_err(|e| RpmOstreeError::from_call("Cleanup", e))?;
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        transaction::run_within("Cleanup", SHORT_TRANSACTION_LIMIT, &address, &tx).await
    }

    /// Unlocks the finalization-locked staged deployment whose manifest digest is `digest` and
    /// whose base commit is `base_commit`, and lets rpm-ostreed reboot into it:
    /// `FinalizeDeployment({"checksum": …})`.
    ///
    /// What `checksum` is compared with depends on the daemon (coreos/rpm-ostree:
    /// src/daemon/rpmostreed-transaction-types.cxx `finalize_deployment_transaction_execute`):
    /// the staged deployment's base commit up to v2025.6, its image's manifest digest from
    /// v2025.7 (e47214b7; the commit when the image metadata cannot be read). The D-Bus API names
    /// no version, so the digest goes first; the daemon's one deterministic answer to a
    /// commit-comparing daemon, "Expected staged base checksum <digest>, but found <this
    /// commit>", is answered once with the commit, and the client remembers that this daemon
    /// compares commits. Any other mismatch is [`RpmOstreeError::StagedMismatch`].
    pub async fn finalize_deployment(
        &self,
        digest: &str,
        base_commit: &str,
    ) -> Result<(), RpmOstreeError> {
        let by_commit = self
            .finalize_by_commit
            .load(std::sync::atomic::Ordering::Relaxed);
        let first = if by_commit { base_commit } else { digest };
        match self.finalize_with(first).await {
            Err(RpmOstreeError::Failed(m)) if !by_commit && m == mismatch(digest, base_commit) => {
                tracing::info!(%digest, base_commit, "rpm-ostreed compares the staged base commit (before v2025.7); finalizing by commit");
                self.finalize_by_commit
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                self.finalize_with(base_commit).await
            }
            other => other,
        }
        .map_err(|e| match e {
            RpmOstreeError::Failed(m) if m.starts_with(MISMATCH_PREFIX) => {
                RpmOstreeError::StagedMismatch(m)
            }
            e => e,
        })
    }

    /// One `FinalizeDeployment` transaction with `checksum`.
    async fn finalize_with(&self, checksum: &str) -> Result<(), RpmOstreeError> {
        let mut options = BTreeMap::new();
        options.insert("checksum", Value::from(checksum));
        options.insert(
            "initiating-command-line",
            Value::from("streamd: reboot approved"),
        );
        let address = self
            .os()
            .await?
            .finalize_deployment(options)
            .await
            .map_err(|e| RpmOstreeError::from_call("FinalizeDeployment", e))?;
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let run =
            transaction::run_within("FinalizeDeployment", SHORT_TRANSACTION_LIMIT, &address, &tx);
        match run.await {
            Err(RpmOstreeError::Failed(m)) if m.starts_with(INHIBITED_PREFIX) => {
                Err(RpmOstreeError::Inhibited(crate::text::one_line_reason(&m)))
            }
            other => other,
        }
    }

    /// Runs one `UpdateDeployment` transaction to its end, sending progress to `events`.
    pub async fn update_deployment(
        &self,
        call: &UpdateDeploymentCall,
        events: &tokio::sync::mpsc::Sender<TxnEvent>,
        cancel: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Result<(), RpmOstreeError> {
        let (conn, os) = self.transaction_os().await?;
        let fds = call.open_files()?;
        let (modifiers, options) = call.dicts(&fds);
        let result = match os.update_deployment(modifiers, options).await {
            Ok(address) => transaction::run(&address, events, cancel).await,
            Err(e) => Err(RpmOstreeError::from_call("UpdateDeployment", e)),
        };
        // Leaving the bus drops the transaction if it never started.
        let _ = conn.close().await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_failures_are_told_from_broken_images() {
        let cases = [
            (
                r#"Creating importer: failed to invoke method OpenImage: pinging container registry quay.io: Get "https://quay.io/v2/": dial tcp: lookup quay.io on 10.0.0.10:53: no such host"#,
                true,
            ),
            (
                r#"Importing: Unable to pull base image: reading blob sha256:ab: Get "https://cdn.quay.io/x": net/http: TLS handshake timeout"#,
                true,
            ),
            (
                "Importing: reading blob sha256:ab: read tcp 10.0.0.2:4711->1.2.3.4:443: read: connection reset by peer",
                true,
            ),
            (
                "fetching blob: received unexpected HTTP status: 503 Service Unavailable",
                true,
            ),
            ("reading manifest: toomanyrequests: Rate exceeded", true),
            (
                "reading manifest sha256:ab in quay.io/x: unauthorized: access to the requested resource is not authorized",
                false,
            ),
            (
                "reading manifest sha256:ab in quay.io/x: manifest unknown",
                false,
            ),
            (
                "Could not depsolve transaction; 1 problem detected: package kernel-rt-core requires kernel-rt-modules",
                false,
            ),
            (
                "Writing content object: min-free-space-percent '3%' would be exceeded, at least 13.6 kB requested",
                false,
            ),
            (
                "Writing content object: No space left on device (connection reset by peer earlier)",
                false,
            ),
            (
                "Old and new refs are equal: ostree-unverified-registry:x",
                false,
            ),
            ("", false),
        ];
        for (message, network) in cases {
            assert_eq!(network_failure(message), network, "{message}");
            assert_eq!(
                RpmOstreeError::Failed(message.into()).is_network_failure(),
                network,
                "{message}"
            );
        }
        // Only a failed transaction qualifies: other errors have their own handling.
        assert!(!RpmOstreeError::Busy("connection reset by peer".into()).is_network_failure());
    }

    fn method_error(name: &str, message: &str) -> zbus::Error {
        let name = zbus::names::OwnedErrorName::try_from(name).unwrap();
        let call = zbus::Message::method_call("/", "M")
            .unwrap()
            .build(&())
            .unwrap();
        let reply = zbus::Message::error(&call.header(), name.clone())
            .unwrap()
            .build(&(message,))
            .unwrap();
        zbus::Error::MethodError(name, Some(message.into()), reply)
    }

    #[test]
    fn the_daemons_own_refusals_are_not_retried() {
        let denied = RpmOstreeError::from_call(
            "UpdateDeployment",
            method_error(
                "org.freedesktop.DBus.Error.AccessDenied",
                "rpmostreed OS operation UpdateDeployment not allowed for user",
            ),
        );
        assert!(
            matches!(denied, RpmOstreeError::Refused { .. }),
            "{denied:?}"
        );
        assert!(!denied.is_transient());
        let rebooting = RpmOstreeError::from_call(
            "UpdateDeployment",
            method_error(
                "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code0",
                "Reboot initiated, cannot start new transaction",
            ),
        );
        assert!(!rebooting.is_transient());
        for name in UNREACHED_ERRORS {
            let e = RpmOstreeError::from_call("UpdateDeployment", method_error(name, "x"));
            assert!(e.is_transient(), "{name}");
        }
        assert!(
            RpmOstreeError::from_call("UpdateDeployment", method_error(BUSY_ERROR, "b"))
                .is_transient()
        );
        let gone = RpmOstreeError::from_call(
            "Reload",
            zbus::Error::InputOutput(std::sync::Arc::new(std::io::Error::from(
                std::io::ErrorKind::BrokenPipe,
            ))),
        );
        assert!(gone.is_transient());
    }

    /// The type of every option streamd sends: rpm-ostreed looks each up with an expected type
    /// and silently ignores a mismatch, so a mistyped `lock-finalization` would stage unlocked.
    #[test]
    fn every_option_has_the_type_rpm_ostreed_looks_up() {
        let image: crate::image::reference::ImageRef =
            "quay.example/rhcos@sha256:0000000000000000000000000000000000000000000000000000000000000000"
                .parse()
                .unwrap();
        let mut plan = StagePlan::rebase("rhel-10", &image, true);
        plan.uninstall = vec!["kernel-rt-core".into()];
        plan.override_remove = vec!["kernel".into()];
        plan.local_rpms = vec!["/dev/null".into()];
        let call = UpdateDeploymentCall::for_plan(&plan);
        let fds = call.open_files().unwrap();
        let (modifiers, options) = call.dicts(&fds);
        let types = |d: &BTreeMap<&str, Value<'_>>| -> BTreeMap<String, String> {
            d.iter()
                .map(|(k, v)| (k.to_string(), v.value_signature().to_string()))
                .collect()
        };
        // coreos/rpm-ostree:src/daemon/rpmostreed-transaction-types.cxx
        // (`deploy_transaction_execute`, `vardict_lookup_*`) and the interface XML.
        let want = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, t)| (k.to_string(), t.to_string()))
                .collect()
        };
        assert_eq!(
            types(&modifiers),
            want(&[
                ("install-local-packages", "ah"),
                ("override-remove-packages", "as"),
                ("set-refspec", "s"),
                ("uninstall-packages", "as"),
            ])
        );
        assert_eq!(
            types(&options),
            want(&[
                ("allow-downgrade", "b"),
                ("initiating-command-line", "s"),
                ("lock-finalization", "b"),
                ("reboot", "b"),
            ])
        );
        // Without the admin's downgrade permission the key is absent (rpm-ostree's default
        // for a rebase), never `false`.
        let plain = UpdateDeploymentCall::for_plan(&StagePlan::rebase("rhel-10", &image, false));
        assert!(!plain.options.contains_key("allow-downgrade"));
    }
}
