//! The loop itself: what wakes it (the Node and OSImageStream watches, the running
//! transaction, long work, timers, streamd's D-Bus API, the watchdog) and how each is handled.
//! What runs and when the timers fire is the core's (`core.rs`); this loop owns the tasks and
//! the sources, feeds the core its events and executes the effects it returns.

use std::pin::pin;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::LocalBoxStream;
use tokio::time::sleep_until;
use tracing::{debug, info, warn};

use super::Agent;
use super::core::{Activity, Event};
use super::task::{self, StagingEvent, TaskEvent, TaskFailed};
use super::work::Outcome;
use crate::cluster::node::NodeUpdate;
use crate::cluster::streams::StreamsUpdate;
use crate::dbus_api::Request;
use crate::notify;

/// Longest wait for the last status patch when stopping.
const STOP_FLUSH: Duration = Duration::from_secs(5);
/// The streams and timers the loop owns beside the agent.
struct Sources {
    /// The Node watch, once there is a client.
    watch: Option<LocalBoxStream<'static, NodeUpdate>>,
    /// The OSImageStream watch, once resolution or the checks need it.
    streams: Option<LocalBoxStream<'static, StreamsUpdate>>,
    /// Half the systemd watchdog interval, when the watchdog is on.
    watchdog: Option<tokio::time::Interval>,
}

/// What woke the loop, with what it carried.
enum Wake {
    /// Time to look at the credential files.
    CredentialsDue,
    /// The Node watch (`None`: it ended).
    Node(Option<NodeUpdate>),
    /// The OSImageStream watch (`None`: it ended).
    Streams(Option<StreamsUpdate>),
    /// The staging transaction progressed or ended.
    Staging(StagingEvent),
    /// Long work ended (`Err`: its task failed).
    Work(Result<Outcome, TaskFailed>),
    /// A retry timer fired.
    RetryDue,
    /// The status patch is due.
    FlushDue,
    /// A request over streamd's D-Bus API.
    Request(Request),
    /// The readiness checks are due again.
    ReadinessDue,
    /// Time for `WATCHDOG=1`.
    WatchdogDue,
}

impl Agent {
    /// Runs until `shutdown` resolves.
    ///
    /// The daemon said `READY=1` before the agent was built (`src/bin/streamd.rs`): waiting for
    /// the kubeconfig, the API server or the Node object is a reported state (journal,
    /// `STATUS=`, `streamctl status`), never an exit, so an unreachable cluster cannot use up
    /// systemd's start limit.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let mut src = Sources {
            watch: None,
            streams: None,
            // WATCHDOG=1 comes from this loop itself, so a wedged loop is restarted by systemd.
            watchdog: notify::watchdog_interval().map(tokio::time::interval),
        };
        let mut shutdown = pin!(shutdown);
        loop {
            let wake = tokio::select! {
                wake = self.wait(&mut src) => wake,
                () = &mut shutdown => break,
            };
            self.handle(wake, &mut src).await?;
            // The cluster's streams are watched once resolution or the checks need them.
            if src.streams.is_none() && (self.reboot.resolve_streams || self.wants_catalog()) {
                src.streams = self
                    .node
                    .client()
                    .map(|c| crate::cluster::streams::watch(c).boxed_local());
            }
            self.readiness_tick().await;
        }
        info!("stopping");
        // systemd waits for it; a full queue must not lose it.
        notify::send_until_sent(&[sd_notify::NotifyState::Stopping], STOP_FLUSH).await;
        // A running transaction keeps running in rpm-ostreed, and work in its task is dropped
        // (nothing it does is left half-done by that: see `work.rs`); the next start reads the
        // result. The last status gets a short chance to go out, inside TimeoutStopSec.
        if tokio::time::timeout(STOP_FLUSH, self.flush())
            .await
            .is_err()
        {
            warn!("the last status patch did not finish before stopping");
        }
        Ok(())
    }

    /// Waits for the next thing the loop reacts to.
    async fn wait(&mut self, src: &mut Sources) -> Wake {
        let flush_at = self.flush_at();
        let step = match self.core.activity() {
            Activity::Running { step, .. } => step.label(),
            Activity::Idle | Activity::Settling { .. } => "work",
        };
        tokio::select! {
            _ = sleep_until(self.core.credentials_at().unwrap_or_else(Instant::now).into()) => Wake::CredentialsDue,
            upd = next_opt(&mut src.watch) => Wake::Node(upd),
            upd = next_opt(&mut src.streams) => Wake::Streams(upd),
            ev = task::next(&mut self.task, step) => match ev {
                TaskEvent::Staging(ev) => Wake::Staging(ev),
                TaskEvent::Work(done) => Wake::Work(done),
            },
            _ = sleep_opt(self.core.retry_at()) => Wake::RetryDue,
            _ = sleep_opt(flush_at) => Wake::FlushDue,
            Some(req) = self.requests.recv() => Wake::Request(req),
            _ = sleep_opt(self.core.readiness_at()) => Wake::ReadinessDue,
            _ = tick(&mut src.watchdog) => Wake::WatchdogDue,
        }
    }

    /// Reacts to one [`Wake`]; an error ends the loop (a watch that ended for good).
    async fn handle(&mut self, wake: Wake, src: &mut Sources) -> anyhow::Result<()> {
        match wake {
            Wake::CredentialsDue => {
                if self.load_credentials().await {
                    // A new client: the watches must use it.
                    src.watch = self.node.watch().map(StreamExt::boxed_local);
                    src.streams = None;
                }
            }
            Wake::Node(Some(upd)) => self.on_node_update(upd).await,
            Wake::Node(None) => anyhow::bail!("the node watch ended"),
            Wake::Streams(Some(StreamsUpdate::Catalog(c))) => {
                debug!(catalog = ?c, "os image streams changed");
                self.catalog = Some(c);
                self.inputs_changed().await;
                self.rejudge_images().await;
            }
            Wake::Streams(Some(StreamsUpdate::Error(e))) => {
                warn!(error = %e, "osimagestream watch failed; retrying");
            }
            Wake::Streams(None) => anyhow::bail!("the osimagestream watch ended"),
            Wake::Staging(StagingEvent::Progress(ev)) => self.on_progress(ev).await,
            Wake::Staging(StagingEvent::Finished(res)) => {
                self.on_staged(res).await;
                self.settle().await;
            }
            Wake::Work(done) => self.work_done(done).await,
            Wake::RetryDue => {
                let effects = self.core.handle(Event::RetryDue);
                self.execute(effects).await;
            }
            Wake::FlushDue => self.flush().await,
            Wake::Request(req) => self.on_request(req).await,
            Wake::ReadinessDue => {
                self.core.handle(Event::ReadinessDue);
            }
            Wake::WatchdogDue => {
                notify::send(&[sd_notify::NotifyState::Watchdog]);
            }
        }
        Ok(())
    }

    /// A step's task ended: tells the core, acts on what it found and settles. The span names
    /// the step and the request it ran for, so every handler's lines carry them.
    #[tracing::instrument(skip_all, fields(step = tracing::field::Empty, request = tracing::field::Empty))]
    async fn work_done(&mut self, done: Result<Outcome, TaskFailed>) {
        if let Activity::Running { step, .. } = self.core.activity() {
            let span = tracing::Span::current();
            span.record("step", step.label());
            if let Some(request) = step.request() {
                span.record("request", tracing::field::display(request));
            }
        }
        match done {
            Ok(outcome) => {
                self.ended(None).await;
                self.on_work(outcome).await;
            }
            Err(e) => {
                warn!(error = %e, label = e.label(), "work failed");
                self.ended(Some(e.to_string())).await;
            }
        }
        self.settle().await;
    }

    /// What the node watch reported.
    async fn on_node_update(&mut self, upd: NodeUpdate) {
        match upd {
            NodeUpdate::Annotations(a) => self.on_node(&a).await,
            NodeUpdate::Deleted => warn!(node = self.node.name(), "node object deleted"),
            NodeUpdate::Absent => {
                let reason = format!(
                    "waiting for the Node {}: the API server has no Node of that name (node-name, or the host name when it is not set, must name this node's Node object)",
                    self.node.name()
                );
                self.waiting(reason).await;
            }
            NodeUpdate::Error {
                message,
                unauthorized,
            } => {
                warn!(error = %message, "node watch failed; retrying");
                if unauthorized {
                    self.core.handle(Event::Unauthorized);
                }
                if !self.node_seen {
                    self.waiting(format!("waiting for the Kubernetes API server: {message}"))
                        .await;
                }
            }
        }
    }

    /// A request over streamd's D-Bus API.
    async fn on_request(&mut self, req: Request) {
        match req {
            Request::Reconcile => {
                info!("reconcile requested over d-bus");
                // Also a request whose staging (or bootloader update) failed is tried again.
                self.forget_failure();
                self.bootloader = None;
                self.reconcile().await;
            }
            Request::Preflight { inputs, reply } => {
                self.watch_streams_for_dry_runs();
                // Registry reads can take minutes: answered from a task of its own.
                let run = self.dry_run(inputs);
                tokio::spawn(async move {
                    let _ = reply.send(run.await.to_string());
                });
            }
        }
    }
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn next_opt<S: futures::Stream + Unpin>(s: &mut Option<S>) -> Option<S::Item> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
