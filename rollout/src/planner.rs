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

use std::collections::BTreeSet;

use streamd::cluster::protocol::{CheckId, Desired, Inputs, State, UnknownCheck};

use crate::crd::{NodeIssue, OnTimeout};
use crate::node::{Heartbeat, NodeView, ROLLOUT_STEP, Step};
use crate::waves;

mod model;

pub use model::{
    Action, CheckKeys, Degraded, MaxUnavailableError, Plan, PoolInput, Progress, Stall, Summary,
    max_unavailable,
};

/// Where one node stands for the pool's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not given the request yet (or given another one).
    Untargeted,
    /// Given the request; streamd checks, pulls or stages.
    Staging,
    /// Given the request, not acknowledged within `agentTimeoutSeconds`: no staging slot.
    Unresponsive,
    /// Staged and asking for a reboot; not taken by the controller.
    Waiting,
    /// Taken by the controller (cordoned, draining, approved, rebooting).
    InFlight,
    /// Runs the target; not taken.
    Updated,
    /// streamd reports Degraded or Refused for the request.
    Failed,
    /// Not on the request and held out of the rollout ([`waves::HOLD`]); not taken.
    Held,
}

/// Plans the next actions for a pool and its nodes (sorted by name, so candidates are taken in
/// a stable order across restarts).
pub fn plan(pool: &PoolInput, nodes: &[NodeView]) -> Plan {
    let mut summary = Summary {
        machines: nodes.len(),
        mco_managed: nodes.iter().any(|n| n.mco_managed()),
        canary_paused: pool.paused && pool.waves.canary.is_some() && pool.waves.canary_done,
        ..Summary::default()
    };
    let nodes = unclaimed(pool, nodes, &mut summary);
    let max = max_unavailable(pool.max_unavailable.as_ref(), nodes.len());
    summary.max_unavailable = *max.as_ref().unwrap_or(&1);
    summary.unavailable = nodes
        .iter()
        .filter(|n| counted_unavailable(pool, n))
        .count();
    let target = usable_target(pool, &max, &mut summary);
    let hash = target.map(Desired::observed_hash);

    let mut actions = checks(pool, &nodes, target);
    if let (Some(t), Some(h)) = (target, &hash) {
        summary.readiness = Some(readiness(&nodes, t, h));
    }
    let (Some(target), Some(hash), Ok(max)) = (target, hash, max) else {
        return Plan {
            actions,
            summary,
            taints: Vec::new(),
        };
    };
    if summary.mco_managed {
        actions.extend(mco_releases(&nodes));
        let taints = nodes
            .iter()
            .filter(|n| n.update_tainted)
            .map(|n| (n.name.clone(), false))
            .collect();
        return Plan {
            actions,
            summary,
            taints,
        };
    }

    let phases: Vec<Phase> = nodes
        .iter()
        .map(|n| phase(pool, n, target, &hash))
        .collect();
    count(&nodes, &phases, &mut summary);
    held_and_soaking(pool, &nodes, &phases, &mut summary);
    agents_down(&nodes, &mut summary);
    unresponsive(pool, &nodes, &phases, &hash, &mut summary);

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
        let work = new_work(pool, &nodes, &phases, max, &mut summary);
        if !work.iter().any(|a| matches!(a, Action::Cordon { .. })) {
            let stall = blocked_by_others(&nodes, &phases, max, summary.unavailable);
            if summary.stall.is_none() {
                summary.stall = stall;
            }
        }
        actions.extend(work);
    }
    let taints = update_taints(&nodes, &phases);
    Plan {
        actions,
        summary,
        taints,
    }
}

/// Every node not yet on the pool's request carries the update taint (also a paused or
/// Degraded pool's: they are still to update), an updated or held one does not.
fn update_taints(nodes: &[&NodeView], phases: &[Phase]) -> Vec<(String, bool)> {
    nodes
        .iter()
        .zip(phases)
        .map(|(n, p)| (n, !matches!(p, Phase::Updated | Phase::Held)))
        .filter(|(n, want)| n.update_tainted != *want)
        .map(|(n, want)| (n.name.clone(), want))
        .collect()
}

/// A pool whose nodes became the machine-config operator's lets go of those it moves: each
/// node it cordoned or gave its request is released (see [`release`]; one whose approved
/// reboot is under way once it is back).
fn mco_releases(nodes: &[&NodeView]) -> Vec<Action> {
    nodes
        .iter()
        .filter(|n| match release(n) {
            Release::Wait => false,
            Release::Now { withdraw, uncordon } => {
                uncordon || (withdraw && n.inputs().stream.is_some())
            }
        })
        .map(|n| Action::Release {
            node: n.name.clone(),
        })
        .collect()
}

/// Lowers `summary.recheck_after` to `secs`.
fn recheck(summary: &mut Summary, secs: u64) {
    let secs = secs.max(1);
    summary.recheck_after = Some(summary.recheck_after.map_or(secs, |s| s.min(secs)));
}

/// Nodes given the request whose streamd did not acknowledge it within `agentTimeoutSeconds`
/// (each an issue; the first the pool's stall); the others' deadlines are rechecked.
fn unresponsive(
    pool: &PoolInput,
    nodes: &[&NodeView],
    phases: &[Phase],
    hash: &str,
    summary: &mut Summary,
) {
    for (n, p) in nodes.iter().zip(phases) {
        let Some(at) = n.targeted_at() else { continue };
        let deadline = at.saturating_add(pool.agent_timeout_seconds);
        match p {
            Phase::Staging if n.observed() != Some(hash) && deadline >= pool.now => {
                recheck(summary, deadline - pool.now + 1);
            }
            Phase::Unresponsive => {
                let message = format!(
                    "streamd did not acknowledge the pool's request within {} s (no observed-desired for it); its staging slot goes to another node",
                    pool.agent_timeout_seconds
                );
                stalled(summary, n, "AgentNotResponding", message);
            }
            _ => {}
        }
    }
}

/// Records a stalled node: an issue with state `reason` saying `why`, and the pool's stall if it
/// has none.
fn stalled(summary: &mut Summary, n: &NodeView, reason: &'static str, why: String) {
    summary.stall.get_or_insert_with(|| Stall {
        reason,
        message: format!("node {}: {why}", n.name),
    });
    summary.issues.push(NodeIssue {
        name: n.name.clone(),
        state: reason.into(),
        reason: why,
    });
}

/// `Blocked` when a node waits for its reboot slot only because nodes the rollout did not take
/// (NotReady, or cordoned by someone else) use up `maxUnavailable`.
fn blocked_by_others(
    nodes: &[&NodeView],
    phases: &[Phase],
    max: usize,
    unavailable: usize,
) -> Option<Stall> {
    let waiting = nodes
        .iter()
        .zip(phases)
        .any(|(n, p)| *p == Phase::Waiting && cordonable(n));
    let foreign: Vec<String> = nodes
        .iter()
        .filter(|n| {
            unavailable_node(n) && !n.annotations.contains_key(ROLLOUT_STEP) && !waves::held(n)
        })
        .map(|n| {
            let why = if n.ready { "cordoned" } else { "NotReady" };
            format!("{} ({why})", n.name)
        })
        .collect();
    let own = unavailable.saturating_sub(foreign.len());
    if !waiting || unavailable < max || foreign.is_empty() || own >= max {
        return None;
    }
    Some(Stall {
        reason: "Blocked",
        message: format!(
            "nodes the rollout did not take are unavailable and use maxUnavailable {max}: {}; it goes on when they are Ready and schedulable again",
            foreign.join(", ")
        ),
    })
}

/// The nodes in the order they are taken ([`waves::order`]), without those another custom pool
/// selects too (each an issue).
fn unclaimed<'a>(
    pool: &PoolInput,
    nodes: &'a [NodeView],
    summary: &mut Summary,
) -> Vec<&'a NodeView> {
    let mut all: Vec<&NodeView> = nodes.iter().collect();
    waves::order(&mut all, pool.waves.controller_node.as_deref());
    let mut nodes = Vec::with_capacity(all.len());
    for n in all {
        match pool.claimed.get(&n.name) {
            Some(other) => summary.issues.push(NodeIssue {
                name: n.name.clone(),
                state: "Conflict".into(),
                reason: format!(
                    "also selected by the custom StreamPool {other}: a node of two custom pools is left to neither (as the machine-config operator does) until one stops selecting it"
                ),
            }),
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
    if let Some(why) = &pool.spec_error {
        summary.degraded.get_or_insert(Degraded {
            reason: "InvalidSpec",
            message: why.clone(),
        });
        return None;
    }
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
/// unavailable, a maintenance window is open and the canary has slots left; the controller's
/// own node only once no other node is on its way.
fn new_work(
    pool: &PoolInput,
    nodes: &[&NodeView],
    phases: &[Phase],
    max: usize,
    summary: &mut Summary,
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
    let mut budget = max.saturating_sub(summary.unavailable);
    if let Some(left) = canary(pool, nodes, phases, summary) {
        budget = budget.min(left);
    }
    let candidates = waiting_in_order(pool, nodes, phases);
    if !pool.waves.window.open && !candidates.is_empty() {
        budget = 0;
        summary.stall.get_or_insert(Stall {
            reason: "OutsideWindow",
            message: "outside the pool's maintenance windows: no node is cordoned until the next one opens; staging goes on".into(),
        });
    }
    if let Some(secs) = pool.waves.window.change_in {
        recheck(summary, secs);
    }
    for (n, token) in candidates.into_iter().take(budget) {
        actions.push(Action::Cordon {
            node: n.name.clone(),
            token: token.to_string(),
        });
    }
    actions
}

/// The nodes that may be cordoned now, in the order they are taken, with their tokens: nodes
/// whose drain was given up for their token go last, and the controller's own node only once
/// no other node is on its way.
fn waiting_in_order<'a>(
    pool: &PoolInput,
    nodes: &[&'a NodeView],
    phases: &[Phase],
) -> Vec<(&'a NodeView, &'a str)> {
    let own = pool.waves.controller_node.as_deref();
    let others_on_their_way = nodes.iter().zip(phases).any(|(n, p)| {
        Some(n.name.as_str()) != own
            && matches!(
                p,
                Phase::Untargeted | Phase::Staging | Phase::Waiting | Phase::InFlight
            )
    });
    let (fresh, aside): (Vec<_>, Vec<_>) = nodes
        .iter()
        .zip(phases)
        .filter(|(n, p)| **p == Phase::Waiting && cordonable(n))
        .filter(|(n, _)| !(others_on_their_way && Some(n.name.as_str()) == own))
        .filter_map(|(n, _)| Some((*n, n.reboot_requested()?)))
        .partition(|(n, t)| !n.set_aside_for(t));
    fresh.into_iter().chain(aside).collect()
}

/// With a canary that has not run for the target: how many more nodes it lets the rollout take
/// (the nodes updated or in flight count); once they are all back and nodes remain, the canary
/// is complete.
fn canary(
    pool: &PoolInput,
    nodes: &[&NodeView],
    phases: &[Phase],
    summary: &mut Summary,
) -> Option<usize> {
    let in_flight = phases.iter().filter(|p| **p == Phase::InFlight).count();
    let soaking = nodes
        .iter()
        .zip(phases)
        .filter(|(n, p)| {
            **p == Phase::Updated
                && waves::soaking(n, pool.waves.min_ready_seconds, pool.now).is_some()
        })
        .count();
    let left = waves::canary_slots(&pool.waves, summary.updated + in_flight)?;
    let remaining = phases
        .iter()
        .any(|p| !matches!(p, Phase::Updated | Phase::Held | Phase::Failed));
    if left == 0 && in_flight == 0 && soaking == 0 && remaining {
        summary.canary_complete = true;
    }
    Some(left)
}

/// Held nodes (each an issue), the soak deadlines, the nodes' progress and the planned order.
fn held_and_soaking(
    pool: &PoolInput,
    nodes: &[&NodeView],
    phases: &[Phase],
    summary: &mut Summary,
) {
    for (n, p) in nodes.iter().zip(phases) {
        match p {
            Phase::Held => summary.issues.push(NodeIssue {
                name: n.name.clone(),
                state: "Held".into(),
                reason: format!(
                    "held out of the rollout by its {} label or annotation; remove it to let the pool take the node",
                    waves::HOLD
                ),
            }),
            Phase::Updated => {
                if let Some(left) = waves::soaking(n, pool.waves.min_ready_seconds, pool.now) {
                    recheck(summary, left);
                    summary.progress.push(progress(n, "Soaking", n.updated_at()));
                }
            }
            Phase::Failed | Phase::Untargeted => {}
            Phase::Staging | Phase::Unresponsive => {
                // streamd's state, not its reason: the reason moves with the pull's progress
                // and each move would cost a status write.
                let mut p = progress(n, "Staging", n.targeted_at());
                p.reason = n
                    .state()
                    .map_or_else(|| "no state yet".to_string(), |s| s.to_string());
                summary.progress.push(p);
            }
            Phase::Waiting => summary.progress.push(progress(n, "WaitingForReboot", None)),
            Phase::InFlight => summary.progress.push(match n.step() {
                Some(Step::Draining { started, .. }) => progress(n, "Draining", Some(started)),
                _ => progress(n, "Rebooting", n.step().and_then(|s| s.approved_at())),
            }),
        }
        if !matches!(p, Phase::Held | Phase::Updated | Phase::Failed) {
            summary.upcoming.push(n.name.clone());
        }
    }
}

fn progress(n: &NodeView, step: &'static str, since: Option<u64>) -> Progress {
    Progress {
        name: n.name.clone(),
        step,
        since,
        reason: n.reason().to_string(),
    }
}

/// A node waiting for its reboot may be taken: available, and its agent alive (a node whose
/// agent is gone could not take the approval: cordoned and drained, it would stay so).
fn cordonable(n: &NodeView) -> bool {
    !unavailable_node(n)
        && !matches!(n.heartbeat, Heartbeat::Stale { .. })
        && n.reboot_requested().is_some()
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

/// Unavailable as `maxUnavailable` counts it: [`unavailable`], except a held node the
/// controller has not taken (an admin keeps it out of the rollout; its downtime is not the
/// rollout's), and a node that still soaks after its update (`minReadySeconds`).
fn counted_unavailable(pool: &PoolInput, n: &NodeView) -> bool {
    let taken = n.annotations.contains_key(ROLLOUT_STEP);
    if waves::held(n) && !taken {
        return false;
    }
    unavailable(n) || waves::soaking(n, pool.waves.min_ready_seconds, pool.now).is_some()
}

fn unavailable_node(n: &NodeView) -> bool {
    !n.ready || n.unschedulable
}

fn phase(pool: &PoolInput, n: &NodeView, target: &Desired, hash: &str) -> Phase {
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
    if waves::held(n) && !(acked && state == Some(State::Done)) {
        return Phase::Held;
    }
    let silent = n
        .targeted_at()
        .is_some_and(|at| pool.now.saturating_sub(at) > pool.agent_timeout_seconds);
    match (given, acked, state) {
        (false, _, _) => Phase::Untargeted,
        (true, false, _) if silent => Phase::Unresponsive,
        (true, true, Some(State::Done)) => Phase::Updated,
        (true, true, Some(State::Staged)) if n.reboot_requested().is_some() => Phase::Waiting,
        _ => Phase::Staging,
    }
}

/// The next step for a node the controller has taken.
fn in_flight(pool: &PoolInput, n: &NodeView, hash: &str, summary: &mut Summary) -> Option<Action> {
    let acked = n.observed() == Some(hash);
    let step = n.step()?;
    if acked && n.state() == Some(State::Done) && n.ready {
        return Some(Action::Uncordon {
            node: n.name.clone(),
        });
    }
    if let Step::Approved {
        since: Some(since),
        token,
    } = &step
    {
        // A new token on a staged node is drained again below: not a reboot overdue.
        let restaged = n.state() == Some(State::Staged) && n.reboot_requested() != Some(token);
        let deadline = since.saturating_add(pool.reboot_timeout_seconds);
        if !restaged && pool.now > deadline {
            let message = format!(
                "approved for its reboot at {since} (Unix seconds) and not back Done and Ready within {} s; it still counts as unavailable",
                pool.reboot_timeout_seconds
            );
            stalled(summary, n, "NodeNotReturning", message);
        } else if !restaged {
            recheck(summary, deadline - pool.now + 1);
        }
    }
    match (acked, n.state()) {
        (true, Some(State::Staged)) => staged_in_flight(pool, n, step, summary),
        // Rebooting, coming back, or staging again: wait for streamd.
        _ => None,
    }
}

/// The next step for a staged node the controller has taken: drain it, retry or give up a
/// drain past its timeout, or drain again for a new token.
fn staged_in_flight(
    pool: &PoolInput,
    n: &NodeView,
    step: Step,
    summary: &mut Summary,
) -> Option<Action> {
    let token = n.reboot_requested()?;
    if pool.paused {
        return None;
    }
    let drain = Action::Drain {
        node: n.name.clone(),
        token: token.to_string(),
    };
    match step {
        Step::Approved {
            token: approved, ..
        } if approved == token => None,
        // Uncordoned by someone else mid-drain: cordoned again before anything else (as the
        // machine-config operator's drain controller does), never approved uncordoned.
        Step::Draining {
            token: draining, ..
        } if draining == token && !n.unschedulable => Some(Action::Recordon {
            node: n.name.clone(),
        }),
        Step::Draining {
            started,
            token: draining,
        } if draining == token => {
            let waited = pool.now.saturating_sub(started);
            let Some(over) = waited.checked_sub(pool.drain_timeout_seconds + 1) else {
                summary.draining.push(n.name.clone());
                // Its passes are the drain's to schedule (pod events, evictions to try again:
                // `crate::drain`); its timeout is the planner's.
                recheck(summary, pool.drain_timeout_seconds + 1 - waited);
                return Some(drain);
            };
            summary.timed_out.push(n.name.clone());
            let then = match pool.drain_on_timeout {
                OnTimeout::Retry => "it stays cordoned and the drain is retried",
                OnTimeout::Release => {
                    "it is uncordoned and set aside until the other nodes had their turn"
                }
            };
            let message = format!(
                "drain did not finish within {} s; {then}",
                pool.drain_timeout_seconds
            );
            stalled(summary, n, "DrainTimeout", message);
            match pool.drain_on_timeout {
                OnTimeout::Retry => {
                    recheck(summary, drain_retry_after(over));
                    Some(drain)
                }
                OnTimeout::Release => Some(Action::SetAside {
                    node: n.name.clone(),
                    token: token.to_string(),
                }),
            }
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

/// How long to wait before the next pass of a drain `over` seconds past its timeout, as the
/// machine-config operator's drain controller backs off a failing drain
/// (openshift/machine-config-operator:pkg/controller/drain/drain_controller.go, release-4.21,
/// `DrainRequeueDelay` 1 min, `DrainRequeueFailingDelay` 5 min past
/// `DrainRequeueFailingThreshold` 10 min).
pub fn drain_retry_after(over: u64) -> u64 {
    if over < 600 { 60 } else { 300 }
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
    if let Some(Step::Approved { token, .. }) = n.step() {
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
mod tests;
