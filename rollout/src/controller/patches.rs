//! The Node merge patches the controller writes: one per planner action, the release and the
//! approval (the last two conditional on the node's `resourceVersion`).

use serde_json::{Value, json};
use streamd::cluster::protocol::{
    DESIRED_EXTENSIONS_IMAGE, DESIRED_OS_IMAGE, DESIRED_STREAM, Desired, REBOOT_APPROVED,
};

use crate::node::{
    CHECK_EXTENSIONS_IMAGE, CHECK_OS_IMAGE, CHECK_STREAM, ROLLOUT_POOL, ROLLOUT_SET_ASIDE,
    ROLLOUT_STEP, ROLLOUT_TARGETED, ROLLOUT_UPDATED, Step,
};
use crate::planner::{Action, CheckKeys};

fn annotations_patch(pairs: &[(&str, Option<&str>)]) -> serde_json::Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.map_or(Value::Null, |v| json!(v))))
        .collect()
}

/// The check-* keys of `check`, with the pool's name.
pub(super) fn check_patch(pool: &str, check: &CheckKeys) -> serde_json::Map<String, Value> {
    let mut pairs = check.annotations().to_vec();
    pairs.push((ROLLOUT_POOL, Some(pool)));
    annotations_patch(&pairs)
}

/// The merge patch an action of pool `pool` writes on its node (a drain's approval is
/// [`approval_patch`]).
pub fn action_patch(
    pool: &str,
    action: &Action,
    target: &Desired,
    check: Option<&CheckKeys>,
    now: u64,
) -> Option<Value> {
    let (annotations, unschedulable) = match action {
        Action::Check { .. } => (check_patch(pool, check?), None),
        Action::Target { .. } => {
            let os = target.os_image.to_string();
            let ext = target.extensions_image.as_ref().map(ToString::to_string);
            let at = now.to_string();
            (
                annotations_patch(&[
                    (DESIRED_STREAM, Some(&target.stream)),
                    (DESIRED_OS_IMAGE, Some(&os)),
                    (DESIRED_EXTENSIONS_IMAGE, ext.as_deref()),
                    (ROLLOUT_POOL, Some(pool)),
                    (ROLLOUT_TARGETED, Some(&at)),
                    (ROLLOUT_UPDATED, None),
                ]),
                None,
            )
        }
        Action::Cordon { token, .. } => {
            let step = Step::Draining {
                started: now,
                token: token.clone(),
            }
            .render();
            (
                annotations_patch(&[(ROLLOUT_STEP, Some(&step))]),
                Some(true),
            )
        }
        Action::Drain { .. } | Action::Release { .. } => return None,
        Action::Recordon { .. } => (serde_json::Map::new(), Some(true)),
        Action::Uncordon { .. } => {
            let at = now.to_string();
            (
                annotations_patch(&[
                    (ROLLOUT_STEP, None),
                    (REBOOT_APPROVED, None),
                    (ROLLOUT_SET_ASIDE, None),
                    (ROLLOUT_UPDATED, Some(&at)),
                ]),
                Some(false),
            )
        }
        Action::SetAside { token, .. } => (
            annotations_patch(&[(ROLLOUT_STEP, None), (ROLLOUT_SET_ASIDE, Some(token))]),
            Some(false),
        ),
    };
    let mut patch = if annotations.is_empty() {
        json!({})
    } else {
        json!({ "metadata": { "annotations": annotations } })
    };
    if let Some(u) = unschedulable {
        patch["spec"] = json!({ "unschedulable": u });
    }
    Some(patch)
}

/// Releases a node (see [`crate::planner::Release::Now`]), only if it is still as listed at `resource_version`
/// (a node another pool took meanwhile is left to it: the write is a 409 and the next pass
/// looks again).
pub fn release_patch(withdraw: bool, uncordon: bool, resource_version: &str) -> Value {
    let mut pairs = vec![
        (ROLLOUT_POOL, None),
        (CHECK_STREAM, None),
        (CHECK_OS_IMAGE, None),
        (CHECK_EXTENSIONS_IMAGE, None),
        (ROLLOUT_SET_ASIDE, None),
        (ROLLOUT_UPDATED, None),
    ];
    if withdraw {
        pairs.extend([
            (DESIRED_STREAM, None),
            (DESIRED_OS_IMAGE, None),
            (DESIRED_EXTENSIONS_IMAGE, None),
            (ROLLOUT_TARGETED, None),
        ]);
    }
    if uncordon {
        pairs.extend([(ROLLOUT_STEP, None), (REBOOT_APPROVED, None)]);
    }
    let mut patch = json!({ "metadata": {
        "annotations": annotations_patch(&pairs),
        "resourceVersion": resource_version,
    } });
    if uncordon {
        patch["spec"] = json!({ "unschedulable": false });
    }
    patch
}

/// Approves exactly `token` and marks it approved at `now`, in one patch, only if the node is
/// still as listed at `resource_version` (cordoned: one uncordoned meanwhile may have taken new
/// pods, so the write is a 409 and the next pass looks again).
pub fn approval_patch(token: &str, now: u64, resource_version: &str) -> Value {
    let step = Step::Approved {
        since: Some(now),
        token: token.to_string(),
    }
    .render();
    json!({ "metadata": {
        "annotations": annotations_patch(&[
            (REBOOT_APPROVED, Some(token)),
            (ROLLOUT_STEP, Some(&step)),
        ]),
        "resourceVersion": resource_version,
    } })
}
