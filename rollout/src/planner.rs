//! The reconcile logic as a pure function: a pool's settings and its nodes in, the next actions
//! and the pool's status out. No I/O, no clock: everything is derived from what the cluster
//! shows now (the node protocol's keys, Ready, `spec.unschedulable` and the controller's own
//! `rollout-step` mark), so a restarted controller or a new leader plans the same next step and
//! never drains or approves a node twice.
//!
//! Modelled on the machine-config operator's node controller
//! (openshift/machine-config-operator:pkg/controller/node/node_controller.go `maxUnavailable`,
//! `getAllCandidateMachines`; pkg/controller/node/status.go `getUnavailableMachines`): a node is
//! unavailable when it is not Ready, cordoned (by anyone) or being moved, and a new node is
//! taken only while fewer than `maxUnavailable` are.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use streamd::cluster::protocol::{CheckId, Desired, Inputs, State, UnknownCheck};

use crate::crd::NodeIssue;
use crate::node::{
    CHECK_EXTENSIONS_IMAGE, CHECK_OS_IMAGE, CHECK_STREAM, Heartbeat, NodeView, ROLLOUT_STEP, Step,
};

/// The check-* keys the pool asks its not-yet-moved nodes to dry-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckKeys {
    /// `check-stream`.
    pub stream: String,
    /// `check-os-image`; `None`: the node resolves it from OSImageStream.
    pub os_image: Option<String>,
    /// `check-extensions-image`.
    pub extensions_image: Option<String>,
}

impl CheckKeys {
    /// The key/value pairs to write (`None`: remove).
    pub fn annotations(&self) -> [(&'static str, Option<&str>); 3] {
        [
            (CHECK_STREAM, Some(self.stream.as_str())),
            (CHECK_OS_IMAGE, self.os_image.as_deref()),
            (CHECK_EXTENSIONS_IMAGE, self.extensions_image.as_deref()),
        ]
    }

    fn set_on(&self, node: &NodeView) -> bool {
        self.annotations()
            .iter()
            .all(|(k, v)| node.annotations.get(*k).map(String::as_str) == *v)
    }
}

/// The pool, resolved.
#[derive(Debug, Clone)]
pub struct PoolInput {
    /// The request every node gets, or why there is none (bad spec, OSImageStream not served).
    pub target: Result<Desired, String>,
    /// What the not-yet-moved nodes are asked to dry-run (`None` with a bad stream name).
    pub check: Option<CheckKeys>,
    /// `spec.maxUnavailable` as given (default 1).
    pub max_unavailable: Option<IntOrString>,
    /// `spec.maxConcurrentStaging`, resolved.
    pub max_concurrent_staging: usize,
    /// `spec.paused`.
    pub paused: bool,
    /// `spec.drain.timeoutSeconds`, resolved.
    pub drain_timeout_seconds: u64,
    /// Unix seconds now (drain timeouts).
    pub now: u64,
    /// Nodes another pool selects too (node → that pool): the machine-config operator refuses
    /// such a node, and so does the controller (neither pool touches it; both are Degraded).
    pub claimed: BTreeMap<String, String>,
}

/// One step for one node; the executor does it with one Node patch (a drain pass lists and
/// evicts pods first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the check-* keys (read-only dry run on the node).
    Check {
        /// Node name.
        node: String,
    },
    /// Write the desired-* keys: the node pulls and stages the target.
    Target {
        /// Node name.
        node: String,
    },
    /// Cordon the node and mark [`Step::Draining`] for `token`, started `now`.
    Cordon {
        /// Node name.
        node: String,
        /// The node's `reboot-requested`.
        token: String,
    },
    /// One drain pass; when no pod is left, approve `token` (and mark [`Step::Approved`]).
    Drain {
        /// Node name.
        node: String,
        /// The node's `reboot-requested`, copied verbatim into `reboot-approved`.
        token: String,
    },
    /// Uncordon the node and remove the controller's mark and the spent approval.
    Uncordon {
        /// Node name.
        node: String,
    },
}

impl Action {
    /// The node it is for.
    pub fn node(&self) -> &str {
        match self {
            Action::Check { node }
            | Action::Target { node }
            | Action::Cordon { node, .. }
            | Action::Drain { node, .. }
            | Action::Uncordon { node } => node,
        }
    }
}

/// Why the pool is Degraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degraded {
    /// CamelCase cause: `TargetUnresolved`, `InvalidSpec`, `NodeInSeveralPools`,
    /// `NodeDegraded`, `NodeRefused`, `DrainTimeout`.
    pub reason: &'static str,
    /// One line for a human.
    pub message: String,
}

/// What the planner saw, for the pool's status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Nodes selected.
    pub machines: usize,
    /// Nodes on the target, finished and uncordoned.
    pub updated: usize,
    /// Updated nodes that are Ready and schedulable.
    pub ready: usize,
    /// Nodes not Ready, cordoned or being moved.
    pub unavailable: usize,
    /// Nodes Degraded or Refused for the pool's request.
    pub degraded_nodes: usize,
    /// `maxUnavailable` resolved against the pool size.
    pub max_unavailable: usize,
    /// Why the rollout takes no new nodes; `None`: it does.
    pub degraded: Option<Degraded>,
    /// Nodes an admin should look at.
    pub issues: Vec<NodeIssue>,
    /// Nodes being drained (their blockers are added by the executor).
    pub draining: Vec<String>,
    /// Nodes whose drain timed out (the executor names the pods still there).
    pub timed_out: Vec<String>,
    /// The readiness line, e.g. `12 of 14 ready; 2 refuse: cpu-level`.
    pub readiness: Option<String>,
    /// The pool's nodes are the machine-config operator's: readiness only.
    pub mco_managed: bool,
    /// Nodes whose streamd heartbeat ran out (each also an issue).
    pub agents_down: usize,
}

/// The next actions and the status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// In order; each is independent of the others' success.
    pub actions: Vec<Action>,
    /// For the pool's status.
    pub summary: Summary,
}

/// Error in `spec.maxUnavailable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.maxUnavailable {0:?}: expected a count >= 0 or a percentage such as \"25%\"")]
pub struct MaxUnavailableError(pub String);

/// `maxUnavailable` for a pool of `nodes` nodes: a count, or a percentage rounded down, and at
/// least 1 — as the machine-config operator's node controller
/// (openshift/machine-config-operator:pkg/controller/node/node_controller.go `maxUnavailable`,
/// `intstrutil.GetScaledValueFromIntOrPercent(…, roundUp=false)`, 0 → 1).
pub fn max_unavailable(
    value: Option<&IntOrString>,
    nodes: usize,
) -> Result<usize, MaxUnavailableError> {
    let scaled = match value {
        None => 1,
        Some(IntOrString::Int(n)) => {
            usize::try_from(*n).map_err(|_| MaxUnavailableError(n.to_string()))?
        }
        Some(IntOrString::String(s)) => {
            let percent: usize = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| MaxUnavailableError(s.clone()))?;
            percent.saturating_mul(nodes) / 100
        }
    };
    Ok(scaled.max(1))
}

/// Where one node stands for the pool's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not given the request yet (or given another one).
    Untargeted,
    /// Given the request; streamd checks, pulls or stages.
    Staging,
    /// Staged and asking for a reboot; not taken by the controller.
    Waiting,
    /// Taken by the controller (cordoned, draining, approved, rebooting).
    InFlight,
    /// Runs the target; not taken.
    Updated,
    /// streamd reports Degraded or Refused for the request.
    Failed,
}

/// Plans the next actions for a pool and its nodes (sorted by name, so candidates are taken in
/// a stable order across restarts).
pub fn plan(pool: &PoolInput, nodes: &[NodeView]) -> Plan {
    let mut summary = Summary {
        machines: nodes.len(),
        mco_managed: nodes.iter().any(|n| n.mco_managed()),
        ..Summary::default()
    };
    let nodes = unclaimed(pool, nodes, &mut summary);
    let max = max_unavailable(pool.max_unavailable.as_ref(), nodes.len());
    summary.max_unavailable = *max.as_ref().unwrap_or(&1);
    summary.unavailable = nodes.iter().filter(|n| unavailable(n)).count();
    let target = usable_target(pool, &max, &mut summary);
    let hash = target.map(Desired::observed_hash);

    let mut actions = checks(pool, &nodes, target);
    if let (Some(t), Some(h)) = (target, &hash) {
        summary.readiness = Some(readiness(&nodes, t, h));
    }
    let (Some(target), Some(hash), Ok(max)) = (target, hash, max) else {
        return Plan { actions, summary };
    };
    if summary.mco_managed {
        return Plan { actions, summary };
    }

    let phases: Vec<Phase> = nodes.iter().map(|n| phase(n, target, &hash)).collect();
    count(&nodes, &phases, &mut summary);
    agents_down(&nodes, &mut summary);

    // Nodes already taken go on (also while the pool is Degraded: they are unavailable
    // already, and finishing them gives capacity back); `paused` stops them before the next
    // disruptive step.
    for (n, p) in nodes.iter().zip(&phases) {
        if *p != Phase::InFlight {
            continue;
        }
        if let Some(a) = in_flight(pool, n, &hash, &mut summary) {
            actions.push(a);
        }
    }

    let blocked = pool.paused || summary.degraded.is_some();
    if !blocked {
        actions.extend(new_work(pool, &nodes, &phases, max, summary.unavailable));
    }
    Plan { actions, summary }
}

/// The nodes sorted by name, without those another pool selects too (each an issue, and the
/// pool Degraded).
fn unclaimed<'a>(
    pool: &PoolInput,
    nodes: &'a [NodeView],
    summary: &mut Summary,
) -> Vec<&'a NodeView> {
    let mut all: Vec<&NodeView> = nodes.iter().collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let mut nodes = Vec::with_capacity(all.len());
    for n in all {
        match pool.claimed.get(&n.name) {
            Some(other) => {
                let message = format!("node {} is also selected by StreamPool {other}", n.name);
                summary.issues.push(NodeIssue {
                    name: n.name.clone(),
                    state: "Conflict".into(),
                    reason: message.clone(),
                });
                summary.degraded.get_or_insert(Degraded {
                    reason: "NodeInSeveralPools",
                    message,
                });
            }
            None => nodes.push(n),
        }
    }
    nodes
}

/// The pool's request when it and `maxUnavailable` are valid; otherwise `None`, the pool
/// Degraded.
fn usable_target<'a>(
    pool: &'a PoolInput,
    max: &Result<usize, MaxUnavailableError>,
    summary: &mut Summary,
) -> Option<&'a Desired> {
    match (&pool.target, max) {
        (Err(why), _) => {
            summary.degraded.get_or_insert(Degraded {
                reason: "TargetUnresolved",
                message: why.clone(),
            });
            None
        }
        (Ok(_), Err(e)) => {
            summary.degraded.get_or_insert(Degraded {
                reason: "InvalidSpec",
                message: e.to_string(),
            });
            None
        }
        (Ok(t), Ok(_)) => Some(t),
    }
}

/// Readiness checks are read-only: asked of every node not yet given the request, also in a
/// paused, degraded or machine-config-operator pool.
fn checks(pool: &PoolInput, nodes: &[&NodeView], target: Option<&Desired>) -> Vec<Action> {
    let Some(check) = &pool.check else {
        return Vec::new();
    };
    nodes
        .iter()
        .filter(|n| !target.is_some_and(|t| on_target(n, t)) && !check.set_on(n))
        .map(|n| Action::Check {
            node: n.name.clone(),
        })
        .collect()
}

/// Counts the updated, ready and failed nodes (each failed one an issue; the first makes the
/// pool Degraded).
fn count(nodes: &[&NodeView], phases: &[Phase], summary: &mut Summary) {
    for (n, p) in nodes.iter().zip(phases) {
        match p {
            Phase::Updated => {
                summary.updated += 1;
                if n.ready && !n.unschedulable {
                    summary.ready += 1;
                }
            }
            Phase::Failed => {
                summary.degraded_nodes += 1;
                summary.issues.push(NodeIssue {
                    name: n.name.clone(),
                    state: n.state().unwrap_or_default().to_string(),
                    reason: n.reason().to_string(),
                });
                if summary.degraded.is_none() {
                    summary.degraded = Some(Degraded {
                        reason: if n.state() == Some(State::Refused) {
                            "NodeRefused"
                        } else {
                            "NodeDegraded"
                        },
                        message: format!("node {}: {}", n.name, n.reason()),
                    });
                }
            }
            _ => {}
        }
    }
}

/// Nodes whose streamd stopped renewing its heartbeat while the node is Ready: streamd is not
/// running there, or cannot reach the API server. Each is an issue (the pool goes on with the
/// others); a node that is not Ready, or rebooting, is expected to be quiet.
fn agents_down(nodes: &[&NodeView], summary: &mut Summary) {
    for n in nodes {
        let Heartbeat::Stale { renewed } = &n.heartbeat else {
            continue;
        };
        if !n.ready || n.state() == Some(State::Rebooting) {
            continue;
        }
        summary.agents_down += 1;
        summary.issues.push(NodeIssue {
            name: n.name.clone(),
            state: "NoHeartbeat".into(),
            reason: format!(
                "streamd's heartbeat Lease was last renewed at {}: streamd is not running on the node or cannot reach the API server; see systemctl status streamd there",
                streamd::text::one_line(renewed, 64)
            ),
        });
    }
}

/// New work for a pool that is neither paused nor Degraded: targets for untargeted nodes while
/// staging slots are free, and cordons for nodes waiting to reboot while fewer than `max` are
/// unavailable (`unavailable` now).
fn new_work(
    pool: &PoolInput,
    nodes: &[&NodeView],
    phases: &[Phase],
    max: usize,
    mut unavailable: usize,
) -> Vec<Action> {
    // Staging runs ahead, bounded so the registry is not hit by the whole pool at once.
    let staging = phases.iter().filter(|p| **p == Phase::Staging).count();
    let slots = pool.max_concurrent_staging.saturating_sub(staging);
    let mut actions: Vec<Action> = nodes
        .iter()
        .zip(phases)
        .filter(|(_, p)| **p == Phase::Untargeted)
        .take(slots)
        .map(|(n, _)| Action::Target {
            node: n.name.clone(),
        })
        .collect();
    for (n, p) in nodes.iter().zip(phases) {
        if unavailable >= max {
            break;
        }
        // A node whose agent is gone could not take the approval: cordoned and drained, it
        // would stay so.
        if *p == Phase::Waiting
            && !unavailable_node(n)
            && !matches!(n.heartbeat, Heartbeat::Stale { .. })
            && let Some(token) = n.reboot_requested()
        {
            actions.push(Action::Cordon {
                node: n.name.clone(),
                token: token.to_string(),
            });
            unavailable += 1;
        }
    }
    actions
}

/// Whether the node carries the pool's request in its desired-* keys.
fn on_target(n: &NodeView, target: &Desired) -> bool {
    let inputs = Inputs {
        reboot_approved: None,
        ..n.inputs()
    };
    matches!(inputs.desired(), Ok(Some(d)) if d == *target)
}

/// Not Ready, cordoned by anyone, or taken by the controller.
fn unavailable(n: &NodeView) -> bool {
    unavailable_node(n) || n.annotations.contains_key(ROLLOUT_STEP)
}

fn unavailable_node(n: &NodeView) -> bool {
    !n.ready || n.unschedulable
}

fn phase(n: &NodeView, target: &Desired, hash: &str) -> Phase {
    let given = on_target(n, target);
    let acked = given && n.observed() == Some(hash);
    let state = n.state();
    // A Refused invalid request carries no observed-desired.
    let failed = matches!(state, Some(State::Degraded | State::Refused))
        && (acked || (given && n.observed().is_none()));
    if failed {
        return Phase::Failed;
    }
    if n.step().is_some() {
        // Taken by the controller; a retarget mid-flight (the stream's digest moved) waits
        // for a staging slot like any other node.
        return if given {
            Phase::InFlight
        } else {
            Phase::Untargeted
        };
    }
    match (given, acked, state) {
        (false, _, _) => Phase::Untargeted,
        (true, true, Some(State::Done)) => Phase::Updated,
        (true, true, Some(State::Staged)) if n.reboot_requested().is_some() => Phase::Waiting,
        _ => Phase::Staging,
    }
}

/// The next step for a node the controller has taken.
fn in_flight(pool: &PoolInput, n: &NodeView, hash: &str, summary: &mut Summary) -> Option<Action> {
    let acked = n.observed() == Some(hash);
    let step = n.step()?;
    match (acked, n.state()) {
        (true, Some(State::Done)) if n.ready => Some(Action::Uncordon {
            node: n.name.clone(),
        }),
        (true, Some(State::Staged)) => {
            let token = n.reboot_requested()?;
            if pool.paused {
                return None;
            }
            match step {
                Step::Approved { token: approved } if approved == token => None,
                Step::Draining {
                    started,
                    token: draining,
                } if draining == token => {
                    let waited = pool.now.saturating_sub(started);
                    if waited > pool.drain_timeout_seconds {
                        summary.timed_out.push(n.name.clone());
                        if summary.degraded.is_none() {
                            summary.degraded = Some(Degraded {
                                reason: "DrainTimeout",
                                message: format!(
                                    "node {}: drain did not finish within {} s",
                                    n.name, pool.drain_timeout_seconds
                                ),
                            });
                        }
                        return None;
                    }
                    summary.draining.push(n.name.clone());
                    Some(Action::Drain {
                        node: n.name.clone(),
                        token: token.to_string(),
                    })
                }
                // A new token (streamd staged again after a reboot nobody approved, or a
                // rollback), or a mark edited by hand: drain again from the start (the node
                // is still cordoned, so this adds no unavailability) and approve the new one.
                _ => Some(Action::Cordon {
                    node: n.name.clone(),
                    token: token.to_string(),
                }),
            }
        }
        // Rebooting, coming back, or staging again: wait for streamd.
        _ => None,
    }
}

/// What happens to a node the pool lets go (the pool is being deleted, or the node left its
/// selector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Its approved reboot is under way: its cycle finishes first (a deleted pool keeps its
    /// finalizer meanwhile), then it is released.
    Wait,
    /// Remove the controller's keys: `withdraw` the pool's request too (the node has not
    /// moved to it: streamd drops what it staged and goes `Idle`; a node that runs the request
    /// keeps it, as the record of what it was moved to), and `uncordon` a node the controller
    /// cordoned (with its mark and approval).
    Now {
        /// Remove the `desired-*` keys.
        withdraw: bool,
        /// The controller cordoned it: uncordon, remove `rollout-step` and `reboot-approved`.
        uncordon: bool,
    },
}

/// How to release `n`. Only the node's own keys count: the pool's target may be unresolvable
/// by then, or the node may have left for another pool.
pub fn release(n: &NodeView) -> Release {
    let state = n.state();
    if let Some(Step::Approved { token }) = n.step() {
        let rebooting = match state {
            Some(State::Rebooting) => true,
            Some(State::Staged) => n.reboot_requested() == Some(token.as_str()),
            Some(State::Done) => !n.ready,
            _ => false,
        };
        if rebooting {
            return Release::Wait;
        }
    }
    let inputs = Inputs {
        reboot_approved: None,
        ..n.inputs()
    };
    let runs_it = state == Some(State::Done)
        && matches!(inputs.desired(), Ok(Some(d)) if n.observed() == Some(d.observed_hash().as_str()));
    Release::Now {
        withdraw: !runs_it,
        uncordon: n.step().is_some(),
    }
}

/// `12 of 14 ready; 2 refuse: cpu-level; 1 not checked`: nodes on the target (staged or done)
/// and nodes whose dry run of the target passed count as ready; a failed check names its id.
fn readiness(nodes: &[&NodeView], target: &Desired, hash: &str) -> String {
    let mut ready = 0;
    let mut refuse = 0;
    let mut ids = BTreeSet::new();
    for n in nodes {
        let acked = on_target(n, target) && n.observed() == Some(hash);
        match n.state() {
            Some(State::Staged | State::Rebooting | State::Done) if acked => {
                ready += 1;
                continue;
            }
            Some(State::Refused) if acked => {
                refuse += 1;
                let (known, unknown) = n.failed_checks();
                if known.is_empty() && unknown.is_empty() {
                    // Refused for something no check names: a bad request.
                    ids.insert("request".to_string());
                }
                ids.extend(summary_ids(known, unknown));
                continue;
            }
            _ => {}
        }
        match n.readiness(&target.stream) {
            Some(e) if e.checked == hash && e.ready => ready += 1,
            Some(e) if e.checked == hash && !e.failed.is_empty() => {
                refuse += 1;
                let (known, unknown) = e.failed_checks();
                ids.extend(summary_ids(known, unknown));
            }
            _ => {}
        }
    }
    let mut line = format!("{ready} of {} ready", nodes.len());
    if refuse > 0 {
        let ids: Vec<String> = ids.into_iter().collect();
        line.push_str(&format!("; {refuse} refuse: {}", ids.join(", ")));
    }
    let unchecked = nodes.len() - ready - refuse;
    if unchecked > 0 {
        line.push_str(&format!("; {unchecked} not checked"));
    }
    line
}

/// The names the readiness summary gives failed checks: their ids, and `unknown-check` for
/// ids of a newer streamd.
fn summary_ids(known: Vec<CheckId>, unknown: Vec<UnknownCheck>) -> impl Iterator<Item = String> {
    let unknown = (!unknown.is_empty()).then(|| "unknown-check".to_string());
    known
        .into_iter()
        .map(|id| id.as_str().to_string())
        .chain(unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{MCD_CURRENT_CONFIG, READINESS};
    use streamd::cluster::protocol::FAILED_CHECKS;
    use streamd::cluster::protocol::{
        DESIRED_OS_IMAGE, DESIRED_STREAM, OBSERVED_DESIRED, REASON, REBOOT_REQUESTED, STATE,
    };

    const OS10: &str = "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010";

    fn target() -> Desired {
        Inputs {
            stream: Some("rhel-10".into()),
            os_image: Some(OS10.into()),
            extensions_image: None,
            reboot_approved: None,
        }
        .desired()
        .expect("valid")
        .expect("some")
    }

    fn hash() -> String {
        target().observed_hash()
    }

    fn pool() -> PoolInput {
        PoolInput {
            target: Ok(target()),
            check: Some(CheckKeys {
                stream: "rhel-10".into(),
                os_image: None,
                extensions_image: None,
            }),
            max_unavailable: None,
            max_concurrent_staging: 10,
            paused: false,
            drain_timeout_seconds: 600,
            now: 10_000,
            claimed: BTreeMap::new(),
        }
    }

    /// A Ready, schedulable node with the check keys already set (so Check actions show only
    /// where a test expects them).
    fn node(name: &str) -> NodeView {
        let mut n = NodeView {
            name: name.into(),
            ready: true,
            ..NodeView::default()
        };
        n.annotations.insert(CHECK_STREAM.into(), "rhel-10".into());
        n
    }

    fn set(mut n: NodeView, k: &str, v: &str) -> NodeView {
        n.annotations.insert(k.into(), v.into());
        n
    }

    fn targeted(n: NodeView) -> NodeView {
        set(set(n, DESIRED_STREAM, "rhel-10"), DESIRED_OS_IMAGE, OS10)
    }

    fn in_state(n: NodeView, state: &str) -> NodeView {
        set(set(targeted(n), OBSERVED_DESIRED, &hash()), STATE, state)
    }

    fn staged(name: &str, token: &str) -> NodeView {
        set(in_state(node(name), "Staged"), REBOOT_REQUESTED, token)
    }

    fn step(n: NodeView, s: Step) -> NodeView {
        let mut n = set(n, ROLLOUT_STEP, &s.render());
        n.unschedulable = true;
        n
    }

    fn draining(token: &str, started: u64) -> Step {
        Step::Draining {
            started,
            token: token.into(),
        }
    }

    fn target_a(n: &str) -> Action {
        Action::Target { node: n.into() }
    }
    fn cordon(n: &str, t: &str) -> Action {
        Action::Cordon {
            node: n.into(),
            token: t.into(),
        }
    }

    #[test]
    fn table() {
        let refused = set(
            set(
                in_state(node("w2"), "Refused"),
                REASON,
                "preflight check cpu-level failed: x86-64-v2",
            ),
            REBOOT_REQUESTED,
            "",
        );
        let mut not_ready = staged("w2", "t2");
        not_ready.ready = false;
        let mut cordoned_by_admin = staged("w2", "t2");
        cordoned_by_admin.unschedulable = true;
        let done_not_ready = {
            let mut n = step(
                in_state(node("w1"), "Done"),
                Step::Approved { token: "t1".into() },
            );
            n.ready = false;
            n
        };
        let paused = PoolInput {
            paused: true,
            ..pool()
        };
        let staging2 = PoolInput {
            max_concurrent_staging: 2,
            ..pool()
        };
        let half = PoolInput {
            max_unavailable: Some(IntOrString::String("50%".into())),
            ..pool()
        };
        #[rustfmt::skip]
        let table: Vec<(&str, PoolInput, Vec<NodeView>, Vec<Action>)> = vec![
            ("fresh pool: staging runs ahead, bounded", staging2.clone(),
             vec![node("w1"), node("w2"), node("w3")],
             vec![target_a("w1"), target_a("w2")]),
            ("staging slots full", staging2.clone(),
             vec![in_state(node("w1"), "Staging"), in_state(node("w2"), "Preflight"), node("w3")],
             vec![]),
            ("a staged node frees a slot", staging2,
             vec![staged("w1", "t1"), in_state(node("w2"), "Staging"), node("w3")],
             vec![target_a("w3"), cordon("w1", "t1")]),
            ("maxUnavailable 1: one node at a time", pool(),
             vec![staged("w1", "t1"), staged("w2", "t2"), staged("w3", "t3")],
             vec![cordon("w1", "t1")]),
            ("maxUnavailable 50% of 4: two", half,
             vec![staged("w1", "t1"), staged("w2", "t2"), staged("w3", "t3"), staged("w4", "t4")],
             vec![cordon("w1", "t1"), cordon("w2", "t2")]),
            ("a NotReady node uses the only slot", pool(),
             vec![staged("w1", "t1"), not_ready, staged("w3", "t3")],
             vec![]),
            ("a node cordoned by someone else uses the slot and is not taken", pool(),
             vec![staged("w1", "t1"), cordoned_by_admin],
             vec![]),
            ("draining continues", pool(),
             vec![step(staged("w1", "t1"), draining("t1", 9_900)), staged("w2", "t2")],
             vec![Action::Drain { node: "w1".into(), token: "t1".into() }]),
            ("drain timed out: nothing, pool degraded", pool(),
             vec![step(staged("w1", "t1"), draining("t1", 1_000)), staged("w2", "t2")],
             vec![]),
            ("approved: no second drain or approval", pool(),
             vec![step(staged("w1", "t1"), Step::Approved { token: "t1".into() }), staged("w2", "t2")],
             vec![]),
            ("a new token after an unplanned reboot: drained again, no new slot", pool(),
             vec![step(staged("w1", "t1b"), Step::Approved { token: "t1".into() }), staged("w2", "t2")],
             vec![cordon("w1", "t1b")]),
            ("rebooting: wait", pool(),
             vec![step(in_state(node("w1"), "Rebooting"), Step::Approved { token: "t1".into() }), staged("w2", "t2")],
             vec![]),
            ("done but not Ready: wait", pool(),
             vec![done_not_ready, staged("w2", "t2")],
             vec![]),
            ("done and Ready: uncordon, then the next", pool(),
             vec![step(in_state(node("w1"), "Done"), Step::Approved { token: "t1".into() }), staged("w2", "t2")],
             vec![Action::Uncordon { node: "w1".into() }]),
            ("a Refused node stops new work; the node in flight finishes", pool(),
             vec![step(in_state(node("w1"), "Done"), Step::Approved { token: "t1".into() }), refused.clone(), staged("w3", "t3"), node("w4")],
             vec![Action::Uncordon { node: "w1".into() }]),
            ("paused: no new work, in-flight drain stops", paused.clone(),
             vec![step(staged("w1", "t1"), draining("t1", 9_900)), staged("w2", "t2"), node("w3")],
             vec![]),
            ("paused: a finished node is still uncordoned", paused,
             vec![step(in_state(node("w1"), "Done"), Step::Approved { token: "t1".into() }), staged("w2", "t2")],
             vec![Action::Uncordon { node: "w1".into() }]),
            ("updated nodes are left alone", pool(),
             vec![in_state(node("w1"), "Done"), in_state(node("w2"), "Done")],
             vec![]),
        ];
        for (name, pool, nodes, want) in table {
            assert_eq!(plan(&pool, &nodes).actions, want, "{name}");
        }
    }

    #[test]
    fn released_nodes_finish_an_approved_reboot_and_keep_only_a_request_they_run() {
        let approved = |n: NodeView| step(n, Step::Approved { token: "t1".into() });
        let mut done_not_ready = approved(in_state(node("w1"), "Done"));
        done_not_ready.ready = false;
        let now = |withdraw, uncordon| Release::Now { withdraw, uncordon };
        #[rustfmt::skip]
        let table: Vec<(&str, NodeView, Release)> = vec![
            ("untouched", node("w1"), now(true, false)),
            ("staging", in_state(node("w1"), "Staging"), now(true, false)),
            ("staged, waiting", staged("w1", "t1"), now(true, false)),
            ("draining", step(staged("w1", "t1"), draining("t1", 1)), now(true, true)),
            ("approved, not rebooted yet", approved(staged("w1", "t1")), Release::Wait),
            ("approved, rebooting", approved(in_state(node("w1"), "Rebooting")), Release::Wait),
            ("approved, back but not Ready", done_not_ready, Release::Wait),
            ("approved, done", approved(in_state(node("w1"), "Done")), now(false, true)),
            ("approved, degraded after the reboot", approved(in_state(node("w1"), "Degraded")), now(true, true)),
            ("approved token stale: staged again", approved(staged("w1", "t2")), now(true, true)),
            ("updated earlier", in_state(node("w1"), "Done"), now(false, false)),
        ];
        for (name, n, want) in table {
            assert_eq!(release(&n), want, "{name}");
        }
    }

    #[test]
    fn degraded_reasons() {
        let refused = set(
            in_state(node("w2"), "Refused"),
            REASON,
            "preflight check cpu-level failed: x86-64-v2",
        );
        let p = plan(&pool(), &[staged("w1", "t1"), refused]);
        let d = p.summary.degraded.expect("degraded");
        assert_eq!(d.reason, "NodeRefused");
        assert_eq!(
            d.message,
            "node w2: preflight check cpu-level failed: x86-64-v2"
        );
        assert_eq!(p.summary.degraded_nodes, 1);
        assert_eq!(p.summary.issues[0].state, "Refused");

        let p = plan(&pool(), &[step(staged("w1", "t1"), draining("t1", 1_000))]);
        assert_eq!(p.summary.degraded.expect("timeout").reason, "DrainTimeout");
        assert_eq!(p.summary.timed_out, vec!["w1".to_string()]);

        let bad = PoolInput {
            target: Err("spec.target: no OSImageStream".into()),
            ..pool()
        };
        let p = plan(&bad, &[node("w1")]);
        assert_eq!(
            p.summary.degraded.expect("target").reason,
            "TargetUnresolved"
        );
        assert!(p.actions.is_empty());

        let bad = PoolInput {
            max_unavailable: Some(IntOrString::String("half".into())),
            ..pool()
        };
        let p = plan(&bad, &[staged("w1", "t1")]);
        assert_eq!(p.summary.degraded.expect("spec").reason, "InvalidSpec");
        assert!(p.actions.is_empty());
    }

    #[test]
    fn a_node_of_two_pools_is_left_alone_and_stops_the_pool() {
        let both = PoolInput {
            claimed: [("w1".to_string(), "infra".to_string())].into(),
            ..pool()
        };
        let p = plan(&both, &[staged("w1", "t1"), staged("w2", "t2"), node("w3")]);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        let d = p.summary.degraded.expect("degraded");
        assert_eq!(d.reason, "NodeInSeveralPools");
        assert_eq!(d.message, "node w1 is also selected by StreamPool infra");
        assert_eq!(p.summary.machines, 3);
    }

    #[test]
    fn check_keys_written_where_missing_also_when_paused_or_mco() {
        let mut bare = node("w1");
        bare.annotations.clear();
        let mco = set(node("w2"), MCD_CURRENT_CONFIG, "rendered-worker-abc");
        let mut mco_bare = mco.clone();
        mco_bare.annotations.remove(CHECK_STREAM);
        let paused = PoolInput {
            paused: true,
            ..pool()
        };
        let p = plan(&paused, &[bare.clone(), targeted(node("w3"))]);
        assert_eq!(p.actions, vec![Action::Check { node: "w1".into() }]);
        // One machine-config-operator node makes the pool readiness-only: checks, nothing else.
        let p = plan(&pool(), &[bare, mco_bare, staged("w4", "t4")]);
        assert!(p.summary.mco_managed);
        assert_eq!(
            p.actions,
            vec![
                Action::Check { node: "w1".into() },
                Action::Check { node: "w2".into() }
            ]
        );
    }

    #[test]
    fn max_unavailable_scales_like_the_mco() {
        let s = |v: &str| Some(IntOrString::String(v.into()));
        assert_eq!(max_unavailable(None, 10), Ok(1));
        assert_eq!(max_unavailable(Some(&IntOrString::Int(0)), 10), Ok(1));
        assert_eq!(max_unavailable(Some(&IntOrString::Int(3)), 10), Ok(3));
        assert_eq!(max_unavailable(s("25%").as_ref(), 10), Ok(2));
        assert_eq!(max_unavailable(s("5%").as_ref(), 10), Ok(1));
        assert_eq!(max_unavailable(s("100%").as_ref(), 7), Ok(7));
        assert!(max_unavailable(Some(&IntOrString::Int(-1)), 10).is_err());
        assert!(max_unavailable(s("25").as_ref(), 10).is_err());
        assert!(max_unavailable(s("x%").as_ref(), 10).is_err());
    }

    #[test]
    fn a_node_whose_agent_stopped_is_an_issue_and_never_cordoned() {
        let stale = |n: NodeView| NodeView {
            heartbeat: Heartbeat::Stale {
                renewed: "2026-12-04T10:00:00.000000Z".into(),
            },
            ..n
        };
        // Waiting for its reboot, but its streamd is gone: the next node is taken instead.
        let plan = super::plan(&pool(), &[stale(staged("w1", "t1")), staged("w2", "t2")]);
        assert_eq!(plan.actions, vec![cordon("w2", "t2")]);
        assert_eq!(plan.summary.agents_down, 1);
        let issue = &plan.summary.issues[0];
        assert_eq!(
            (issue.name.as_str(), issue.state.as_str()),
            ("w1", "NoHeartbeat")
        );
        assert!(
            issue.reason.contains("2026-12-04T10:00:00"),
            "{}",
            issue.reason
        );
        assert_eq!(
            plan.summary.degraded, None,
            "the pool goes on with the others"
        );
        // Quiet while rebooting or NotReady; alive or unknown is no issue.
        let mut not_ready = stale(staged("w1", "t1"));
        not_ready.ready = false;
        let rebooting = stale(step(
            in_state(node("w2"), "Rebooting"),
            Step::Approved { token: "t2".into() },
        ));
        let alive = NodeView {
            heartbeat: Heartbeat::Alive,
            ..staged("w3", "t3")
        };
        let plan = super::plan(&pool(), &[not_ready, rebooting, alive, staged("w4", "t4")]);
        assert_eq!(plan.summary.agents_down, 0);
        assert!(plan.summary.issues.is_empty(), "{:?}", plan.summary.issues);
    }

    #[test]
    fn readiness_summary_and_counts() {
        let entry = |ready: bool, failed: &str, checked: &str| {
            format!(
                r#"{{"rhel-10":{{"ready":{ready},"failed":[{failed}],"reason":"","osImage":"q","checked":"{checked}"}}}}"#
            )
        };
        let h = hash();
        let nodes = vec![
            in_state(node("a"), "Done"),
            set(node("b"), READINESS, &entry(true, "", &h)),
            set(node("c"), READINESS, &entry(false, r#""cpu-level""#, &h)),
            set(
                node("d"),
                READINESS,
                &entry(false, r#""cpu-level","disk-space""#, &h),
            ),
            // A result for other images (a stale digest) is not counted.
            set(node("e"), READINESS, &entry(true, "", "0000000000000000")),
            // The failed checks come from their own key, never from the reason's prose.
            set(
                set(
                    in_state(node("f"), "Refused"),
                    REASON,
                    "preflight check cpu-level failed: mismatch",
                ),
                FAILED_CHECKS,
                "fips",
            ),
        ];
        let p = plan(&pool(), &nodes);
        assert_eq!(
            p.summary.readiness.as_deref(),
            Some("2 of 6 ready; 3 refuse: cpu-level, disk-space, fips; 1 not checked")
        );
        assert_eq!(p.summary.machines, 6);
        assert_eq!(p.summary.updated, 1);
        assert_eq!(p.summary.ready, 1);
        assert_eq!(p.summary.degraded_nodes, 1);
        // A refusal no check names (a bad request), and an id of a newer streamd.
        let nodes = vec![
            set(
                in_state(node("g"), "Refused"),
                REASON,
                "preflight check fips failed: mismatch",
            ),
            set(
                node("h"),
                READINESS,
                &entry(false, r#""quantum-level""#, &h),
            ),
        ];
        let p = plan(&pool(), &nodes);
        assert_eq!(
            p.summary.readiness.as_deref(),
            Some("0 of 2 ready; 2 refuse: request, unknown-check")
        );
    }

    mod properties;
}
