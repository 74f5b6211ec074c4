//! Fake systemd manager: `org.freedesktop.systemd1` on the testbed's private bus, enough of it to
//! run transient service units the way a client such as `systemd-run --wait` does.
//!
//! What it implements has the real names, signatures and errors (systemd's
//! `src/core/dbus-manager.c`, `dbus-unit.c`, `dbus-execute.c`): `StartTransientUnit`,
//! `Subscribe`/`Unsubscribe`, `GetUnit`, the `JobNew`/`JobRemoved` signals (broadcast only while
//! some client is subscribed), unit objects with `org.freedesktop.systemd1.Unit` (`Id`,
//! `Description`, `LoadState`, `ActiveState`, `SubState`, `Unref()`) and
//! `org.freedesktop.systemd1.Service` (`Result`, `ExecMainCode`, `ExecMainStatus`,
//! `ExecMainPID`). `ExecStart` really runs, as a child of the testbed process (for `oneshot`,
//! several lines one after the other while they succeed), then `ExecStopPost` whatever the
//! result, before the unit is dead and its start job done. Job objects,
//! auxiliary units and unit types other than services are not modelled.
//!
//! One unit with a fragment file is modelled for `StartUnit`: `bootloader-update.service`
//! (bootupd's, RHEL >= 9.6: `Type=oneshot`, `RemainAfterExit=yes`, `ExecStart=bootupctl
//! update`), present when the host root has `usr/lib/systemd/system/bootloader-update.service`
//! (else `StartUnit` fails `NoSuchUnit` "Unit … not found.", as systemd's
//! `bus_unit_validate_load_state`). Its `bootupctl update` is a shell stand-in that fails
//! (exit 1, the file's text on stderr) while `HOST/run/testbed/bootloader-update-fails` exists
//! and otherwise appends a line to `HOST/run/testbed/bootloader-updated`. Starting it again
//! while it is `active (exited)` finishes the job `done` without running it, as systemd does.
//! streamd's `streamd-bootloader-update.target` (present when the host root has its fragment)
//! pulls in the units its `Requires=` lists, in the same call: one that cannot be loaded fails
//! `StartUnit` with `NoSuchUnit` naming it (systemd's `transaction_add_job_and_dependencies`),
//! and the target's job ends after theirs (`After=`), `dependency` when one failed
//! (`job_fail_dependencies`). A pulled-in start is recorded with `pulled_in_by` and no sender.
//! The target's own unit object is not exported (a client reads the service's).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use futures::StreamExt as _;
use serde::Serialize;
use serde_json::{Value as Json, json};
use tracing::{debug, info};
use zbus::fdo::DBusProxy;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{ObjectPath, OwnedObjectPath, OwnedValue};
use zbus::{Connection, interface};

use crate::control::SystemdCmd;
use crate::fakes::dbus_error::{INVALID_ARGS, NOT_SUPPORTED, NamedError};

/// systemd's well-known bus name.
pub const BUS_NAME: &str = "org.freedesktop.systemd1";
/// The manager object.
pub const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
/// systemd's default `PATH` for system services (`DEFAULT_PATH` without the split-usr part).
const SERVICE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin";
/// `CLD_EXITED` and `CLD_KILLED` of `waitid()`, what `ExecMainCode` holds.
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
/// The exit status systemd gives a service whose `execve()` failed (`EXIT_EXEC`).
const EXIT_EXEC: i32 = 203;

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// The units with a fragment file the fake models (see the module comment).
pub const BOOTLOADER_UPDATE: &str = "bootloader-update.service";
/// streamd's target that pulls [`BOOTLOADER_UPDATE`] in (systemd/streamd-bootloader-update.target).
pub const BOOTLOADER_TARGET: &str = "streamd-bootloader-update.target";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";
const NOT_SUBSCRIBED: &str = "org.freedesktop.systemd1.NotSubscribed";
const NOT_REFERENCED: &str = "org.freedesktop.systemd1.NotReferenced";
const BAD_UNIT_SETTING: &str = "org.freedesktop.systemd1.BadUnitSetting";

/// The job modes `job_mode_from_string()` knows.
const JOB_MODES: [&str; 10] = [
    "fail",
    "lenient",
    "replace",
    "replace-irreversibly",
    "isolate",
    "flush",
    "ignore-dependencies",
    "ignore-requirements",
    "triggering",
    "restart-dependencies",
];
/// Unit type suffixes systemd knows.
const UNIT_TYPES: [&str; 11] = [
    "service",
    "socket",
    "target",
    "device",
    "mount",
    "automount",
    "swap",
    "timer",
    "path",
    "slice",
    "scope",
];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

mod spec;

use spec::{ServiceSpec, stdio};

/// The runtime state of a loaded unit.
#[derive(Debug, Clone)]
struct UnitState {
    spec: ServiceSpec,
    active: &'static str,
    sub: &'static str,
    result: &'static str,
    main_code: i32,
    main_status: i32,
    main_pid: u32,
    /// Bus names holding a reference (`AddRef`).
    refs: BTreeSet<String>,
}

/// What the control socket shows about each unit started.
#[derive(Debug, Clone, Serialize)]
struct UnitRecord {
    unit: String,
    mode: String,
    sender: String,
    job: u32,
    spec: ServiceSpec,
    job_result: Option<String>,
    result: Option<String>,
    exec_main_code: Option<i32>,
    exec_main_status: Option<i32>,
    /// What the service wrote to the journal (stdout when not redirected, and stderr).
    journal: String,
    /// The unit whose `Requires=` pulled this start job in (no client asked for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pulled_in_by: Option<String>,
}

impl UnitRecord {
    /// A start job just queued.
    fn new(
        unit: &str,
        mode: String,
        sender: &str,
        job: u32,
        spec: ServiceSpec,
        pulled_in_by: Option<String>,
    ) -> Self {
        UnitRecord {
            unit: unit.to_string(),
            mode,
            sender: sender.to_string(),
            job,
            spec,
            job_result: None,
            result: None,
            exec_main_code: None,
            exec_main_status: None,
            journal: String::new(),
            pulled_in_by,
        }
    }
}

struct Shared {
    conn: Connection,
    units: Mutex<BTreeMap<String, UnitState>>,
    subscribers: Mutex<BTreeSet<String>>,
    records: Mutex<Vec<UnitRecord>>,
    next_job: AtomicU32,
    /// The host root whose unit files `StartUnit` can load.
    host_root: Mutex<Option<PathBuf>>,
}

/// A running fake systemd manager. Dropping it closes its bus connection.
pub struct FakeSystemd {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeSystemd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSystemd").finish_non_exhaustive()
    }
}

impl FakeSystemd {
    /// Connects to the bus at `bus_address`, exports the manager and owns `org.freedesktop.systemd1`.
    pub async fn start(bus_address: &str) -> anyhow::Result<FakeSystemd> {
        let conn = zbus::connection::Builder::address(bus_address)?
            .build()
            .await
            .with_context(|| format!("connecting to {bus_address}"))?;
        let shared = Arc::new(Shared {
            conn: conn.clone(),
            units: Mutex::new(BTreeMap::new()),
            subscribers: Mutex::new(BTreeSet::new()),
            records: Mutex::new(Vec::new()),
            next_job: AtomicU32::new(1),
            host_root: Mutex::new(None),
        });
        conn.object_server()
            .at(
                MANAGER_PATH,
                ManagerIface {
                    shared: shared.clone(),
                },
            )
            .await?;
        let mut owners = DBusProxy::new(&conn)
            .await?
            .receive_name_owner_changed()
            .await?;
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            while let Some(signal) = owners.next().await {
                let Ok(args) = signal.args() else { continue };
                if args.new_owner().is_some() {
                    continue;
                }
                let Some(shared) = weak.upgrade() else { break };
                shared.name_vanished(args.name().as_str()).await;
            }
        });
        conn.request_name(BUS_NAME)
            .await
            .context("owning org.freedesktop.systemd1")?;
        info!("fake systemd is on the bus");
        Ok(FakeSystemd { shared })
    }

    /// The host root below which `StartUnit` finds unit files (`usr/lib/systemd/system/`).
    pub fn set_host_root(&self, root: PathBuf) {
        *lock(&self.shared.host_root) = Some(root);
    }

    /// Runs one control command (see `docs/testbed.md`).
    pub async fn control(&self, cmd: SystemdCmd) -> anyhow::Result<Json> {
        Ok(match cmd {
            SystemdCmd::Units => serde_json::to_value(&*lock(&self.shared.records))?,
            SystemdCmd::Loaded => {
                json!(lock(&self.shared.units).keys().cloned().collect::<Vec<_>>())
            }
        })
    }
}

impl Drop for FakeSystemd {
    fn drop(&mut self) {
        let conn = self.shared.conn.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = conn.close().await;
            });
        }
    }
}

/// The unit's object path: `bus_label_escape()` keeps `[A-Za-z0-9]` and writes any other byte
/// as `_xx` (lowercase hex).
pub fn unit_path(name: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

/// `job_mode_from_string()`'s answer to a mode it does not know.
fn check_job_mode(mode: &str) -> Result<(), NamedError> {
    if JOB_MODES.contains(&mode) {
        Ok(())
    } else {
        Err(NamedError::new(
            INVALID_ARGS,
            format!("Job mode {mode} invalid"),
        ))
    }
}

fn job_path(id: u32) -> String {
    format!("/org/freedesktop/systemd1/job/{id}")
}

/// `unit_name_is_valid(name, UNIT_NAME_PLAIN)`: a known type suffix, a non-empty prefix of
/// `[A-Za-z0-9:_.\-]`, at most 255 bytes. Returns the type.
fn unit_type(name: &str) -> Option<&str> {
    if name.len() > 255 {
        return None;
    }
    let (prefix, suffix) = name.rsplit_once('.')?;
    let valid = !prefix.is_empty()
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_.\\-".contains(&b));
    (valid && UNIT_TYPES.contains(&suffix)).then_some(suffix)
}

fn owned_path(p: String) -> Result<OwnedObjectPath, NamedError> {
    OwnedObjectPath::try_from(p).map_err(|e| NamedError::new(INVALID_ARGS, e.to_string()))
}

impl Shared {
    /// A client left the bus: it is no longer subscribed and its unit references go.
    async fn name_vanished(self: &Arc<Self>, name: &str) {
        lock(&self.subscribers).remove(name);
        let released: Vec<String> = {
            let mut units = lock(&self.units);
            units
                .iter_mut()
                .filter_map(|(unit, s)| s.refs.remove(name).then(|| unit.clone()))
                .collect()
        };
        for unit in released {
            self.collect(&unit).await;
        }
    }

    /// Unloads `unit` when nothing keeps it: unreferenced and inactive (or failed, with
    /// `CollectMode=inactive-or-failed`), like systemd's garbage collection.
    async fn collect(&self, unit: &str) {
        let gone = {
            let mut units = lock(&self.units);
            let idle = units.get(unit).is_some_and(|s| {
                s.refs.is_empty()
                    && (s.active == "inactive" || (s.active == "failed" && s.spec.collect_failed))
            });
            if idle {
                units.remove(unit);
            }
            idle
        };
        if gone {
            let path = unit_path(unit);
            let server = self.conn.object_server();
            let _ = server.remove::<UnitIface, _>(path.as_str()).await;
            let _ = server.remove::<ServiceIface, _>(path.as_str()).await;
            debug!(unit, "unit unloaded");
        }
    }

    /// Loads `name` with `spec`, exports its objects, records it and runs it in the
    /// background; returns the start job's path.
    async fn load_and_start(
        self: &Arc<Self>,
        name: String,
        mode: String,
        spec: ServiceSpec,
        sender: String,
    ) -> Result<OwnedObjectPath, NamedError> {
        let (job, _) = self.start_job(name, mode, spec, sender, None).await?;
        owned_path(job_path(job))
    }

    /// [`Shared::load_and_start`], returning the job's id and its end (the job result).
    async fn start_job(
        self: &Arc<Self>,
        name: String,
        mode: String,
        spec: ServiceSpec,
        sender: String,
        pulled_in_by: Option<String>,
    ) -> Result<(u32, tokio::task::JoinHandle<&'static str>), NamedError> {
        let job = self.next_job.fetch_add(1, Ordering::SeqCst);
        let mut refs = BTreeSet::new();
        if spec.add_ref {
            refs.insert(sender.clone());
        }
        let state = UnitState {
            spec: spec.clone(),
            active: "activating",
            sub: "start",
            result: "success",
            main_code: 0,
            main_status: 0,
            main_pid: 0,
            refs,
        };
        lock(&self.units).insert(name.clone(), state);
        let path = unit_path(&name);
        let server = self.conn.object_server();
        let exported = async {
            server
                .at(
                    path.as_str(),
                    UnitIface {
                        shared: self.clone(),
                        name: name.clone(),
                    },
                )
                .await?;
            server
                .at(
                    path.as_str(),
                    ServiceIface {
                        shared: self.clone(),
                        name: name.clone(),
                    },
                )
                .await
        };
        if let Err(e) = exported.await {
            lock(&self.units).remove(&name);
            return Err(NamedError::new(
                crate::fakes::dbus_error::FAILED,
                format!("exporting {path}: {e}"),
            ));
        }
        self.record(UnitRecord::new(
            &name,
            mode,
            &sender,
            job,
            spec,
            pulled_in_by,
        ));
        info!(unit = %name, job, sender = %sender, "starting unit");
        self.emit_job_new(job, &name).await;
        Ok((job, tokio::spawn(self.clone().run(name, job))))
    }

    fn subscribed(&self) -> bool {
        !lock(&self.subscribers).is_empty()
    }

    fn record(&self, record: UnitRecord) {
        lock(&self.records).push(record);
    }

    fn update_record(&self, job: u32, f: impl FnOnce(&mut UnitRecord)) {
        if let Some(r) = lock(&self.records).iter_mut().find(|r| r.job == job) {
            f(r);
        }
    }

    /// Starts `bootloader-update.service` (its fragment exists below `root`); returns the job's
    /// id and its end.
    async fn start_bootloader_update(
        self: &Arc<Self>,
        root: &std::path::Path,
        mode: String,
        sender: String,
        pulled_in_by: Option<String>,
    ) -> Result<(u32, tokio::task::JoinHandle<&'static str>), NamedError> {
        let name = BOOTLOADER_UPDATE.to_string();
        if self
            .with_unit(&name, |s| (s.active == "active").then_some(()))
            .is_some()
        {
            // Already started (RemainAfterExit=yes): the start job has nothing to do.
            let job = self.next_job.fetch_add(1, Ordering::SeqCst);
            self.emit_job_new(job, &name).await;
            self.emit_job_removed(job, &name, "done").await;
            return Ok((job, tokio::spawn(async { "done" })));
        }
        // A failed earlier run stays loaded; this start runs it again.
        lock(&self.units).remove(&name);
        let fails = root.join("run/testbed/bootloader-update-fails");
        let done = root.join("run/testbed/bootloader-updated");
        let script = format!(
            "if [ -e '{f}' ]; then cat '{f}' >&2; exit 1; fi; mkdir -p '{r}' && echo updated >> '{d}' && echo 'Updated EFI: shim, grub'",
            f = fails.display(),
            r = root.join("run/testbed").display(),
            d = done.display()
        );
        let mut spec = ServiceSpec::new(&name);
        spec.description = "Update bootloader on boot".into();
        spec.service_type = "oneshot".into();
        spec.remain_after_exit = true;
        spec.exec_start = vec![(
            "/bin/sh".into(),
            vec!["/usr/bin/bootupctl".into(), "-c".into(), script],
            false,
        )];
        self.start_job(name, mode, spec, sender, pulled_in_by).await
    }

    /// Runs the unit's `ExecStart` and finishes its start job; returns the job result.
    async fn run(self: Arc<Self>, unit: String, job: u32) -> &'static str {
        let Some(spec) = lock(&self.units).get(&unit).map(|s| s.spec.clone()) else {
            return "canceled";
        };
        let oneshot = spec.service_type == "oneshot";
        let mut journal = String::new();
        let mut outcome = (CLD_EXITED, 0);
        for (path, argv, _ignore) in &spec.exec_start {
            outcome = self
                .exec_status(&unit, path, argv, &spec, &mut journal, true)
                .await;
            if outcome != (CLD_EXITED, 0) {
                break;
            }
        }
        let (code, status) = outcome;
        let mut result = match (code, status) {
            (CLD_EXITED, 0) => "success",
            (CLD_EXITED, _) => "exit-code",
            _ => "signal",
        };
        // The stop-post commands run before the unit is dead (and its job done); one that
        // fails turns a success into `exit-code` (service.c `service_enter_dead` keeps the
        // first failure). `ExecMain*` stay the main command's.
        for (path, argv, _ignore) in &spec.exec_stop_post {
            let post = self
                .exec_status(&unit, path, argv, &spec, &mut journal, false)
                .await;
            if post != (CLD_EXITED, 0) && result == "success" {
                result = "exit-code";
            }
        }
        let success = result == "success";
        {
            let mut units = lock(&self.units);
            if let Some(s) = units.get_mut(&unit) {
                s.result = result;
                s.main_code = code;
                s.main_status = status;
                (s.active, s.sub) = match (success, spec.remain_after_exit) {
                    (true, true) => ("active", "exited"),
                    (true, false) => ("inactive", "dead"),
                    (false, _) => ("failed", "failed"),
                };
            }
        }
        let job_result = if success || !oneshot {
            "done"
        } else {
            "failed"
        };
        self.update_record(job, |r| {
            r.job_result = Some(job_result.into());
            r.result = Some(result.into());
            r.exec_main_code = Some(code);
            r.exec_main_status = Some(status);
            r.journal = journal;
        });
        info!(unit = %unit, job, result, status, "transient unit finished");
        self.emit_unit_changed(&unit).await;
        self.emit_job_removed(job, &unit, job_result).await;
        self.collect(&unit).await;
        job_result
    }

    /// [`Self::exec`], with an `execve` failure as systemd reports it (status 203, `EXIT_EXEC`).
    async fn exec_status(
        &self,
        unit: &str,
        path: &str,
        argv: &[String],
        spec: &ServiceSpec,
        journal: &mut String,
        main: bool,
    ) -> (i32, i32) {
        match self.exec(unit, path, argv, spec, journal, main).await {
            Ok(o) => o,
            Err(e) => {
                journal.push_str(&format!("{unit}: Failed to execute {path}: {e}\n"));
                (CLD_EXITED, EXIT_EXEC)
            }
        }
    }

    /// Runs one command to its end; `(code, status)` as `waitid()` reports them. A `main` one
    /// (`ExecStart`) is the unit's `ExecMainPID` while it runs.
    async fn exec(
        &self,
        unit: &str,
        path: &str,
        argv: &[String],
        spec: &ServiceSpec,
        journal: &mut String,
        main: bool,
    ) -> std::io::Result<(i32, i32)> {
        use std::os::unix::process::CommandExt as _;
        let stdout = stdio(&spec.stdout)?;
        let stderr = stdio(&spec.stderr)?;
        let mut cmd = std::process::Command::new(path);
        if let Some(arg0) = argv.first() {
            cmd.arg0(arg0);
        }
        cmd.args(argv.iter().skip(1))
            .env_clear()
            .env("PATH", SERVICE_PATH)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        for kv in &spec.environment {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        let child = tokio::process::Command::from(cmd)
            .kill_on_drop(true)
            .spawn()?;
        if let Some(pid) = child.id().filter(|_| main)
            && let Some(s) = lock(&self.units).get_mut(unit)
        {
            s.main_pid = pid;
        }
        let out = child.wait_with_output().await?;
        journal.push_str(&String::from_utf8_lossy(&out.stdout));
        journal.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok(match (out.status.code(), out.status.signal()) {
            (Some(c), _) => (CLD_EXITED, c),
            (None, Some(sig)) => (CLD_KILLED, sig),
            (None, None) => (CLD_EXITED, 1),
        })
    }

    /// The manager's emitter and job `id`'s path, while some client is subscribed (systemd
    /// sends `JobNew`/`JobRemoved` only then).
    fn job_signal(&self, id: u32) -> Option<(SignalEmitter<'_>, ObjectPath<'static>)> {
        if !self.subscribed() {
            return None;
        }
        let emitter = SignalEmitter::new(&self.conn, MANAGER_PATH).ok()?;
        let job = ObjectPath::try_from(job_path(id)).ok()?;
        Some((emitter, job))
    }

    async fn emit_job_new(&self, id: u32, unit: &str) {
        if let Some((emitter, job)) = self.job_signal(id) {
            log_emit(ManagerIface::job_new(&emitter, id, job, unit).await);
        }
    }

    async fn emit_job_removed(&self, id: u32, unit: &str, result: &str) {
        if let Some((emitter, job)) = self.job_signal(id) {
            log_emit(ManagerIface::job_removed(&emitter, id, job, unit, result).await);
        }
    }

    async fn emit_unit_changed(&self, unit: &str) {
        let path = unit_path(unit);
        let server = self.conn.object_server();
        if let Ok(iface) = server.interface::<_, UnitIface>(path.as_str()).await {
            let emitter = iface.signal_emitter();
            let u = iface.get().await;
            log_emit(u.active_state_changed(emitter).await);
            log_emit(u.sub_state_changed(emitter).await);
        }
        if let Ok(iface) = server.interface::<_, ServiceIface>(path.as_str()).await {
            let emitter = iface.signal_emitter();
            let s = iface.get().await;
            log_emit(s.result_changed(emitter).await);
            log_emit(s.exec_main_status_changed(emitter).await);
            log_emit(s.exec_main_code_changed(emitter).await);
        }
    }

    fn with_unit<T: Default>(&self, unit: &str, f: impl FnOnce(&UnitState) -> T) -> T {
        lock(&self.units).get(unit).map(f).unwrap_or_default()
    }
}

fn log_emit(r: zbus::Result<()>) {
    if let Err(e) = r {
        debug!(error = %e, "signal not emitted");
    }
}

fn sender_of(hdr: &Header<'_>) -> String {
    hdr.sender().map(|s| s.to_string()).unwrap_or_default()
}

// The interface macro generates signal emitters it cannot document: the interface lives in a
// module of its own that allows that.
#[allow(missing_docs)]
mod manager_iface {
    use super::*;

    /// `org.freedesktop.systemd1.Manager`.
    pub(super) struct ManagerIface {
        pub(super) shared: Arc<Shared>,
    }

    #[interface(name = "org.freedesktop.systemd1.Manager")]
    impl ManagerIface {
        /// Creates and starts a transient unit; returns the start job's path.
        async fn start_transient_unit(
            &self,
            name: String,
            mode: String,
            properties: Vec<(String, OwnedValue)>,
            aux: Vec<(String, Vec<(String, OwnedValue)>)>,
            #[zbus(header)] hdr: Header<'_>,
        ) -> Result<OwnedObjectPath, NamedError> {
            check_job_mode(&mode)?;
            let Some(kind) = unit_type(&name) else {
                return Err(NamedError::new(INVALID_ARGS, "Invalid unit name or type."));
            };
            if kind != "service" {
                return Err(NamedError::new(
                    NOT_SUPPORTED,
                    format!("the testbed's fake systemd only runs service units, not {name}"),
                ));
            }
            if !aux.is_empty() {
                return Err(NamedError::new(
                    NOT_SUPPORTED,
                    "the testbed's fake systemd does not model auxiliary units",
                ));
            }
            if lock(&self.shared.units).contains_key(&name) {
                return Err(NamedError::new(
                    UNIT_EXISTS,
                    format!("Unit {name} was already loaded or has a fragment file."),
                ));
            }
            let mut spec = ServiceSpec::new(&name);
            for (key, value) in &properties {
                spec.set(key, value)?;
            }
            if spec.exec_start.is_empty()
                || (spec.exec_start.len() > 1 && spec.service_type != "oneshot")
            {
                // service_verify() fails the load ("has no ExecStart=…", or "has more than one
                // ExecStart= setting, which is only allowed for Type=oneshot services"), and the
                // start job is refused by bus_unit_validate_load_state().
                return Err(NamedError::new(
                    BAD_UNIT_SETTING,
                    format!("Unit {name} has a bad unit file setting."),
                ));
            }
            self.shared
                .load_and_start(name, mode, spec, sender_of(&hdr))
                .await
        }

        /// Starts a unit that has a fragment file; `bootloader-update.service` and streamd's
        /// `streamd-bootloader-update.target` are modelled.
        async fn start_unit(
            &self,
            name: String,
            mode: String,
            #[zbus(header)] hdr: Header<'_>,
        ) -> Result<OwnedObjectPath, NamedError> {
            check_job_mode(&mode)?;
            let root = lock(&self.shared.host_root).clone().unwrap_or_default();
            let fragment = |unit: &str| root.join("usr/lib/systemd/system").join(unit);
            let not_found =
                |unit: &str| NamedError::new(NO_SUCH_UNIT, format!("Unit {unit} not found."));
            let modelled = [BOOTLOADER_UPDATE, BOOTLOADER_TARGET].contains(&name.as_str());
            if !modelled || !fragment(&name).exists() {
                return Err(not_found(&name));
            }
            let sender = sender_of(&hdr);
            if name == BOOTLOADER_UPDATE {
                let (job, _) = self
                    .shared
                    .start_bootloader_update(&root, mode, sender, None)
                    .await?;
                return owned_path(job_path(job));
            }
            // The target: its `Requires=` go into the same transaction, and one that cannot be
            // loaded fails the whole call (transaction_add_job_and_dependencies).
            let text = std::fs::read_to_string(fragment(&name)).unwrap_or_default();
            let requires: Vec<String> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Requires="))
                .flat_map(|v| v.split_whitespace().map(str::to_string))
                .collect();
            for dep in &requires {
                if dep != BOOTLOADER_UPDATE || !fragment(dep).exists() {
                    return Err(not_found(dep));
                }
            }
            let job = self.shared.next_job.fetch_add(1, Ordering::SeqCst);
            let mut spec = ServiceSpec::new(&name);
            spec.description =
                "streamd: update the bootloader before a move to another RHEL major".into();
            self.shared.record(UnitRecord::new(
                &name,
                mode.clone(),
                &sender,
                job,
                spec,
                None,
            ));
            self.shared.emit_job_new(job, &name).await;
            // Every dependency is bootupd's unit (checked above): one start job, however often named.
            let dep = if requires.is_empty() {
                None
            } else {
                let pulled = self
                    .shared
                    .start_bootloader_update(&root, mode.clone(), String::new(), Some(name.clone()))
                    .await?;
                Some(pulled.1)
            };
            let shared = self.shared.clone();
            tokio::spawn(async move {
                // After=: the target's job ends once its dependency's job has; a failed one fails
                // it with `dependency` (job_fail_dependencies).
                let ended = match dep {
                    Some(end) => end.await.unwrap_or("failed"),
                    None => "done",
                };
                let result = if ended == "done" {
                    "done"
                } else {
                    "dependency"
                };
                shared.update_record(job, |r| r.job_result = Some(result.into()));
                shared.emit_job_removed(job, &name, result).await;
            });
            owned_path(job_path(job))
        }

        /// Enables `JobNew`/`JobRemoved` (and the other manager signals) for the caller.
        async fn subscribe(&self, #[zbus(header)] hdr: Header<'_>) -> Result<(), NamedError> {
            if !lock(&self.shared.subscribers).insert(sender_of(&hdr)) {
                return Err(NamedError::new(
                    ALREADY_SUBSCRIBED,
                    "Client is already subscribed.",
                ));
            }
            Ok(())
        }

        /// Undoes `Subscribe`.
        async fn unsubscribe(&self, #[zbus(header)] hdr: Header<'_>) -> Result<(), NamedError> {
            if !lock(&self.shared.subscribers).remove(&sender_of(&hdr)) {
                return Err(NamedError::new(NOT_SUBSCRIBED, "Client is not subscribed."));
            }
            Ok(())
        }

        /// The object path of a loaded unit.
        async fn get_unit(&self, name: String) -> Result<OwnedObjectPath, NamedError> {
            if !lock(&self.shared.units).contains_key(&name) {
                return Err(NamedError::new(
                    NO_SUCH_UNIT,
                    format!("Unit {name} not loaded."),
                ));
            }
            owned_path(unit_path(&name))
        }

        /// A job was queued.
        #[zbus(signal)]
        pub(super) async fn job_new(
            emitter: &SignalEmitter<'_>,
            id: u32,
            job: ObjectPath<'_>,
            unit: &str,
        ) -> zbus::Result<()>;

        /// A job finished: `result` is `done`, `canceled`, `timeout`, `failed`, `dependency` or
        /// `skipped`.
        #[zbus(signal)]
        pub(super) async fn job_removed(
            emitter: &SignalEmitter<'_>,
            id: u32,
            job: ObjectPath<'_>,
            unit: &str,
            result: &str,
        ) -> zbus::Result<()>;
    }
}
use manager_iface::ManagerIface;

/// `org.freedesktop.systemd1.Unit` of one unit.
struct UnitIface {
    shared: Arc<Shared>,
    name: String,
}

#[interface(name = "org.freedesktop.systemd1.Unit")]
impl UnitIface {
    /// Drops the caller's reference (taken with `AddRef`).
    async fn unref(&self, #[zbus(header)] hdr: Header<'_>) -> Result<(), NamedError> {
        let sender = sender_of(&hdr);
        let removed = lock(&self.shared.units)
            .get_mut(&self.name)
            .is_some_and(|s| s.refs.remove(&sender));
        if !removed {
            return Err(NamedError::new(
                NOT_REFERENCED,
                "Unit has not been referenced yet.",
            ));
        }
        self.shared.collect(&self.name).await;
        Ok(())
    }

    #[zbus(property)]
    fn id(&self) -> String {
        self.name.clone()
    }

    #[zbus(property)]
    fn description(&self) -> String {
        self.shared
            .with_unit(&self.name, |s| s.spec.description.clone())
    }

    #[zbus(property)]
    fn load_state(&self) -> String {
        "loaded".into()
    }

    #[zbus(property)]
    fn active_state(&self) -> String {
        self.shared.with_unit(&self.name, |s| s.active.to_string())
    }

    #[zbus(property)]
    fn sub_state(&self) -> String {
        self.shared.with_unit(&self.name, |s| s.sub.to_string())
    }
}

/// `org.freedesktop.systemd1.Service` of one service unit.
struct ServiceIface {
    shared: Arc<Shared>,
    name: String,
}

#[interface(name = "org.freedesktop.systemd1.Service")]
impl ServiceIface {
    #[zbus(property)]
    fn result(&self) -> String {
        self.shared.with_unit(&self.name, |s| s.result.to_string())
    }

    #[zbus(property, name = "ExecMainCode")]
    fn exec_main_code(&self) -> i32 {
        self.shared.with_unit(&self.name, |s| s.main_code)
    }

    #[zbus(property, name = "ExecMainStatus")]
    fn exec_main_status(&self) -> i32 {
        self.shared.with_unit(&self.name, |s| s.main_status)
    }

    #[zbus(property, name = "ExecMainPID")]
    fn exec_main_pid(&self) -> u32 {
        self.shared.with_unit(&self.name, |s| s.main_pid)
    }

    #[zbus(property, name = "Type")]
    fn service_type(&self) -> String {
        self.shared
            .with_unit(&self.name, |s| s.spec.service_type.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_paths_and_names_follow_systemd() {
        assert_eq!(
            unit_path("streamd-bootc-switch-1.service"),
            "/org/freedesktop/systemd1/unit/streamd_2dbootc_2dswitch_2d1_2eservice"
        );
        assert_eq!(
            unit_path("dbus.service"),
            "/org/freedesktop/systemd1/unit/dbus_2eservice"
        );
        assert_eq!(unit_type("a.service"), Some("service"));
        assert_eq!(unit_type("a.scope"), Some("scope"));
        for bad in ["a", ".service", "a.nothing", "a b.service", "a/b.service"] {
            assert_eq!(unit_type(bad), None, "{bad}");
        }
        assert_eq!(unit_type(&format!("{}.service", "a".repeat(260))), None);
    }
}
