//! The bootc backend: for hosts where rpm-ostreed is not available (or config says
//! `backend = "bootc"`).
//!
//! bootc has no D-Bus API and needs uid 0 with `CAP_SYS_ADMIN`, which the sandboxed daemon does
//! not have. So every bootc command runs as a **transient systemd unit** started over systemd's
//! D-Bus API (`StartTransientUnit`, then `JobRemoved`, then the unit's `Result`): `bootc status
//! --json` with its stdout in a file of streamd's runtime directory, and `bootc switch
//! --transport registry [--enforce-container-sigpolicy] <image>`; each unit's stderr goes to
//! another file, so a failure carries bootc's own words. Commands that write the sysroot run in
//! one fixed unit ([`WRITE_UNIT`]): one that outlived its caller's limit is joined by the retry,
//! never run twice side by side. Reboots go through logind's `Reboot`, after checking its
//! inhibitors.
//!
//! `bootc status --json` is the hidden legacy flag every bootc with JSON output accepts (since
//! v0.1; `--format=json` only since v0.1.13), as the machine-config daemon uses it; the
//! document is parsed in every shape bootc has printed (`org.containers.bootc/v1alpha1` before
//! v0.1.15, no `ostree.stateroot` before v1.3.0: bootc-dev/bootc:crates/lib/src/spec.rs).
//!
//! `bootc switch` stages unlocked: any reboot, planned or not, applies it. bootc >= 1.12 can
//! hold a stage ([`Client::hold`], `bootc upgrade --download-only`, which locks the staged
//! deployment of the spec's digest) and let it go ([`Client::release`], `--from-downloaded`).
//! Upstream has no locked switch, so [`Client::switch_held`] closes the gap with libostree's
//! legacy lock file `/run/ostree/staged-deployment-locked`, which the finalization at shutdown
//! honours whoever made it and a first stage leaves alone: one unit creates it, switches and
//! holds, and removes it again when nothing got staged. Over an existing stage that cannot work
//! (libostree unlinks the file when it replaces a stage), so there it refuses
//! ([`BootcError::StagedAlready`]; docs/protocol.md). Older bootc has no lock, so the agent
//! calls [`Client::switch`] only once the reboot is approved, and [`Client::reboot`] right
//! after it. bootc cannot carry rpm-ostree package overrides either;
//! [`refusal`] says which hosts cannot use this backend.
//!
//! `bootc status` prints no image labels (its `ImageStatus` has only the reference, version,
//! timestamp, digest and architecture: bootc-dev/bootc:crates/lib/src/spec.rs), although
//! bootc reads the whole image configuration from the deployment's commit for it. So
//! [`Client::deployments`] fills the booted and staged deployments' [`Deployment::image_labels`]
//! from the same place, the ostree-ext key `ostree.container.image-config` of the commit
//! metadata ([`crate::backend::helper::META_CONFIG`]), read through libostree in the
//! `streamd-verify` helper ([`crate::backend::helper`]); a commit's labels never change, so
//! each is read once. An absent key (an import by an ostree-ext that did not store the
//! configuration) or format v0's `"null"` means no labels, as ostree-ext itself takes it; a
//! failed read or a malformed configuration leaves the labels unknown
//! ([`Deployment::image_labels_error`]), never the status unusable, and is read again after
//! [`labels::LABELS_RETRY`].
//!
//! Like [`crate::backend::rpmostree`], this is an edge: replies become typed values and typed errors;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::info;
use zbus::zvariant::Value;

use crate::backend::Deployment;
use crate::backend::KernelVariant;
use crate::backend::helper::HelperError;

mod labels;
mod status;
mod unit;

pub use status::parse_status;

use unit::{Slot, error_name};

/// How long `bootc status` may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `bootc switch` may take (it pulls a whole OS image).
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(3600);
/// The unit every bootc command that writes the sysroot runs in: one at a time, and joined
/// by a retry while it runs.
pub const WRITE_UNIT: &str = "streamd-bootc-deploy.service";

/// The shell the held switch's fixed scripts run in; their only argument is the host's
/// `/run/ostree` (`$1`), never anything from the request.
const SH: &str = "/bin/sh";
/// Before a held switch: refuse when something is staged (staging over it would unlink the
/// lock file), else create libostree's legacy lock file, as `ostree_sysroot_change_finalization`
/// does (mode 0640).
const LOCK_BEFORE_STAGING: &str = r#"set -e
if [ -e "$1/staged-deployment" ]; then
    echo "error: a deployment is staged already; staging over it would drop its finalization lock ($1/staged-deployment-locked), so streamd does not stage before the reboot is approved over it" >&2
    exit 1
fi
mkdir -p "$1"
umask 0137
: > "$1/staged-deployment-locked""#;
/// When the held switch's unit ends (`ExecStopPost`, also after a failure or a stop): with
/// nothing staged the lock file goes, so that it cannot hold someone else's next stage.
const UNLOCK_IF_UNSTAGED: &str =
    r#"[ -e "$1/staged-deployment" ] || rm -f "$1/staged-deployment-locked""#;

const BLOCKED_BY_INHIBITOR: &str = "org.freedesktop.login1.BlockedByInhibitorLock";

/// Errors the agent branches on.
#[derive(Debug, thiserror::Error)]
pub enum BootcError {
    /// A D-Bus call to systemd, logind or the bus failed.
    #[error("{service} call {call} failed: {message}")]
    Call {
        /// `systemd`, `logind` or `dbus`.
        service: &'static str,
        /// The method.
        call: &'static str,
        /// What D-Bus said.
        message: String,
    },
    /// The bootc unit ran and failed.
    #[error(
        "bootc failed in unit {unit} (result {result}, exit status {status}): {}; see `journalctl -u {unit}`",
        if .stderr.is_empty() { "no error output" } else { .stderr.as_str() }
    )]
    UnitFailed {
        /// The transient unit.
        unit: String,
        /// Its `Result` (`exit-code`, `signal`, …) or the job's result.
        result: String,
        /// `ExecMainStatus`: the exit code, or the signal number.
        status: i32,
        /// What bootc wrote to stderr (its `error: …` chain), on one bounded line.
        stderr: String,
    },
    /// The bootc unit did not finish in time; it is left running, and a retry waits for it
    /// instead of starting another.
    #[error("bootc unit {unit} did not finish within {secs} s; see `journalctl -u {unit}`")]
    Timeout {
        /// The transient unit.
        unit: String,
        /// The limit.
        secs: u64,
    },
    /// `bootc status --json` printed something that is not the documented document.
    #[error("unexpected bootc status output: {0}")]
    Status(String),
    /// The status output file could not be read.
    #[error("reading bootc's status output {path}: {message}")]
    Output {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A deployment is staged already where a held stage was to be made: staging over it
    /// would leave the new stage unlocked until the hold (libostree unlinks the legacy lock
    /// when it replaces a staged deployment), and bootc has no command that removes one.
    #[error(
        "{staged} is staged already; staging over it would leave the new stage unlocked until \
         it is held (ostree drops the lock file when it replaces a staged deployment), so \
         streamd does not stage before the reboot approval while it is there"
    )]
    StagedAlready {
        /// The staged image (or deployment id).
        staged: String,
    },
    /// A `block` inhibitor covers shutdown: the reboot must wait.
    #[error("the reboot is blocked by an inhibitor lock held by {who}: {why}")]
    Inhibited {
        /// Who holds the lock.
        who: String,
        /// Its reason.
        why: String,
    },
}

impl BootcError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            BootcError::Call { .. } => "bootc-call",
            BootcError::UnitFailed { .. } => "bootc-unit-failed",
            BootcError::Timeout { .. } => "bootc-timeout",
            BootcError::Status(_) => "bootc-status-malformed",
            BootcError::Output { .. } => "bootc-output-unreadable",
            BootcError::StagedAlready { .. } => "bootc-staged-already",
            BootcError::Inhibited { .. } => "bootc-inhibited",
        }
    }

    /// Transient errors are retried with backoff instead of ending in `Degraded`.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BootcError::Call { .. } | BootcError::Timeout { .. } | BootcError::Inhibited { .. }
        )
    }

    /// A `bootc switch` that failed on the network while pulling (bootc's error text reads as
    /// one, judged like an rpm-ostree transaction's message), so the same request may succeed
    /// later and is retried.
    pub fn is_network_failure(&self) -> bool {
        matches!(self, BootcError::UnitFailed { stderr, .. }
            if crate::backend::rpmostree::network_failure(stderr))
    }

    fn call(service: &'static str, call: &'static str, e: zbus::Error) -> Self {
        let message = match &e {
            zbus::Error::MethodError(name, msg, _) => format!(
                "{} ({})",
                crate::text::one_line_reason(msg.as_deref().unwrap_or_default()),
                name.as_str()
            ),
            other => other.to_string(),
        };
        BootcError::Call {
            service,
            call,
            message,
        }
    }
}

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Login {
    #[allow(clippy::type_complexity)]
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;
    fn reboot(&self, interactive: bool) -> zbus::Result<()>;
}

/// Whether rpm-ostreed can be reached: its name is owned or activatable. For `backend = "auto"`.
pub async fn rpm_ostreed_available(conn: &zbus::Connection) -> Result<bool, BootcError> {
    let call = |c: &'static str| move |e: zbus::Error| BootcError::call("dbus", c, e);
    let dbus = zbus::fdo::DBusProxy::new(conn)
        .await
        .map_err(call("proxy"))?;
    let name = zbus::names::BusName::try_from(crate::backend::rpmostree::BUS_NAME)
        .map_err(|e| call("NameHasOwner")(e.into()))?;
    if dbus
        .name_has_owner(name)
        .await
        .map_err(|e| call("NameHasOwner")(e.into()))?
    {
        return Ok(true);
    }
    let activatable = dbus
        .list_activatable_names()
        .await
        .map_err(|e| call("ListActivatableNames")(e.into()))?;
    Ok(activatable
        .iter()
        .any(|n| n.as_str() == crate::backend::rpmostree::BUS_NAME))
}

/// What makes a host unable to use this backend for a rebase, as a reason for the `Refused`
/// state: bootc replaces the origin with the bare image reference, so rpm-ostree package
/// layering, overrides and a real-time or 64k kernel (package overrides too) would be lost.
pub fn refusal(kernel: KernelVariant, booted: &Deployment) -> Option<String> {
    const TAIL: &str = "bootc cannot carry package overrides; the target must be a variant image \
                        that already contains them";
    if kernel != KernelVariant::Default {
        return Some(format!(
            "the host runs the {} kernel, a package override; {TAIL}",
            kernel.as_str()
        ));
    }
    if booted.incompatible {
        return Some(format!(
            "the booted deployment has local rpm-ostree package changes; {TAIL}"
        ));
    }
    let layered: Vec<&str> = booted
        .added_packages()
        .chain(booted.requested_base_removals.iter().map(String::as_str))
        .collect();
    if !layered.is_empty() {
        return Some(format!(
            "the booted deployment layers or overrides packages ({}); {TAIL}",
            layered.join(", ")
        ));
    }
    None
}

/// A connection to systemd and logind that runs bootc in transient units.
#[derive(Debug, Clone)]
pub struct Client {
    conn: zbus::Connection,
    bootc: PathBuf,
    runtime_dir: PathBuf,
    /// The host's `/run/ostree` as the units see it (below `host-root`).
    run_ostree: PathBuf,
    /// Numbers the units of this process.
    seq: Arc<AtomicU64>,
    /// How long `bootc status` may take.
    status_timeout: Duration,
    /// How long a command that writes the sysroot (`bootc switch`) may take.
    write_timeout: Duration,
    /// Whether the last `bootc status` came from a bootc that can hold a stage.
    holds: Arc<AtomicBool>,
    /// The `streamd-verify` helper that reads image configurations (or why it is unknown).
    helper: Result<PathBuf, HelperError>,
    /// The ostree repository (`host-root/sysroot/ostree/repo`).
    repo: PathBuf,
    /// The labels of the commits read so far, and the reads that failed.
    labels: Arc<Mutex<labels::LabelCache>>,
}

impl Client {
    /// A client on `conn` (the system bus) running `bootc` (e.g. `/usr/bin/bootc`) and writing
    /// status output below `runtime_dir` (streamd's runtime directory, which systemd can write).
    /// `host_root` is the host's `/` (`host-root`): the units find libostree's runtime state
    /// below it, and the image labels are read from its `sysroot/ostree/repo` by the
    /// `streamd-verify` helper next to the running program.
    pub fn new(
        conn: zbus::Connection,
        bootc: impl Into<PathBuf>,
        runtime_dir: impl Into<PathBuf>,
        host_root: &Path,
    ) -> Self {
        Client {
            conn,
            bootc: bootc.into(),
            runtime_dir: runtime_dir.into(),
            run_ostree: host_root.join("run/ostree"),
            seq: Arc::new(AtomicU64::new(0)),
            status_timeout: STATUS_TIMEOUT,
            write_timeout: SWITCH_TIMEOUT,
            holds: Arc::new(AtomicBool::new(false)),
            helper: crate::backend::helper::beside_current_exe(),
            repo: host_root.join("sysroot/ostree/repo"),
            labels: Arc::new(Mutex::new(labels::LabelCache::default())),
        }
    }

    /// The same client reading image labels with the helper at `helper` instead of the one
    /// next to the running program.
    pub fn with_helper(mut self, helper: impl Into<PathBuf>) -> Self {
        self.helper = Ok(helper.into());
        self
    }

    /// The same client with other limits for `bootc status` and for the commands that write
    /// the sysroot (by default [`STATUS_TIMEOUT`] and [`SWITCH_TIMEOUT`]).
    pub fn with_timeouts(mut self, status: Duration, write: Duration) -> Self {
        self.status_timeout = status;
        self.write_timeout = write;
        self
    }

    /// The system bus connection.
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    /// Every deployment bootc reports, staged first, then booted, rollback and the others; the
    /// staged and booted ones with their image labels (or why they are unknown).
    pub async fn deployments(&self) -> Result<Vec<Deployment>, BootcError> {
        let n = self.next();
        let output = self.runtime_dir.join(format!("bootc-status-{n}.json"));
        let argv = self.bootc_argv(&["status", "--json"]);
        let out = output.to_string_lossy().into_owned();
        let run = self
            .run_unit(
                "status",
                &[argv],
                None,
                &[("StandardOutputFileToTruncate", Value::from(out.as_str()))],
                self.status_timeout,
                Slot::Read,
            )
            .await;
        let read = status::read_output(&output);
        // The file is only a channel; a failed run's partial output goes too.
        let _ = std::fs::remove_file(&output);
        run?;
        let (mut deployments, holds) = status::parse_host(&read?)?;
        self.holds.store(holds, Ordering::SeqCst);
        self.fill_labels(&mut deployments).await;
        Ok(deployments)
    }

    /// Whether this host's bootc can hold a staged deployment (v1.12.0 or later, as the last
    /// [`Client::deployments`] showed; `false` before the first).
    pub fn can_hold(&self) -> bool {
        self.holds.load(Ordering::SeqCst)
    }

    /// Holds the staged deployment: `bootc upgrade --download-only` finalization-locks the
    /// staged deployment when it already has the digest of the spec's image (the staged one),
    /// so no reboot applies it. bootc >= 1.12 only ([`Client::can_hold`]).
    pub async fn hold(&self) -> Result<(), BootcError> {
        self.upgrade("--download-only").await
    }

    /// Lets the held stage be applied by the next reboot: `bootc upgrade --from-downloaded`
    /// unlocks it without pulling.
    pub async fn release(&self) -> Result<(), BootcError> {
        self.upgrade("--from-downloaded").await
    }

    async fn upgrade(&self, flag: &str) -> Result<(), BootcError> {
        self.write("upgrade", self.bootc_argv(&["upgrade", flag]))
            .await
    }

    /// Runs one bootc command that writes the sysroot in [`WRITE_UNIT`].
    async fn write(&self, verb: &str, argv: Vec<String>) -> Result<(), BootcError> {
        self.run_unit(verb, &[argv], None, &[], self.write_timeout, Slot::Write)
            .await
    }

    /// `bootc ARGS` as a unit's command line.
    fn bootc_argv(&self, args: &[&str]) -> Vec<String> {
        std::iter::once(self.bootc.to_string_lossy().into_owned())
            .chain(args.iter().map(|a| a.to_string()))
            .collect()
    }

    /// `bootc switch --transport registry [--enforce-container-sigpolicy] <pullspec>`.
    fn switch_argv(&self, pullspec: &str, enforce_sigpolicy: bool) -> Vec<String> {
        let mut args = vec!["switch", "--transport", "registry"];
        if enforce_sigpolicy {
            args.push("--enforce-container-sigpolicy");
        }
        args.push(pullspec);
        self.bootc_argv(&args)
    }

    /// Stages `pullspec` with `bootc switch --transport registry <pullspec>`. Not locked: any
    /// reboot applies it, so call this only once the reboot is approved. With
    /// `enforce_sigpolicy` (the host runs a signed image) `--enforce-container-sigpolicy` keeps
    /// the target under the host's `policy.json`: without it bootc would record the new image
    /// as unverified and signature enforcement would be silently dropped.
    pub async fn switch(&self, pullspec: &str, enforce_sigpolicy: bool) -> Result<(), BootcError> {
        self.write("switch", self.switch_argv(pullspec, enforce_sigpolicy))
            .await
    }

    /// Stages `pullspec` held, never unlocked for a moment: one unit creates libostree's legacy
    /// lock file `/run/ostree/staged-deployment-locked` (finalization is skipped while it
    /// exists), then runs `bootc switch` (a first stage leaves that file alone) and `bootc
    /// upgrade --download-only` (the lock bootc reports as `downloadOnly`); when the unit ends
    /// with nothing staged (a failed switch) it removes the file again, so that no later stage
    /// by anyone is locked by it. The unit refuses to start when a deployment is staged already:
    /// staging over it would unlink the file (ostreedev/ostree#3025) and leave the new stage
    /// unlocked until the hold. bootc >= 1.12 only ([`Client::can_hold`]).
    pub async fn switch_held(
        &self,
        pullspec: &str,
        enforce_sigpolicy: bool,
    ) -> Result<(), BootcError> {
        let dir = self.run_ostree.to_string_lossy().into_owned();
        let sh = |script: &str| -> Vec<String> {
            [SH, "-c", script, "streamd-bootc-hold", dir.as_str()]
                .iter()
                .map(|a| a.to_string())
                .collect()
        };
        let commands = [
            sh(LOCK_BEFORE_STAGING),
            self.switch_argv(pullspec, enforce_sigpolicy),
            self.bootc_argv(&["upgrade", "--download-only"]),
        ];
        self.run_unit(
            "switch",
            &commands,
            Some(&sh(UNLOCK_IF_UNSTAGED)),
            &[],
            self.write_timeout,
            Slot::Write,
        )
        .await
    }

    /// [`BootcError::Inhibited`] while a `block` inhibitor covers shutdown.
    pub async fn check_inhibitors(&self) -> Result<(), BootcError> {
        let login = LoginProxy::new(&self.conn)
            .await
            .map_err(|e| BootcError::call("logind", "proxy", e))?;
        self.inhibited(&login).await
    }

    async fn inhibited(&self, login: &LoginProxy<'_>) -> Result<(), BootcError> {
        let inhibitors = login
            .list_inhibitors()
            .await
            .map_err(|e| BootcError::call("logind", "ListInhibitors", e))?;
        if let Some((_, who, why, _, _, _)) =
            inhibitors.into_iter().find(|(what, _, _, mode, _, _)| {
                mode == "block" && what.split(':').any(|w| w == "shutdown")
            })
        {
            return Err(BootcError::Inhibited { who, why });
        }
        Ok(())
    }

    /// Reboots through logind, unless a `block` inhibitor covers shutdown ([`BootcError::Inhibited`]).
    pub async fn reboot(&self) -> Result<(), BootcError> {
        let login = LoginProxy::new(&self.conn)
            .await
            .map_err(|e| BootcError::call("logind", "proxy", e))?;
        self.inhibited(&login).await?;
        match login.reboot(false).await {
            Ok(()) => {
                info!("reboot requested through logind");
                Ok(())
            }
            // An inhibitor taken between the two calls.
            Err(e) if error_name(&e) == Some(BLOCKED_BY_INHIBITOR) => Err(BootcError::Inhibited {
                who: "unknown".into(),
                why: crate::text::one_line_reason(&e.to_string()),
            }),
            Err(e) => Err(BootcError::call("logind", "Reboot", e)),
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }
}
