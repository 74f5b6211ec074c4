//! Fake `rpm-ostreed`: `org.projectatomic.rpmostree1` on a private bus.
//!
//! Every member it exports has the name and signature of the real interface; transactions
//! run on a peer-to-peer socket the way the real daemon's do. Test knobs are set through
//! [`FakeRpmOstreed::control`].

mod admin;
mod control;
mod deploy;
mod depsolve;
mod errors;
pub(crate) mod host;
mod import;
pub mod libostree;
mod model;
mod os;
mod ostree;
mod realstage;
mod reboot;
mod records;
mod refspec;
mod rpm;
mod runners;
mod runstate;
mod sysroot;
mod transaction;
mod vardict;
mod version;

pub use version::RpmOstreeVersion;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use zbus::fdo::{DBusProxy, RequestNameFlags};
use zbus::{Connection, object_server::SignalEmitter};

use crate::control::RpmOstreedCmd;
use crate::fixtures::Fixture;
// The fixture tests build a sysroot and check it against the host root.
use crate::fixtures::images::TestImage;
use control::Knobs;
#[cfg(test)]
pub(crate) use deploy::{create_initial, low_disk, names_package, sanity_check};
use model::State;
use os::OsIface;
#[cfg(test)]
pub(crate) use ostree::read_deployments;
pub use reboot::RebootOutcome;
use records::TxnRecord;
use sysroot::SysrootIface;
use transaction::Txn;

/// The daemon's well-known bus name.
const BUS_NAME: &str = "org.projectatomic.rpmostree1";
/// Base path; the ObjectManager lives here.
const BASE_PATH: &str = "/org/projectatomic/rpmostree1";
/// Path of the Sysroot object.
const SYSROOT_PATH: &str = "/org/projectatomic/rpmostree1/Sysroot";

/// How the fake daemon is set up.
#[derive(Debug, Clone)]
pub struct RpmOstreedConfig {
    /// Address of the private system bus (`unix:path=…`).
    pub bus_address: String,
    /// Transaction socket (`DIR/rpm-ostree-transaction.sock`); transaction methods return
    /// `unix:path=<this path>`.
    pub txn_socket: PathBuf,
    /// Where the side file (`state.json`) and scratch trees live.
    pub state_dir: PathBuf,
    /// The real ostree sysroot holding the deployments (created if it has none).
    pub sysroot: PathBuf,
    /// The host root the fake reads (`proc/cpuinfo`, the `run/testbed/low-disk` marker);
    /// `None`: no host checks.
    pub host_root: Option<PathBuf>,
    /// The kind of host, for a new sysroot's booted deployment and the architecture.
    pub fixture: Fixture,
    /// The stateroot, e.g. `rhcos`.
    pub osname: String,
    /// The images that can be pulled.
    pub images: Vec<TestImage>,
    /// Index into `images` of the booted image, used when the sysroot has no deployment yet.
    pub booted: usize,
    /// The rpm-ostree release the fake plays.
    pub version: RpmOstreeVersion,
    /// Stage, lock, finalize and clean up through real libostree 2025.x (the trixie root
    /// `scripts/setup.sh` makes; needs root and `host_root`): see `realstage`. Off: the
    /// testbed's `ostree` deploys and the fake writes libostree's record itself.
    pub real_libostree: bool,
}

/// A running fake `rpm-ostreed`. Dropping it takes the daemon off the bus.
pub struct FakeRpmOstreed {
    daemon: Arc<Daemon>,
}

impl std::fmt::Debug for FakeRpmOstreed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRpmOstreed").finish_non_exhaustive()
    }
}

impl FakeRpmOstreed {
    /// Load (or create) the sysroot, connect to the bus and own the daemon's name.
    pub async fn start(cfg: RpmOstreedConfig) -> anyhow::Result<FakeRpmOstreed> {
        let real = match (cfg.real_libostree, cfg.host_root.as_deref()) {
            (false, _) => None,
            (true, Some(root)) => Some(
                realstage::RealStage::new(&cfg.sysroot, root, &cfg.state_dir)
                    .context("staging through real libostree")?,
            ),
            (true, None) => anyhow::bail!("real libostree staging needs a host root"),
        };
        let disk = realstage::disk_deployments(&cfg.sysroot, real.as_ref())?;
        let state = match State::load(&cfg.state_dir, &disk)? {
            Some(state) => state,
            None => {
                let image = cfg.images.get(cfg.booted).with_context(|| {
                    format!("booted image index {} is not in the catalog", cfg.booted)
                })?;
                let began = Instant::now();
                let state = deploy::create_initial(
                    &cfg.sysroot,
                    &cfg.state_dir.join("scratch"),
                    &cfg.osname,
                    image,
                    &cfg.fixture,
                    cfg.host_root.as_deref(),
                )
                .await
                .with_context(|| format!("creating the sysroot {}", cfg.sysroot.display()))?;
                state.save(&cfg.state_dir)?;
                info!(
                    sysroot = %cfg.sysroot.display(),
                    host = cfg.fixture.name,
                    elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "created the ostree sysroot"
                );
                state
            }
        };
        let daemon = Arc::new(Daemon {
            os_path: model::os_object_path(&cfg.osname),
            version: cfg.version,
            osname: cfg.osname,
            images: cfg.images,
            state_dir: cfg.state_dir,
            sysroot: cfg.sysroot,
            host_root: cfg.host_root,
            real,
            arch: cfg.fixture.arch().to_string(),
            txn_socket: cfg.txn_socket,
            bus_address: cfg.bus_address,
            state: Mutex::new(state),
            rebooting: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            clients: Mutex::new(HashMap::new()),
            knobs: Mutex::new(Knobs::default()),
            records: Mutex::new(Vec::new()),
            active: Mutex::new(None),
            txn_gate: tokio::sync::Mutex::new(()),
            bus: Mutex::new(None),
            next_txn_id: AtomicU64::new(1),
        });
        daemon.connect_bus().await?;
        info!(osname = %daemon.osname, "fake rpm-ostreed is on the bus");
        Ok(FakeRpmOstreed { daemon })
    }

    /// The booted deployment's kernel command line as `/proc/cmdline` shows it
    /// (`BOOT_IMAGE=…` followed by its bootloader entry's options).
    pub fn booted_cmdline(&self) -> Option<String> {
        let state = lock(&self.daemon.state);
        Some(state.booted()?.disk.as_ref()?.proc_cmdline())
    }

    /// The real ostree sysroot.
    pub fn sysroot(&self) -> &Path {
        &self.daemon.sysroot
    }

    /// Runs one control command (see `docs/testbed.md`) and returns its result.
    pub async fn control(&self, cmd: RpmOstreedCmd) -> anyhow::Result<serde_json::Value> {
        self.daemon.control(cmd).await
    }
}

impl Drop for FakeRpmOstreed {
    fn drop(&mut self) {
        self.daemon.shutdown();
    }
}

/// Lock a mutex, taking the data even if a panicking thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The current bus connection and the task watching `NameOwnerChanged` on it.
struct Bus {
    conn: Connection,
    watcher: JoinHandle<()>,
}

/// The daemon's state, shared by its D-Bus objects and tasks.
pub(crate) struct Daemon {
    /// The rpm-ostree release played.
    version: RpmOstreeVersion,
    osname: String,
    os_path: String,
    images: Vec<TestImage>,
    state_dir: PathBuf,
    sysroot: PathBuf,
    host_root: Option<PathBuf>,
    /// Real libostree stages, unlocks, removes and finalizes (`real_libostree`).
    real: Option<realstage::RealStage>,
    /// RPM architecture of the host.
    arch: String,
    txn_socket: PathBuf,
    bus_address: String,
    state: Mutex<State>,
    /// A reboot was initiated; the real daemon then refuses new transactions.
    rebooting: AtomicBool,
    /// The fake was dropped; a pending simulated restart must not bring it back.
    stopped: AtomicBool,
    /// Registered clients: unique bus name → `id` option.
    clients: Mutex<HashMap<String, Option<String>>>,
    knobs: Mutex<Knobs>,
    records: Mutex<Vec<TxnRecord>>,
    active: Mutex<Option<Arc<Txn>>>,
    /// Serialises "check for an active transaction, then create one".
    txn_gate: tokio::sync::Mutex<()>,
    bus: Mutex<Option<Bus>>,
    next_txn_id: AtomicU64,
}

impl Daemon {
    /// Connect to the bus, export the objects and take the well-known name. The previous
    /// owner may still be going away (after a simulated crash), so a taken name is retried.
    async fn connect_bus(self: &Arc<Self>) -> anyhow::Result<()> {
        let conn = zbus::connection::Builder::address(self.bus_address.as_str())?
            .serve_at(BASE_PATH, zbus::fdo::ObjectManager)?
            .serve_at(SYSROOT_PATH, SysrootIface::new(self.clone()))?
            .serve_at(self.os_path.as_str(), OsIface::new(self.clone()))?
            .build()
            .await
            .with_context(|| format!("connecting to {}", self.bus_address))?;
        let mut owners = DBusProxy::new(&conn)
            .await?
            .receive_name_owner_changed()
            .await?;
        let weak = Arc::downgrade(self);
        let watcher = tokio::spawn(async move {
            while let Some(signal) = owners.next().await {
                let Ok(args) = signal.args() else { continue };
                if args.new_owner().is_some() {
                    continue;
                }
                let Some(daemon) = weak.upgrade() else { break };
                daemon.name_vanished(args.name().as_str());
            }
        });
        {
            // Checked under the lock that shutdown() takes, so a dropped fake stays down.
            let mut bus = lock(&self.bus);
            if self.stopped.load(Ordering::SeqCst) {
                drop(bus);
                watcher.abort();
                let _ = conn.close().await;
                anyhow::bail!("the fake rpm-ostreed was stopped");
            }
            // Stored before the name is owned: method handlers look the connection up.
            *bus = Some(Bus {
                conn: conn.clone(),
                watcher,
            });
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match conn
                .request_name_with_flags(BUS_NAME, RequestNameFlags::DoNotQueue.into())
                .await
            {
                Ok(_) => break,
                Err(zbus::Error::NameTaken) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(e).context("owning org.projectatomic.rpmostree1"),
            }
        }
        Ok(())
    }

    /// Owns (`on`) or releases the daemon's bus name on its connection.
    pub(crate) async fn set_on_bus(&self, on: bool) -> anyhow::Result<()> {
        let Some(conn) = self.bus_conn() else {
            anyhow::bail!("the fake rpm-ostreed is not connected to the bus");
        };
        if on {
            conn.request_name_with_flags(BUS_NAME, RequestNameFlags::DoNotQueue.into())
                .await
                .context("owning org.projectatomic.rpmostree1")?;
        } else {
            conn.release_name(BUS_NAME).await?;
        }
        Ok(())
    }

    fn bus_conn(&self) -> Option<Connection> {
        lock(&self.bus).as_ref().map(|b| b.conn.clone())
    }

    /// A bus name disappeared: forget the client, and drop a transaction its caller
    /// abandoned before `Start()`.
    fn name_vanished(self: &Arc<Self>, name: &str) {
        lock(&self.clients).remove(name);
        let abandoned = lock(&self.active)
            .clone()
            .filter(|t| t.sender == name && !t.is_started());
        if let Some(txn) = abandoned {
            info!(
                txn = txn.id,
                sender = name,
                "client disconnected before calling start; cancelling transaction"
            );
            self.update_record(txn.id, |r| r.dropped = true);
            self.release(&txn);
        }
    }

    /// `client(id:… dbus:… uid:…)`, like the real daemon's client description.
    async fn describe_client(&self, sender: &str) -> String {
        let id = lock(&self.clients).get(sender).cloned().flatten();
        let uid = match self.bus_conn() {
            Some(conn) => match DBusProxy::new(&conn).await {
                Ok(proxy) => match zbus::names::BusName::try_from(sender) {
                    Ok(name) => proxy.get_connection_unix_user(name).await.ok(),
                    Err(_) => None,
                },
                Err(_) => None,
            },
            None => None,
        };
        let mut s = String::from("client(");
        if let Some(id) = id {
            s.push_str(&format!("id:{id} "));
        }
        s.push_str("dbus");
        s.push_str(sender);
        match uid {
            Some(uid) => s.push_str(&format!(" uid:{uid})")),
            None => s.push_str(" uid:<unknown>)"),
        }
        s
    }

    /// Persist the side file, and write libostree's runtime record of the staged deployment
    /// below the host root (see [`runstate`]), unless real libostree wrote it.
    fn save_state(&self, state: &State) -> Result<(), String> {
        state
            .save(&self.state_dir)
            .map_err(|e| format!("writing deployment state: {e:#}"))?;
        match &self.host_root {
            // libostree itself wrote its record.
            Some(_) if self.real.is_some() => Ok(()),
            Some(root) => runstate::write(root, state, lock(&self.knobs).legacy_lock_file)
                .map_err(|e| format!("writing the staged deployment record: {e:#}")),
            None => Ok(()),
        }
    }

    /// The deployment dictionary as rpm-ostreed builds it now (the legacy lock file decides
    /// `finalization-locked`).
    fn dict_of(
        &self,
        d: &model::Deployment,
    ) -> zbus::zvariant::Result<HashMap<String, zbus::zvariant::OwnedValue>> {
        d.to_dict(runstate::legacy_lock_exists(self.host_root.as_deref()))
    }

    /// Re-read the sysroot and the side file (another tool may have changed either); whether
    /// anything changed.
    fn reload_state(&self) -> anyhow::Result<bool> {
        let disk = realstage::disk_deployments(&self.sysroot, self.real.as_ref())?;
        let Some(state) = State::load(&self.state_dir, &disk)? else {
            return Ok(false);
        };
        let mut current = lock(&self.state);
        let changed = *current != state;
        *current = state;
        Ok(changed)
    }

    /// Re-read the sysroot after the fake changed it, keep the side-file data of every
    /// deployment still on disk (plus `extra`, a deployment just written) and save.
    fn resync(&self, extra: Option<model::Deployment>) -> Result<(), String> {
        let disk = realstage::disk_deployments(&self.sysroot, self.real.as_ref())
            .map_err(|e| format!("reading the sysroot: {e:#}"))?;
        let mut state = lock(&self.state);
        let mut side = state.clone();
        side.deployments.extend(extra);
        *state = State::join(&disk, side);
        self.save_state(&state)
    }

    /// Mark that the daemon initiated a reboot (`FinalizeDeployment`, or a deploy with
    /// `reboot`): it then refuses new transactions until the host goes down.
    fn request_reboot(&self) -> Result<(), String> {
        self.rebooting.store(true, Ordering::SeqCst);
        self.record_reboot_request()
    }

    /// Record that the host is going down (the simulated reboot consumes it), whoever asked.
    fn record_reboot_request(&self) -> Result<(), String> {
        let mut state = lock(&self.state);
        state.reboot_requested = true;
        self.save_state(&state)
    }

    /// Emit PropertiesChanged for everything derived from the deployment list.
    async fn notify_deployments(&self) {
        let Some(conn) = self.bus_conn() else { return };
        let server = conn.object_server();
        if let Ok(iface) = server.interface::<_, SysrootIface>(SYSROOT_PATH).await {
            let emitter = iface.signal_emitter();
            let sysroot = iface.get().await;
            log_emit(sysroot.deployments_changed(emitter).await);
            log_emit(sysroot.booted_changed(emitter).await);
        }
        if let Ok(iface) = server.interface::<_, OsIface>(self.os_path.as_str()).await {
            let emitter: &SignalEmitter<'_> = iface.signal_emitter();
            let os = iface.get().await;
            log_emit(os.booted_deployment_changed(emitter).await);
            log_emit(os.default_deployment_changed(emitter).await);
            log_emit(os.rollback_deployment_changed(emitter).await);
        }
    }

    /// Emit PropertiesChanged for `ActiveTransaction` and `ActiveTransactionPath`.
    async fn notify_active_txn(&self) {
        let Some(conn) = self.bus_conn() else { return };
        if let Ok(iface) = conn
            .object_server()
            .interface::<_, SysrootIface>(SYSROOT_PATH)
            .await
        {
            let emitter = iface.signal_emitter();
            let sysroot = iface.get().await;
            log_emit(sysroot.active_transaction_changed(emitter).await);
            log_emit(sysroot.active_transaction_path_changed(emitter).await);
        }
    }

    /// Simulate `rpm-ostreed` crashing mid-transaction and being restarted: the peers lose
    /// their connection without `Finished`, the bus name is released and re-acquired by a new
    /// connection, and nothing the transaction would have written is written.
    async fn crash_and_restart(self: Arc<Self>, txn: Arc<Txn>) {
        // Let the reply to Start() reach the client first, as it does for a real crash.
        tokio::time::sleep(Duration::from_millis(50)).await;
        warn!(txn = txn.id, "simulating a daemon crash mid-transaction");
        self.update_record(txn.id, |r| r.crashed = true);
        let peers = self.detach(&txn);
        for peer in peers {
            let _ = peer.close().await;
        }
        let old = lock(&self.bus).take();
        if let Some(bus) = old {
            bus.watcher.abort();
            if let Err(e) = bus.conn.close().await {
                debug!(error = %e, "closing the bus connection");
            }
        }
        lock(&self.clients).clear();
        tokio::time::sleep(Duration::from_millis(100)).await;
        match self.connect_bus().await {
            Ok(()) => info!("fake rpm-ostreed restarted and owns its name again"),
            Err(e) => warn!(error = %format!("{e:#}"), "fake rpm-ostreed could not restart"),
        }
    }

    /// Take the daemon off the bus and stop the active transaction (the fake is dropped).
    fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let bus = lock(&self.bus).take();
        let txn = lock(&self.active).take();
        let peers = txn.map(|t| t.shutdown()).unwrap_or_default();
        let _ = std::fs::remove_file(&self.txn_socket);
        if let Some(bus) = &bus {
            bus.watcher.abort();
        }
        // Closing needs the runtime; without one the sockets simply go with the process.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for peer in peers {
                    let _ = peer.close().await;
                }
                if let Some(bus) = bus {
                    let _ = bus.conn.close().await;
                }
            });
        }
    }
}

fn log_emit(result: zbus::Result<()>) {
    if let Err(e) = result {
        debug!(error = %e, "property change not emitted");
    }
}

/// Escape a path for a D-Bus address value (`unix:path=…`).
fn address_escape(path: &std::path::Path) -> String {
    let mut out = String::new();
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'-' | b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'/' | b'.' | b'*' => {
                out.push(char::from(*b))
            }
            other => out.push_str(&format!("%{other:02x}")),
        }
    }
    out
}
