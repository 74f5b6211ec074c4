//! The agent loop: node watch in, decisions out, one staging transaction at a time.
//!
//! All policy lives in the planner; this loop only gathers observations, runs the decision, and
//! reports. It reacts to changes of the input annotations (its own writes do not wake it), to the
//! running transaction, to retry timers and to `streamctl reconcile`. Preflight and the staging
//! transaction are in `staging.rs`, what wakes the loop and how each is handled in
//! `event_loop.rs`, the reboot handshake and the after-boot outcome in `reboot.rs`;
//! everything that can take long (reading deployments, preflight, verification, removing a
//! stage, finalizing) runs in a task and comes back as an event (`work.rs`, `task.rs`). What the
//! agent is doing and when it retries is the sans-I/O core's (`core.rs`); the reported status
//! has one writer (`report.rs`). docs/architecture.md draws the whole.

mod core;
mod event_loop;
pub mod gather;
mod images;
pub mod planner;
pub mod preflight;
mod readiness;
mod reboot;
mod report;
mod staging;
mod task;
mod work;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::backend::Backend;
use crate::backend::Deployment;
use crate::backend::rpmostree::UpdateDeploymentCall;
use crate::backoff::Backoff;
use crate::cluster::node::{CredentialsError, EventType, NodeClient};
use crate::cluster::protocol::{CheckId, CheckInputs, Inputs, Mode, State};
use crate::cluster::report::{PatchFailure, Reporter};
use crate::cluster::status::Status;
use crate::cluster::streams::{Catalog, ResolveError};
use crate::config::RebootPolicy;
use crate::dbus_api::{self, Request};
use crate::host::attempt;
use crate::host::facts::{self, HostRoot};
use core::{Core, Effect, Event, Notice, OnSaveError, Retry, Step};
use gather::{Gatherer, Transient};
use planner::{Decision, Lifecycle, Observation};
use report::Report;
use task::Task;
use work::Outcome;

/// How rpm-ostree refuses a rebase onto the refspec the pending deployment already has.
const REFS_EQUAL: &str = "Old and new refs are equal";
/// While a foreign rpm-ostree transaction runs: 1 s doubling to 30 s.
const BUSY_BACKOFF: Backoff = Backoff::new(core::MIN_BACKOFF, Duration::from_secs(30));

/// The agent's part of the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// When the staged OS is applied.
    pub policy: RebootPolicy,
    /// Reboots into one request before it is refused.
    pub max_attempts: u32,
    /// New stagings of one request after its transaction failed on the network.
    pub pull_retries: u32,
    /// Where the attempt record lives.
    pub state_dir: std::path::PathBuf,
    /// Resolve a stream-only request through the cluster's OSImageStream.
    pub resolve_streams: bool,
    /// Longest delay before staging a digest change of the node's stream.
    pub resolve_spread: Duration,
    /// Who manages the node's OS.
    pub mode: crate::config::ModeChoice,
}

/// Everything the agent needs from outside.
pub struct Agent {
    node: NodeClient,
    backend: Backend,
    host: HostRoot,
    gatherer: Gatherer,
    api: dbus_api::Api,
    requests: mpsc::Receiver<Request>,
    events: mpsc::Sender<(EventType, &'static str, String)>,
    /// The reported status; nothing else writes it.
    report: Report,
    reporter: Reporter,
    inputs: Option<Inputs>,
    /// What the agent is doing, and all its timers (sans I/O, see `core.rs`).
    core: Core,
    /// The task or transaction of the step the core says runs.
    task: Option<Task>,
    /// Held by every preflight run, the agent's and `streamctl preflight`'s: they share the
    /// extraction directory, whose other images' RPMs a run removes.
    preflight_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The Node object was read at least once.
    node_seen: bool,
    /// A client was built once (later loads are rotations).
    credentials_loaded: bool,
    reboot: Settings,
    /// The node's input annotations as written (before stream resolution).
    raw_inputs: Inputs,
    /// The cluster's streams, once read (resolution mode only).
    catalog: Option<Catalog>,
    /// Why the request cannot be resolved right now, if it cannot.
    unresolved: Option<String>,
    /// The annotations `inputs` was resolved from.
    resolved_from: Inputs,
    store: attempt::Store,
    boot_id: String,
    /// The signal that the machine-config daemon manages the node, if any.
    mcd: Option<facts::mcd::McdSignal>,
    /// The MachineConfig the machine-config daemon applied, read (readiness.rs) only while its
    /// operator's move is checked: readiness mode on a node with `mcd`.
    machine_config:
        Result<Option<facts::machineconfig::AppliedConfig>, facts::machineconfig::AppliedError>,
    /// The node's `check-*` keys as written.
    checks: CheckInputs,
    /// The `check-*` error last reported in manage mode (reported once).
    check_error: Option<String>,
    /// The plan the published readiness answers (see `readiness.rs`).
    readiness_key: Option<String>,
    /// The digest whose bootloader update ran this boot, and its failure, if it failed.
    bootloader: Option<(String, Option<String>)>,
    /// The image policy needed the cluster's streams once: they are watched from then on.
    images_watch: bool,
    /// The request waits for the cluster's streams, which the image policy needs to judge it.
    images_waiting: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.node)
            .field("state", &self.report.status().state)
            .field("activity", self.core.activity())
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Builds the agent and exports the D-Bus API.
    pub async fn new(
        node: NodeClient,
        backend: Backend,
        gatherer: Gatherer,
        reboot: Settings,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let host = gatherer.host.clone();
        // Without the boot id a restart cannot be told from a reboot; refuse to run blind.
        let boot_id = host
            .boot_id()
            .context("reading the boot id (/proc/sys/kernel/random/boot_id)")?;
        let (req_tx, requests) = mpsc::channel(1);
        let status = Status {
            node: node.name().to_string(),
            host: Some(facts::gather(&host, backend.kind(), None)),
            last_change: unix_now(),
            ..Status::default()
        };
        let api = dbus_api::Api::export(backend.connection(), status.clone(), req_tx).await?;
        let events = spawn_event_sender(node.clone());
        Ok(Agent {
            node,
            backend,
            host,
            gatherer,
            api,
            requests,
            events,
            report: Report::new(status),
            reporter: Reporter::default(),
            inputs: None,
            core: Core::default(),
            task: None,
            preflight_lock: std::sync::Arc::default(),
            node_seen: false,
            credentials_loaded: false,
            raw_inputs: Inputs::default(),
            catalog: None,
            unresolved: None,
            resolved_from: Inputs::default(),
            store: attempt::Store::new(&reboot.state_dir),
            reboot,
            boot_id,
            mcd: None,
            machine_config: Ok(None),
            checks: CheckInputs::default(),
            check_error: None,
            readiness_key: None,
            bootloader: None,
            images_watch: false,
            images_waiting: false,
        })
    }

    /// Loads or reloads the cluster credentials; true when a new client was built. Schedules
    /// the next look at the files.
    async fn load_credentials(&mut self) -> bool {
        let result = self.node.load().await;
        let loaded = self.node.client().is_some();
        self.core.handle(Event::CredentialsLoaded {
            now: Instant::now(),
            client: loaded,
            new: matches!(result, Ok(true)),
        });
        match result {
            Ok(true) => {
                info!(
                    reload = self.credentials_loaded,
                    "cluster credentials loaded"
                );
                self.credentials_loaded = true;
                true
            }
            Ok(false) => false,
            Err(e) if loaded => {
                // Keep the working client: a rotation may be half-written.
                warn!(error = %e, "reloading cluster credentials failed; keeping the loaded ones");
                false
            }
            Err(e) => {
                let reason = match &e {
                    CredentialsError::Missing(_) => format!("waiting for the kubeconfig: {e}"),
                    CredentialsError::Invalid(_) => format!("waiting for a usable kubeconfig: {e}"),
                };
                self.waiting(reason).await;
                false
            }
        }
    }

    /// Reports why streamd is not (yet) acting on its Node, before the Node was read: on
    /// D-Bus, in `STATUS=` and in the journal. The annotations are not touched (they cannot be
    /// written, and the state before the first read would overwrite the node's real one).
    async fn waiting(&mut self, reason: String) {
        if self.report.status().reason == reason {
            return;
        }
        warn!(%reason, "not acting on the node yet");
        notify_status(self.report.status().state, &reason);
        self.report.set_reason(reason);
        if let Err(e) = self.api.publish(self.report.status()).await {
            warn!(error = %e, "publishing status on d-bus failed");
        }
    }

    async fn on_node(&mut self, annotations: &std::collections::BTreeMap<String, String>) {
        self.reporter.observe_node(annotations);
        self.raw_inputs = Inputs::from_annotations(annotations);
        self.observe_mode(annotations);
        if !self.node_seen {
            self.node_seen = true;
            info!(node = self.node.name(), "watching node");
        }
        self.inputs_changed().await;
    }

    /// Acts on the effective request when the node's inputs or the cluster's streams change.
    async fn inputs_changed(&mut self) {
        if self.report.status().mode == Mode::Readiness {
            self.hold_readiness().await;
            return;
        }
        let resolved = if self.reboot.resolve_streams {
            crate::cluster::streams::resolve(&self.raw_inputs, self.catalog.as_ref())
        } else {
            Ok(self.raw_inputs.clone())
        };
        match resolved {
            Ok(inputs) => {
                if self.unresolved.is_none() && self.inputs.as_ref() == Some(&inputs) {
                    // Our own write, or a change of keys streamd does not read. If someone
                    // edited our output keys, the reporter now sees the difference and the next
                    // flush restores them.
                    return;
                }
                debug!(?inputs, "request changed");
                // A new request or approval may try a failed bootloader update again.
                self.bootloader = None;
                let previous = self.inputs.as_ref().map(|i| (&self.resolved_from, i));
                let spread = crate::cluster::streams::catalog_refresh(
                    previous.filter(|_| self.unresolved.is_none()),
                    &self.raw_inputs,
                    &inputs,
                )
                .then(|| {
                    let delay = crate::cluster::streams::spread_delay(
                        self.reboot.resolve_spread,
                        self.node.name(),
                        &inputs,
                    );
                    info!(delay_s = delay.as_secs(), "the cluster changed the stream's images; spreading the staging");
                    let reason = format!(
                        "the cluster's OSImageStream changed the images of stream {}; staging in {} s (this node's share of resolve-spread-seconds = {}, so the fleet does not pull at once)",
                        crate::text::quote(inputs.stream.as_deref().unwrap_or_default()),
                        delay.as_secs(),
                        self.reboot.resolve_spread.as_secs()
                    );
                    (Instant::now() + delay, reason)
                });
                self.core.handle(Event::Spread(spread));
                self.resolved_from = self.raw_inputs.clone();
                self.unresolved = None;
                self.inputs = Some(inputs);
                self.core.handle(Event::Recovered(Retry::Transient));
                self.reconcile().await;
            }
            Err(e) => {
                let reason = format!("resolving stream through the cluster's OSImageStream: {e}");
                if self.unresolved.as_deref() == Some(reason.as_str()) {
                    return;
                }
                warn!(%reason, "request cannot be resolved");
                self.unresolved = Some(reason.clone());
                self.inputs = None;
                self.report.set_unresolved(self.raw_inputs.stream.clone());
                self.hold().await;
                let state = match e {
                    // The first read of the streams is on its way; nothing to report yet.
                    ResolveError::Pending => return,
                    e if e.refuses() => State::Refused,
                    _ => State::Degraded,
                };
                self.set_state(state, reason).await;
            }
        }
    }

    /// Decides again on the effective request: the core says whether the deployments are read
    /// now, once the running step is done, or not at all.
    #[tracing::instrument(skip_all, fields(request = tracing::field::Empty))]
    async fn reconcile(&mut self) {
        if self.report.status().mode == Mode::Readiness {
            self.hold_readiness().await;
            return;
        }
        if self.unresolved.is_some() {
            // Reported when it was found; a change of the inputs or the streams acts again.
            return;
        }
        let inputs = self.inputs.clone().unwrap_or_default();
        let request = inputs.desired().ok().flatten().map(|d| d.observed_hash());
        if let Some(r) = &request {
            tracing::Span::current().record("request", tracing::field::display(r));
        }
        self.report.set_desired(&inputs, request.clone());
        let effects = self.core.handle(Event::Reconcile {
            now: Instant::now(),
            request,
        });
        self.execute(effects).await;
    }

    /// Does what the core asked for.
    async fn execute(&mut self, effects: Vec<Effect>) {
        let mut reconcile = false;
        for effect in effects {
            match effect {
                Effect::SaveAttempt { record, on_error } => {
                    if let Err(e) = self.store.save(&record) {
                        match on_error {
                            OnSaveError::Log(failed) => warn!(error = %e, "{failed}"),
                            OnSaveError::Degrade => {
                                self.set_state(State::Degraded, e.to_string()).await;
                                break;
                            }
                        }
                    }
                }
                Effect::Observe => {
                    let backend = self.backend.clone();
                    self.task = Some(Task::spawn(async move {
                        Outcome::Observed(backend.deployments().await)
                    }));
                }
                Effect::Abort => {
                    info!("request changed during read-only work; dropping it");
                    if let Some(task) = self.task.take() {
                        task.abort();
                    }
                }
                Effect::CancelStaging => {
                    info!("cancelling the staging transaction");
                    if let Some(task) = &self.task {
                        task.cancel();
                    }
                }
                Effect::Publish => self.publish().await,
                Effect::Retry {
                    retry,
                    reason,
                    delay,
                } => self.report_retry(retry, reason, delay).await,
                Effect::Spreading { reason } => {
                    // A request for the old images must not be approved meanwhile.
                    self.request_reboot(None, None).await;
                    self.set_state(State::Preflight, reason).await;
                }
                Effect::Reconcile => reconcile = true,
                Effect::PostEvent(n) => {
                    let _ = self.events.try_send((n.kind, n.reason, n.message));
                }
                Effect::Flush => self.flush().await,
                Effect::SetState {
                    state,
                    reason,
                    notice,
                } => self.set_state_event(state, reason, notice).await,
                Effect::SetAttempts(n) => self.report.set_attempts(n),
                Effect::Stage {
                    request,
                    plan,
                    expect,
                } => self.start_staging(*plan, request, expect.map(|e| *e)).await,
                Effect::Apply {
                    request,
                    digest,
                    attempt,
                    before,
                } => {
                    let applying = work::Applying {
                        record: *before,
                        digest,
                        attempt,
                    };
                    self.start_apply(request, applying);
                }
                Effect::Then(event) => {
                    let more = self.core.handle(*event);
                    Box::pin(self.execute(more)).await;
                }
                Effect::Verify { request, expect } => self.start_verify(request, *expect),
            }
        }
        if reconcile {
            Box::pin(self.reconcile()).await;
        }
    }

    /// Starts `step` (a decision's next one) in a task.
    fn start(
        &mut self,
        step: Step,
        work: impl std::future::Future<Output = Outcome> + Send + 'static,
    ) {
        let effects = self.core.handle(Event::Started(step));
        debug_assert!(effects.is_empty(), "starting a step has no effects");
        self.task = Some(Task::spawn(work));
    }

    /// A request that is not acted on now: its transaction, if one runs, is cancelled.
    async fn hold(&mut self) {
        let effects = self.core.handle(Event::Hold);
        self.execute(effects).await;
    }

    /// Tells the core that the running step ended (`failed`: its task failed, and why).
    async fn ended(&mut self, failed: Option<String>) {
        let effects = self.core.handle(Event::Ended {
            now: Instant::now(),
            failed,
        });
        self.execute(effects).await;
    }

    /// Tells the core that the ended step's result was acted on.
    async fn settle(&mut self) {
        let effects = self.core.handle(Event::Settled);
        self.execute(effects).await;
    }

    /// Retries after the back-off `retry`'s next delay, reporting `reason`.
    async fn fail(&mut self, retry: Retry, reason: String) {
        let effects = self.core.handle(Event::Failed {
            now: Instant::now(),
            retry,
            reason,
            jitter: crate::backoff::jitter(),
        });
        self.execute(effects).await;
    }

    /// Decides again after `delay`, whatever the back-offs say.
    fn retry_after(&mut self, delay: Duration) {
        self.core.handle(Event::RetryAt(Instant::now() + delay));
    }

    /// Carries on with what a piece of work found.
    async fn on_work(&mut self, outcome: Outcome) {
        match outcome {
            // Work that would go on to stage: never in readiness mode (the mode can change
            // while it runs).
            Outcome::Observed(_) | Outcome::Prepared(..) | Outcome::ForeignRemoved(..)
                if self.report.status().mode == Mode::Readiness =>
            {
                self.hold_readiness().await;
            }
            Outcome::Checked(run) => self.on_checked(*run).await,
            Outcome::BootloaderUpdated(digest, result) => {
                self.on_bootloader_updated(digest, result).await;
            }
            Outcome::Observed(Ok(deployments)) => self.decide(deployments).await,
            Outcome::Observed(Err(e)) => {
                self.transient_failure(format!("reading deployments: {e}"))
                    .await;
            }
            Outcome::Prepared(run, result) => self.on_prepared(*run, result).await,
            Outcome::ForeignRemoved(start, result) => self.on_foreign_removed(*start, result).await,
            Outcome::Verified(result) => self.on_verified(result).await,
            Outcome::CleanedUp(record, result) => self.on_cleaned_up(*record, result).await,
            Outcome::Applied(applying, result) => self.on_applied(*applying, result).await,
        }
    }

    /// Decides on freshly read deployments and acts.
    #[tracing::instrument(skip_all, fields(request = tracing::field::Empty))]
    async fn decide(&mut self, deployments: Vec<Deployment>) {
        self.observe_deployments(&deployments);
        if self.unresolved.is_some() {
            // The request became unresolvable while the deployments were read: that is what
            // the node reports (set when it was found), not a decision on an empty request.
            return;
        }
        let inputs = self.inputs.clone().unwrap_or_default();
        let desired = inputs.desired();
        if let Ok(Some(d)) = &desired {
            tracing::Span::current().record("request", tracing::field::display(d.observed_hash()));
        }
        let mut record = match self.store.load() {
            Ok(r) => r,
            Err(e) => {
                // Without the record streamd cannot count reboots: stage nothing, reboot nothing.
                self.set_state(State::Degraded, e.to_string()).await;
                return;
            }
        };
        // A stage kept for a new request that wants the same image (A → B with equal OS images)
        // becomes that request's staging, with a new id: no approval of the earlier request
        // fits it, nor, after B → A, one of A's before.
        if let (Ok(Some(d)), Some(staged)) = (&desired, record.staged.as_mut()) {
            let hash = d.observed_hash();
            if staged.request != hash && staged.os_image == d.os_image.to_string() {
                staged.request = hash;
                staged.id = Some(attempt::new_id());
                if let Err(e) = self.store.save(&record) {
                    self.set_state(State::Degraded, e.to_string()).await;
                    return;
                }
            }
        }
        let boot_id = self.boot_id.clone();
        let d = desired.as_ref().ok().and_then(Option::as_ref);
        let locks = d.map_or_else(
            || self.backend.locks(),
            |d| self.backend.locks_for(&deployments, d.os_image.digest()),
        );
        let obs = Observation {
            desired: &desired,
            deployments: &deployments,
            allow_downgrade: self.gatherer.policy.allow_downgrade,
            backend: self.backend.kind(),
            lifecycle: Lifecycle {
                policy: self.reboot.policy,
                max_attempts: self.reboot.max_attempts,
                boot_id: &boot_id,
                record: &record,
                approved: inputs.reboot_approved.as_deref(),
                locks,
            },
        };
        let decision = planner::decide(&obs);
        debug!(?decision, locks, "decided");
        self.observe_handshake(
            &decision,
            d,
            &record,
            inputs.reboot_approved.as_deref(),
            locks,
        )
        .await;
        match decision {
            // A stage of ours from a staging that failed for good is removed, not checked: a
            // failed transaction can leave its deployment staged (rpm-ostree v2025.5 stages a
            // plain rebase before its sanity check, seen on the real daemon), and an unlocked
            // one would boot at the next reboot. The next pass reports the failure.
            Decision::Verify if self.gave_up(&record).is_some() => {
                self.cleanup_stale(record).await;
            }
            // Failed for good before (maybe before a restart): not pulled again.
            Decision::Stage(_) if let Some(reason) = self.gave_up(&record) => {
                self.set_state(State::Degraded, reason).await;
            }
            Decision::Stage(base) => self.preflight_and_stage(&obs, base).await,
            Decision::CleanupStale => self.cleanup_stale(record).await,
            Decision::Verify => self.verify_recorded(&record).await,
            Decision::RolledBack { attempts, retry } => {
                self.rolled_back(record, attempts, retry).await;
            }
            Decision::Reboot { digest, attempt } => {
                if let Some(d) = d {
                    self.finalize(d, record, digest, attempt).await;
                }
            }
            Decision::Done { applied } => self.done(applied, record).await,
            settled => {
                let staged = self
                    .report
                    .status()
                    .staged_os_image
                    .as_deref()
                    .unwrap_or_default();
                if let Some((state, reason)) = settled.settled(staged) {
                    self.set_state(state, reason).await;
                }
            }
        }
    }

    /// Why staging (or the on-disk check of the stage) failed for good for the current request,
    /// when it did.
    fn gave_up(&self, record: &attempt::Record) -> Option<String> {
        record
            .failure
            .as_ref()
            .filter(|f| {
                Some(f.request.as_str()) == self.report.status().observed_desired.as_deref()
            })
            .and_then(|f| f.gave_up.clone())
    }

    fn observe_deployments(&mut self, deployments: &[Deployment]) {
        let booted = deployments.iter().find(|d| d.booted);
        // Only the kernel variant can change without a reboot (a staged override is not booted,
        // but a restart after one is); the rest was gathered at start.
        self.report.set_deployments(
            booted
                .and_then(Deployment::pullspec)
                .unwrap_or_default()
                .to_string(),
            readiness::booted_stream(&self.host, deployments),
            booted.and_then(|b| facts::kernel_variant(&self.host, b).ok()),
            deployments
                .iter()
                .find(|d| d.staged)
                .and_then(|d| d.pullspec().map(String::from)),
        );
    }

    /// Preflight and plan for a request, without acting: what `streamctl preflight` and
    /// `streamctl plan` show. The returned future owns what it needs, so it runs in a task of
    /// its own.
    fn dry_run(
        &self,
        given: std::collections::HashMap<String, String>,
    ) -> impl std::future::Future<Output = serde_json::Value> + Send + 'static {
        let current = self.inputs.clone().unwrap_or_default();
        let backend = self.backend.clone();
        let gatherer = self.gatherer.clone();
        let facts = self.report.status().host.clone();
        let store = self.store.clone();
        let lock = self.preflight_lock.clone();
        let catalog = self.catalog.clone();
        async move {
            let _one_at_a_time = lock.lock().await;
            let inputs = if given.is_empty() {
                current
            } else {
                let unknown: Vec<&String> = given
                    .keys()
                    .filter(|k| !["stream", "os-image", "extensions-image"].contains(&k.as_str()))
                    .collect();
                if !unknown.is_empty() {
                    return serde_json::json!({"error": format!("unknown keys {unknown:?}: use stream, os-image, extensions-image")});
                }
                Inputs {
                    stream: given.get("stream").cloned(),
                    os_image: given.get("os-image").cloned(),
                    extensions_image: given.get("extensions-image").cloned(),
                    reboot_approved: None,
                }
            };
            let desired = match inputs.desired() {
                Ok(Some(d)) => d,
                Ok(None) => {
                    return serde_json::json!({"error": "no request: give a stream and an OS image"});
                }
                Err(e) => return serde_json::json!({"error": e.to_string()}),
            };
            let deployments = match backend.deployments().await {
                Ok(d) => d,
                Err(e) => {
                    return serde_json::json!({"error": format!("reading deployments: {e}")});
                }
            };
            let Some(facts) = facts else {
                return serde_json::json!({"error": "the host facts are not known yet"});
            };
            let record = store.load().unwrap_or_default();
            let checked = readiness::check_only(
                &gatherer,
                &facts,
                &deployments,
                &record,
                &desired,
                catalog.as_ref(),
            );
            match checked.await {
                Err(Transient(e)) => serde_json::json!({"error": e}),
                Ok(p) => serde_json::json!({
                    "backend": backend.kind().as_str(),
                    "locks": backend.locks(),
                    "checks": p.checks,
                    "plan": p.plan.as_ref().map(UpdateDeploymentCall::for_plan),
                }),
            }
        }
    }

    async fn transient_failure(&mut self, reason: String) {
        self.fail(Retry::Transient, reason).await;
    }

    /// Reports a failure `retry`'s back-off retries after `delay`: `Degraded`, except a registry
    /// failure during preflight, which keeps the state and says when it reads again.
    async fn report_retry(&mut self, retry: Retry, reason: String, delay: Duration) {
        match retry {
            Retry::Transient => {
                warn!(%reason, retry_in = ?delay, "transient failure");
                self.set_state(
                    State::Degraded,
                    format!("{reason}; retrying in {}s", delay.as_secs()),
                )
                .await;
            }
            Retry::Finalize => {
                let reason = format!(
                    "{reason}; nothing was applied, asked again in {}s (streamctl reconcile asks at once)",
                    delay.as_secs()
                );
                warn!(%reason, "the os daemon refused the finalization");
                self.set_state(State::Degraded, reason).await;
            }
            Retry::Registry => {
                warn!(error = %reason, retry_in = ?delay, "preflight could not reach the registry");
                self.set_reason(format!("{reason}; retrying in {}s", delay.as_secs()))
                    .await;
            }
        }
    }

    async fn set_state(&mut self, state: State, reason: String) {
        self.set_state_event(state, reason, None).await;
    }

    /// Says what happens now, in the state the agent is in (progress, a retry's wait).
    async fn set_reason(&mut self, reason: String) {
        self.report.set_reason(reason);
        self.publish().await;
    }

    /// Reports `Refused` because the checks `failed` failed; `reason` tells the first.
    async fn set_refused_by_checks(&mut self, failed: Vec<CheckId>, reason: String) {
        self.set_state_with(State::Refused, reason, failed, None)
            .await;
    }

    /// Like [`Self::set_state`], posting `event` instead of the state's usual one.
    async fn set_state_event(&mut self, state: State, reason: String, event: Option<Notice>) {
        self.set_state_with(state, reason, Vec::new(), event).await;
    }

    /// The one writer of the reported state, reason and failed checks.
    async fn set_state_with(
        &mut self,
        state: State,
        reason: String,
        failed_checks: Vec<CheckId>,
        event: Option<Notice>,
    ) {
        let change = self
            .report
            .set_state(state, reason.clone(), failed_checks, unix_now());
        if change.text {
            notify_status(state, &reason);
        }
        if change.state {
            let s = self.report.status();
            crate::logging::log_state(
                state,
                &reason,
                s.desired_stream.as_deref().unwrap_or(&s.current_stream),
                s.desired_os_image.as_deref().unwrap_or(&s.current_os_image),
                self.node.name(),
            );
        }
        let effects = self.core.handle(Event::Reported {
            state,
            reason,
            entered: change.state,
            notice: event,
        });
        // Boxed: executing an effect can set a state again.
        Box::pin(self.execute(effects)).await;
    }

    async fn publish(&mut self) {
        self.reporter.set(self.report.status());
        if let Err(e) = self.api.publish(self.report.status()).await {
            warn!(error = %e, "publishing status on d-bus failed");
        }
    }

    fn flush_at(&self) -> Option<Instant> {
        self.core.flush_at(self.reporter.due_at(Instant::now()))
    }

    async fn flush(&mut self) {
        let Some(patch) = self.reporter.pending_patch() else {
            return;
        };
        match self.node.patch(&patch).await {
            Ok(annotations) => {
                self.reporter.patched(Instant::now(), &annotations);
                if self.core.patch_retry_at().is_some() {
                    info!("patching node annotations works again");
                }
                self.core.handle(Event::Patched);
            }
            Err(e) => {
                let now = Instant::now();
                self.core.handle(Event::PatchFailed {
                    now,
                    failure: PatchFailure::from(&e),
                    jitter: crate::backoff::jitter(),
                });
                let delay = self
                    .core
                    .patch_retry_at()
                    .map_or(Duration::ZERO, |at| at - now);
                if e.is_transient() {
                    warn!(
                        error = %e,
                        status = e.status(),
                        retry_after = ?e.retry_after(),
                        retry_in = ?delay,
                        "patching node annotations failed; will retry"
                    );
                } else {
                    tracing::error!(
                        error = %e,
                        status = e.status(),
                        retry_in = ?delay,
                        "the api server rejected the node annotation patch; will retry slowly"
                    );
                }
            }
        }
    }
}

/// Events go through a small queue to their own task: posting them never blocks the state
/// machine, and when the queue is full or the rate limit is reached they are dropped (the
/// annotations carry the truth).
fn spawn_event_sender(node: NodeClient) -> mpsc::Sender<(EventType, &'static str, String)> {
    let (tx, mut rx) = mpsc::channel::<(EventType, &'static str, String)>(16);
    tokio::spawn(async move {
        let mut limiter = crate::cluster::report::EventLimiter::default();
        while let Some((kind, reason, message)) = rx.recv().await {
            if !limiter.allow(Instant::now(), reason, &message) {
                debug!(reason, "event dropped by the rate limit");
                continue;
            }
            if let Err(e) = node.event(kind, reason, &message).await {
                warn!(error = format!("{e:#}"), reason, "posting event failed");
            }
        }
    });
    tx
}

/// Sends `STATUS=<state>: <reason>` to systemd (one bounded line).
fn notify_status(state: State, reason: &str) {
    crate::notify::status(&format!("{state}: {reason}"));
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
