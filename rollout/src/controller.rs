//! The thin edge: a kube-runtime controller over `StreamPool`s, woken by watches of the pools,
//! the Nodes (mapped to the pools that select them) and the cluster's OSImageStream — no
//! polling. The Node watch also fills a node store (a reflector), which each reconcile reads
//! instead of listing the nodes. A decision must never rest on a copy that has not yet seen the
//! controller's own last write (it would, say, cordon a node a second time, or approve a reboot
//! on a node it had uncordoned): every write's returned `resourceVersion` is kept
//! ([`written`]), and a pool is not reconciled while the store's copy of any node, or the
//! cache's copy of the pool, predates it; the watch brings the write back within moments and
//! its event reconciles the pool again ([`STALE_RETRY`] at the latest). Every node write is
//! moreover conditional on the version it was decided on, as before, so a copy older than
//! someone else's write is a 409, looked at again. Each reconcile asks the
//! [`planner`](crate::planner) what to do and does it with at most one Node patch per node (the
//! pass's actions and update-taint change of a node merged), and writes the status when it
//! changed: at once when a condition, the target, the generation or a node issue changed, else
//! (per-node progress only) at most every [`STATUS_INTERVAL`] per pool, each write conditional
//! on the pool's `resourceVersion` (a 409 is looked at again from the cache). A drain in progress
//! is woken by its node's pod events ([`drain::watch`]: one pod watch, run while a rollout has
//! a node out of service, maps each event to the pool draining the node) and looked at again when an eviction must be tried again
//! ([`drain::Pass::retry_after`]), at the latest after [`drain::BACKSTOP_SECONDS`]; one past its
//! timeout less often, and a pool with a deadline pending when it falls due
//! ([`Summary::recheck_after`]). What it does is also told in Events on the pool
//! ([`events`](crate::events)).
//!
//! A pool carries the [`FINALIZER`]: deleting it releases its nodes first (see
//! [`planner::release`]), and a node that leaves the pool's selector is released likewise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Config, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector::reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use streamd::cluster::protocol::{Desired, Inputs, validate_stream};
use streamd::cluster::streams::{self, Catalog, StreamsUpdate};
use tokio::sync::watch;

use crate::crd::{
    DEFAULT_AGENT_TIMEOUT_SECONDS, DEFAULT_DRAIN_TIMEOUT_SECONDS, DEFAULT_MAX_CONCURRENT_STAGING,
    DEFAULT_REBOOT_TIMEOUT_SECONDS, StreamPool, Target,
};
use crate::drain;
use crate::events::{self, Journal, Note};
use crate::heartbeat;
use crate::leader::{Fence, NotLeader};
use crate::metrics::Metrics;
use crate::node::{NodeView, ROLLOUT_POOL, ROLLOUT_STEP, taints_with_update};
use crate::planner::{self, CheckKeys, Plan, PoolInput, Release, Summary};
use crate::waves::{self, Waves};

mod execute;
mod failures;
mod patches;
mod written;
use crate::selection::{self, Owner};
use crate::status::{self, DrainBlocker};
use execute::execute;
use patches::check_patch;
pub use patches::{action_patch, approval_patch, release_patch};

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "streamd-rollout";
/// On every StreamPool: the pool goes only once the controller released its nodes.
pub const FINALIZER: &str = "osstream.openshift.io/rollout";
/// How often a node being drained is looked at again.
pub const DRAIN_RETRY: Duration = Duration::from_secs(drain::RETRY_SECONDS);
/// Look again after a write found the object changed since it was read (409).
const CONFLICT_RETRY: Duration = Duration::from_secs(1);
/// Look again after this at the latest while the caches have not seen the controller's own last
/// write (the watch event that brings it reconciles the pool sooner).
pub const STALE_RETRY: Duration = Duration::from_millis(500);
/// A pool's status changed only in per-node progress is written at most this often.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(5);
/// Longest a request may take (connect, send, each read); a hung API server costs a reconcile
/// this long, not kube's default 295 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a reconcile failed; it is retried after a backoff of its own pool
/// (5 s, doubling, at most 5 min).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API request failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// This replica could not prove it holds the leader lease, so it made no write.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The Node watch has not yet listed the nodes (the store is empty until it has).
    #[error("the node watch has not listed the nodes within {0:?}")]
    NodesNotRead(Duration),
    /// The pod watch a drain reads has not listed the pods.
    #[error(transparent)]
    PodsNotRead(#[from] drain::watch::NotRead),
}

/// What reconciles share.
pub struct Context {
    client: kube::Client,
    /// Without kube's built-in retry of 429 (see [`Clients`]).
    drain_client: kube::Client,
    /// The pods of the nodes being drained (one watch, while a rollout has a node out).
    pods: drain::watch::PodStore,
    /// An unfinished drain's next pass at the latest ([`drain::BACKSTOP_SECONDS`]).
    drain_backstop: u64,
    catalog: watch::Receiver<Option<Catalog>>,
    pools: Store<StreamPool>,
    /// Every Node, as the Node watch last showed it.
    nodes: Store<Node>,
    /// The controller's own last writes of nodes and of pools (see [`written`]).
    node_writes: written::Written,
    pool_writes: written::Written,
    /// When each pool's status was last written (see [`STATUS_INTERVAL`]).
    status_written: std::sync::Mutex<BTreeMap<String, std::time::Instant>>,
    recorder: Recorder,
    journal: Journal,
    /// The nodes' heartbeat Leases, as a watch of their namespace last showed them; `None`:
    /// not read (every heartbeat unknown).
    heartbeats: Option<Store<Lease>>,
    /// Checked before every write (see [`crate::leader`]).
    fence: Fence,
    /// The node this replica runs on (taken last).
    node_name: Option<String>,
    /// Failed reconciles per pool (backoff, causes told).
    failures: failures::Failures,
    /// What `/metrics` shows.
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

/// The pool's target as the node protocol's request, resolved through the cluster's
/// OSImageStream when the spec names only a stream (streamd's own resolution,
/// `streamd::cluster::streams::resolve`), and the check-* keys its not-yet-moved nodes get.
pub fn resolve_target(
    target: &Target,
    catalog: Option<&Catalog>,
) -> (Result<Desired, String>, Option<CheckKeys>) {
    let inputs = Inputs {
        stream: Some(target.stream.clone()),
        os_image: target.os_image.clone(),
        extensions_image: target.extensions_image.clone(),
        reboot_approved: None,
    };
    let desired = streams::resolve(&inputs, catalog)
        .map_err(|e| e.to_string())
        .and_then(|r| r.desired().map_err(|e| e.to_string()))
        .and_then(|d| d.ok_or_else(|| "no stream given".to_string()))
        .map_err(|e| format!("spec.target: {e}"));
    let check = validate_stream(&target.stream).ok().map(|()| CheckKeys {
        stream: target.stream.clone(),
        os_image: target.os_image.clone(),
        extensions_image: target.extensions_image.clone(),
    });
    (desired, check)
}

/// The resolved target as the status and the canary's mark give it: `<stream> <os image>`.
fn target_line(t: &Desired) -> String {
    format!("{} {}", t.stream, t.os_image)
}

/// Whether the pool's canary already ran for `target` ([`waves::CANARY_DONE`]).
fn canary_done(pool: &StreamPool, target: Option<&str>) -> bool {
    target.is_some_and(|t| {
        pool.annotations()
            .get(waves::CANARY_DONE)
            .map(String::as_str)
            == Some(t)
    })
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Every write is a merge patch as [`FIELD_MANAGER`].
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// What one reconcile of a pool works with.
struct Scope<'a> {
    ctx: &'a Context,
    pool: &'a StreamPool,
    name: String,
    nodes: Api<Node>,
    pools: Api<StreamPool>,
    /// The Events' references: the pool, and every listed node by name.
    pool_ref: ObjectReference,
    node_refs: BTreeMap<String, ObjectReference>,
    /// Every listed node's resourceVersion, then the one its last write returned: a node write
    /// is made only if the node is still so, so a replica that lost the lease cannot overwrite
    /// what the new leader did.
    versions: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Scope<'_> {
    /// The resourceVersion `node` was listed at or last written to.
    fn version(&self, node: &str) -> Option<String> {
        let versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.get(node).cloned()
    }

    /// Records what a write of `node` returned, for this pass and the next ones.
    fn set_version(&self, node: &str, rv: String) {
        self.ctx.node_writes.wrote(node, rv.clone());
        let mut versions = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        versions.insert(node.to_string(), rv);
    }

    /// Records what a write of the pool returned.
    fn wrote_pool(&self, written: &StreamPool) {
        if let Some(rv) = written.resource_version() {
            self.ctx.pool_writes.wrote(&self.name, rv);
        }
    }

    /// The node carries this pool's request (its name in [`ROLLOUT_POOL`]).
    fn ours(&self, n: &Node) -> bool {
        n.annotations().get(ROLLOUT_POOL) == Some(&self.name)
    }

    /// Publishes `note` about the pool (and its node). Events are best effort: a failure is
    /// logged and the rollout goes on.
    async fn publish(&self, note: Note) {
        let secondary = note
            .node
            .as_ref()
            .and_then(|n| self.node_refs.get(n))
            .cloned();
        let reason = note.reason;
        let event = to_event(note, secondary);
        if let Err(e) = self.ctx.recorder.publish(&event, &self.pool_ref).await {
            tracing::warn!(reason, error = %e, "publishing an event failed");
        }
    }
}

/// The nodes as listed: those the pool takes ([`selection`]: its selector selects them and no
/// pool wins over it), and the others (among which the ones that left it).
struct Listed {
    selected: Vec<Node>,
    unselected: Vec<Node>,
    /// Selected nodes of two custom pools (node → the other pools): left alone.
    claimed: BTreeMap<String, String>,
    /// Why the pool's `nodeSelector` is refused (empty or malformed): it selects nothing and
    /// releases nothing.
    invalid: Option<String>,
}

/// Splits `nodes` between `pool` and the other pools `others` by the machine-config operator's
/// rule ([`selection::owner`]).
fn split(pool: &StreamPool, others: &[Arc<StreamPool>], nodes: Vec<Node>) -> Listed {
    let name = pool.name_any();
    let mut listed = Listed {
        selected: Vec::new(),
        unselected: Vec::new(),
        claimed: BTreeMap::new(),
        invalid: selection::selector_error(&pool.spec.node_selector),
    };
    for n in nodes {
        let mut taking: Vec<String> = others
            .iter()
            .filter(|p| p.name_any() != name && selection::takes(&p.spec.node_selector, n.labels()))
            .map(|p| p.name_any())
            .collect();
        if selection::takes(&pool.spec.node_selector, n.labels()) {
            taking.push(name.clone());
        }
        let names: Vec<&str> = taking.iter().map(String::as_str).collect();
        match selection::owner(&names) {
            Owner::Pool(p) if p == name => listed.selected.push(n),
            Owner::Conflict(pools) if pools.contains(&name) => {
                let rest: Vec<String> = pools.into_iter().filter(|p| *p != name).collect();
                listed.claimed.insert(n.name_any(), rest.join(", "));
                listed.selected.push(n);
            }
            _ => listed.unselected.push(n),
        }
    }
    listed
}

/// One pass over `pool`: reads the nodes from the store and hands them to [`finalizer`], unless
/// a cached copy predates the controller's own last write; its span carries the pool's name.
#[tracing::instrument(skip(pool, ctx), fields(pool = %pool.name_any()))]
async fn reconcile(pool: Arc<StreamPool>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, ctx.nodes.wait_until_ready())
        .await
        .map_err(|_| Error::NodesNotRead(REQUEST_TIMEOUT))?
        .map_err(|_| Error::NodesNotRead(REQUEST_TIMEOUT))?;
    // Every node, not only the selected ones: those that left the selector are released.
    let mut all: Vec<Node> = ctx
        .nodes
        .state()
        .iter()
        .map(|n| n.as_ref().clone())
        .collect();
    // In name order, as the API server lists them (the store keeps no order).
    all.sort_by_key(ResourceExt::name_any);
    let pool_stale = ctx
        .pool_writes
        .stale(&pool.name_any(), pool.resource_version().as_deref());
    let nodes_stale = all
        .iter()
        .filter(|n| {
            ctx.node_writes
                .stale(&n.name_any(), n.resource_version().as_deref())
        })
        .count();
    if pool_stale || nodes_stale > 0 {
        tracing::debug!(
            pool_stale,
            nodes_stale,
            "the cache has not seen this controller's last write yet; looked at again"
        );
        return Ok(Requeue::requeue(STALE_RETRY));
    }
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let scope = Scope {
        ctx: &ctx,
        pool: &pool,
        name: pool.name_any(),
        nodes,
        pools: Api::all(ctx.client.clone()),
        pool_ref: reference(pool.object_ref(&())),
        node_refs: all
            .iter()
            .map(|n| (n.name_any(), reference(n.object_ref(&()))))
            .collect(),
        versions: std::sync::Mutex::new(
            all.iter()
                .filter_map(|n| Some((n.name_any(), n.resource_version()?)))
                .collect(),
        ),
    };
    let listed = split(&pool, &ctx.pools.state(), all);
    let done = finalizer(&scope, &listed).await?;
    ctx.failures.succeeded(&scope.name);
    Ok(done)
}

/// Between [`apply`] and [`cleanup`], as kube-runtime's `finalizer` helper: a pool being
/// deleted is cleaned up; any other gets the [`FINALIZER`] first (in the same pass, unlike
/// kube-runtime's, which waits for the write to come back through the watch) and is applied.
async fn finalizer(scope: &Scope<'_>, listed: &Listed) -> Result<Requeue, Error> {
    if scope.pool.meta().deletion_timestamp.is_some() {
        return cleanup(scope, listed).await;
    }
    if !scope.pool.finalizers().iter().any(|f| f == FINALIZER)
        && !set_finalizer(scope, true).await?
    {
        return Ok(Requeue::requeue(CONFLICT_RETRY));
    }
    apply(scope, listed).await
}

/// The pool is being deleted: releases its nodes, then removes the [`FINALIZER`].
async fn cleanup(scope: &Scope<'_>, listed: &Listed) -> Result<Requeue, Error> {
    // Its nodes: those carrying its request, and selected ones it cordoned before nodes
    // carried the pool's name.
    let own = listed
        .selected
        .iter()
        .filter(|n| {
            let a = n.annotations();
            scope.ours(n) || (!a.contains_key(ROLLOUT_POOL) && a.contains_key(ROLLOUT_STEP))
        })
        .chain(listed.unselected.iter().filter(|n| scope.ours(n)));
    let mut waiting = 0;
    for n in own {
        if !release_node(scope, n, "the pool is deleted").await? {
            waiting += 1;
        }
    }
    if waiting > 0 {
        return Ok(Requeue::requeue(DRAIN_RETRY));
    }
    if !set_finalizer(scope, false).await? {
        return Ok(Requeue::requeue(CONFLICT_RETRY));
    }
    scope.ctx.pods.hold(&scope.name, &[], false);
    scope.ctx.journal.forget(&scope.name);
    scope.ctx.metrics.forget(&scope.name);
    scope.ctx.pool_writes.forget(&scope.name);
    scope
        .ctx
        .status_written
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&scope.name);
    tracing::info!("nodes released; the pool may go");
    Ok(Requeue::await_change())
}

/// The rollout: releases the nodes that left the selector, plans, does the plan's actions and
/// writes the status.
async fn apply(scope: &Scope<'_>, listed: &Listed) -> Result<Requeue, Error> {
    let mut leaving = false;
    // A refused selector selects nothing, and is no reason to let go of the pool's nodes.
    let leavers = listed
        .unselected
        .iter()
        .filter(|n| listed.invalid.is_none() && scope.ours(n));
    for n in leavers {
        leaving |= !release_node(scope, n, "it left the pool's selector").await?;
    }
    let leases = scope
        .ctx
        .heartbeats
        .as_ref()
        .map(heartbeat::read)
        .unwrap_or_default();
    let Some((input, plan)) = plan(scope, listed, &leases) else {
        // The first read of OSImageStream is under way; its arrival reconciles every pool.
        return Ok(Requeue::await_change());
    };
    scope
        .ctx
        .pods
        .hold(&scope.name, &plan.summary.draining, holds_pods(&plan));
    // A malformed podSelector made the pool Degraded (`InvalidSpec`): no drain runs.
    let settings = drain::Settings::from_spec(&scope.pool.spec.drain).unwrap_or_default();
    let (blockers, drain_after) =
        execute(scope, &input, &plan, &listed.selected, &settings).await?;
    if plan.summary.canary_complete
        && let Ok(t) = &input.target
    {
        pause_after_canary(scope, &target_line(t)).await?;
    }
    let status_due = write_status(scope, &input, &plan.summary, &blockers).await?;
    let now = i64::try_from(input.now).unwrap_or(i64::MAX);
    let ours = listed
        .selected
        .iter()
        .filter_map(|n| leases.get(&n.name_any()));
    // A deadline or a heartbeat that runs out changes nothing the watches see.
    let after = [
        leaving.then_some(DRAIN_RETRY),
        drain_after.map(Duration::from_secs),
        status_due,
        plan.summary.recheck_after.map(Duration::from_secs),
        heartbeat::recheck_after(ours, now),
    ]
    .into_iter()
    .flatten()
    .min();
    Ok(after.map_or_else(Requeue::await_change, Requeue::requeue))
}

/// Whether the pool's rollout has a node out of service (one it cordons now, or Draining,
/// Rebooting or Soaking): the drains' pod watch runs while some pool has ([`drain::watch`]).
fn holds_pods(plan: &Plan) -> bool {
    plan.actions.iter().any(|a| {
        matches!(
            a,
            planner::Action::Cordon { .. } | planner::Action::Drain { .. }
        )
    }) || !plan.summary.draining.is_empty()
        || plan
            .summary
            .progress
            .iter()
            .any(|p| matches!(p.step, "Draining" | "Rebooting" | "Soaking"))
}

/// The planner's input for the pool and its selected nodes, and its plan; `None` while the
/// target waits for the first read of OSImageStream.
fn plan(
    scope: &Scope<'_>,
    listed: &Listed,
    leases: &BTreeMap<String, Lease>,
) -> Option<(PoolInput, Plan)> {
    let spec = &scope.pool.spec;
    let catalog = scope.ctx.catalog.borrow().clone();
    if catalog.is_none() && spec.target.os_image.is_none() {
        return None;
    }
    let selected = &listed.selected;
    let (target, check) = resolve_target(&spec.target, catalog.as_ref());
    let target_text = target.as_ref().ok().map(target_line);
    let now = now_secs();
    let window = crate::window::now(&spec.windows, now).map_err(|e| e.to_string());
    let input = PoolInput {
        target,
        check,
        max_unavailable: spec.max_unavailable.clone(),
        max_concurrent_staging: spec
            .max_concurrent_staging
            .unwrap_or(DEFAULT_MAX_CONCURRENT_STAGING) as usize,
        paused: spec.paused,
        drain_timeout_seconds: spec
            .drain
            .timeout_seconds
            .unwrap_or(DEFAULT_DRAIN_TIMEOUT_SECONDS),
        drain_on_timeout: spec.drain.on_timeout.unwrap_or_default(),
        agent_timeout_seconds: spec
            .agent_timeout_seconds
            .unwrap_or(DEFAULT_AGENT_TIMEOUT_SECONDS),
        reboot_timeout_seconds: spec
            .reboot_timeout_seconds
            .unwrap_or(DEFAULT_REBOOT_TIMEOUT_SECONDS),
        now,
        spec_error: listed
            .invalid
            .clone()
            .or_else(|| drain::Settings::from_spec(&spec.drain).err())
            .or_else(|| window.clone().err()),
        claimed: listed.claimed.clone(),
        waves: Waves {
            controller_node: scope.ctx.node_name.clone(),
            min_ready_seconds: spec.min_ready_seconds.unwrap_or_default(),
            canary: spec.canary.map(|n| n as usize),
            canary_done: canary_done(scope.pool, target_text.as_deref()),
            window: window.unwrap_or_default(),
        },
    };
    let now = i64::try_from(input.now).unwrap_or(i64::MAX);
    let views: Vec<NodeView> = selected
        .iter()
        .map(|n| NodeView {
            heartbeat: heartbeat::of(leases.get(&n.name_any()), now),
            ..NodeView::from_node(n)
        })
        .collect();
    let plan = planner::plan(&input, &views);
    Some((input, plan))
}

/// Patches `node` only if the fence holds and the node is as listed (or as this pass's last
/// write of it left it); `false`: it is not (409), look again.
async fn patch_listed_node(scope: &Scope<'_>, node: &str, mut patch: Value) -> Result<bool, Error> {
    scope.ctx.fence.check()?;
    let listed = scope.version(node);
    if let (Some(rv), Some(meta)) = (listed, patch.get_mut("metadata")) {
        meta["resourceVersion"] = Value::String(rv);
    }
    match scope
        .nodes
        .patch(node, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            if let Some(rv) = written.resource_version() {
                scope.set_version(node, rv);
            }
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(Error::Api {
            what: format!("patching node {node}"),
            source,
        }),
    }
}

/// Writes the pool's status when it changed (only per-node progress: at most every
/// [`STATUS_INTERVAL`]), conditional on the pool as cached, then publishes what is news in it;
/// `Some`: look again after this (a change held back, or a 409).
async fn write_status(
    scope: &Scope<'_>,
    input: &PoolInput,
    summary: &Summary,
    blockers: &[DrainBlocker],
) -> Result<Option<Duration>, Error> {
    let pool = scope.pool;
    let built = status::build(
        summary,
        pool.meta().generation,
        input.target.as_ref().ok().map(target_line),
        pool.spec.paused,
        pool.status.as_ref(),
        blockers,
        Time(jiff_now()),
    );
    let news = scope
        .ctx
        .journal
        .news(&scope.name, pool.status.as_ref(), &built);
    scope
        .ctx
        .metrics
        .pool(&scope.name, &status::phase(&built), summary, blockers.len());
    let mut again = None;
    let held = || -> Option<Duration> {
        let written = scope
            .ctx
            .status_written
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let since = written.get(&scope.name)?.elapsed();
        STATUS_INTERVAL.checked_sub(since)
    };
    if pool.status.as_ref() == Some(&built) {
    } else if let Some(wait) = held().filter(|_| !status::urgent(pool.status.as_ref(), &built)) {
        tracing::debug!(
            wait_ms = wait.as_millis(),
            "status progress held back; written with the next change or after the wait"
        );
        again = Some(wait);
    } else {
        scope.ctx.fence.check()?;
        let mut value = serde_json::to_value(&built).unwrap_or_default();
        // A merge patch keeps keys it does not name: clear the optional ones explicitly.
        for key in [
            "target",
            "readiness",
            "nodes",
            "plannedOrder",
            "progress",
            "observedGeneration",
        ] {
            if let Some(map) = value.as_object_mut() {
                map.entry(key).or_insert(Value::Null);
            }
        }
        let patch = json!({
            "metadata": { "resourceVersion": pool.resource_version() },
            "status": value,
        });
        match scope
            .pools
            .patch_status(&scope.name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                scope.wrote_pool(&written);
                scope
                    .ctx
                    .status_written
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(scope.name.clone(), std::time::Instant::now());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!("the pool changed since it was cached; status looked at again");
                again = Some(CONFLICT_RETRY);
            }
            Err(source) => {
                return Err(Error::Api {
                    what: format!("writing the status of pool {}", scope.name),
                    source,
                });
            }
        }
    }
    for note in news {
        scope.publish(note).await;
    }
    Ok(again)
}

/// The canary moved its nodes: pauses the pool (`spec.paused: true`) and marks the canary done
/// for `target` ([`waves::CANARY_DONE`]) in one write, only if the pool is as the cache has it (a
/// 409 is looked at again at the next pass).
async fn pause_after_canary(scope: &Scope<'_>, target: &str) -> Result<(), Error> {
    scope.ctx.fence.check()?;
    let patch = json!({
        "metadata": {
            "annotations": { waves::CANARY_DONE: target },
            "resourceVersion": scope.pool.resource_version(),
        },
        "spec": { "paused": true },
    });
    match scope
        .pools
        .patch(&scope.name, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            scope.wrote_pool(&written);
            tracing::info!(target, "canary complete; pool paused");
            scope.publish(events::canary_complete(target)).await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(Error::Api {
            what: format!("pausing pool {} after its canary", scope.name),
            source,
        }),
    }
}

/// Releases node `n` of the pool (`why`, for the Event); `false`: not yet (its approved reboot
/// is under way, or it changed since it was listed).
async fn release_node(scope: &Scope<'_>, n: &Node, why: &str) -> Result<bool, Error> {
    let Release::Now { withdraw, uncordon } = planner::release(&NodeView::from_node(n)) else {
        return Ok(false);
    };
    let node = n.name_any();
    scope.ctx.fence.check()?;
    let mut patch = release_patch(
        withdraw,
        uncordon,
        &n.resource_version().unwrap_or_default(),
    );
    // A released node is no longer the pool's to update.
    if NodeView::from_node(n).update_tainted {
        patch["spec"]["taints"] = json!(taints_with_update(n, false));
    }
    match scope
        .nodes
        .patch(&node, &patch_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            if let Some(rv) = written.resource_version() {
                scope.set_version(&node, rv);
            }
        }
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(false),
        Err(source) => {
            return Err(Error::Api {
                what: format!("releasing node {node}"),
                source,
            });
        }
    }
    tracing::info!(node, why, withdraw, uncordon, "node released");
    scope
        .publish(events::released(&node, why, withdraw, uncordon))
        .await;
    Ok(true)
}

/// Adds (`on`) or removes the [`FINALIZER`], only if the pool is as the cache has it;
/// `false`: it is not (409), look again.
async fn set_finalizer(scope: &Scope<'_>, on: bool) -> Result<bool, Error> {
    let pool = scope.pool;
    let mut finalizers: Vec<String> = pool
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if on {
        finalizers.push(FINALIZER.into());
    }
    let patch = json!({ "metadata": {
        "finalizers": finalizers,
        "resourceVersion": pool.resource_version(),
    } });
    match scope
        .pools
        .patch(&pool.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            scope.wrote_pool(&written);
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(Error::Api {
            what: format!("writing the finalizer of pool {}", pool.name_any()),
            source,
        }),
    }
}

/// The Event of `note`, related to `secondary` (its node).
fn to_event(note: Note, secondary: Option<ObjectReference>) -> Event {
    Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.into(),
        note: Some(note.text),
        action: note.action.into(),
        secondary,
    }
}

/// An Event's reference to `object`, without the version it had then (so that the recorder
/// sees one object, not one per status write).
fn reference(mut object: ObjectReference) -> ObjectReference {
    object.resource_version = None;
    object
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// A failed reconcile: logged at warn, told once per cause as a Warning Event on the pool (not
/// by a replica that is not the leader: it makes no write), retried after the pool's backoff.
fn error_policy(pool: Arc<StreamPool>, error: &Error, ctx: Arc<Context>) -> Requeue {
    let name = pool.name_any();
    let cause = failures::cause(error);
    let (after, new) = ctx.failures.failed(&name, &cause);
    ctx.metrics.reconcile_failed(&name);
    tracing::warn!(pool = %name, error = %error, retry_in_secs = after.as_secs(), "reconcile failed; retrying");
    if new && !matches!(error, Error::NotLeader(_)) {
        let event = to_event(events::reconcile_failed(&error.to_string()), None);
        let reference = reference(pool.object_ref(&()));
        let recorder = ctx.recorder.clone();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, "publishing an event failed");
            }
        });
    }
    Requeue::requeue(after)
}

/// The pools that take a node with `labels` ([`selection::takes`]; each decides who owns it).
fn pools_selecting(
    pools: &[Arc<StreamPool>],
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<StreamPool>> {
    pools
        .iter()
        .filter(|p| selection::takes(&p.spec.node_selector, labels))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// The controller's API clients.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // kube::Client is not Debug
pub struct Clients {
    /// Requests (reads and writes, the leader lease), each bounded by [`REQUEST_TIMEOUT`].
    pub main: kube::Client,
    /// Watches, which wait on the API server for minutes by design (kube-runtime's watcher asks
    /// for `timeoutSeconds=290` and keeps kube's default 295 s read timeout).
    pub watch: kube::Client,
    /// Evictions: kube's client retries a 429 by itself by default (up to 15 times, backing
    /// off to 1000 s: kube-rs/kube:kube-client/src/client/retry.rs `RetryPolicy::server_retry`,
    /// `Config::default_retry`), which would hold a drain inside one eviction for as long as a
    /// PodDisruptionBudget refuses it. The drain sees the 429 itself and tries again on its
    /// next pass, so this client has the retry off.
    pub drain: kube::Client,
}

impl Clients {
    /// The three clients from one configuration.
    pub fn new(config: kube::Config) -> Result<Clients, kube::Error> {
        let mut requests = config.clone();
        requests.connect_timeout = Some(REQUEST_TIMEOUT);
        requests.read_timeout = Some(REQUEST_TIMEOUT);
        requests.write_timeout = Some(REQUEST_TIMEOUT);
        let mut no_retry = requests.clone();
        no_retry.default_retry = false;
        Ok(Clients {
            main: kube::Client::try_from(requests)?,
            watch: kube::Client::try_from(config)?,
            drain: kube::Client::try_from(no_retry)?,
        })
    }
}

/// Runs the controller until `shutdown` completes (leadership lost, or a signal); `identity`
/// (the pod name) is the Events' reporting instance; the nodes' heartbeat Leases are read in
/// `heartbeat_namespace` (`None`: not at all); no write is made unless `fence` holds.
pub async fn run(
    clients: Clients,
    identity: &str,
    heartbeat_namespace: Option<&str>,
    node_name: Option<&str>,
    metrics: Arc<Metrics>,
    fence: Fence,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = clients.main;
    let (catalog_tx, catalog_rx) = watch::channel(None);
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut updates = Box::pin(streams::watch(clients.watch.clone()));
    let follow = tokio::spawn(async move {
        while let Some(update) = updates.next().await {
            match update {
                StreamsUpdate::Catalog(c) => {
                    catalog_tx.send_replace(Some(c));
                    // Full: a reconcile of every pool is already due.
                    let _ = trigger_tx.try_send(());
                }
                StreamsUpdate::Error(e) => {
                    tracing::warn!(error = %e, "reading OSImageStream failed; retrying");
                }
            }
        }
    });
    let triggers = futures::stream::unfold(trigger_rx, |mut rx| async move {
        rx.recv().await.map(|()| ((), rx))
    });
    let controller = Controller::new(
        Api::<StreamPool>::all(clients.watch.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let (nodes, node_writer) = reflector::store();
    let node_events = reflector(
        node_writer,
        watcher::watcher(
            Api::<Node>::all(clients.watch.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let (heartbeats, leases) = heartbeat_namespace
        .map(|ns| heartbeat::watch(clients.watch.clone(), ns))
        .unzip();
    // Pod events on the nodes being drained, each naming the pool to wake (drain::watch).
    let (wake_tx, wake_rx) = tokio::sync::mpsc::channel::<ObjectRef<StreamPool>>(64);
    let wakes = futures::stream::unfold(wake_rx, |mut rx| async move {
        rx.recv().await.map(|pool| (pool, rx))
    });
    let ctx = Arc::new(Context {
        client: client.clone(),
        drain_client: clients.drain,
        pods: drain::watch::PodStore::new(clients.watch.clone(), wake_tx),
        drain_backstop: drain::backstop_seconds(),
        catalog: catalog_rx,
        pools: store.clone(),
        nodes,
        node_writes: written::Written::default(),
        pool_writes: written::Written::default(),
        status_written: std::sync::Mutex::default(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: events::REPORTER.into(),
                instance: Some(identity.to_string()),
            },
        ),
        journal: Journal::default(),
        heartbeats,
        fence,
        node_name: node_name.map(str::to_string),
        failures: failures::Failures::default(),
        metrics,
    });
    controller
        .watches_stream(node_events, move |node: Node| {
            let state = store.state();
            let mut pools = pools_selecting(&state, node.labels());
            // A node that left its pool's selector (the pool releases it).
            if let Some(own) = node.annotations().get(ROLLOUT_POOL) {
                let own = ObjectRef::new(own);
                if !pools.contains(&own) {
                    pools.push(own);
                }
            }
            pools
        })
        .reconcile_on(wakes)
        .reconcile_all_on(triggers)
        .with_config(Config::default().debounce(Duration::from_millis(200)))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
    follow.abort();
    if let Some(leases) = leases {
        leases.abort();
    }
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod reconcile_tests;

#[cfg(test)]
mod tests;
