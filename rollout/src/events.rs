//! The Events an admin follows a rollout by (`kubectl describe streampool <name>`): written
//! with kube-runtime's `events::Recorder` (events.k8s.io/v1, in namespace `default` as for any
//! cluster-scoped object), about the StreamPool, with the Node as the related object when
//! there is one.
//!
//! Two kinds: a node's move is reported once, when it is updated and uncordoned (with how long
//! it took; the routine steps before are in the pool's `status.progress`, and each Event is an
//! API request), and a step that needs an admin's eye (a drain given up, a node cordoned
//! again, a node released) once, after its patch succeeded; a lasting
//! condition read from the pool's status (paused, pool degraded, a node Refused or Degraded, an
//! eviction a PodDisruptionBudget refuses) is reported when it starts or changes, not on every
//! reconcile or drain pass. The [`Journal`] remembers what was reported; for a pool it has not
//! seen (a restarted controller, a new leader) what the last written status shows counts as
//! reported already.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::crd::StreamPoolStatus;
use crate::planner::Action;

/// `reportingController` of every Event.
pub const REPORTER: &str = "streamd-rollout";
/// The `status.nodes[]` state of a drain a PodDisruptionBudget holds, and its Event's reason.
pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
/// A note is one line of at most this many characters (the API allows 1024 bytes; a character
/// is at most 4).
pub const MAX_NOTE_CHARS: usize = 256;

/// One Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// PascalCase reason, e.g. `DrainStarted`.
    pub reason: &'static str,
    /// PascalCase action, e.g. `Drain`.
    pub action: &'static str,
    /// The related Node.
    pub node: Option<String>,
    /// One inert line (no control characters), at most [`MAX_NOTE_CHARS`].
    pub text: String,
}

fn note(
    warning: bool,
    reason: &'static str,
    action: &'static str,
    node: Option<&str>,
    text: &str,
) -> Note {
    Note {
        warning,
        reason,
        action,
        node: node.map(String::from),
        text: streamd::text::one_line(text, MAX_NOTE_CHARS),
    }
}

/// The Event of an action the controller did on a node toward `stream`, `took` seconds after
/// the node was given the request. Routine steps (the check keys, the target, the cordon and
/// drain, the approval) are not told one by one: a node tells one Normal Event when it is
/// updated (uncordoned on the target), saying how long its move took; each Warning stays.
pub fn for_action(action: &Action, stream: &str, took: Option<u64>) -> Option<Note> {
    Some(match action {
        Action::Check { .. }
        | Action::Target { .. }
        | Action::Cordon { .. }
        | Action::Drain { .. } => return None,
        Action::Uncordon { node } => {
            let took = took.map_or(String::new(), |s| {
                format!(" ({s} s after it was given the request)")
            });
            note(
                false,
                "NodeUpdated",
                "Uncordon",
                Some(node),
                &format!(
                    "node {node}: staged, drained, rebooted into {stream} and uncordoned{took}"
                ),
            )
        }
        Action::SetAside { node, token } => note(
            true,
            "DrainGivenUp",
            "Release",
            Some(node),
            &format!(
                "node {node}: the drain before reboot {token} did not finish within its timeout; uncordoned and set aside (drain.onTimeout: release), the pool moves on"
            ),
        ),
        Action::Recordon { node } => note(
            true,
            "NodeRecordoned",
            "Drain",
            Some(node),
            &format!(
                "node {node}: uncordoned by someone else while it was drained; cordoned again, the drain goes on (to take it out of the rollout, relabel it out of the pool's selector)"
            ),
        ),
        // Told by `released`, with what the release did.
        Action::Release { .. } => return None,
    })
}

/// The Event of a node released by the pool (`why`: the pool is deleted, or the node left its
/// selector).
pub fn released(node: &str, why: &str, withdrew: bool, uncordoned: bool) -> Note {
    let mut text = format!("node {node}: released because {why}");
    if uncordoned {
        text.push_str("; uncordoned");
    }
    if withdrew {
        text.push_str("; the pool's request withdrawn");
    }
    note(false, "NodeReleased", "Release", Some(node), &text)
}

/// The Warning Event of a failed reconcile (`error`: what failed, one line), told once per
/// cause.
pub fn reconcile_failed(error: &str) -> Note {
    note(
        true,
        "ReconcileFailed",
        "Reconcile",
        None,
        &format!("reconcile failed, retrying with backoff: {error}"),
    )
}

/// The Event of a pool paused because its canary moved its nodes toward `target`.
pub fn canary_complete(target: &str) -> Note {
    note(
        false,
        "CanaryComplete",
        "Pause",
        None,
        &format!(
            "the canary's nodes run {target} and are back; the pool is paused: set spec.paused: false to go on"
        ),
    )
}

/// A lasting condition: its key, its value (a change is news) and its Event (`None`: the
/// condition's quiet value, e.g. not degraded).
type Lasting = (String, String, Option<Note>);

/// The lasting conditions `status` shows.
fn lasting(status: &StreamPoolStatus) -> Vec<Lasting> {
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let paused = condition("Paused").is_some_and(|c| c.status == "True");
    let mut out = vec![(
        "paused".to_string(),
        paused.to_string(),
        Some(if paused {
            note(
                false,
                "Paused",
                "Pause",
                None,
                "rollout paused: no node is given the target, cordoned, drained or approved",
            )
        } else {
            note(false, "Resumed", "Resume", None, "rollout resumed")
        }),
    )];
    let degraded = condition("Degraded").filter(|c| c.status == "True");
    out.push((
        "degraded".into(),
        degraded.map_or(String::new(), |c| format!("{}: {}", c.reason, c.message)),
        degraded.map(|c| {
            note(
                true,
                "PoolDegraded",
                "Rollout",
                None,
                &format!(
                    "{}: {}; no new node is taken until it is resolved",
                    c.reason, c.message
                ),
            )
        }),
    ));
    let blocked = condition("Updating").filter(|c| c.status == "True" && c.reason == "Blocked");
    out.push((
        "blocked".into(),
        blocked.map_or(String::new(), |c| c.message.clone()),
        blocked.map(|c| note(true, "PoolBlocked", "Rollout", None, &c.message)),
    ));
    for issue in &status.nodes {
        let name = issue.name.as_str();
        let (reason, action) = match issue.state.as_str() {
            "Refused" => ("NodeRefused", "Rollout"),
            "Degraded" => ("NodeDegraded", "Rollout"),
            "AgentNotResponding" => ("AgentNotResponding", "Rollout"),
            "NodeNotReturning" => ("NodeNotReturning", "Reboot"),
            "DrainTimeout" => ("DrainTimeout", "Drain"),
            "Conflict" => ("NodeInSeveralPools", "Rollout"),
            EVICTION_BLOCKED => (EVICTION_BLOCKED, "Drain"),
            _ => continue,
        };
        let text = if reason == EVICTION_BLOCKED {
            format!(
                "node {name}: a PodDisruptionBudget refuses an eviction; retrying: {}",
                issue.reason
            )
        } else {
            format!("node {name}: {}", issue.reason)
        };
        out.push((
            format!("{reason}/{name}"),
            // An eviction refused again on the next pass is the same news.
            if reason == EVICTION_BLOCKED {
                String::new()
            } else {
                issue.reason.clone()
            },
            Some(note(true, reason, action, Some(name), &text)),
        ));
    }
    out
}

/// What was reported, per pool (see the module documentation).
#[derive(Debug, Default)]
pub struct Journal(Mutex<HashMap<String, BTreeMap<String, String>>>);

impl Journal {
    /// The Events of the lasting conditions `now` shows that were not reported for `pool`
    /// yet; `previous` is the pool's status before this reconcile.
    pub fn news(
        &self,
        pool: &str,
        previous: Option<&StreamPoolStatus>,
        now: &StreamPoolStatus,
    ) -> Vec<Note> {
        let mut pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seen = pools.entry(pool.to_string()).or_insert_with(|| {
            previous.map_or_else(
                // A new pool: being unpaused is no news, being paused is.
                || BTreeMap::from([("paused".to_string(), false.to_string())]),
                |p| lasting(p).into_iter().map(|(k, v, _)| (k, v)).collect(),
            )
        });
        let current = lasting(now);
        let news = current
            .iter()
            .filter(|(k, v, _)| seen.get(k) != Some(v))
            .filter_map(|(_, _, n)| n.clone())
            .collect();
        *seen = current.into_iter().map(|(k, v, _)| (k, v)).collect();
        news
    }

    /// Forgets `pool` (deleted).
    pub fn forget(&self, pool: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Condition, NodeIssue};

    fn status(
        paused: bool,
        degraded: Option<(&str, &str)>,
        nodes: &[(&str, &str, &str)],
    ) -> StreamPoolStatus {
        let cond = |type_: &str, on: bool, reason: &str, message: &str| Condition {
            type_: type_.into(),
            status: if on { "True" } else { "False" }.into(),
            last_transition_time: None,
            observed_generation: None,
            reason: reason.into(),
            message: message.into(),
        };
        StreamPoolStatus {
            conditions: vec![
                cond("Paused", paused, "", ""),
                match degraded {
                    Some((r, m)) => cond("Degraded", true, r, m),
                    None => cond("Degraded", false, "AsExpected", ""),
                },
            ],
            nodes: nodes
                .iter()
                .map(|(n, s, r)| NodeIssue {
                    name: n.to_string(),
                    state: s.to_string(),
                    reason: r.to_string(),
                })
                .collect(),
            ..StreamPoolStatus::default()
        }
    }

    fn reasons(notes: &[Note]) -> Vec<&str> {
        notes.iter().map(|n| n.reason).collect()
    }

    #[test]
    fn lasting_conditions_are_reported_when_they_start_or_change() {
        let j = Journal::default();
        let quiet = status(false, None, &[]);
        assert!(j.news("p", None, &quiet).is_empty());
        let blocked = status(
            false,
            None,
            &[(
                "w1",
                EVICTION_BLOCKED,
                "default/web: eviction refused (429): Cannot evict pod",
            )],
        );
        assert_eq!(
            reasons(&j.news("p", Some(&quiet), &blocked)),
            ["EvictionBlocked"]
        );
        // The next drain pass, refused again with another text: no news.
        let again = status(
            false,
            None,
            &[(
                "w1",
                EVICTION_BLOCKED,
                "default/web: eviction refused (429): other text",
            )],
        );
        assert!(j.news("p", Some(&blocked), &again).is_empty());
        let refused = status(
            false,
            Some(("NodeRefused", "node w2: preflight check cpu-level failed")),
            &[(
                "w2",
                "Refused",
                "preflight check cpu-level failed: x86-64-v2",
            )],
        );
        assert_eq!(
            reasons(&j.news("p", Some(&again), &refused)),
            ["PoolDegraded", "NodeRefused"]
        );
        assert!(j.news("p", Some(&refused), &refused).is_empty());
        let paused = status(true, None, &[]);
        assert_eq!(reasons(&j.news("p", Some(&refused), &paused)), ["Paused"]);
        assert_eq!(reasons(&j.news("p", Some(&paused), &quiet)), ["Resumed"]);
        // A new pool created paused.
        assert_eq!(reasons(&j.news("q", None, &paused)), ["Paused"]);
    }

    #[test]
    fn only_a_refused_eviction_is_eviction_blocked_whatever_the_text_says() {
        // A pod whose name (or a reason text) reads like a refusal is still only draining.
        let draining = status(
            false,
            None,
            &[(
                "w1",
                "Draining",
                "default/eviction refused (429): terminating",
            )],
        );
        assert!(Journal::default().news("p", None, &draining).is_empty());
    }

    #[test]
    fn a_new_leader_does_not_report_what_the_status_already_shows() {
        let j = Journal::default();
        let refused = status(
            true,
            Some(("NodeRefused", "node w2: x")),
            &[("w2", "Refused", "x")],
        );
        assert!(j.news("p", Some(&refused), &refused).is_empty());
    }

    #[test]
    fn notes_are_one_inert_bounded_line() {
        let hostile = format!("line one\nline two\u{1b}[31m red\u{7}{}", "x".repeat(2000));
        let s = status(false, None, &[("w2", "Degraded", hostile.as_str())]);
        let notes = Journal::default().news("p", None, &s);
        let text = &notes[0].text;
        assert!(
            text.starts_with("node w2: line one; line two red"),
            "{text}"
        );
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert_eq!(text.chars().count(), MAX_NOTE_CHARS);
        assert!(text.len() <= 1024);
    }

    #[test]
    fn a_node_tells_one_routine_event_when_updated() {
        let n =
            for_action(&Action::Uncordon { node: "w1".into() }, "rhel-10", Some(42)).expect("note");
        assert_eq!(
            (n.warning, n.reason, n.action, n.node.as_deref()),
            (false, "NodeUpdated", "Uncordon", Some("w1"))
        );
        assert!(
            n.text.contains("rhel-10") && n.text.contains("42 s"),
            "{}",
            n.text
        );
        let routine = [
            Action::Check { node: "w1".into() },
            Action::Target { node: "w1".into() },
            Action::Cordon {
                node: "w1".into(),
                token: "t1".into(),
            },
            Action::Drain {
                node: "w1".into(),
                token: "t1".into(),
            },
        ];
        for a in &routine {
            assert_eq!(for_action(a, "rhel-10", Some(1)), None, "{a:?}");
        }
        let warning = for_action(
            &Action::SetAside {
                node: "w1".into(),
                token: "t1".into(),
            },
            "rhel-10",
            None,
        )
        .expect("note");
        assert!(warning.warning);
    }
}
