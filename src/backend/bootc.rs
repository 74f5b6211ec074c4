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
//! v1.1.0, no `ostree.stateroot` before v1.3.0: bootc-dev/bootc:crates/lib/src/spec.rs).
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
//! [`LABELS_RETRY`].
//!
//! Like [`crate::backend::rpmostree`], this is an edge: replies become typed values and typed errors;
//! no policy lives here.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::Deserialize;
use tracing::{debug, info, warn};
use zbus::zvariant::Value;

use crate::backend::Deployment;
use crate::backend::KernelVariant;
// The systemd proxies are shared with the Secure Boot bootloader update.
use crate::backend::systemd::{
    JobEnd, JobRemovedStream, ManagerProxy, ServiceProxy, UnitProxy, job_watch, wait_job,
};

/// How long `bootc status` may take.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `bootc switch` may take (it pulls a whole OS image).
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long the helper may take to read the image configuration of two commits.
const LABELS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit whose labels could not be read waits before the next read: every
/// status reads the deployments, and a read that keeps failing (a damaged repository, a
/// missing helper) should neither run the helper nor warn each time.
const LABELS_RETRY: Duration = Duration::from_secs(300);

/// The unit every bootc command that writes the sysroot runs in: one at a time, and joined
/// by a retry while it runs.
pub const WRITE_UNIT: &str = "streamd-bootc-deploy.service";
/// Its stderr file, in the runtime directory (a joined run's error chain is read from it too).
const WRITE_STDERR: &str = "bootc-deploy.stderr";
/// The pause before starting again after another command's unit ended (systemd unloads it on
/// its next garbage collection).
const REJOIN_PAUSE: Duration = Duration::from_millis(200);

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

/// Which unit a bootc command runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A unit of its own (`bootc status`).
    Read,
    /// [`WRITE_UNIT`].
    Write,
}

fn closed(unit: &str) -> BootcError {
    BootcError::Call {
        service: "systemd",
        call: "JobRemoved",
        message: format!("the bus connection closed while {unit} ran"),
    }
}

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
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

fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
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
    helper: Result<PathBuf, String>,
    /// The ostree repository (`host-root/sysroot/ostree/repo`).
    repo: PathBuf,
    /// The labels of the commits read so far, and the reads that failed.
    labels: Arc<Mutex<LabelCache>>,
}

/// The image labels read per commit (commits are immutable) and the reads that failed (tried
/// again after [`LABELS_RETRY`]); only the current deployments' commits are kept.
#[derive(Debug, Default)]
struct LabelCache {
    read: HashMap<String, BTreeMap<String, String>>,
    /// Per commit: why its labels are unknown, and when that was found.
    failed: HashMap<String, (String, Instant)>,
}

impl LabelCache {
    /// Forgets the commits not in `deployed`, and says which of `wanted` to read at `now`:
    /// those neither read nor failed within [`LABELS_RETRY`], sorted, without repeats.
    fn due(&mut self, deployed: &[&str], wanted: &[&str], now: Instant) -> Vec<String> {
        self.read.retain(|c, _| deployed.contains(&c.as_str()));
        self.failed.retain(|c, _| deployed.contains(&c.as_str()));
        let mut out: Vec<String> = wanted
            .iter()
            .filter(|c| !self.read.contains_key(**c))
            .filter(|c| {
                self.failed
                    .get(**c)
                    .is_none_or(|(_, at)| now.duration_since(*at) >= LABELS_RETRY)
            })
            .map(|c| c.to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Records what a read of `commit` found at `now`; true for a failure worth a warning (the
    /// first one, or a reason that changed).
    fn record(
        &mut self,
        commit: &str,
        found: Result<BTreeMap<String, String>, String>,
        now: Instant,
    ) -> bool {
        match found {
            Ok(labels) => {
                self.failed.remove(commit);
                self.read.insert(commit.to_string(), labels);
                false
            }
            Err(e) => {
                let new = self.failed.get(commit).is_none_or(|(was, _)| *was != e);
                self.failed.insert(commit.to_string(), (e, now));
                new
            }
        }
    }

    /// The labels of `commit`, or why they are unknown.
    fn get(&self, commit: &str) -> Result<&BTreeMap<String, String>, &str> {
        match (self.read.get(commit), self.failed.get(commit)) {
            (Some(labels), _) => Ok(labels),
            (None, Some((why, _))) => Err(why),
            (None, None) => Err("not read"),
        }
    }
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
            labels: Arc::new(Mutex::new(LabelCache::default())),
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
        let read = read_output(&output);
        // The file is only a channel; a failed run's partial output goes too.
        let _ = std::fs::remove_file(&output);
        run?;
        let (mut deployments, holds) = parse_host(&read?)?;
        self.holds.store(holds, Ordering::SeqCst);
        self.fill_labels(&mut deployments).await;
        Ok(deployments)
    }

    /// Fills the image labels of the booted and staged deployments from their commits' stored
    /// image configuration: known ones at once, the others in one helper run. A failure
    /// leaves [`Deployment::image_labels_error`] set, is warned about once, and is tried again
    /// after [`LABELS_RETRY`].
    async fn fill_labels(&self, deployments: &mut [Deployment]) {
        let deployed: Vec<&str> = deployments.iter().map(|d| d.checksum.as_str()).collect();
        let wanted: Vec<&str> = deployments
            .iter()
            .filter(|d| d.booted || d.staged)
            .map(|d| d.checksum.as_str())
            .collect();
        let missing = self.labels.lock().unwrap_or_else(|p| p.into_inner()).due(
            &deployed,
            &wanted,
            Instant::now(),
        );
        if !missing.is_empty() {
            let read = self.read_configs(&missing).await;
            let now = Instant::now();
            let mut cache = self.labels.lock().unwrap_or_else(|p| p.into_inner());
            for commit in &missing {
                let labels = match &read {
                    Err(e) => Err(e.clone()),
                    Ok(answer) => match answer.get(commit) {
                        None => Err("the helper did not answer for this commit".to_string()),
                        Some(Err(e)) => Err(e.clone()),
                        Some(Ok(config)) => labels_of_config(config.as_deref()),
                    },
                };
                match labels {
                    Ok(l) => {
                        debug!(%commit, labels = l.len(), "read the image labels of a deployment commit");
                        cache.record(commit, Ok(l), now);
                    }
                    Err(e) => {
                        if cache.record(commit, Err(e.clone()), now) {
                            warn!(%commit, error = %e, retry_in = ?LABELS_RETRY, "the image labels of a deployment commit could not be read");
                        }
                    }
                }
            }
        }
        let cache = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        for d in deployments.iter_mut().filter(|d| d.booted || d.staged) {
            match cache.get(&d.checksum) {
                Ok(l) => d.image_labels = l.clone(),
                Err(why) => d.image_labels_error = Some(why.to_string()),
            }
        }
    }

    /// The helper's answer for `commits`.
    async fn read_configs(&self, commits: &[String]) -> crate::backend::helper::ImageConfigsAnswer {
        use crate::backend::helper::{IMAGE_CONFIGS, ImageConfigs, run};
        let helper = self.helper.as_ref().map_err(String::clone)?;
        let req = ImageConfigs {
            repo: self.repo.clone(),
            commits: commits.to_vec(),
        };
        run::<crate::backend::helper::ImageConfigsAnswer>(
            helper,
            &[IMAGE_CONFIGS],
            &req,
            LABELS_TIMEOUT,
        )
        .await?
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

    /// Runs `commands` one after the other (while they succeed) as a transient oneshot service,
    /// then `stop_post` whatever happened, and waits for its start job to end; an error unless
    /// every command exited 0. A command that writes the sysroot (`slot` [`Slot::Write`]) runs
    /// in the one unit [`WRITE_UNIT`]: while that unit is loaded (a run that outlived an earlier
    /// caller's limit, or an earlier streamd's) it is joined, never started beside; a joined
    /// run of the same commands is this call's result, another one runs once it ended.
    async fn run_unit(
        &self,
        verb: &str,
        commands: &[Vec<String>],
        stop_post: Option<&[String]>,
        extra: &[(&str, Value<'_>)],
        limit: Duration,
        slot: Slot,
    ) -> Result<(), BootcError> {
        let call = |c: &'static str| move |e: zbus::Error| BootcError::call("systemd", c, e);
        let deadline = tokio::time::Instant::now() + limit;
        let timeout = |unit: &str| BootcError::Timeout {
            unit: unit.to_string(),
            secs: limit.as_secs(),
        };
        let manager = ManagerProxy::new(&self.conn).await.map_err(call("proxy"))?;
        // The match rule exists before the unit does, so its JobRemoved cannot be missed.
        let mut removed = job_watch(&manager).await.map_err(|(c, e)| call(c)(e))?;
        // The bootc commands in the description tell a joined run's commands from another's.
        let bootc = self.bootc.to_string_lossy();
        let shown: Vec<String> = commands
            .iter()
            .filter(|c| c.first().is_some_and(|p| *p == bootc))
            .map(|c| format!("bootc {}", c[1..].join(" ")))
            .collect();
        let shown = shown.join(" && ");
        let description = format!("streamd: {shown}");
        let stderr_file = match slot {
            Slot::Write => self.runtime_dir.join(WRITE_STDERR),
            Slot::Read => self
                .runtime_dir
                .join(format!("bootc-{verb}-{}.stderr", self.next())),
        };
        let stderr_path = stderr_file.to_string_lossy().into_owned();
        let started = Instant::now();
        let props = unit_properties(&description, commands, stop_post, extra, &stderr_path);
        let (unit, job_result) = loop {
            let unit = match slot {
                Slot::Write => WRITE_UNIT.to_string(),
                Slot::Read => format!(
                    "streamd-bootc-{verb}-{}-{}.service",
                    std::process::id(),
                    self.next()
                ),
            };
            let job = match manager
                .start_transient_unit(&unit, "fail", &props, &[])
                .await
            {
                Ok(job) => job,
                // A unit of an earlier streamd with the same pid is still loaded.
                Err(e) if error_name(&e) == Some(UNIT_EXISTS) && slot == Slot::Read => continue,
                Err(e) if error_name(&e) == Some(UNIT_EXISTS) => {
                    let joined = tokio::time::timeout_at(
                        deadline,
                        self.join(&manager, &mut removed, &unit, &description),
                    )
                    .await
                    .map_err(|_| timeout(&unit))??;
                    match joined {
                        Some(result) => break (unit, result),
                        None if tokio::time::Instant::now() >= deadline => {
                            return Err(timeout(&unit));
                        }
                        // Another command ended (or is being collected): start ours.
                        None => {
                            tokio::time::sleep(REJOIN_PAUSE).await;
                            continue;
                        }
                    }
                }
                Err(e) => return Err(call("StartTransientUnit")(e)),
            };
            info!(unit = %unit, job = %job.as_str(), command = %shown, "started bootc unit");
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match wait_job(&mut removed, &job, left).await {
                // Left running: a retry joins it (see above).
                JobEnd::TimedOut => return Err(timeout(&unit)),
                JobEnd::Closed => return Err(closed(&unit)),
                JobEnd::Removed(r) => break (unit, r),
            }
        };
        let (result, status) = self.unit_result(&unit).await;
        let stderr = read_stderr(&stderr_file);
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        debug!(unit = %unit, job_result = %job_result, result = ?result, status = ?status, elapsed_ms, "bootc unit finished");
        match (job_result.as_str(), result.as_deref()) {
            ("done", Some("success") | None) => Ok(()),
            (_, Some(r)) if r != "success" => Err(BootcError::UnitFailed {
                unit,
                result: r.to_string(),
                status: status.unwrap_or(-1),
                stderr,
            }),
            (job, _) => Err(BootcError::UnitFailed {
                unit,
                result: job.to_string(),
                status: status.unwrap_or(-1),
                stderr,
            }),
        }
    }

    /// Waits for the loaded unit `unit` to end. Returns its start job's result when it ran
    /// `description`'s command (that run is the caller's); `None` when it ran another command
    /// (our reference to it, if any, is dropped so that it goes) or is gone already.
    async fn join(
        &self,
        manager: &ManagerProxy<'_>,
        removed: &mut JobRemovedStream,
        unit: &str,
        description: &str,
    ) -> Result<Option<String>, BootcError> {
        let call = |c: &'static str| move |e: zbus::Error| BootcError::call("systemd", c, e);
        let path = match manager.get_unit(unit).await {
            Ok(p) => p,
            Err(e) if error_name(&e) == Some(NO_SUCH_UNIT) => return Ok(None),
            Err(e) => return Err(call("GetUnit")(e)),
        };
        let proxy = UnitProxy::builder(&self.conn)
            .path(path)
            .map_err(call("proxy"))?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(call("proxy"))?;
        // Read after the JobRemoved match exists: a run that ends meanwhile is not missed.
        let (Ok(state), Ok(running)) = (proxy.active_state().await, proxy.description().await)
        else {
            // Unloaded between the calls.
            return Ok(None);
        };
        let same = running == description;
        let job_result = if matches!(state.as_str(), "inactive" | "failed") {
            // Ended, kept loaded by a reference (ours, from a call that gave up waiting).
            if state == "failed" { "failed" } else { "done" }.to_string()
        } else {
            info!(unit, running = %running, "a bootc unit is still running; waiting for it instead of starting another");
            loop {
                let Some(signal) = removed.next().await else {
                    return Err(closed(unit));
                };
                let Ok(args) = signal.args() else { continue };
                if args.unit == unit {
                    break args.result;
                }
            }
        };
        if same {
            return Ok(Some(job_result));
        }
        if let Err(e) = proxy.unref().await {
            debug!(unit, error = %e, "no reference of ours to drop");
        }
        Ok(None)
    }

    /// The unit's `Result` and `ExecMainStatus`, then our reference goes; `None` when the
    /// unit is already gone.
    async fn unit_result(&self, unit: &str) -> (Option<String>, Option<i32>) {
        let read = async {
            let manager = ManagerProxy::new(&self.conn).await?;
            let path = manager.get_unit(unit).await?;
            let service = ServiceProxy::builder(&self.conn)
                .path(path.clone())?
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            let result = service.result().await?;
            let status = service.exec_main_status().await?;
            let unit_proxy = UnitProxy::builder(&self.conn).path(path)?.build().await?;
            if let Err(e) = unit_proxy.unref().await {
                debug!(unit, error = %e, "unit reference not dropped");
            }
            Ok::<_, zbus::Error>((result, status))
        };
        match read.await {
            Ok((r, s)) => (Some(r), Some(s)),
            Err(e) => {
                warn!(unit, error = %e, "could not read the unit's result");
                (None, None)
            }
        }
    }
}

/// Longest part of bootc's stderr kept for a reason (its last lines: the error chain).
const STDERR_KEEP: usize = 8 * 1024;

/// What a unit wrote to stderr, on one line (the file then goes); empty when there is none.
fn read_stderr(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    // Progress output comes first; the `error: …` chain is at the end.
    let tail = &text[text.len().saturating_sub(STDERR_KEEP)..];
    crate::text::one_line(&String::from_utf8_lossy(tail), 600)
}

fn read_output(path: &Path) -> Result<String, BootcError> {
    std::fs::read_to_string(path).map_err(|e| BootcError::Output {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `bootc status --json` (`BootcHost` of `org.containers.bootc/v1`, or `v1alpha1` before
/// bootc v1.1.0).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Host {
    api_version: String,
    kind: String,
    status: HostStatus,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostStatus {
    staged: Option<BootEntry>,
    booted: Option<BootEntry>,
    rollback: Option<BootEntry>,
    #[serde(default)]
    other_deployments: Vec<BootEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootEntry {
    image: Option<ImageStatus>,
    incompatible: bool,
    pinned: bool,
    /// Printed since v1.12.0 (`upgrade --download-only`): its presence says this bootc can
    /// hold a stage.
    #[serde(default)]
    download_only: Option<bool>,
    ostree: Option<BootEntryOstree>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageStatus {
    image: ImageReference,
    version: Option<String>,
    image_digest: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageReference {
    image: String,
    transport: String,
    signature: Option<Signature>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Signature {
    OstreeRemote(String),
    ContainerPolicy,
    Insecure,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootEntryOstree {
    /// Printed since bootc v1.3.0.
    #[serde(default)]
    stateroot: Option<String>,
    checksum: String,
    deploy_serial: u32,
}

impl ImageReference {
    /// The ostree-ext image reference bootc writes into the origin, which rpm-ostree shows as
    /// `container-image-reference`.
    fn ostree_refspec(&self) -> String {
        let registry = self.transport == "registry";
        let imgref = if registry {
            format!("docker://{}", self.image)
        } else {
            format!("{}:{}", self.transport, self.image)
        };
        match &self.signature {
            None | Some(Signature::Insecure) if registry => {
                format!("ostree-unverified-registry:{}", self.image)
            }
            None | Some(Signature::Insecure) => format!("ostree-unverified-image:{imgref}"),
            Some(Signature::ContainerPolicy) => format!("ostree-image-signed:{imgref}"),
            Some(Signature::OstreeRemote(r)) if registry => {
                format!("ostree-remote-registry:{r}:{}", self.image)
            }
            Some(Signature::OstreeRemote(r)) => format!("ostree-remote-image:{r}:{imgref}"),
        }
    }
}

impl BootEntry {
    fn to_deployment(&self, booted: bool, staged: bool) -> Result<Deployment, BootcError> {
        let ostree = self.ostree.as_ref().ok_or_else(|| {
            BootcError::Status(
                "a deployment without ostree data (composefs-backed hosts are not supported)"
                    .into(),
            )
        })?;
        let serial = i32::try_from(ostree.deploy_serial).map_err(|_| {
            BootcError::Status(format!(
                "deploySerial {} is out of range",
                ostree.deploy_serial
            ))
        })?;
        // Before v1.3.0 bootc does not say the stateroot: the deployment is then known by its
        // checksum and serial (unique within a stateroot) and `osname` stays empty.
        let osname = ostree.stateroot.clone().unwrap_or_default();
        let id = if osname.is_empty() {
            format!("{}.{}", ostree.checksum, serial)
        } else {
            format!("{osname}-{}.{}", ostree.checksum, serial)
        };
        Ok(Deployment {
            id,
            osname,
            serial,
            checksum: ostree.checksum.clone(),
            booted,
            staged,
            pinned: self.pinned,
            finalization_locked: staged && self.download_only == Some(true),
            version: self.image.as_ref().and_then(|i| i.version.clone()),
            container_image_reference: self.image.as_ref().map(|i| i.image.ostree_refspec()),
            container_image_reference_digest: self.image.as_ref().map(|i| i.image_digest.clone()),
            incompatible: self.incompatible,
            ..Deployment::default()
        })
    }
}

/// The transient oneshot unit's properties: `commands`, then `stop_post` whatever happened,
/// bootc's stderr appended to `stderr_path`, and `extra`.
fn unit_properties<'a>(
    description: &'a str,
    commands: &[Vec<String>],
    stop_post: Option<&[String]>,
    extra: &[(&'a str, Value<'a>)],
    stderr_path: &'a str,
) -> Vec<(&'a str, Value<'a>)> {
    let exec = |cmds: &[Vec<String>]| {
        Value::from(
            cmds.iter()
                .map(|c| (c[0].clone(), c.clone(), false))
                .collect::<Vec<_>>(),
        )
    };
    let mut props: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from(description)),
        ("Type", Value::from("oneshot")),
        ("ExecStart", exec(commands)),
        // Keep the unit loaded until its result is read, then let it go even if failed (the
        // journal keeps its output).
        ("AddRef", Value::from(true)),
        ("CollectMode", Value::from("inactive-or-failed")),
        // bootc's error chain, for the reason; the journal keeps a copy only when stderr goes
        // there, so the file is the one place it is read from. Appended to: systemd opens it
        // anew for each command, and truncating would leave only the last one's
        // (`ExecStopPost`'s) words.
        ("StandardErrorFileToAppend", Value::from(stderr_path)),
    ];
    if let Some(post) = stop_post {
        props.push(("ExecStopPost", exec(std::slice::from_ref(&post.to_vec()))));
    }
    props.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    props
}

/// The labels of an image configuration as ostree-ext stored it on the merge commit (`config`
/// is the value of `ostree.container.image-config`): none when the key is absent or holds
/// format v0's `"null"` (bootc-dev/bootc:crates/ostree-ext/src/container/store.rs
/// `image_config_from_commitmeta` takes both as the default configuration); an error when it is
/// not JSON.
fn labels_of_config(config: Option<&str>) -> Result<BTreeMap<String, String>, String> {
    match config {
        None | Some("null") => Ok(BTreeMap::new()),
        Some(json) => crate::backend::deployment::labels_of(json),
    }
}

/// Parses `bootc status --json` into deployments: staged, booted, rollback, others.
pub fn parse_status(json: &str) -> Result<Vec<Deployment>, BootcError> {
    parse_host(json).map(|(deployments, _)| deployments)
}

/// [`parse_status`], and whether this bootc can hold a stage: it prints `downloadOnly` (since
/// v1.12.0, with `upgrade --download-only` and `--from-downloaded`: bootc-dev/bootc commits
/// c325582f and a5784832).
fn parse_host(json: &str) -> Result<(Vec<Deployment>, bool), BootcError> {
    let host: Host = serde_json::from_str(json)
        .map_err(|e| BootcError::Status(format!("not a bootc host document: {e}")))?;
    if host.kind != "BootcHost" || !host.api_version.starts_with("org.containers.bootc/") {
        return Err(BootcError::Status(format!(
            "kind {:?} of {:?}, expected BootcHost of org.containers.bootc",
            host.kind, host.api_version
        )));
    }
    let s = &host.status;
    let mut out = Vec::new();
    if let Some(e) = &s.staged {
        out.push(e.to_deployment(false, true)?);
    }
    match &s.booted {
        Some(e) => out.push(e.to_deployment(true, false)?),
        None => {
            return Err(BootcError::Status(
                "the host is not booted through ostree (status.booted is null)".into(),
            ));
        }
    }
    for e in s.rollback.iter().chain(&s.other_deployments) {
        out.push(e.to_deployment(false, false)?);
    }
    let holds = s.booted.as_ref().is_some_and(|b| b.download_only.is_some());
    Ok((out, holds))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed read is retried only after [`LABELS_RETRY`] and warned about once per reason;
    /// a read is kept; commits no longer deployed are forgotten.
    #[test]
    fn label_reads_are_kept_and_failures_retried_later() {
        let t0 = Instant::now();
        let mut c = LabelCache::default();
        let (a, b) = ("aaaa", "bbbb");
        assert_eq!(c.due(&[a, b], &[b, a, a], t0), vec!["aaaa", "bbbb"]);
        assert_eq!(c.get(a), Err("not read"));
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert!(!c.record(a, Ok(labels.clone()), t0));
        assert!(
            c.record(b, Err("damaged".into()), t0),
            "first failure warns"
        );
        assert_eq!(c.get(a), Ok(&labels));
        assert_eq!(c.get(b), Err("damaged"));
        let soon = t0 + LABELS_RETRY / 2;
        assert!(
            c.due(&[a, b], &[a, b], soon).is_empty(),
            "nothing before the retry"
        );
        let later = t0 + LABELS_RETRY;
        assert_eq!(c.due(&[a, b], &[a, b], later), vec!["bbbb"]);
        assert!(
            !c.record(b, Err("damaged".into()), later),
            "same reason: no warning"
        );
        assert!(
            c.record(b, Err("gone".into()), later + LABELS_RETRY),
            "new reason warns"
        );
        assert!(!c.record(b, Ok(BTreeMap::new()), later + LABELS_RETRY));
        assert_eq!(c.get(b), Ok(&BTreeMap::new()));
        // `a` is no longer deployed: forgotten, and read again if it comes back.
        assert!(c.due(&[b], &[b], later).is_empty());
        assert_eq!(c.get(a), Err("not read"));
        assert_eq!(c.due(&[a, b], &[a], later), vec!["aaaa"]);
    }

    #[test]
    fn labels_come_from_the_stored_image_config() {
        let labels = labels_of_config(Some(
            r#"{"config":{"Labels":{"baseOSContainerImage":"q.io/a@sha256:00","io.openshift.os.streamclass":"rhel-9","n":1}}}"#,
        ))
        .expect("a configuration");
        assert_eq!(
            labels.get("baseOSContainerImage").map(String::as_str),
            Some("q.io/a@sha256:00")
        );
        assert_eq!(labels.len(), 2, "non-string labels are skipped: {labels:?}");
        // No key (an older ostree-ext), format v0's "null", a configuration without labels:
        // none, as ostree-ext takes them.
        for config in [None, Some("null"), Some(r#"{"config":{}}"#)] {
            assert_eq!(labels_of_config(config), Ok(BTreeMap::new()), "{config:?}");
        }
        // Malformed: unknown, not empty.
        let e = labels_of_config(Some("{not json")).expect_err("malformed");
        assert!(e.contains("ostree.container.image-config"), "{e}");
    }

    #[test]
    fn refspecs_follow_ostree_ext() {
        let r = |transport: &str, signature: Option<Signature>| ImageReference {
            image: "q.io/a/b@sha256:00".into(),
            transport: transport.into(),
            signature,
        };
        let cases = [
            (
                r("registry", None),
                "ostree-unverified-registry:q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::Insecure)),
                "ostree-unverified-registry:q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::ContainerPolicy)),
                "ostree-image-signed:docker://q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::OstreeRemote("rh".into()))),
                "ostree-remote-registry:rh:q.io/a/b@sha256:00",
            ),
            (
                r("oci", None),
                "ostree-unverified-image:oci:q.io/a/b@sha256:00",
            ),
            (
                r("oci", Some(Signature::OstreeRemote("rh".into()))),
                "ostree-remote-image:rh:oci:q.io/a/b@sha256:00",
            ),
        ];
        for (reference, want) in cases {
            assert_eq!(reference.ostree_refspec(), want);
            if reference.transport == "registry" {
                assert_eq!(
                    crate::backend::deployment::pullspec_of_refspec(want),
                    Some("q.io/a/b@sha256:00"),
                    "{want}"
                );
            }
        }
    }
}
