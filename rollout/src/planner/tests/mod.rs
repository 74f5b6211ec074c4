//! The planner's table and scenario tests; the property test is in `properties.rs`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::node::{
    CHECK_STREAM, MCD_CURRENT_CONFIG, READINESS, ROLLOUT_SET_ASIDE, ROLLOUT_TARGETED,
};
use crate::waves::{self, Waves};
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
        spec_error: None,
        max_unavailable: None,
        max_concurrent_staging: 10,
        paused: false,
        drain_timeout_seconds: 600,
        drain_on_timeout: OnTimeout::Retry,
        agent_timeout_seconds: 600,
        reboot_timeout_seconds: 1_800,
        now: 10_000,
        claimed: BTreeMap::new(),
        waves: Waves::default(),
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
            Step::Approved {
                since: None,
                token: "t1".into(),
            },
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
        ("drain timed out: retried (onTimeout retry), no other node taken", pool(),
         vec![step(staged("w1", "t1"), draining("t1", 1_000)), staged("w2", "t2")],
         vec![Action::Drain { node: "w1".into(), token: "t1".into() }]),
        ("approved: no second drain or approval", pool(),
         vec![step(staged("w1", "t1"), Step::Approved { since: None, token: "t1".into() }), staged("w2", "t2")],
         vec![]),
        ("a new token after an unplanned reboot: drained again, no new slot", pool(),
         vec![step(staged("w1", "t1b"), Step::Approved { since: None, token: "t1".into() }), staged("w2", "t2")],
         vec![cordon("w1", "t1b")]),
        ("rebooting: wait", pool(),
         vec![step(in_state(node("w1"), "Rebooting"), Step::Approved { since: None, token: "t1".into() }), staged("w2", "t2")],
         vec![]),
        ("done but not Ready: wait", pool(),
         vec![done_not_ready, staged("w2", "t2")],
         vec![]),
        ("done and Ready: uncordon, then the next", pool(),
         vec![step(in_state(node("w1"), "Done"), Step::Approved { since: None, token: "t1".into() }), staged("w2", "t2")],
         vec![Action::Uncordon { node: "w1".into() }]),
        ("a Refused node stops new work; the node in flight finishes", pool(),
         vec![step(in_state(node("w1"), "Done"), Step::Approved { since: None, token: "t1".into() }), refused.clone(), staged("w3", "t3"), node("w4")],
         vec![Action::Uncordon { node: "w1".into() }]),
        ("paused: no new work, in-flight drain stops", paused.clone(),
         vec![step(staged("w1", "t1"), draining("t1", 9_900)), staged("w2", "t2"), node("w3")],
         vec![]),
        ("paused: a finished node is still uncordoned", paused,
         vec![step(in_state(node("w1"), "Done"), Step::Approved { since: None, token: "t1".into() }), staged("w2", "t2")],
         vec![Action::Uncordon { node: "w1".into() }]),
        ("updated nodes are left alone", pool(),
         vec![in_state(node("w1"), "Done"), in_state(node("w2"), "Done")],
         vec![]),
    ];
    for (name, pool, nodes, want) in table {
        assert_eq!(plan(&pool, &nodes).actions, want, "{name}");
    }
}

/// Drains past their timeout, nodes set aside, agents and reboots past their deadlines.
#[test]
fn stall_table() {
    #[rustfmt::skip]
    let table: Vec<(&str, PoolInput, Vec<NodeView>, Vec<Action>)> = vec![
        ("drain timed out, onTimeout release: set aside, the next node taken", PoolInput { drain_on_timeout: OnTimeout::Release, ..pool() },
         vec![step(staged("w1", "t1"), draining("t1", 1_000)), staged("w2", "t2")],
         vec![Action::SetAside { node: "w1".into(), token: "t1".into() }]),
        ("uncordoned by someone else mid-drain: cordoned again, not drained or approved", pool(),
         vec![uncordoned(step(staged("w1", "t1"), draining("t1", 9_900))), staged("w2", "t2")],
         vec![Action::Recordon { node: "w1".into() }]),
        ("uncordoned past the drain timeout: cordoned again first", PoolInput { drain_on_timeout: OnTimeout::Release, ..pool() },
         vec![uncordoned(step(staged("w1", "t1"), draining("t1", 1_000)))],
         vec![Action::Recordon { node: "w1".into() }]),
        ("a node set aside for its token goes after the others", pool(),
         vec![set(staged("w1", "t1"), ROLLOUT_SET_ASIDE, "t1"), staged("w2", "t2")],
         vec![cordon("w2", "t2")]),
        ("a node set aside is taken again when it is the last", pool(),
         vec![set(staged("w1", "t1"), ROLLOUT_SET_ASIDE, "t1"), in_state(node("w2"), "Done")],
         vec![cordon("w1", "t1")]),
        ("set aside for an older token: an ordinary node", pool(),
         vec![set(staged("w1", "t1b"), ROLLOUT_SET_ASIDE, "t1"), staged("w2", "t2")],
         vec![cordon("w1", "t1b")]),
        ("an agent silent past agentTimeoutSeconds frees its staging slot", PoolInput { max_concurrent_staging: 1, ..pool() },
         vec![set(targeted(node("w1")), ROLLOUT_TARGETED, "9000"), node("w2")],
         vec![target_a("w2")]),
        ("an agent within agentTimeoutSeconds holds its slot", PoolInput { max_concurrent_staging: 1, ..pool() },
         vec![set(targeted(node("w1")), ROLLOUT_TARGETED, "9500"), node("w2")],
         vec![]),
        ("a reboot past rebootTimeoutSeconds still counts as unavailable", pool(),
         vec![step(in_state(node("w1"), "Rebooting"), Step::Approved { since: Some(1_000), token: "t1".into() }), staged("w2", "t2")],
         vec![]),
        ("a node NotReady past rebootTimeoutSeconds: no other node in its place", half_of_three(),
         vec![not_returning_not_ready(), staged("w2", "t2"), staged("w3", "t3")],
         vec![]),
    ];
    for (name, pool, nodes, want) in table {
        assert_eq!(plan(&pool, &nodes).actions, want, "{name}");
    }
}

fn uncordoned(mut n: NodeView) -> NodeView {
    n.unschedulable = false;
    n
}

/// `maxUnavailable: 50%` of three nodes (1).
fn half_of_three() -> PoolInput {
    PoolInput {
        max_unavailable: Some(IntOrString::String("50%".into())),
        ..pool()
    }
}

/// w1, approved long ago, back on the old deployment but NotReady.
fn not_returning_not_ready() -> NodeView {
    let mut n = step(
        in_state(node("w1"), "Done"),
        Step::Approved {
            since: Some(1_000),
            token: "t1".into(),
        },
    );
    n.ready = false;
    n
}

#[test]
fn released_nodes_finish_an_approved_reboot_and_keep_only_a_request_they_run() {
    let approved = |n: NodeView| {
        step(
            n,
            Step::Approved {
                since: None,
                token: "t1".into(),
            },
        )
    };
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

    // A drain past its timeout is a stall, not Degraded: the pool takes other nodes as its
    // maxUnavailable allows.
    let p = plan(&pool(), &[step(staged("w1", "t1"), draining("t1", 1_000))]);
    assert_eq!(p.summary.degraded, None);
    let stall = p.summary.stall.expect("timeout");
    assert_eq!(stall.reason, "DrainTimeout");
    assert_eq!(
        stall.message,
        "node w1: drain did not finish within 600 s; it stays cordoned and the drain is retried"
    );
    assert_eq!(p.summary.timed_out, vec!["w1".to_string()]);
    assert_eq!(p.summary.issues[0].state, "DrainTimeout");

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
        spec_error: Some("spec.drain.podSelector: bad".into()),
        ..pool()
    };
    let p = plan(&bad, &[staged("w1", "t1")]);
    let d = p.summary.degraded.expect("spec");
    assert_eq!(
        (d.reason, d.message.as_str()),
        ("InvalidSpec", "spec.drain.podSelector: bad")
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
fn a_node_of_two_custom_pools_is_left_alone_and_the_pool_says_so() {
    let both = PoolInput {
        claimed: [("w1".to_string(), "infra".to_string())].into(),
        ..pool()
    };
    let p = plan(&both, &[staged("w1", "t1"), staged("w2", "t2"), node("w3")]);
    // The others go on; w1 is neither cordoned nor targeted.
    assert_eq!(p.actions, vec![target_a("w3"), cordon("w2", "t2")]);
    assert_eq!(p.summary.degraded, None);
    let issue = &p.summary.issues[0];
    assert_eq!(
        (issue.name.as_str(), issue.state.as_str()),
        ("w1", "Conflict")
    );
    assert!(
        issue
            .reason
            .starts_with("also selected by the custom StreamPool infra"),
        "{}",
        issue.reason
    );
    // Counted, so the pool is not Updated while the node is in two pools.
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
    // (w4's request is withdrawn: the pool's nodes are the machine-config operator's now.)
    let p = plan(&pool(), &[bare, mco_bare, staged("w4", "t4")]);
    assert!(p.summary.mco_managed);
    assert_eq!(
        p.actions,
        vec![
            Action::Check { node: "w1".into() },
            Action::Check { node: "w2".into() },
            Action::Release { node: "w4".into() },
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
        Step::Approved {
            since: None,
            token: "t2".into(),
        },
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

#[test]
fn stalls_are_named_with_their_nodes() {
    let silent = set(targeted(node("w1")), ROLLOUT_TARGETED, "9000");
    let p = plan(&pool(), &[silent.clone(), node("w2")]);
    let stall = p.summary.stall.expect("agent");
    assert_eq!(stall.reason, "AgentNotResponding");
    assert!(
        stall
            .message
            .starts_with("node w1: streamd did not acknowledge the pool's request within 600 s"),
        "{}",
        stall.message
    );
    assert_eq!(
        (
            p.summary.issues[0].name.as_str(),
            p.summary.issues[0].state.as_str()
        ),
        ("w1", "AgentNotResponding")
    );
    // Acknowledged late: an ordinary staging node again.
    let acked = set(silent, OBSERVED_DESIRED, &hash());
    let p = plan(&pool(), &[set(acked, STATE, "Staging")]);
    assert_eq!(p.summary.stall, None);

    let p = plan(
        &half_of_three(),
        &[not_returning_not_ready(), staged("w2", "t2")],
    );
    let stall = p.summary.stall.expect("reboot");
    assert_eq!(stall.reason, "NodeNotReturning");
    assert!(
        stall
            .message
            .contains("within 1800 s; it still counts as unavailable"),
        "{}",
        stall.message
    );
    assert_eq!(p.summary.unavailable, 1);

    // NotReady and cordoned by someone else: the waiting node is Blocked, naming them.
    let mut down = staged("w2", "t2");
    down.ready = false;
    let mut cordoned = in_state(node("w3"), "Done");
    cordoned.unschedulable = true;
    let two = PoolInput {
        max_unavailable: Some(IntOrString::Int(2)),
        ..pool()
    };
    let p = plan(&two, &[staged("w1", "t1"), down.clone(), cordoned]);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    let stall = p.summary.stall.expect("blocked");
    assert_eq!(stall.reason, "Blocked");
    assert!(
        stall.message.contains("w2 (NotReady), w3 (cordoned)"),
        "{}",
        stall.message
    );
    // The rollout's own node in flight uses the slot: progress, not Blocked.
    let own = step(staged("w3", "t3"), draining("t3", 9_900));
    let p = plan(&pool(), &[staged("w1", "t1"), own]);
    assert_eq!(p.summary.stall, None);
    // Nothing waits: nothing is blocked.
    let p = plan(&pool(), &[in_state(node("w1"), "Staging"), down]);
    assert_eq!(p.summary.stall, None);
}

#[test]
fn deadlines_and_drain_retries_are_rechecked() {
    // Draining within its timeout: looked at again just after the timeout (its passes are the
    // drain's: pod events, evictions tried again).
    let p = plan(&pool(), &[step(staged("w1", "t1"), draining("t1", 9_900))]);
    assert_eq!(p.summary.recheck_after, Some(600 - 100 + 1));
    // An agent deadline at 9_500 + 600: looked at again just after it.
    let p = plan(
        &pool(),
        &[set(targeted(node("w1")), ROLLOUT_TARGETED, "9500")],
    );
    assert_eq!(p.summary.recheck_after, Some(101));
    // A reboot approved at 9_000: 1_800 s from then.
    let rebooting = step(
        in_state(node("w1"), "Rebooting"),
        Step::Approved {
            since: Some(9_000),
            token: "t1".into(),
        },
    );
    assert_eq!(plan(&pool(), &[rebooting]).summary.recheck_after, Some(801));
    // A drain retried past its timeout backs off.
    let p = plan(&pool(), &[step(staged("w1", "t1"), draining("t1", 1_000))]);
    assert_eq!(p.summary.recheck_after, Some(300));
    let p = plan(&pool(), &[step(staged("w1", "t1"), draining("t1", 9_000))]);
    assert_eq!(p.summary.recheck_after, Some(60));
    assert_eq!(
        plan(&pool(), &[in_state(node("w1"), "Done")])
            .summary
            .recheck_after,
        None
    );
}

#[test]
fn drain_retries_back_off_like_the_mco() {
    for (over, want) in [(0, 60), (599, 60), (600, 300), (100_000, 300)] {
        assert_eq!(drain_retry_after(over), want, "{over}");
    }
}

#[test]
fn a_pool_that_becomes_mco_managed_releases_its_nodes() {
    let mco = |n: NodeView| set(n, MCD_CURRENT_CONFIG, "rendered-worker-abc");
    let approved = Step::Approved {
        since: Some(9_900),
        token: "t2".into(),
    };
    let nodes = [
        mco(step(staged("w1", "t1"), draining("t1", 9_900))),
        mco(step(in_state(node("w2"), "Rebooting"), approved)),
        mco(in_state(node("w3"), "Staging")),
        // Runs the request: nothing of it to take back.
        mco(in_state(node("w4"), "Done")),
        mco(node("w5")),
    ];
    let p = plan(&pool(), &nodes);
    assert!(p.summary.mco_managed);
    assert_eq!(
        p.actions,
        vec![
            Action::Release { node: "w1".into() },
            Action::Release { node: "w3".into() },
        ]
    );
}

#[test]
fn an_empty_pool_plans_nothing() {
    let p = plan(&pool(), &[]);
    assert!(p.actions.is_empty());
    assert_eq!((p.summary.machines, p.summary.updated), (0, 0));
    assert_eq!(p.summary.degraded, None);
}

#[test]
fn update_taints() {
    let tainted = |mut n: NodeView| {
        n.update_tainted = true;
        n
    };
    let on = |n: &str| (n.to_string(), true);
    let off = |n: &str| (n.to_string(), false);
    let paused = PoolInput {
        paused: true,
        ..pool()
    };
    let invalid = PoolInput {
        spec_error: Some("bad podSelector".into()),
        ..pool()
    };
    type Row = (&'static str, PoolInput, Vec<NodeView>, Vec<(String, bool)>);
    let rows: Vec<Row> = vec![
        (
            "fresh nodes are tainted",
            pool(),
            vec![node("w1"), node("w2")],
            vec![on("w1"), on("w2")],
        ),
        (
            "staging, staged and in flight keep theirs",
            pool(),
            vec![
                tainted(in_state(node("w1"), "Staging")),
                tainted(staged("w2", "t2")),
                tainted(step(
                    in_state(node("w3"), "Rebooting"),
                    Step::Approved {
                        since: None,
                        token: "t3".into(),
                    },
                )),
            ],
            vec![],
        ),
        (
            "an updated node loses it",
            pool(),
            vec![
                tainted(in_state(node("w1"), "Done")),
                in_state(node("w2"), "Done"),
            ],
            vec![off("w1")],
        ),
        // Uncordoned in this pass; the taint goes once it is seen updated.
        (
            "done but still marked keeps it until uncordoned",
            pool(),
            vec![tainted(step(
                in_state(node("w1"), "Done"),
                Step::Approved {
                    since: None,
                    token: "t1".into(),
                },
            ))],
            vec![],
        ),
        (
            "a failed node is still to update",
            pool(),
            vec![set(in_state(node("w1"), "Degraded"), REASON, "pull failed")],
            vec![on("w1")],
        ),
        (
            "a paused pool still marks what is to update",
            paused,
            vec![node("w1")],
            vec![on("w1")],
        ),
        (
            "an invalid spec changes no taint",
            invalid,
            vec![node("w1"), tainted(in_state(node("w2"), "Done"))],
            vec![],
        ),
        (
            "an MCO pool removes them",
            pool(),
            vec![
                tainted(set(node("w1"), MCD_CURRENT_CONFIG, "rendered-worker-abc")),
                set(node("w2"), MCD_CURRENT_CONFIG, "rendered-worker-abc"),
            ],
            vec![off("w1")],
        ),
    ];
    for (name, pool, nodes, want) in rows {
        assert_eq!(plan(&pool, &nodes).taints, want, "{name}");
    }
}

fn in_zone(mut n: NodeView, zone: &str, created: i64) -> NodeView {
    n.zone = Some(zone.into());
    n.created = Some(created);
    n
}

fn held(mut n: NodeView) -> NodeView {
    n.hold = Some("true".into());
    n
}

/// Done and uncordoned by the controller at `at`.
fn updated_at(name: &str, at: u64) -> NodeView {
    set(
        in_state(node(name), "Done"),
        crate::node::ROLLOUT_UPDATED,
        &at.to_string(),
    )
}

fn with_waves(waves: Waves) -> PoolInput {
    PoolInput { waves, ..pool() }
}

#[test]
fn waves_table() {
    let own = with_waves(Waves {
        controller_node: Some("w1".into()),
        ..Waves::default()
    });
    let soak = with_waves(Waves {
        min_ready_seconds: 300,
        ..Waves::default()
    });
    let canary = |done| {
        with_waves(Waves {
            canary: Some(1),
            canary_done: done,
            ..Waves::default()
        })
    };
    let closed = with_waves(Waves {
        window: waves::WindowNow {
            open: false,
            change_in: Some(3_600),
        },
        ..Waves::default()
    });
    let mut held_cordoned = held(staged("w1", "t1"));
    held_cordoned.unschedulable = true;
    #[rustfmt::skip]
    let table: Vec<(&str, PoolInput, Vec<NodeView>, Vec<Action>)> = vec![
        ("zone by zone, oldest first, not by name", pool(),
         vec![in_zone(staged("w1", "t1"), "b", 1), in_zone(staged("w2", "t2"), "a", 9), in_zone(staged("w3", "t3"), "a", 5)],
         vec![cordon("w3", "t3")]),
        ("targets are given in that order too", PoolInput { max_concurrent_staging: 1, ..pool() },
         vec![in_zone(node("w1"), "b", 1), in_zone(node("w2"), "a", 9)],
         vec![target_a("w2")]),
        ("the controller's node waits while another is on its way", own.clone(),
         vec![staged("w1", "t1"), in_state(node("w2"), "Staging")],
         vec![]),
        ("the controller's node is taken last", own.clone(),
         vec![staged("w1", "t1"), in_state(node("w2"), "Done")],
         vec![cordon("w1", "t1")]),
        ("a silent agent elsewhere does not hold the controller's node", own,
         vec![staged("w1", "t1"), set(targeted(node("w2")), crate::node::ROLLOUT_TARGETED, "1")],
         vec![cordon("w1", "t1")]),
        ("a held node is neither targeted nor cordoned", pool(),
         vec![held(node("w1")), held(staged("w2", "t2")), staged("w3", "t3")],
         vec![cordon("w3", "t3")]),
        ("a held node someone cordoned uses no slot", pool(),
         vec![held_cordoned, staged("w2", "t2")],
         vec![cordon("w2", "t2")]),
        ("a held node already taken finishes its cycle", pool(),
         vec![held(step(staged("w1", "t1"), draining("t1", 9_900)))],
         vec![Action::Drain { node: "w1".into(), token: "t1".into() }]),
        ("a node soaking holds its slot", soak.clone(),
         vec![updated_at("w1", 9_800), staged("w2", "t2")],
         vec![]),
        ("after the soak the slot is free", soak,
         vec![updated_at("w1", 9_700), staged("w2", "t2")],
         vec![cordon("w2", "t2")]),
        ("the canary takes its nodes", canary(false),
         vec![staged("w1", "t1"), staged("w2", "t2")],
         vec![cordon("w1", "t1")]),
        ("the canary took its node: no more", canary(false),
         vec![in_state(node("w1"), "Done"), staged("w2", "t2")],
         vec![]),
        ("the canary ran for this target: the pool goes on", canary(true),
         vec![in_state(node("w1"), "Done"), staged("w2", "t2")],
         vec![cordon("w2", "t2")]),
        ("outside the windows: staging goes on, no cordon", PoolInput { max_concurrent_staging: 1, ..closed.clone() },
         vec![staged("w1", "t1"), node("w2")],
         vec![target_a("w2")]),
        ("outside the windows: a node in flight finishes", closed,
         vec![step(staged("w1", "t1"), draining("t1", 9_900)), staged("w2", "t2")],
         vec![Action::Drain { node: "w1".into(), token: "t1".into() }]),
    ];
    for (name, pool, nodes, want) in table {
        assert_eq!(plan(&pool, &nodes).actions, want, "{name}");
    }
}

#[test]
fn waves_in_the_summary() {
    let canary = with_waves(Waves {
        canary: Some(1),
        ..Waves::default()
    });
    let nodes = [in_state(node("w1"), "Done"), staged("w2", "t2")];
    assert!(plan(&canary, &nodes).summary.canary_complete);
    let in_flight = [
        step(in_state(node("w1"), "Rebooting"), draining("t1", 9_990)),
        staged("w2", "t2"),
    ];
    assert!(
        !plan(&canary, &in_flight).summary.canary_complete,
        "complete only once its nodes are back"
    );
    let all = [in_state(node("w1"), "Done")];
    assert!(
        !plan(&canary, &all).summary.canary_complete,
        "nothing left to pause for"
    );

    let soak = with_waves(Waves {
        min_ready_seconds: 300,
        ..Waves::default()
    });
    let s = plan(&soak, &[updated_at("w1", 9_800), staged("w2", "t2")]).summary;
    assert_eq!((s.unavailable, s.recheck_after), (1, Some(100)));

    let closed = with_waves(Waves {
        window: waves::WindowNow {
            open: false,
            change_in: Some(3_600),
        },
        ..Waves::default()
    });
    let s = plan(&closed, &[staged("w1", "t1")]).summary;
    assert_eq!(s.stall.map(|x| x.reason), Some("OutsideWindow"));
    assert_eq!(s.recheck_after, Some(3_600));

    let p = plan(
        &pool(),
        &[
            in_zone(held(node("w0")), "a", 0),
            in_zone(in_state(node("w1"), "Done"), "a", 1),
            in_zone(staged("w2", "t2"), "b", 2),
            in_zone(node("w3"), "a", 3),
        ],
    );
    assert_eq!(p.summary.upcoming, ["w3", "w2"], "the planned order");
    assert!(
        p.summary
            .issues
            .iter()
            .any(|i| i.name == "w0" && i.state == "Held")
    );
    assert!(
        !p.taints.iter().any(|(n, on)| n == "w0" && *on),
        "a held node is not tainted"
    );
}

#[test]
fn progress_names_each_node_on_its_way() {
    let soak = with_waves(Waves {
        min_ready_seconds: 300,
        ..Waves::default()
    });
    let nodes = [
        updated_at("w0", 9_800),
        step(staged("w1", "t1"), draining("t1", 9_900)),
        step(
            in_state(node("w2"), "Rebooting"),
            Step::Approved {
                since: Some(9_950),
                token: "t2".into(),
            },
        ),
        set(staged("w3", "t3"), REASON, "staged; waiting for approval"),
        set(
            in_state(set(node("w4"), ROLLOUT_TARGETED, "9990"), "Staging"),
            REASON,
            "pulling 40%",
        ),
        node("w5"),
    ];
    let got: Vec<(String, &str, Option<u64>, String)> = plan(&soak, &nodes)
        .summary
        .progress
        .into_iter()
        .map(|p| (p.name, p.step, p.since, p.reason))
        .collect();
    let want = [
        ("w0", "Soaking", Some(9_800), ""),
        ("w1", "Draining", Some(9_900), ""),
        ("w2", "Rebooting", Some(9_950), ""),
        (
            "w3",
            "WaitingForReboot",
            None,
            "staged; waiting for approval",
        ),
        ("w4", "Staging", Some(9_990), "Staging"),
    ];
    let want: Vec<(String, &str, Option<u64>, String)> = want
        .iter()
        .map(|(n, s, t, r)| (n.to_string(), *s, *t, r.to_string()))
        .collect();
    assert_eq!(got, want);
}
