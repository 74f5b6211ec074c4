//! The transaction server: the one active transaction, its peer-to-peer socket, its
//! `org.projectatomic.rpmostree1.Transaction` object and its run.
//!
//! Lifetime rules follow the real daemon: a transaction method creates the transaction and
//! returns the socket address; a caller that leaves the bus before `Start()` abandons it;
//! after `Start()` it runs on its own; it is released once it has finished and no peer is
//! connected, or 30 s after finishing (the peers are then closed).

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

use super::deploy::PackageChanges;
use super::errors::DaemonError;
use super::records::TxnRecord;
use super::{Daemon, address_escape, lock};

/// The real daemon's `FORCE_CLOSE_TXN_TIMEOUT_SECS`.
const FORCE_CLOSE_AFTER: Duration = Duration::from_secs(30);
/// Pause between the steps of a run, so that clients see signals arrive over time.
pub(crate) const STEP: Duration = Duration::from_millis(5);
/// `G_IO_ERROR_CANCELLED`'s message, which is what `Finished` carries after `Cancel()`.
const CANCELLED: &str = "Operation was cancelled";
/// How long a peer may take to authenticate.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a deploy transaction (`UpdateDeployment`, `Rebase`) was asked to do.
pub(crate) struct DeployPlan {
    /// Package modifiers and the options that go with them.
    pub(crate) changes: PackageChanges,
    pub(crate) refspec: Option<String>,
    pub(crate) revision: Option<String>,
    /// Skip the base's build-time check (`RPMOSTREE_SYSROOT_UPGRADER_FLAGS_ALLOW_OLDER`).
    pub(crate) allow_downgrade: bool,
    pub(crate) lock_finalization: bool,
    pub(crate) reboot: bool,
    pub(crate) command_line: Option<String>,
}

/// What `FinalizeDeployment` was asked to check.
pub(crate) struct FinalizePlan {
    pub(crate) checksum: Option<String>,
    pub(crate) allow_missing_checksum: bool,
    pub(crate) allow_unlocked: bool,
}

/// The work a transaction does once started.
pub(crate) enum Work {
    Deploy(DeployPlan),
    Cleanup {
        pending: bool,
        rollback: bool,
        /// `base`: prune what no deployment uses, also when no deployment is removed.
        base: bool,
    },
    Finalize(FinalizePlan),
    /// A deploy request `deploy_transaction_execute` refuses: it fails with this message once
    /// started, as the real daemon validates only then.
    Invalid(String),
    /// Another client's transaction (`hold-foreign`): already started, runs until released.
    Foreign,
}

/// A transaction method call, as far as the transaction machinery needs it.
pub(crate) struct TxnRequest {
    pub(crate) method: &'static str,
    pub(crate) sender: String,
    /// The serialized parameters; a call joins the active transaction only if these match.
    pub(crate) params: Vec<u8>,
    pub(crate) title: String,
    pub(crate) modifiers: serde_json::Value,
    pub(crate) options: serde_json::Value,
    pub(crate) args: serde_json::Value,
    pub(crate) fds: u32,
}

impl TxnRequest {
    /// The log record of this call as transaction `id` (0: refused, no transaction).
    pub(crate) fn record(&self, id: u64) -> TxnRecord {
        TxnRecord {
            id,
            method: self.method.to_string(),
            sender: self.sender.clone(),
            title: self.title.clone(),
            modifiers: self.modifiers.clone(),
            options: self.options.clone(),
            args: self.args.clone(),
            fds: self.fds,
            started: false,
            started_ms: None,
            finished_ms: None,
            joined: 0,
            result: None,
            cancelled: false,
            dropped: false,
            crashed: false,
            reboot_requested: false,
            error: None,
            journal: Vec::new(),
            pulled: false,
        }
    }
}

/// A transaction and its peers.
pub(crate) struct Txn {
    pub(crate) id: u64,
    pub(crate) method: String,
    pub(crate) sender: String,
    pub(crate) os_path: String,
    /// `None`: nobody can join (the foreign transaction).
    params: Option<Vec<u8>>,
    pub(crate) address: String,
    client_description: String,
    work: Work,
    /// `fail-next`, taken when the transaction was created.
    pub(crate) fail: Option<String>,
    /// `exit-mid-transaction`, taken when the transaction was created.
    crash: bool,
    inner: Mutex<Inner>,
    pub(crate) cancel: Notify,
}

#[derive(Default)]
struct Inner {
    title: String,
    started: bool,
    cancelled: bool,
    finished: Option<(bool, String)>,
    peers: Vec<(u64, Connection)>,
    next_peer: u64,
    tasks: Vec<JoinHandle<()>>,
    released: bool,
}

/// A signal on the Transaction interface.
pub(crate) enum Signal<'a> {
    Message(&'a str),
    TaskBegin(&'a str),
    TaskEnd(&'a str),
    Percent(&'a str, u32),
    ProgressEnd,
    Finished(bool, &'a str),
}

impl Txn {
    pub(crate) fn is_started(&self) -> bool {
        lock(&self.inner).started
    }

    pub(crate) fn title(&self) -> String {
        lock(&self.inner).title.clone()
    }

    fn peer_conns(&self) -> Vec<Connection> {
        lock(&self.inner)
            .peers
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Keep a task that belongs to this transaction; it is aborted when the transaction goes.
    fn track(&self, task: JoinHandle<()>) {
        let mut inner = lock(&self.inner);
        if inner.released {
            task.abort();
        } else {
            inner.tasks.retain(|t| !t.is_finished());
            inner.tasks.push(task);
        }
    }

    /// Stop the transaction's tasks (except the calling one) and hand over its peers.
    pub(crate) fn shutdown(&self) -> Vec<Connection> {
        let mut inner = lock(&self.inner);
        inner.released = true;
        let current = tokio::task::try_id();
        for task in inner.tasks.drain(..) {
            if Some(task.id()) != current {
                task.abort();
            }
        }
        inner.peers.drain(..).map(|(_, c)| c).collect()
    }

    fn add_peer(&self, peer: u64, conn: &Connection) -> bool {
        let mut inner = lock(&self.inner);
        if inner.released {
            return false;
        }
        if !inner.peers.iter().any(|(id, _)| *id == peer) {
            inner.peers.push((peer, conn.clone()));
        }
        true
    }

    fn remove_peer(&self, peer: u64) {
        lock(&self.inner).peers.retain(|(id, _)| *id != peer);
    }

    pub(crate) fn cancelled(&self) -> Result<(), String> {
        if lock(&self.inner).cancelled {
            Err(CANCELLED.to_string())
        } else {
            Ok(())
        }
    }

    /// Sleep, waking early for `Cancel()`; fails if the transaction was cancelled.
    pub(crate) async fn pause(&self, d: Duration) -> Result<(), String> {
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.cancel.notified() => {}
        }
        self.cancelled()
    }

    pub(crate) async fn emit(&self, signal: Signal<'_>) {
        for conn in self.peer_conns() {
            let emitter = match SignalEmitter::new(&conn, "/") {
                Ok(e) => e,
                Err(e) => {
                    debug!(error = %e, "no signal emitter for peer");
                    continue;
                }
            };
            let sent = match signal {
                Signal::Message(text) => TxnIface::message(&emitter, text).await,
                Signal::TaskBegin(text) => TxnIface::task_begin(&emitter, text).await,
                Signal::TaskEnd(text) => TxnIface::task_end(&emitter, text).await,
                Signal::Percent(text, pct) => TxnIface::percent_progress(&emitter, text, pct).await,
                Signal::ProgressEnd => TxnIface::progress_end(&emitter).await,
                Signal::Finished(ok, msg) => TxnIface::finished(&emitter, ok, msg).await,
            };
            if let Err(e) = sent {
                debug!(txn = self.id, error = %e, "signal not delivered to peer");
            }
        }
    }

    /// Change the title, announcing it to the peers like a GDBus skeleton does.
    pub(crate) async fn set_title(&self, title: String) {
        lock(&self.inner).title = title;
        for conn in self.peer_conns() {
            if let Ok(iface) = conn.object_server().interface::<_, TxnIface>("/").await {
                let iface_ref = iface.get().await;
                if let Err(e) = iface_ref.title_changed(iface.signal_emitter()).await {
                    debug!(error = %e, "title change not emitted");
                }
            }
        }
    }
}

impl Daemon {
    /// `rpmostreed_sysroot_prep_for_txn` plus transaction creation: join an identical
    /// running transaction, refuse while another one runs, else validate with `prepare`
    /// and start serving a new one. Returns the transaction address.
    pub(crate) async fn begin_txn(
        self: &Arc<Self>,
        req: TxnRequest,
        prepare: impl FnOnce(&Daemon) -> Result<Work, DaemonError>,
    ) -> Result<String, DaemonError> {
        let _gate = self.txn_gate.lock().await;
        let result = self.begin_txn_locked(&req, prepare).await;
        if let Err(e) = &result {
            info!(method = req.method, sender = %req.sender, error = %e, "transaction method refused");
            let mut record = req.record(0);
            record.error = Some(e.describe());
            lock(&self.records).push(record);
        }
        result
    }

    async fn begin_txn_locked(
        self: &Arc<Self>,
        req: &TxnRequest,
        prepare: impl FnOnce(&Daemon) -> Result<Work, DaemonError>,
    ) -> Result<String, DaemonError> {
        if lock(&self.knobs).deny_calls {
            // polkit said no (coreos/rpm-ostree:src/daemon/rpmostreed-os.cxx
            // `os_authorize_method`): the same answer for every retry.
            return Err(DaemonError::AccessDenied(format!(
                "rpmostreed OS operation {} not allowed for user",
                req.method
            )));
        }
        if self.rebooting.load(Ordering::SeqCst) {
            return Err(DaemonError::GioFailed(
                "Reboot initiated, cannot start new transaction".into(),
            ));
        }
        let active = lock(&self.active).clone();
        if let Some(txn) = active {
            if txn.method == req.method && txn.params.as_deref() == Some(req.params.as_slice()) {
                info!(txn = txn.id, sender = %req.sender, "client joining existing transaction");
                self.update_record(txn.id, |r| r.joined += 1);
                return Ok(txn.address.clone());
            }
            return Err(DaemonError::GioBusy(format!(
                "Transaction in progress: {}\n You can cancel the current transaction with `rpm-ostree cancel`",
                txn.title()
            )));
        }
        let work = prepare(self)?;
        let (fail, crash) = {
            let mut knobs = lock(&self.knobs);
            (
                knobs.fail_next.take(),
                std::mem::take(&mut knobs.exit_mid_transaction),
            )
        };
        let client_description = self.describe_client(&req.sender).await;
        let txn = Arc::new(Txn {
            id: self.next_txn_id.fetch_add(1, Ordering::SeqCst),
            method: req.method.to_string(),
            sender: req.sender.clone(),
            os_path: self.os_path.clone(),
            params: Some(req.params.clone()),
            address: format!("unix:path={}", address_escape(&self.txn_socket)),
            client_description,
            work,
            fail,
            crash,
            inner: Mutex::new(Inner {
                title: req.title.clone(),
                ..Inner::default()
            }),
            cancel: Notify::new(),
        });
        self.activate(&txn)
            .map_err(|e| DaemonError::GioFailed(format!("{e:#}")))?;
        lock(&self.records).push(req.record(txn.id));
        info!(txn = txn.id, method = req.method, sender = %req.sender, address = %txn.address, "transaction created");
        self.notify_active_txn().await;
        Ok(txn.address.clone())
    }

    /// Make `txn` the active transaction and listen for its peers.
    fn activate(self: &Arc<Self>, txn: &Arc<Txn>) -> anyhow::Result<()> {
        // A previous daemon (or test run) may have left the socket file behind.
        let _ = std::fs::remove_file(&self.txn_socket);
        let listener = UnixListener::bind(&self.txn_socket)?;
        // The real socket is world-connectable (0666); there is no authorization hook.
        std::fs::set_permissions(&self.txn_socket, std::fs::Permissions::from_mode(0o666))?;
        *lock(&self.active) = Some(txn.clone());
        let accept = tokio::spawn(accept_peers(self.clone(), txn.clone(), listener));
        txn.track(accept);
        Ok(())
    }

    /// Start pretending that another client runs an `upgrade` (`hold-foreign`), or finish it.
    pub(crate) async fn hold_foreign(self: &Arc<Self>, on: bool) -> anyhow::Result<()> {
        let _gate = self.txn_gate.lock().await;
        let active = lock(&self.active).clone();
        let foreign = active.filter(|t| matches!(t.work, Work::Foreign));
        if !on {
            if let Some(txn) = foreign {
                self.finish_txn(&txn, Ok(())).await;
            }
            return Ok(());
        }
        if foreign.is_some() {
            return Ok(());
        }
        if lock(&self.active).is_some() {
            anyhow::bail!("a transaction is active; cannot hold a foreign one");
        }
        let txn = Arc::new(Txn {
            id: self.next_txn_id.fetch_add(1, Ordering::SeqCst),
            method: "Upgrade".into(),
            sender: ":1.0".into(),
            os_path: self.os_path.clone(),
            params: None,
            address: format!("unix:path={}", address_escape(&self.txn_socket)),
            client_description: "client(id:cli dbus:1.0 uid:0)".into(),
            work: Work::Foreign,
            fail: None,
            crash: false,
            inner: Mutex::new(Inner {
                title: "upgrade".into(),
                started: true,
                ..Inner::default()
            }),
            cancel: Notify::new(),
        });
        self.activate(&txn)?;
        info!(txn = txn.id, "holding a foreign transaction");
        self.notify_active_txn().await;
        Ok(())
    }

    /// `Start()`: true if this call started the transaction.
    fn start_txn(self: &Arc<Self>, txn: &Arc<Txn>, peer: u64, conn: &Connection) -> bool {
        txn.add_peer(peer, conn);
        let (started_now, finished) = {
            let mut inner = lock(&txn.inner);
            let was = inner.started;
            inner.started = true;
            (!was, inner.finished.clone())
        };
        if started_now {
            info!(txn = txn.id, "transaction started");
            let now = crate::fakes::apiserver::clock::unix_ms();
            self.update_record(txn.id, |r| {
                r.started = true;
                r.started_ms = Some(now);
            });
            if txn.crash {
                tokio::spawn(self.clone().crash_and_restart(txn.clone()));
            } else {
                let run = tokio::spawn(self.clone().run(txn.clone()));
                txn.track(run);
            }
        } else if let Some((ok, msg)) = finished {
            // A late client still learns the outcome: Finished again, on its connection only.
            let conn = conn.clone();
            tokio::spawn(async move {
                if let Ok(emitter) = SignalEmitter::new(&conn, "/")
                    && let Err(e) = TxnIface::finished(&emitter, ok, &msg).await
                {
                    debug!(error = %e, "finished not re-emitted");
                }
            });
        }
        started_now
    }

    /// `Cancel()`: the run stops at its next step with `Finished(false, "Operation was cancelled")`.
    async fn cancel_txn(self: &Arc<Self>, txn: &Arc<Txn>) {
        {
            let mut inner = lock(&txn.inner);
            if inner.finished.is_some() || inner.cancelled {
                return;
            }
            inner.cancelled = true;
        }
        info!(txn = txn.id, "transaction cancelled");
        self.update_record(txn.id, |r| r.cancelled = true);
        txn.cancel.notify_one();
        // Nothing runs for a foreign transaction, so it finishes here.
        if matches!(txn.work, Work::Foreign) {
            self.finish_txn(txn, Err(CANCELLED.into())).await;
        }
    }

    async fn run(self: Arc<Self>, txn: Arc<Txn>) {
        let result = match txn.cancelled() {
            Err(e) => Err(e),
            Ok(()) => match &txn.work {
                Work::Deploy(plan) => self.run_deploy(&txn, plan).await,
                Work::Cleanup {
                    pending,
                    rollback,
                    base,
                } => self.run_cleanup(&txn, *pending, *rollback, *base).await,
                Work::Finalize(plan) => self.run_finalize(&txn, plan).await,
                Work::Invalid(message) => Err(message.clone()),
                Work::Foreign => return,
            },
        };
        self.finish_txn(&txn, result).await;
    }

    /// no peer is left (else force-close it later).
    async fn finish_txn(self: &Arc<Self>, txn: &Arc<Txn>, result: Result<(), String>) {
        let (ok, message) = match result {
            Ok(()) => (true, String::new()),
            Err(m) => (false, m),
        };
        {
            let mut inner = lock(&txn.inner);
            if inner.finished.is_some() {
                return;
            }
            inner.finished = Some((ok, message.clone()));
        }
        info!(txn = txn.id, ok, message = %message, "transaction finished");
        let now = crate::fakes::apiserver::clock::unix_ms();
        self.update_record(txn.id, |r| {
            r.result = Some(super::records::TxnResult {
                ok,
                message: message.clone(),
            });
            r.finished_ms = Some(now);
        });
        txn.emit(Signal::Finished(ok, &message)).await;
        if txn.peer_conns().is_empty() {
            self.release(txn);
        } else {
            let daemon = self.clone();
            let weak = Arc::downgrade(txn);
            let timer = tokio::spawn(async move {
                tokio::time::sleep(FORCE_CLOSE_AFTER).await;
                if let Some(txn) = weak.upgrade() {
                    warn!(txn = txn.id, "forcibly closing transaction due to timeout");
                    daemon.release(&txn);
                }
            });
            txn.track(timer);
        }
    }

    /// Release `txn` if it has finished and no peer is connected.
    fn maybe_release(self: &Arc<Self>, txn: &Arc<Txn>) {
        let done = {
            let inner = lock(&txn.inner);
            inner.finished.is_some() && inner.peers.is_empty()
        };
        if done {
            self.release(txn);
        }
    }

    /// Stop `txn` and stop listening for it; returns its peers (still open).
    pub(super) fn detach(&self, txn: &Arc<Txn>) -> Vec<Connection> {
        {
            let mut active = lock(&self.active);
            if active.as_ref().is_some_and(|a| Arc::ptr_eq(a, txn)) {
                *active = None;
                // Only while it is ours: a newer transaction re-creates the socket.
                let _ = std::fs::remove_file(&self.txn_socket);
            }
        }
        txn.shutdown()
    }

    /// Drop the transaction: close its peers and reset `ActiveTransaction`.
    pub(super) fn release(self: &Arc<Self>, txn: &Arc<Txn>) {
        let was_active = lock(&self.active)
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(a, txn));
        let peers = self.detach(txn);
        if !was_active {
            return;
        }
        info!(txn = txn.id, "transaction released");
        // Separate task: the caller may be one of the transaction's own (now aborted) tasks.
        let daemon = self.clone();
        tokio::spawn(async move {
            for peer in peers {
                let _ = peer.close().await;
            }
            daemon.notify_active_txn().await;
        });
    }

    pub(super) fn update_record(&self, id: u64, f: impl FnOnce(&mut TxnRecord)) {
        if let Some(r) = lock(&self.records)
            .iter_mut()
            .rev()
            .find(|r| r.id == id && r.error.is_none())
        {
            f(r);
        }
    }
}

/// Accept peer connections for `txn` until it is released.
async fn accept_peers(daemon: Arc<Daemon>, txn: Arc<Txn>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                if std::mem::take(&mut lock(&daemon.knobs).drop_peer_next) {
                    warn!(
                        txn = txn.id,
                        "closing a transaction peer before authentication"
                    );
                    drop(stream);
                    continue;
                }
                let peer = {
                    let mut inner = lock(&txn.inner);
                    inner.next_peer += 1;
                    inner.next_peer
                };
                let task = tokio::spawn(serve_peer(daemon.clone(), txn.clone(), peer, stream));
                txn.track(task);
            }
            Err(e) => {
                warn!(error = %e, "accepting a transaction peer failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Authenticate one peer, export the Transaction object on its connection, and forget the
/// peer when it disconnects.
async fn serve_peer(daemon: Arc<Daemon>, txn: Arc<Txn>, peer: u64, stream: UnixStream) {
    let iface = TxnIface {
        daemon: daemon.clone(),
        txn: txn.clone(),
        peer,
    };
    let build = async {
        zbus::connection::Builder::unix_stream(stream)
            .server(zbus::Guid::generate())?
            .p2p()
            .serve_at("/", iface)?
            .build()
            .await
    };
    let conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, build).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            warn!(txn = txn.id, error = %e, "transaction peer failed to connect");
            return;
        }
        Err(_) => {
            warn!(
                txn = txn.id,
                "transaction peer did not authenticate in time"
            );
            return;
        }
    };
    if !txn.add_peer(peer, &conn) {
        let _ = conn.close().await;
        return;
    }
    info!(
        txn = txn.id,
        peer, "process connected to transaction progress"
    );
    conn.closed().await;
    info!(
        txn = txn.id,
        peer, "process disconnected from transaction progress"
    );
    txn.remove_peer(peer);
    daemon.maybe_release(&txn);
}

/// `org.projectatomic.rpmostree1.Transaction` at `/` on one peer connection.
pub(crate) struct TxnIface {
    daemon: Arc<Daemon>,
    txn: Arc<Txn>,
    peer: u64,
}

#[interface(name = "org.projectatomic.rpmostree1.Transaction")]
impl TxnIface {
    /// A single-line human-readable title (`rebase`, or the initiating command line).
    #[zbus(property)]
    fn title(&self) -> String {
        self.txn.title()
    }

    /// The client that started the transaction.
    #[zbus(property)]
    fn initiating_client_description(&self) -> String {
        self.txn.client_description.clone()
    }

    /// Cancel the transaction; `Finished(false, …)` follows.
    async fn cancel(&self) {
        self.daemon.cancel_txn(&self.txn).await;
    }

    /// Start the transaction; false if it was already started.
    #[zbus(out_args("started"))]
    fn start(&self, #[zbus(connection)] conn: &Connection) -> bool {
        self.daemon.start_txn(&self.txn, self.peer, conn)
    }

    /// The transaction ended.
    #[zbus(signal)]
    async fn finished(
        emitter: &SignalEmitter<'_>,
        success: bool,
        error_message: &str,
    ) -> zbus::Result<()>;

    /// A line of output.
    #[zbus(signal)]
    async fn message(emitter: &SignalEmitter<'_>, text: &str) -> zbus::Result<()>;

    /// A task began.
    #[zbus(signal)]
    async fn task_begin(emitter: &SignalEmitter<'_>, text: &str) -> zbus::Result<()>;

    /// The current task ended.
    #[zbus(signal)]
    async fn task_end(emitter: &SignalEmitter<'_>, text: &str) -> zbus::Result<()>;

    /// Generic percentage progress.
    #[zbus(signal)]
    async fn percent_progress(
        emitter: &SignalEmitter<'_>,
        text: &str,
        percentage: u32,
    ) -> zbus::Result<()>;

    /// Download progress of an ostree pull. Container pulls (the only pulls this fake makes)
    /// never emit it; it is declared so the interface matches the real one.
    #[zbus(signal)]
    async fn download_progress(
        emitter: &SignalEmitter<'_>,
        time: (u64, u64),
        outstanding: (u32, u32),
        metadata: (u32, u32, u32),
        delta: (u32, u32, u32, u64),
        content: (u32, u32),
        transfer: (u64, u64),
    ) -> zbus::Result<()>;

    /// Progress signals are done.
    #[zbus(signal)]
    async fn progress_end(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;
}
