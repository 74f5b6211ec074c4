//! The pool's status from the planner's summary: counts, conditions (keeping
//! `lastTransitionTime` while a condition's status holds, as MachineConfigPool's do), per-node
//! issues and the readiness line.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::crd::{Condition, NodeIssue, StreamPoolStatus};
use crate::planner::Summary;

/// At most this many per-node issues are listed (the counts hold the rest).
pub const MAX_ISSUES: usize = 20;

/// The status to write. `previous` keeps transition times; `drain_blockers` are the executor's
/// findings for nodes being drained (`node`, what is left).
pub fn build(
    summary: &Summary,
    generation: Option<i64>,
    target: Option<String>,
    paused: bool,
    previous: Option<&StreamPoolStatus>,
    drain_blockers: &[(String, String)],
    now: Time,
) -> StreamPoolStatus {
    let all_updated = summary.machines > 0 && summary.updated == summary.machines;
    let degraded = summary.degraded.as_ref();
    let (updating_reason, updating_message) = if summary.mco_managed {
        (
            "ManagedByMachineConfigOperator",
            "the machine-config operator manages these nodes; readiness checks only".to_string(),
        )
    } else if paused {
        ("Paused", "the pool is paused".to_string())
    } else if all_updated {
        ("Updated", String::new())
    } else {
        (
            "Updating",
            format!(
                "{} of {} nodes updated; {} unavailable (max {})",
                summary.updated, summary.machines, summary.unavailable, summary.max_unavailable
            ),
        )
    };
    let wanted = [
        cond(
            "Updating",
            !all_updated && !paused && !summary.mco_managed && target.is_some(),
            updating_reason,
            updating_message,
        ),
        cond(
            "Updated",
            all_updated && !summary.mco_managed,
            if all_updated { "Updated" } else { "NotUpdated" },
            format!(
                "{} of {} nodes run the target",
                summary.updated, summary.machines
            ),
        ),
        cond(
            "Degraded",
            degraded.is_some(),
            degraded.map_or("AsExpected", |d| d.reason),
            degraded.map(|d| d.message.clone()).unwrap_or_default(),
        ),
        cond(
            "Paused",
            paused,
            if paused { "Paused" } else { "NotPaused" },
            String::new(),
        ),
    ];
    let conditions = wanted
        .into_iter()
        .map(|mut c| {
            let kept = previous
                .and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_))
                .filter(|o| o.status == c.status)
                .and_then(|o| o.last_transition_time.clone());
            c.last_transition_time = Some(kept.unwrap_or_else(|| now.clone()));
            c
        })
        .collect();
    let mut nodes = summary.issues.clone();
    nodes.extend(drain_blockers.iter().map(|(n, why)| NodeIssue {
        name: n.clone(),
        state: "Draining".into(),
        reason: why.clone(),
    }));
    nodes.truncate(MAX_ISSUES);
    StreamPoolStatus {
        observed_generation: generation,
        target,
        machine_count: count(summary.machines),
        updated_machine_count: count(summary.updated),
        ready_machine_count: count(summary.ready),
        unavailable_machine_count: count(summary.unavailable),
        degraded_machine_count: count(summary.degraded_nodes),
        conditions,
        nodes,
        readiness: summary.readiness.clone(),
    }
}

fn cond(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: None,
        reason: reason.to_string(),
        message: streamd::text::one_line(&message, 1024),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
