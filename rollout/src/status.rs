//! The pool's status from the planner's summary: counts, conditions (keeping
//! `lastTransitionTime` while a condition's status holds, as MachineConfigPool's do), per-node
//! issues and the readiness line.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::crd::{Condition, NodeIssue, NodeProgress, StreamPoolStatus};
use crate::events::EVICTION_BLOCKED;
use crate::planner::Summary;

/// At most this many per-node issues are listed (the counts hold the rest).
pub const MAX_ISSUES: usize = 20;

/// A node being drained that is not drained yet, as the executor found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainBlocker {
    /// The node.
    pub node: String,
    /// A PodDisruptionBudget refused one of its evictions (state [`EVICTION_BLOCKED`], else
    /// `Draining`).
    pub evictions_refused: bool,
    /// What is left, one line (`namespace/name: why; …`).
    pub why: String,
}

impl DrainBlocker {
    /// Its entry in `status.nodes[]`.
    fn issue(&self) -> NodeIssue {
        let state = if self.evictions_refused {
            EVICTION_BLOCKED
        } else {
            "Draining"
        };
        NodeIssue {
            name: self.node.clone(),
            state: state.into(),
            reason: self.why.clone(),
        }
    }
}

/// The status to write. `previous` keeps transition times; `drain_blockers` are the executor's
/// findings for nodes being drained.
pub fn build(
    summary: &Summary,
    generation: Option<i64>,
    target: Option<String>,
    paused: bool,
    previous: Option<&StreamPoolStatus>,
    drain_blockers: &[DrainBlocker],
    now: Time,
) -> StreamPoolStatus {
    // An empty pool has nothing left to move: Updated, as a MachineConfigPool without machines.
    // A pool Degraded for its spec or target is not Updated, even with nothing to move.
    let all_updated = summary.updated == summary.machines && summary.degraded.is_none();
    let degraded = summary.degraded.as_ref();
    // A refused spec moves nothing: not Updating.
    let refused = degraded.filter(|d| d.reason == "InvalidSpec");
    let canary_message =
        "the canary's nodes run the target; set spec.paused: false to go on".to_string();
    let (updating_reason, updating_message) =
        updating(summary, paused, refused, all_updated, &canary_message);
    let wanted = [
        cond(
            "Updating",
            !all_updated
                && !paused
                && !summary.mco_managed
                && target.is_some()
                && refused.is_none(),
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
            match (paused, summary.canary_paused) {
                (true, true) => "CanaryComplete",
                (true, false) => "Paused",
                (false, _) => "NotPaused",
            },
            if paused && summary.canary_paused {
                canary_message
            } else {
                String::new()
            },
        ),
    ];
    let conditions = wanted
        .into_iter()
        .map(|c| unknown_without_target(c, target.is_some()))
        .map(|mut c| {
            let kept = previous
                .and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_))
                .filter(|o| o.status == c.status)
                .and_then(|o| o.last_transition_time.clone());
            c.last_transition_time = Some(kept.unwrap_or_else(|| now.clone()));
            c.observed_generation = generation;
            c
        })
        .collect();
    let mut nodes = summary.issues.clone();
    nodes.extend(drain_blockers.iter().map(DrainBlocker::issue));
    nodes.truncate(MAX_ISSUES);
    // What a node (or whoever can annotate it) wrote reaches the pool's status inert and bounded,
    // like the Events' text.
    for n in &mut nodes {
        n.reason = streamd::text::one_line(&n.reason, crate::events::MAX_NOTE_CHARS);
    }
    StreamPoolStatus {
        observed_generation: generation,
        target,
        machine_count: count(summary.machines),
        updated_machine_count: count(summary.updated),
        ready_machine_count: count(summary.ready),
        unavailable_machine_count: count(summary.unavailable),
        degraded_machine_count: count(summary.degraded_nodes),
        no_heartbeat_machine_count: count(summary.agents_down),
        conditions,
        nodes,
        planned_order: summary.upcoming.iter().take(MAX_ISSUES).cloned().collect(),
        progress: summary
            .progress
            .iter()
            .take(MAX_ISSUES)
            .map(|p| NodeProgress {
                name: p.name.clone(),
                step: p.step.to_string(),
                since: p
                    .since
                    .and_then(|s| i64::try_from(s).ok())
                    .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
                    .map(Time),
                reason: streamd::text::one_line(&p.reason, crate::events::MAX_NOTE_CHARS),
            })
            .collect(),
        readiness: summary.readiness.clone(),
    }
}

/// Whether `new` must be written at once rather than coalesced with later changes: it differs
/// from `old` in more than per-node progress (counts, `progress`, `plannedOrder`, `readiness`,
/// the conditions' messages), i.e. in the generation observed, the target, a condition's status
/// or reason, or the per-node issues (which the Events tell).
pub fn urgent(old: Option<&StreamPoolStatus>, new: &StreamPoolStatus) -> bool {
    let Some(old) = old else {
        return true;
    };
    let conditions = |s: &StreamPoolStatus| -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    old.observed_generation != new.observed_generation
        || old.target != new.target
        || conditions(old) != conditions(new)
        || old.nodes != new.nodes
}

/// The pool's phase for the metrics: `Degraded`, `Paused` or `Updated` when that condition is
/// `True`, else the `Updating` condition's reason (`Updating`, or the stall).
pub fn phase(status: &StreamPoolStatus) -> String {
    let on = |t: &str| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    ["Degraded", "Paused", "Updated"]
        .into_iter()
        .find(|t| on(t))
        .map(str::to_string)
        .or_else(|| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == "Updating")
                .map(|c| c.reason.clone())
        })
        .unwrap_or_default()
}

/// The `Updating` condition's reason and message.
fn updating(
    summary: &Summary,
    paused: bool,
    refused: Option<&crate::planner::Degraded>,
    all_updated: bool,
    canary_message: &str,
) -> (&'static str, String) {
    if let Some(d) = refused {
        (d.reason, d.message.clone())
    } else if summary.mco_managed {
        (
            "ManagedByMachineConfigOperator",
            "the machine-config operator manages these nodes; readiness checks only".to_string(),
        )
    } else if paused && summary.canary_paused {
        ("CanaryComplete", canary_message.to_string())
    } else if paused {
        ("Paused", "the pool is paused".to_string())
    } else if all_updated {
        ("Updated", String::new())
    } else if let Some(stall) = &summary.stall {
        (stall.reason, stall.message.clone())
    } else {
        (
            "Updating",
            format!(
                "{} of {} nodes updated; {} unavailable (max {})",
                summary.updated, summary.machines, summary.unavailable, summary.max_unavailable
            ),
        )
    }
}

/// Without a resolved target the controller cannot tell whether the nodes run it: `Updated` is
/// `Unknown` (API conventions), with the reason the `Degraded` condition details.
fn unknown_without_target(mut c: Condition, resolved: bool) -> Condition {
    if !resolved && c.type_ == "Updated" {
        c.status = "Unknown".into();
        c.reason = "TargetUnknown".into();
        c.message = "the target is not resolved; see the Degraded condition".into();
    }
    c
}

fn cond(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: None,
        observed_generation: None,
        reason: reason.to_string(),
        message: streamd::text::one_line(&message, 1024),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::Degraded;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid"))
    }

    fn status_of<'a>(s: &'a StreamPoolStatus, type_: &str) -> (&'a str, &'a str, i64) {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition");
        (
            c.status.as_str(),
            c.reason.as_str(),
            c.last_transition_time
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or_default(),
        )
    }

    #[test]
    fn only_progress_waits_to_be_written() {
        let at3 = |updated: usize| Summary {
            machines: 3,
            updated,
            max_unavailable: 1,
            ..Summary::default()
        };
        let first = build(&at3(0), Some(1), Some("t".into()), false, None, &[], at(1));
        assert!(urgent(None, &first));
        let one = build(
            &at3(1),
            Some(1),
            Some("t".into()),
            false,
            Some(&first),
            &[],
            at(2),
        );
        assert_ne!(one, first, "the counts and the message moved");
        assert!(!urgent(Some(&first), &one), "only progress");
        let done = build(
            &at3(3),
            Some(1),
            Some("t".into()),
            false,
            Some(&one),
            &[],
            at(3),
        );
        assert!(urgent(Some(&one), &done), "Updated turned True");
        let blocked = build(
            &at3(1),
            Some(1),
            Some("t".into()),
            false,
            Some(&one),
            &[DrainBlocker {
                node: "w2".into(),
                evictions_refused: true,
                why: "ns/p: eviction refused (429)".into(),
            }],
            at(4),
        );
        assert!(urgent(Some(&one), &blocked), "a node issue");
        let next = build(
            &at3(1),
            Some(2),
            Some("t".into()),
            false,
            Some(&one),
            &[],
            at(5),
        );
        assert!(urgent(Some(&one), &next), "a new generation");
    }

    #[test]
    fn node_reasons_are_one_capped_line() {
        let summary = Summary {
            machines: 1,
            issues: vec![NodeIssue {
                name: "w1".into(),
                state: "Degraded".into(),
                reason: format!("first\nsecond\u{1b}[31m {}", "x".repeat(2_000)),
            }],
            ..Summary::default()
        };
        let blockers = [DrainBlocker {
            node: "w2".into(),
            evictions_refused: false,
            why: "pod a\rpod b".into(),
        }];
        let s = build(&summary, None, None, false, None, &blockers, at(1));
        for n in &s.nodes {
            assert!(!n.reason.chars().any(char::is_control), "{:?}", n.reason);
            assert!(
                n.reason.chars().count() <= crate::events::MAX_NOTE_CHARS,
                "{}",
                n.reason.len()
            );
        }
        assert!(
            s.nodes[0].reason.starts_with("first"),
            "{}",
            s.nodes[0].reason
        );
        assert_eq!(s.nodes.len(), 2);
    }

    #[test]
    fn conditions_follow_the_api_conventions() {
        let unresolved = Summary {
            machines: 2,
            degraded: Some(Degraded {
                reason: "TargetUnresolved",
                message: "spec.target: no OSImageStream".into(),
            }),
            ..Summary::default()
        };
        let s = build(&unresolved, Some(7), None, false, None, &[], at(1));
        assert_eq!(status_of(&s, "Updated"), ("Unknown", "TargetUnknown", 1));
        assert_eq!(status_of(&s, "Degraded"), ("True", "TargetUnresolved", 1));
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(7)),
            "{:?}",
            s.conditions
        );
        let mut types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(
            types.len(),
            s.conditions.len(),
            "one condition per type (a map)"
        );
    }

    #[test]
    fn a_canary_pause_says_so() {
        let summary = Summary {
            machines: 3,
            updated: 1,
            canary_paused: true,
            ..Summary::default()
        };
        let s = build(&summary, Some(1), Some("t".into()), true, None, &[], at(1));
        assert_eq!(status_of(&s, "Paused"), ("True", "CanaryComplete", 1));
        assert_eq!(status_of(&s, "Updating"), ("False", "CanaryComplete", 1));
    }

    #[test]
    fn an_empty_pool_is_updated() {
        let s = build(
            &Summary::default(),
            Some(1),
            Some("t".into()),
            false,
            None,
            &[],
            at(1),
        );
        assert_eq!(status_of(&s, "Updated"), ("True", "Updated", 1));
        assert_eq!(status_of(&s, "Updating").0, "False");
    }

    #[test]
    fn a_stall_names_the_updating_reason() {
        let stalled = Summary {
            machines: 2,
            stall: Some(crate::planner::Stall {
                reason: "NodeNotReturning",
                message: "node w1: approved for its reboot at 5 (Unix seconds) and not back".into(),
            }),
            ..Summary::default()
        };
        let s = build(&stalled, Some(1), Some("t".into()), false, None, &[], at(1));
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Updating")
            .expect("Updating");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "NodeNotReturning")
        );
        assert!(c.message.starts_with("node w1: approved"), "{}", c.message);
        assert_eq!(status_of(&s, "Degraded").0, "False");
    }

    #[test]
    fn conditions_follow_the_summary_and_keep_transition_times() {
        let updating = Summary {
            machines: 3,
            updated: 1,
            unavailable: 1,
            max_unavailable: 1,
            ..Summary::default()
        };
        let first = build(
            &updating,
            Some(2),
            Some("t".into()),
            false,
            None,
            &[],
            at(100),
        );
        assert_eq!(status_of(&first, "Updating"), ("True", "Updating", 100));
        assert_eq!(status_of(&first, "Updated"), ("False", "NotUpdated", 100));
        assert_eq!(status_of(&first, "Degraded"), ("False", "AsExpected", 100));
        assert_eq!(first.observed_generation, Some(2));
        assert_eq!(
            (
                first.machine_count,
                first.updated_machine_count,
                first.unavailable_machine_count
            ),
            (3, 1, 1)
        );

        // A Refused node: Degraded flips (new time), Updating holds (old time).
        let refused = Summary {
            degraded: Some(Degraded {
                reason: "NodeRefused",
                message: "node w2: preflight check cpu-level failed".into(),
            }),
            ..updating.clone()
        };
        let second = build(
            &refused,
            Some(2),
            Some("t".into()),
            false,
            Some(&first),
            &[],
            at(200),
        );
        assert_eq!(status_of(&second, "Degraded"), ("True", "NodeRefused", 200));
        assert_eq!(status_of(&second, "Updating"), ("True", "Updating", 100));

        let paused = build(
            &updating,
            Some(3),
            Some("t".into()),
            true,
            Some(&second),
            &[],
            at(300),
        );
        assert_eq!(status_of(&paused, "Paused"), ("True", "Paused", 300));
        assert_eq!(status_of(&paused, "Updating"), ("False", "Paused", 300));

        let done = Summary {
            updated: 3,
            ready: 3,
            unavailable: 0,
            ..updating
        };
        let last = build(
            &done,
            Some(3),
            Some("t".into()),
            false,
            Some(&paused),
            &[
                DrainBlocker {
                    node: "w9".into(),
                    evictions_refused: true,
                    why: "ns/p: eviction refused (429)".into(),
                },
                DrainBlocker {
                    node: "w8".into(),
                    evictions_refused: false,
                    why: "ns/q: terminating".into(),
                },
            ],
            at(400),
        );
        assert_eq!(status_of(&last, "Updated"), ("True", "Updated", 400));
        assert_eq!(status_of(&last, "Updating").0, "False");
        let states: Vec<_> = last.nodes.iter().map(|n| n.state.as_str()).collect();
        assert_eq!(states, [EVICTION_BLOCKED, "Draining"]);
    }
}
