//! A pass's node writes: the plan's actions and update-taint changes, at most one Node patch per
//! node (a drain's pass and approval, and a release, as they come).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::{
    Error, Scope, action_patch, approval_patch, check_patch, patch_listed_node, release_node,
};
use crate::drain;
use crate::events;
use crate::node::{NodeView, Step, taints_with_update};
use crate::planner::{Action, Plan, PoolInput};
use crate::status::DrainBlocker;

/// Does the plan's actions and update-taint changes with at most one Node patch per node (the
/// check keys, the target, a cordon or an uncordon of a node and its taint change merged; a
/// drain runs a pass first and approves only once no pod is left; a release is
/// [`release_node`]'s, of the node as `listed`), and tells in an Event what needs an admin's
/// eye; returns the drains not finished, with what is left, and when the next pass of a
/// drain within its timeout is due at the latest (seconds; one past it goes at the planner's
/// pace).
pub(super) async fn execute(
    scope: &Scope<'_>,
    input: &PoolInput,
    plan: &Plan,
    listed: &[Node],
    settings: &drain::Settings,
) -> Result<(Vec<DrainBlocker>, Option<u64>), Error> {
    let find = |node: &str| listed.iter().find(|n| n.name_any() == node);
    let mut blockers = Vec::new();
    let mut drain_after: Option<u64> = None;
    // Per node, in the order first met: the merged patch and the actions it carries.
    let mut writes: Vec<(String, Value, Vec<&Action>)> = Vec::new();
    for action in &plan.actions {
        let node = action.node();
        let patch = match (action, &input.target) {
            (Action::Release { .. }, _) => {
                if let Some(n) = find(node) {
                    let why = "the machine-config operator manages the pool's nodes";
                    release_node(scope, n, why).await?;
                }
                continue;
            }
            (Action::Drain { token, .. }, _) => {
                let drain = Drain {
                    node,
                    token,
                    settings,
                    timed_out: plan.summary.timed_out.iter().any(|t| t == node),
                };
                if let Some((left, due)) = drain_and_approve(scope, input, listed, drain).await? {
                    blockers.push(left);
                    if let Some(due) = due {
                        drain_after = Some(drain_after.map_or(due, |d| d.min(due)));
                    }
                }
                continue;
            }
            (a, Ok(t)) => match action_patch(&scope.name, a, t, input.check.as_ref(), input.now) {
                Some(p) => p,
                None => continue,
            },
            (Action::Check { .. }, Err(_)) => match &input.check {
                Some(c) => json!({ "metadata": { "annotations": check_patch(&scope.name, c) } }),
                None => continue,
            },
            (_, Err(_)) => continue,
        };
        match writes.iter_mut().find(|(n, _, _)| n == node) {
            Some((_, merged, done)) => {
                merge_patch(merged, patch);
                done.push(action);
            }
            None => writes.push((node.to_string(), patch, vec![action])),
        }
    }
    let mut taints: BTreeMap<&str, bool> = plan
        .taints
        .iter()
        .map(|(n, on)| (n.as_str(), *on))
        .collect();
    for (node, patch, done) in &mut writes {
        let Some(n) = find(node) else { continue };
        // An uncordoned node runs the target: the next pass would take its taint off.
        let uncordoned = done.iter().any(|a| matches!(a, Action::Uncordon { .. }));
        let on = taints
            .remove(node.as_str())
            .or_else(|| (uncordoned && NodeView::from_node(n).update_tainted).then_some(false));
        if let Some(on) = on {
            merge_patch(
                patch,
                json!({ "spec": { "taints": taints_with_update(n, on) } }),
            );
        }
    }
    for (node, patch, done) in writes {
        tracing::info!(node, actions = ?done, "node step");
        if !patch_listed_node(scope, &node, patch).await? {
            let why = "the node changed since it was listed (uncordoned?); looked at again";
            blockers.push(DrainBlocker {
                node,
                evictions_refused: false,
                why: why.to_string(),
            });
            continue;
        }
        for action in done {
            if let Some(note) = events::for_action(action) {
                scope.publish(note).await;
            }
        }
    }
    set_update_taints(scope, &taints, listed).await?;
    Ok((blockers, drain_after))
}

/// A drain the plan asks for: its node, the reboot token to approve, how to drain, and whether
/// it ran past its timeout (then its next pass goes at the planner's pace).
struct Drain<'a> {
    node: &'a str,
    token: &'a str,
    settings: &'a drain::Settings,
    timed_out: bool,
}

/// Runs a drain pass over the node (its pods from the shared pod store) and approves its reboot
/// once no pod is left; `Some`: not yet, with what is left and, for a drain within its timeout,
/// when its next pass is due at the latest (a pod event may wake it sooner).
async fn drain_and_approve(
    scope: &Scope<'_>,
    input: &PoolInput,
    listed: &[Node],
    drain: Drain<'_>,
) -> Result<Option<(DrainBlocker, Option<u64>)>, Error> {
    let Drain {
        node,
        token,
        settings,
        timed_out,
    } = drain;
    scope.ctx.fence.check()?;
    let now = i64::try_from(input.now).unwrap_or(i64::MAX);
    let pods = scope.ctx.pods.pods(node).await?;
    let pass = drain::pass(&scope.ctx.drain_client, node, pods, settings, now).await;
    if !pass.complete() {
        let due = (!timed_out).then(|| pass.retry_after.unwrap_or(scope.ctx.drain_backstop));
        let left = DrainBlocker {
            node: node.to_string(),
            evictions_refused: pass.refused,
            why: pass.remaining.join("; "),
        };
        return Ok(Some((left, due)));
    }
    tracing::info!(node, token, "drained; approving the reboot");
    let patch = approval_patch(token, input.now, &scope.version(node).unwrap_or_default());
    if patch_listed_node(scope, node, patch).await? {
        drained(scope, listed, node, input.now);
        Ok(None)
    } else {
        let why =
            "the node changed since it was listed (uncordoned?); not approved, looked at again";
        let left = DrainBlocker {
            node: node.to_string(),
            evictions_refused: false,
            why: why.into(),
        };
        Ok(Some((left, None)))
    }
}

/// Records how long `node`'s drain took (from its mark as listed), now that its reboot is
/// approved.
fn drained(scope: &Scope<'_>, listed: &[Node], node: &str, now: u64) {
    let step = listed
        .iter()
        .find(|n| n.name_any() == node)
        .and_then(|n| NodeView::from_node(n).step());
    if let Some(Step::Draining { started, .. }) = step {
        scope
            .ctx
            .metrics
            .drained(&scope.name, now.saturating_sub(started));
    }
}

/// Merges the merge patch `more` into `patch` (members of both objects merged, else `more`'s
/// value; a `null` stays, as the removal it asks for).
fn merge_patch(patch: &mut Value, more: Value) {
    match (patch, more) {
        (Value::Object(into), Value::Object(from)) => {
            for (k, v) in from {
                match into.get_mut(&k) {
                    Some(existing) => merge_patch(existing, v),
                    None => {
                        into.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Sets or removes the update taint of the nodes `taints` names (those no action of the pass
/// wrote), each write conditional on the node as listed: a 409 is looked at again next pass.
async fn set_update_taints(
    scope: &Scope<'_>,
    taints: &BTreeMap<&str, bool>,
    listed: &[Node],
) -> Result<(), Error> {
    for (node, on) in taints {
        let Some(n) = listed.iter().find(|n| n.name_any() == *node) else {
            continue;
        };
        let patch = json!({
            "metadata": { "resourceVersion": n.resource_version().unwrap_or_default() },
            "spec": { "taints": taints_with_update(n, *on) },
        });
        if patch_listed_node(scope, node, patch).await? {
            tracing::info!(node, on, "update taint");
        } else {
            tracing::debug!(
                node,
                on,
                "node changed since listed; update taint looked at again"
            );
        }
    }
    Ok(())
}
