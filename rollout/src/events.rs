//! The Events an admin follows a rollout by (`kubectl describe streampool <name>`): written
//! with kube-runtime's `events::Recorder` (events.k8s.io/v1, in namespace `default` as for any
//! cluster-scoped object), about the StreamPool, with the Node as the related object when
//! there is one.
//!
//! Three kinds: the rollout's start and completion, once each (`RolloutStarted` when the pool
//! finds nodes to move toward a target, `RolloutCompleted` with the node count and the wall time
//! when they all run it; a node's routine steps are in the pool's `status.progress` and the
//! agent's own Events, and each Event is an API request), a step that needs an admin's eye (a
//! drain given up, a node cordoned again, a node released) once, after its patch succeeded; a lasting
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

/// The Event of an action the controller did on a node. Routine steps (the check keys, the
/// target, the cordon and drain, the approval, the uncordon) are not told: a node's move is told
/// by its agent's Events and the pool's `status.progress` and `status.nodes`, and the rollout
/// as a whole by [`Journal::news`] (`RolloutStarted`, `RolloutCompleted`); each Warning stays.
pub fn for_action(action: &Action) -> Option<Note> {
    Some(match action {
        Action::Check { .. }
        | Action::Target { .. }
        | Action::Cordon { .. }
        | Action::Drain { .. }
        | Action::Uncordon { .. } => return None,
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

/// The [`Journal`]'s key of the rollout's state ([`rollout`]).
const ROLLOUT: &str = "rollout";

/// Where the rollout stands in `status`: `moving <target>` while nodes are still to move to the
/// resolved target (paused or not), `done <target>` when all run it, empty otherwise (no
/// target, no node, a degraded pool with none to move, or the machine-config operator's pool).
fn rollout(status: &StreamPoolStatus) -> String {
    let updated = status.conditions.iter().find(|c| c.type_ == "Updated");
    let managed = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Updating" && c.reason == "ManagedByMachineConfigOperator");
    match (status.target.as_deref(), updated.map(|c| c.status.as_str())) {
        (Some(t), Some("True")) if !managed => format!("done {t}"),
        (Some(t), Some("False"))
            if !managed && status.updated_machine_count < status.machine_count =>
        {
            format!("moving {t}")
        }
        _ => String::new(),
    }
}

/// The rollout's state after `now` given the one `seen` before, and its Normal Event: it
/// starts (`RolloutStarted`) when the pool, not paused nor stalled before its first step
/// (`Updating` true), has nodes to move toward a target it was not seen moving to; it completes
/// (`RolloutCompleted`, with the node count and the wall time) when all nodes run the target it
/// was seen moving to. A pool paused, or stopped by a refused spec, keeps its state: its resume is
/// no new start.
fn rollout_news(
    seen: Option<&String>,
    previous: Option<&StreamPoolStatus>,
    now: &StreamPoolStatus,
) -> (String, Option<Note>) {
    let state = rollout(now);
    let seen = seen.cloned().unwrap_or_default();
    let target = now.target.as_deref().unwrap_or_default();
    let nodes = now.machine_count;
    let was_moving = seen.strip_prefix("moving ") == Some(target);
    if state.starts_with("moving ") {
        let updating = now
            .conditions
            .iter()
            .any(|c| c.type_ == "Updating" && c.status == "True");
        if was_moving || !updating {
            return (if updating { state } else { seen }, None);
        }
        let left = now.machine_count - now.updated_machine_count;
        let note = note(
            false,
            "RolloutStarted",
            "Rollout",
            None,
            &format!("rollout to {target} started: {left} of {nodes} nodes to update"),
        );
        return (state, Some(note));
    }
    if !state.starts_with("done ") || !was_moving {
        return (state, None);
    }
    // The rollout started when `Updated` last turned False, and ends now that it is True.
    let since = |s: &StreamPoolStatus, status: &str| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Updated" && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_second())
    };
    let took = match (previous.and_then(|p| since(p, "False")), since(now, "True")) {
        (Some(a), Some(b)) if b >= a => format!(" in {} s", b - a),
        _ => String::new(),
    };
    let note = note(
        false,
        "RolloutCompleted",
        "Rollout",
        None,
        &format!("rollout to {target} complete: all {nodes} nodes run it{took}"),
    );
    (state, Some(note))
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
                |p| {
                    let mut seen: BTreeMap<String, String> =
                        lasting(p).into_iter().map(|(k, v, _)| (k, v)).collect();
                    seen.insert(ROLLOUT.into(), rollout(p));
                    seen
                },
            )
        });
        let current = lasting(now);
        let (state, started_or_done) = rollout_news(seen.get(ROLLOUT), previous, now);
        let mut news: Vec<Note> = started_or_done.into_iter().collect();
        news.extend(
            current
                .iter()
                .filter(|(k, v, _)| seen.get(k) != Some(v))
                .filter_map(|(_, _, n)| n.clone()),
        );
        *seen = current.into_iter().map(|(k, v, _)| (k, v)).collect();
        seen.insert(ROLLOUT.into(), state);
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
    fn a_node_tells_no_routine_event() {
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
            Action::Uncordon { node: "w1".into() },
        ];
        for a in &routine {
            assert_eq!(for_action(a), None, "{a:?}");
        }
        let warning = for_action(&Action::SetAside {
            node: "w1".into(),
            token: "t1".into(),
        })
        .expect("note");
        assert!(warning.warning);
    }

    /// `status` of a pool of `nodes` with `updated` on `target`, `Updated` since `at`.
    fn moving(target: &str, nodes: i32, updated: i32, at: i64) -> StreamPoolStatus {
        let mut s = status(false, None, &[]);
        let done = updated == nodes;
        s.target = Some(target.into());
        s.machine_count = nodes;
        s.updated_machine_count = updated;
        s.conditions.push(Condition {
            type_: "Updating".into(),
            status: if done { "False" } else { "True" }.into(),
            last_transition_time: None,
            observed_generation: None,
            reason: String::new(),
            message: String::new(),
        });
        s.conditions.push(Condition {
            type_: "Updated".into(),
            status: if done { "True" } else { "False" }.into(),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(at).expect("time"),
            )),
            observed_generation: None,
            reason: String::new(),
            message: String::new(),
        });
        s
    }

    #[test]
    fn a_rollout_tells_its_start_and_its_completion_once() {
        let j = Journal::default();
        let start = moving("rhel-10 img", 3, 0, 1000);
        let news = j.news("p", None, &start);
        assert_eq!(reasons(&news), ["RolloutStarted"]);
        assert_eq!(
            news[0].text,
            "rollout to rhel-10 img started: 3 of 3 nodes to update"
        );
        assert!(!news[0].warning && news[0].node.is_none());
        // Nodes move, the pool is paused and resumed: no rollout news.
        let midway = moving("rhel-10 img", 3, 1, 1000);
        assert!(j.news("p", Some(&start), &midway).is_empty());
        let paused = {
            let mut s = moving("rhel-10 img", 3, 1, 1000);
            s.conditions[0].status = "True".into();
            s.conditions[2].status = "False".into();
            s
        };
        assert_eq!(reasons(&j.news("p", Some(&midway), &paused)), ["Paused"]);
        assert_eq!(reasons(&j.news("p", Some(&paused), &midway)), ["Resumed"]);
        let done = moving("rhel-10 img", 3, 3, 1042);
        let news = j.news("p", Some(&midway), &done);
        assert_eq!(reasons(&news), ["RolloutCompleted"]);
        assert_eq!(
            news[0].text,
            "rollout to rhel-10 img complete: all 3 nodes run it in 42 s"
        );
        assert!(j.news("p", Some(&done), &done).is_empty());
        // A new target starts a new rollout.
        let next = moving("rhel-10 img2", 3, 0, 2000);
        assert_eq!(
            reasons(&j.news("p", Some(&done), &next)),
            ["RolloutStarted"]
        );
        // A pool created paused starts when it is resumed, once.
        let (k, created) = (Journal::default(), moving("t", 2, 0, 10));
        let mut held = created.clone();
        held.conditions[0].status = "True".into();
        held.conditions[2].status = "False".into();
        assert_eq!(reasons(&k.news("s", None, &held)), ["Paused"]);
        assert_eq!(
            reasons(&k.news("s", Some(&held), &created)),
            ["RolloutStarted", "Resumed"]
        );
        assert_eq!(reasons(&k.news("s", Some(&created), &held)), ["Paused"]);
        assert_eq!(reasons(&k.news("s", Some(&held), &created)), ["Resumed"]);
        // A pool already on its target, or a new leader mid-rollout: nothing to tell.
        let k = Journal::default();
        assert!(k.news("q", None, &done).is_empty());
        assert!(k.news("r", Some(&midway), &midway).is_empty());
        assert_eq!(
            reasons(&k.news("r", Some(&midway), &done)),
            ["RolloutCompleted"]
        );
    }
}
