//! The agent loop: node watch in, decisions out, one staging transaction at a time.
//!
//! All policy lives in the planner; this loop only gathers observations, runs the decision, and
//! reports. It reacts to changes of the input annotations (its own writes do not wake it), to the
//! running transaction, to retry timers and to `streamctl reconcile`.

use std::pin::pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tracing::{debug, info, warn};

use crate::attempt::{self, Attempt, Record};
use crate::backend::{Backend, BackendError};
use crate::config::RebootPolicy;
use crate::dbus_api::{self, Request};
use crate::gather::{Gatherer, Transient};
use crate::hostfacts::{self, HostRoot};
use crate::kubeclient::{EventType, NodeClient, NodeUpdate};
use crate::planner::{self, Decision, Lifecycle, Observation};
use crate::protocol::{Inputs, State};
use crate::report::Reporter;
use crate::rpmostree::{Deployment, RpmOstreeError, TxnEvent, UpdateDeploymentCall};
use crate::status::Status;
use crate::streams::{Catalog, ResolveError, StreamsUpdate};

/// How rpm-ostree refuses a rebase onto the refspec the pending deployment already has.
const REFS_EQUAL: &str = "Old and new refs are equal";
/// First delay after a transient failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// Longest delay between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait for a foreign rpm-ostree transaction before asking again.
const BUSY_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First delay after a registry or DNS failure during preflight.
const REGISTRY_MIN_BACKOFF: Duration = Duration::from_secs(10);
/// Longest delay between preflight retries.
const REGISTRY_MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The agent's part of the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// When the staged OS is applied.
    pub policy: RebootPolicy,
    /// Reboots into one request before it is refused.
    pub max_attempts: u32,
    /// Where the attempt record lives.
    pub state_dir: std::path::PathBuf,
    /// Resolve a stream-only request through the cluster's OSImageStream.
    pub resolve_streams: bool,
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
    status: Status,
    reporter: Reporter,
    inputs: Option<Inputs>,
    staging: Option<Staging>,
    retry_at: Option<Instant>,
    backoff: Duration,
    registry_backoff: Duration,
    patch_retry_at: Option<Instant>,
    patch_backoff: Duration,
    ready: bool,
    reboot: Settings,
    /// The request for which "Old and new refs are equal" was already taken as "staged meanwhile".
    refs_equal_seen: Option<String>,
    /// The node's input annotations as written (before stream resolution).
    raw_inputs: Inputs,
    /// The cluster's streams, once read (resolution mode only).
    catalog: Option<Catalog>,
    /// Why the request cannot be resolved right now, if it cannot.
    unresolved: Option<String>,
    store: attempt::Store,
    boot_id: String,
}

/// The running staging transaction.
struct Staging {
    /// The request it stages (observed-desired hash).
    hash: String,
    /// What the staged deployment must look like, and the digest the request pins.
    expect: Option<(crate::verify::Expectation, String)>,
    task: JoinHandle<Result<(), BackendError>>,
    progress: mpsc::Receiver<TxnEvent>,
    /// Set to true to cancel the transaction.
    cancel: tokio::sync::watch::Sender<bool>,
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
            host: Some(hostfacts::gather(&host, backend.kind(), None)),
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
            status,
            reporter: Reporter::default(),
            inputs: None,
            staging: None,
            retry_at: None,
            backoff: MIN_BACKOFF,
            registry_backoff: REGISTRY_MIN_BACKOFF,
            patch_retry_at: None,
            patch_backoff: MIN_BACKOFF,
            ready: false,
            refs_equal_seen: None,
            raw_inputs: Inputs::default(),
            catalog: None,
            unresolved: None,
            store: attempt::Store::new(&reboot.state_dir),
            reboot,
            boot_id,
        })
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let mut watch = pin!(self.node.watch());
        let mut streams = self
            .reboot
            .resolve_streams
            .then(|| Box::pin(crate::streams::watch(self.node.client())));
        let mut shutdown = pin!(shutdown);
        // WATCHDOG=1 comes from this loop itself, so a wedged loop is restarted by systemd.
        let mut watchdog = watchdog_interval().map(tokio::time::interval);
        loop {
            let flush_at = self.flush_at();
            tokio::select! {
                upd = watch.next() => match upd {
                    Some(NodeUpdate::Annotations(a)) => self.on_node(&a).await,
                    Some(NodeUpdate::Deleted) => warn!(node = self.node.name(), "node object deleted"),
                    Some(NodeUpdate::Error(e)) => warn!(error = %e, "node watch failed; retrying"),
                    None => anyhow::bail!("the node watch ended"),
                },
                upd = next_opt(&mut streams) => match upd {
                    Some(StreamsUpdate::Catalog(c)) => {
                        debug!(catalog = ?c, "os image streams changed");
                        self.catalog = Some(c);
                        self.inputs_changed().await;
                    }
                    Some(StreamsUpdate::Error(e)) => warn!(error = %e, "osimagestream watch failed; retrying"),
                    None => anyhow::bail!("the osimagestream watch ended"),
                },
                ev = staging_event(&mut self.staging) => match ev {
                    StagingEvent::Progress(ev) => self.on_progress(ev).await,
                    StagingEvent::Finished(res) => self.on_staged(res).await,
                },
                _ = sleep_opt(self.retry_at) => {
                    self.retry_at = None;
                    self.reconcile().await;
                }
                _ = sleep_opt(flush_at) => self.flush().await,
                Some(req) = self.requests.recv() => match req {
                    Request::Reconcile => {
                        info!("reconcile requested over d-bus");
                        self.reconcile().await;
                    }
                    Request::Preflight { inputs, reply } => {
                        let answer = self.dry_run(&inputs).await;
                        let _ = reply.send(answer.to_string());
                    }
                },
                _ = tick(&mut watchdog) => {
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                }
                () = &mut shutdown => break,
            }
        }
        info!("stopping");
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        // A running transaction keeps running in rpm-ostreed; the next start reads its result.
        self.flush().await;
        Ok(())
    }

    async fn on_node(&mut self, annotations: &std::collections::BTreeMap<String, String>) {
        self.reporter.observe_node(annotations);
        self.raw_inputs = Inputs::from_annotations(annotations);
        if !self.ready {
            self.ready = true;
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
            info!(node = self.node.name(), "watching node");
        }
        self.inputs_changed().await;
    }

    /// Acts on the effective request when the node's inputs or the cluster's streams change.
    async fn inputs_changed(&mut self) {
        let resolved = if self.reboot.resolve_streams {
            crate::streams::resolve(&self.raw_inputs, self.catalog.as_ref())
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
                self.unresolved = None;
                self.inputs = Some(inputs);
                self.backoff = MIN_BACKOFF;
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
                self.status.desired_stream = self.raw_inputs.stream.clone();
                self.status.desired_os_image = None;
                self.status.desired_extensions_image = None;
                self.status.observed_desired = None;
                if let Some(st) = &self.staging {
                    let _ = st.cancel.send(true);
                }
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

    async fn reconcile(&mut self) {
        if self.unresolved.is_some() {
            // Reported when it was found; a change of the inputs or the streams acts again.
            return;
        }
        let inputs = self.inputs.clone().unwrap_or_default();
        let desired = inputs.desired();
        self.status.desired_stream = inputs.stream.clone();
        self.status.desired_os_image = inputs.os_image.clone();
        self.status.desired_extensions_image = inputs.extensions_image.clone();
        self.status.observed_desired = desired
            .as_ref()
            .ok()
            .and_then(|d| d.as_ref().map(|d| d.observed_hash()));
        if let Some(st) = &self.staging {
            if self.status.observed_desired.as_deref() == Some(st.hash.as_str()) {
                return;
            }
            // A different request (or none) arrives mid-transaction: cancel it; rpm-ostreed
            // reports the end as Finished, and the reconcile after it acts on the new request.
            info!("request changed while staging; cancelling the transaction");
            let _ = st.cancel.send(true);
            self.publish().await;
            return;
        }
        let deployments = match self.backend.deployments().await {
            Ok(d) => d,
            Err(e) => {
                self.transient_failure(format!("reading deployments: {e}"))
                    .await;
                return;
            }
        };
        self.observe_deployments(&deployments);
        let record = match self.store.load() {
            Ok(r) => r,
            Err(e) => {
                // Without the record streamd cannot count reboots: stage nothing, reboot nothing.
                self.set_state(State::Degraded, e.to_string()).await;
                return;
            }
        };
        let boot_id = self.boot_id.clone();
        let obs = Observation {
            desired: &desired,
            deployments: &deployments,
            allow_downgrade: self.gatherer.policy.allow_downgrade,
            lifecycle: Lifecycle {
                policy: self.reboot.policy,
                max_attempts: self.reboot.max_attempts,
                boot_id: &boot_id,
                record: &record,
                approved: inputs.reboot_approved.as_deref(),
                locks: self.backend.locks(),
            },
        };
        let decision = planner::decide(&obs);
        debug!(?decision, "decided");
        let d = desired.as_ref().ok().and_then(Option::as_ref);
        self.observe_handshake(&decision, d, &record, inputs.reboot_approved.as_deref())
            .await;
        match decision {
            Decision::Stage(base) => {
                let (Some(d), Some(booted), Some(facts)) = (
                    d,
                    deployments.iter().find(|d| d.booted),
                    self.status.host.clone(),
                ) else {
                    return;
                };
                let foreign = obs.foreign_staged().cloned();
                self.set_state(State::Preflight, "running preflight checks".into())
                    .await;
                match self
                    .gatherer
                    .prepare(&facts, d, booted, foreign.as_ref(), base)
                    .await
                {
                    Err(Transient(msg)) => {
                        let delay = jittered(self.registry_backoff);
                        self.registry_backoff =
                            (self.registry_backoff * 2).min(REGISTRY_MAX_BACKOFF);
                        self.retry_at = Some(Instant::now() + delay);
                        warn!(error = %msg, retry_in = ?delay, "preflight could not reach the registry");
                        self.status.reason = format!("{msg}; retrying in {}s", delay.as_secs());
                        self.publish().await;
                    }
                    Ok(prepared) => {
                        self.registry_backoff = REGISTRY_MIN_BACKOFF;
                        for c in &prepared.checks {
                            debug!(check = c.id, result = ?c.result, message = %c.message, "preflight");
                        }
                        match (
                            prepared.plan,
                            crate::preflight::first_failure(&prepared.checks),
                        ) {
                            (Some(plan), _) => {
                                // Without a finalization lock, staging waits for the approval.
                                let token = d.reboot_token(&self.boot_id);
                                if !self.backend.locks()
                                    && self.reboot.policy == RebootPolicy::OnApproval
                                    && inputs.reboot_approved.as_deref() != Some(token.as_str())
                                {
                                    self.request_reboot(Some(token.clone()), None).await;
                                    self.set_state(
                                        State::Staged,
                                        format!(
                                            "preflight passed; {} cannot lock a staged deployment, so {} is staged only after the reboot is approved: set reboot-approved to {token}",
                                            self.backend.kind().as_str(),
                                            plan.os_image
                                        ),
                                    )
                                    .await;
                                    return;
                                }
                                // Allowed by replace-foreign-staged: remove it first, because
                                // rpm-ostree refuses a rebase onto the refspec the pending
                                // deployment already has ("Old and new refs are equal").
                                if let Some(f) = &foreign {
                                    info!(staged = %f.id, "replacing a staged deployment streamd did not create");
                                    if let Err(e) = self.backend.cleanup_pending().await {
                                        self.transient_failure(format!(
                                            "removing the foreign staged deployment {}: {e}",
                                            f.id
                                        ))
                                        .await;
                                        return;
                                    }
                                }
                                // Remember the staging before it starts: a staged deployment
                                // found after a crash is then known to be ours.
                                let mut rec = record.clone();
                                rec.staged = Some(attempt::Staged {
                                    request: d.observed_hash(),
                                    os_image: plan.os_image.to_string(),
                                });
                                if rec
                                    .attempt
                                    .as_ref()
                                    .is_some_and(|a| a.request != d.observed_hash())
                                {
                                    rec.attempt = None;
                                }
                                if let Err(e) = self.store.save(&rec) {
                                    self.set_state(State::Degraded, e.to_string()).await;
                                    return;
                                }
                                info!(call = %serde_json::to_string(&UpdateDeploymentCall::for_plan(&plan)).unwrap_or_default(), backend = self.backend.kind().as_str(), "staging");
                                let hash = self.status.observed_desired.clone().unwrap_or_default();
                                let expect = prepared
                                    .expect
                                    .map(|e| (e, plan.os_image.digest().to_string()));
                                self.start_staging(plan, hash, expect).await;
                            }
                            (None, Some(f)) => {
                                crate::logging::log_preflight_failed(
                                    f.id,
                                    &f.message,
                                    self.status.desired_stream.as_deref().unwrap_or_default(),
                                    self.status.desired_os_image.as_deref().unwrap_or_default(),
                                    self.node.name(),
                                );
                                let reason =
                                    format!("preflight check {} failed: {}", f.id, f.message);
                                self.request_reboot(None, None).await;
                                self.set_state(State::Refused, reason).await;
                            }
                            (None, None) => {
                                self.set_state(State::Refused, "preflight produced no plan".into())
                                    .await;
                            }
                        }
                    }
                }
            }
            Decision::CleanupStale => self.cleanup_stale(record).await,
            Decision::RolledBack { attempts, retry } => {
                self.rolled_back(record, attempts, retry).await;
            }
            Decision::Reboot { digest, attempt } => {
                if let Some(d) = d {
                    self.finalize(d, record, digest, attempt).await;
                }
            }
            Decision::Done { applied } => {
                // The target booted; what the node was (variant kernel, FIPS) must have come
                // along. A mismatch is reported and nothing is done: never a reboot loop.
                let checked = record.attempt.as_ref().filter(|_| applied).map(|a| {
                    self.status
                        .host
                        .as_ref()
                        .map_or(Ok(()), |facts| crate::verify::after_boot(a, facts))
                });
                if let Some(Err(problem)) = checked {
                    warn!(%problem, "the new boot does not match the node before the update");
                    self.set_state(
                        State::Degraded,
                        format!(
                            "booted {} but {problem}; not rebooting again: inspect the node",
                            self.status.current_os_image
                        ),
                    )
                    .await;
                    return;
                }
                if applied {
                    let rec = Record {
                        attempt: None,
                        staged: None,
                        ..record
                    };
                    if let Err(e) = self.store.save(&rec) {
                        warn!(error = %e, "clearing the attempt record failed");
                    }
                    self.status.attempts = 0;
                    let image = self.status.current_os_image.clone();
                    self.set_state_event(
                        State::Done,
                        String::new(),
                        Some((EventType::Normal, "Applied", format!("booted {image}"))),
                    )
                    .await;
                } else {
                    self.set_state(State::Done, String::new()).await;
                }
            }
            other => {
                let reason = match &other {
                    Decision::Refuse(r) => r.clone(),
                    Decision::AwaitApproval { token } => format!(
                        "staged {} ({}); waiting for reboot approval: set reboot-approved to {token}",
                        self.status.staged_os_image.as_deref().unwrap_or_default(),
                        if self.backend.locks() {
                            "finalization-locked"
                        } else {
                            "not locked: any reboot applies it"
                        }
                    ),
                    Decision::RebootPending => {
                        "the staged deployment is finalized; waiting for the reboot".into()
                    }
                    Decision::AlreadyStaged => {
                        "staged without a finalization lock (reboot = never): the next reboot applies it"
                            .into()
                    }
                    _ => String::new(),
                };
                if let Some(state) = other.settled_state() {
                    self.set_state(state, reason).await;
                }
            }
        }
    }

    /// Publishes the reboot request the decision implies; posts `RebootRequested` once per token.
    async fn observe_handshake(
        &mut self,
        decision: &Decision,
        desired: Option<&crate::protocol::Desired>,
        record: &Record,
        approved: Option<&str>,
    ) {
        self.status.attempts = record
            .attempt
            .as_ref()
            .filter(|a| desired.is_some_and(|d| d.observed_hash() == a.request))
            .map_or(0, |a| a.attempts);
        let token = match (decision, desired, self.reboot.policy) {
            (
                Decision::AwaitApproval { .. } | Decision::Reboot { .. } | Decision::RebootPending,
                Some(d),
                RebootPolicy::OnApproval,
            ) => Some(d.reboot_token(&self.boot_id)),
            // Without a lock the request is made after preflight, before staging (see Stage).
            (Decision::Stage(_), _, _) if !self.backend.locks() => return,
            _ => None,
        };
        self.request_reboot(token, approved).await;
    }

    /// Publishes `token` as `reboot-requested` (posting `RebootRequested` when it is new).
    async fn request_reboot(&mut self, token: Option<String>, approved: Option<&str>) {
        self.status.reboot_approved = token.is_some() && token.as_deref() == approved;
        if token != self.status.reboot_requested {
            if let Some(t) = &token {
                info!(token = %t, "requesting reboot approval");
                let _ = self.events.try_send((
                    EventType::Normal,
                    "RebootRequested",
                    format!("set reboot-approved to {t} to let the node reboot into the staged OS"),
                ));
            }
            self.status.reboot_requested = token;
            self.publish().await;
        }
    }

    /// Removes a staged deployment of streamd's that no longer matches the request.
    async fn cleanup_stale(&mut self, record: Record) {
        info!(
            staged = self.status.staged_os_image.as_deref().unwrap_or_default(),
            "removing a staged deployment that no longer matches the request"
        );
        match self.backend.cleanup_pending().await {
            Ok(()) => {
                let rec = Record {
                    staged: None,
                    ..record
                };
                if let Err(e) = self.store.save(&rec) {
                    self.set_state(State::Degraded, e.to_string()).await;
                    return;
                }
                self.backoff = MIN_BACKOFF;
                // Decide again on the cleaned-up deployments.
                self.retry_at = Some(Instant::now());
            }
            Err(e) => {
                self.transient_failure(format!("removing the stale staged deployment: {e}"))
                    .await;
            }
        }
    }

    /// Reports a finalization that did not end on the target and decides whether to retry.
    async fn rolled_back(&mut self, mut record: Record, attempts: u32, retry: bool) {
        let image = self.status.desired_os_image.clone().unwrap_or_default();
        let booted = self.status.current_os_image.clone();
        let journal = crate::hostfacts::finalize_failure(&self.host).await;
        let mut reason = format!(
            "rebooted to apply {image} (attempt {attempts} of {}) but the node came up on {booted}: finalization failed or the node rolled back",
            self.reboot.max_attempts
        );
        if let Some(j) = journal {
            reason.push_str(&format!("; ostree-finalize-staged: {j}"));
        }
        if let Some(a) = record.attempt.as_mut() {
            a.reported_boot = Some(self.boot_id.clone());
        }
        if let Err(e) = self.store.save(&record) {
            self.set_state(State::Degraded, e.to_string()).await;
            return;
        }
        let event = Some((EventType::Warning, "RolledBack", reason.clone()));
        if retry {
            self.set_state_event(State::Degraded, format!("{reason}; trying again"), event)
                .await;
            self.retry_at = Some(Instant::now() + MIN_BACKOFF);
        } else {
            self.set_state_event(
                State::Refused,
                format!("{reason}; giving up until the request changes"),
                event,
            )
            .await;
        }
    }

    /// Records the attempt, reports `Rebooting` and asks rpm-ostreed to finalize and reboot.
    async fn finalize(
        &mut self,
        desired: &crate::protocol::Desired,
        record: Record,
        digest: String,
        attempt: u32,
    ) {
        let mut rec = record.clone();
        let facts = self.status.host.as_ref();
        rec.attempt = Some(Attempt {
            request: desired.observed_hash(),
            os_image: desired.os_image.to_string(),
            digest: digest.clone(),
            boot_id: self.boot_id.clone(),
            attempts: attempt,
            reported_boot: None,
            kernel: facts.and_then(|f| f.kernel),
            fips: facts.and_then(|f| match f.fips {
                crate::hostfacts::Fips::Enabled => Some(true),
                crate::hostfacts::Fips::Disabled => Some(false),
                crate::hostfacts::Fips::Inconsistent => None,
            }),
        });
        // Written before the reboot can happen, so the next boot knows what was tried.
        if let Err(e) = self.store.save(&rec) {
            self.set_state(State::Degraded, e.to_string()).await;
            return;
        }
        self.status.attempts = attempt;
        let reason = format!(
            "applying {} (attempt {attempt} of {}): finalizing the staged deployment and rebooting",
            desired.os_image, self.reboot.max_attempts
        );
        self.set_state_event(
            State::Rebooting,
            reason.clone(),
            Some((EventType::Normal, "Rebooting", reason)),
        )
        .await;
        // The cluster must see Rebooting before the node goes down.
        self.flush().await;
        match self.backend.apply(&digest).await {
            Ok(()) => info!(%digest, attempt, "reboot initiated"),
            Err(e) => {
                // Nothing was applied: this boot's attempt did not happen.
                if let Err(s) = self.store.save(&record) {
                    warn!(error = %s, "restoring the attempt record failed");
                }
                self.status.attempts = attempt.saturating_sub(1);
                let what = match &e {
                    BackendError::RpmOstree(RpmOstreeError::Inhibited(m)) => {
                        format!("the reboot is blocked: {m}")
                    }
                    BackendError::Bootc(b @ crate::bootc::BootcError::Inhibited { .. }) => {
                        b.to_string()
                    }
                    other => format!("applying the staged deployment failed: {other}"),
                };
                self.transient_failure(what).await;
            }
        }
    }

    fn observe_deployments(&mut self, deployments: &[Deployment]) {
        let booted = deployments.iter().find(|d| d.booted);
        self.status.current_os_image = booted
            .and_then(Deployment::pullspec)
            .unwrap_or_default()
            .to_string();
        let label = booted.and_then(|d| d.image_labels.get("io.openshift.os.streamclass").cloned());
        self.status.current_stream = label
            .or_else(|| self.host.os_release().ok().and_then(|r| r.stream()))
            .unwrap_or_default();
        // Only the kernel variant can change without a reboot (a staged override is not booted,
        // but a restart after one is); the rest was gathered at start.
        if let Some(host) = self.status.host.as_mut() {
            host.kernel = booted.and_then(|b| hostfacts::kernel_variant(&self.host, b).ok());
        }
        self.status.staged_os_image = deployments
            .iter()
            .find(|d| d.staged)
            .and_then(|d| d.pullspec().map(String::from));
    }

    async fn start_staging(
        &mut self,
        plan: crate::planner::StagePlan,
        hash: String,
        expect: Option<(crate::verify::Expectation, String)>,
    ) {
        let image = plan.os_image.to_string();
        let (tx, rx) = mpsc::channel(64);
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let backend = self.backend.clone();
        let task =
            tokio::spawn(async move { stage_with_busy_retry(backend, plan, tx, cancelled).await });
        // Let the transaction request go out before the status reporting below.
        tokio::task::yield_now().await;
        self.staging = Some(Staging {
            hash,
            expect,
            task,
            progress: rx,
            cancel,
        });
        self.status.progress = Some(0);
        self.set_state(State::Staging, format!("staging {image}"))
            .await;
    }

    async fn on_progress(&mut self, ev: TxnEvent) {
        match ev {
            TxnEvent::Percent(text, pct) => {
                self.status.progress = Some(pct);
                self.status.reason = text;
            }
            TxnEvent::Message(text) => self.status.reason = text,
        }
        self.publish().await;
    }

    async fn on_staged(&mut self, res: Result<(), BackendError>) {
        let Some(done) = self.staging.take() else {
            return;
        };
        if self.status.observed_desired.as_deref() != Some(done.hash.as_str()) {
            // The request changed while this transaction ran: its result is history, act on the
            // new request (which re-reads the deployments, so a stale stage is seen).
            info!(result = ?res.as_ref().map_err(ToString::to_string), "superseded transaction ended");
            self.backoff = MIN_BACKOFF;
            self.reconcile().await;
            return;
        }
        match res {
            Ok(()) => {
                info!("transaction finished");
                self.backoff = MIN_BACKOFF;
                if let Some(expect) = done.expect
                    && let Err(reason) = self.verify(expect).await
                {
                    self.set_state(State::Degraded, reason).await;
                    return;
                }
                self.reconcile().await;
            }
            Err(e) if e.is_transient() => self.transient_failure(e.to_string()).await,
            // A transaction started before a restart (streamd was killed mid-staging) staged the
            // same target just before this one was asked for: the target is pending, which is
            // what was wanted. Decide again on the deployments, once per request.
            Err(BackendError::RpmOstree(RpmOstreeError::Failed(m)))
                if m.starts_with(REFS_EQUAL)
                    && self.refs_equal_seen.as_deref() != Some(done.hash.as_str()) =>
            {
                info!("the target was staged meanwhile by an earlier transaction; deciding again");
                self.refs_equal_seen = Some(done.hash.clone());
                self.reconcile().await;
            }
            Err(e) => {
                // A failed transaction is not retried for the same request: retrying a broken
                // image would flap the node between Staging and Degraded. A new request, or
                // `streamctl reconcile`, tries again.
                self.set_state(State::Degraded, format!("staging failed: {e}"))
                    .await;
            }
        }
    }

    /// Preflight and plan for a request, without acting: what `streamctl preflight` and
    /// `streamctl plan` show.
    async fn dry_run(
        &mut self,
        given: &std::collections::HashMap<String, String>,
    ) -> serde_json::Value {
        use crate::protocol::Inputs;
        let inputs = if given.is_empty() {
            self.inputs.clone().unwrap_or_default()
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
        let deployments = match self.backend.deployments().await {
            Ok(d) => d,
            Err(e) => return serde_json::json!({"error": format!("reading deployments: {e}")}),
        };
        let (Some(booted), Some(facts)) = (
            deployments.iter().find(|d| d.booted),
            self.status.host.clone(),
        ) else {
            return serde_json::json!({"error": "rpm-ostree reports no booted deployment"});
        };
        let base = crate::planner::StagePlan::rebase(
            &desired.stream,
            &desired.os_image,
            self.gatherer.policy.allow_downgrade,
        );
        let record = self.store.load().unwrap_or_default();
        let observed = Ok(Some(desired.clone()));
        let obs = Observation {
            desired: &observed,
            deployments: &deployments,
            allow_downgrade: self.gatherer.policy.allow_downgrade,
            lifecycle: Lifecycle {
                policy: self.reboot.policy,
                max_attempts: self.reboot.max_attempts,
                boot_id: &self.boot_id,
                record: &record,
                approved: None,
                locks: self.backend.locks(),
            },
        };
        match self
            .gatherer
            .prepare(&facts, &desired, booted, obs.foreign_staged(), base)
            .await
        {
            Err(Transient(e)) => serde_json::json!({"error": e}),
            Ok(p) => serde_json::json!({
                "checks": p.checks,
                "plan": p.plan.as_ref().map(UpdateDeploymentCall::for_plan),
            }),
        }
    }

    /// Checks the staged deployment on disk; on a mismatch removes it and says what differed.
    async fn verify(
        &mut self,
        (mut exp, pinned): (crate::verify::Expectation, String),
    ) -> Result<(), String> {
        let deployments = self
            .backend
            .deployments()
            .await
            .map_err(|e| format!("reading deployments after staging: {e}"))?;
        let (Some(staged), Some(booted)) = (
            deployments.iter().find(|d| d.staged).cloned(),
            deployments.iter().find(|d| d.booted).cloned(),
        ) else {
            return Err("the transaction succeeded but nothing is staged".into());
        };
        // rpm-ostree reports the platform manifest's digest; a pullspec may pin the index.
        if staged.container_image_reference_digest.as_deref() == Some(pinned.as_str()) {
            exp.image_digest = pinned;
        }
        // libostree finds the staged deployment only through the running root.
        let root = self.host.root().to_path_buf();
        let sysroot = if root == std::path::Path::new("/") {
            root
        } else {
            root.join("sysroot")
        };
        let result = tokio::task::spawn_blocking(move || {
            crate::verify::verify_staged(&sysroot, &staged, &booted, &exp)
        })
        .await
        .map_err(|e| format!("verification task failed: {e}"))?;
        match result {
            Ok(()) => {
                info!("staged deployment verified");
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "staged deployment failed verification; removing it");
                let cleaned = match self.backend.cleanup_pending().await {
                    Ok(()) => "the pending deployment was removed".to_string(),
                    Err(c) => format!("removing the pending deployment failed too: {c}"),
                };
                Err(format!("{e}; {cleaned}"))
            }
        }
    }

    async fn transient_failure(&mut self, reason: String) {
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + delay);
        warn!(%reason, retry_in = ?delay, "transient failure");
        self.set_state(
            State::Degraded,
            format!("{reason}; retrying in {}s", delay.as_secs()),
        )
        .await;
    }

    async fn set_state(&mut self, state: State, reason: String) {
        self.set_state_event(state, reason, None).await;
    }

    /// Like [`Self::set_state`], posting `event` instead of the state's usual one.
    async fn set_state_event(
        &mut self,
        state: State,
        reason: String,
        event: Option<(EventType, &'static str, String)>,
    ) {
        let explicit = event.is_some();
        if let Some(ev) = event {
            let _ = self.events.try_send(ev);
        }
        if self.status.state != state {
            self.status.last_change = unix_now();
            crate::logging::log_state(
                state,
                &reason,
                self.status
                    .desired_stream
                    .as_deref()
                    .unwrap_or(&self.status.current_stream),
                self.status
                    .desired_os_image
                    .as_deref()
                    .unwrap_or(&self.status.current_os_image),
                self.node.name(),
            );
            let _ = sd_notify::notify(
                false,
                &[sd_notify::NotifyState::Status(&format!(
                    "{state}: {reason}"
                ))],
            );
            if let Some((kind, name)) = event_for(state).filter(|_| !explicit) {
                let _ = self.events.try_send((kind, name, reason.clone()));
            }
        }
        if state != State::Staging {
            self.status.progress = None;
        }
        match state {
            State::Degraded | State::Refused => self.status.last_error = Some(reason.clone()),
            State::Done => self.status.last_error = None,
            _ => {}
        }
        self.status.state = state;
        self.status.reason = reason;
        self.publish().await;
    }

    async fn publish(&mut self) {
        self.reporter.set(&self.status);
        if let Err(e) = self.api.publish(&self.status).await {
            warn!(error = %e, "publishing status on d-bus failed");
        }
    }

    fn flush_at(&self) -> Option<Instant> {
        let due = self.reporter.due_at(Instant::now())?;
        Some(match self.patch_retry_at {
            Some(r) if r > due => r,
            _ => due,
        })
    }

    async fn flush(&mut self) {
        let Some(patch) = self.reporter.pending_patch() else {
            return;
        };
        match self.node.patch(&patch).await {
            Ok(annotations) => {
                self.reporter.patched(Instant::now(), &annotations);
                if self.patch_retry_at.take().is_some() {
                    info!("patching node annotations works again");
                }
                self.patch_backoff = MIN_BACKOFF;
            }
            Err(e) => {
                // Whatever is pending then goes out, not this patch: the latest status wins.
                let delay = crate::report::patch_retry_delay(
                    self.patch_backoff,
                    &e,
                    crate::report::jitter(),
                );
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
                self.patch_retry_at = Some(Instant::now() + delay);
                self.patch_backoff = (self.patch_backoff * 2).min(crate::report::PATCH_MAX_BACKOFF);
            }
        }
    }
}

/// The Event posted when entering `state`, if any.
fn event_for(state: State) -> Option<(EventType, &'static str)> {
    match state {
        State::Staging => Some((EventType::Normal, "StagingStarted")),
        State::Staged => Some((EventType::Normal, "Staged")),
        State::Refused => Some((EventType::Warning, "PreflightFailed")),
        State::Degraded => Some((EventType::Warning, "Failed")),
        State::Idle | State::Preflight | State::Rebooting | State::Done => None,
    }
}

async fn stage_with_busy_retry(
    backend: Backend,
    plan: crate::planner::StagePlan,
    progress: mpsc::Sender<TxnEvent>,
    mut cancelled: tokio::sync::watch::Receiver<bool>,
) -> Result<(), BackendError> {
    let mut delay = MIN_BACKOFF;
    loop {
        match backend.stage(&plan, &progress, cancelled.clone()).await {
            Err(BackendError::RpmOstree(RpmOstreeError::Busy(msg))) => {
                info!(%msg, retry_in = ?delay, "rpm-ostreed busy; waiting");
                let _ = progress.try_send(TxnEvent::Message(format!(
                    "waiting for another rpm-ostree transaction ({msg}); retrying in {}s",
                    delay.as_secs()
                )));
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                        return Err(RpmOstreeError::Cancelled.into());
                    }
                }
                delay = (delay * 2).min(BUSY_MAX_BACKOFF);
            }
            other => return other,
        }
    }
}

/// Events go through a small queue to their own task: posting them never blocks the state
/// machine, and when the queue is full or the rate limit is reached they are dropped (the
/// annotations carry the truth).
fn spawn_event_sender(node: NodeClient) -> mpsc::Sender<(EventType, &'static str, String)> {
    let (tx, mut rx) = mpsc::channel::<(EventType, &'static str, String)>(16);
    tokio::spawn(async move {
        let mut limiter = crate::report::EventLimiter::default();
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

/// Something the staging transaction did.
enum StagingEvent {
    Progress(TxnEvent),
    Finished(Result<(), BackendError>),
}

/// Waits for the running transaction's next progress event or its end; progress queued before
/// the end is delivered first.
async fn staging_event(staging: &mut Option<Staging>) -> StagingEvent {
    let Some(s) = staging else {
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        Some(ev) = s.progress.recv() => StagingEvent::Progress(ev),
        res = &mut s.task => StagingEvent::Finished(match res {
            Ok(r) => r,
            Err(e) => Err(RpmOstreeError::Protocol(format!("staging task failed: {e}")).into()),
        }),
    }
}

/// Half the watchdog timeout systemd asked for (`WATCHDOG_USEC`), if any.
fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0)
        .then(|| Duration::from_micros(usec / 2))
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

/// `d` plus up to a quarter of it, so a fleet does not retry in lockstep.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 + crate::report::jitter() / 4.0)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
