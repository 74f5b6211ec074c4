//! streamd-rollout end to end: the real binary, with the shipped CRD and RBAC (it runs as its
//! service account), against a fleet of real streamd nodes (`common::Pool`, on
//! `testbed::Fleet`): the fake API server (CRDs, the status subresource, pods with graceful
//! deletion, PodDisruptionBudgets, the Eviction API, cordon, Leases, the server's own record of
//! unavailable nodes), and per node a fake rpm-ostreed, host root and real streamd that stages
//! rhel-10 from the registry and reboots through the stand-in kubelet. Approvals and drains are
//! counted from what the API server saw (`Pool::seen`), never from the nodes' account.

use std::time::Duration;

use serde_json::{Value, json};
use testbed::control::{ApiServerCmd, Fault};

mod common;

use common::{Pool, spec};

/// Three nodes move rhel-9 → rhel-10 one at a time; a PodDisruptionBudget refuses the eviction
/// of worker-0's web pod while the other replica is not Ready; a DaemonSet pod stays; every
/// node is drained and approved exactly once; the API server never saw more than one node
/// unavailable.
#[tokio::test]
async fn a_pool_moves_one_node_at_a_time_past_a_pdb() {
    let mut p = Pool::start("pdb", 3, &[]).await;
    let web = json!({"app": "web"});
    p.pod("web-a", "worker-0", ("ReplicaSet", "web"), web.clone());
    p.pod("web-b", "worker-2", ("ReplicaSet", "web"), web.clone());
    p.set_pod_ready("web-b", false);
    p.pod(
        "agent-0",
        "worker-0",
        ("DaemonSet", "agent"),
        json!({"app": "agent"}),
    );
    p.web_pdb(json!({"maxUnavailable": 1}));
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);

    p.wait("worker-0 cordoned and its eviction refused", 120, |p| {
        p.cordoned("worker-0") && p.eviction_refused("worker-0")
    })
    .await;
    // Every node still to update prefers not to get the evicted pods.
    for n in ["worker-0", "worker-1", "worker-2"] {
        assert!(p.update_tainted(n), "{n} has no update taint");
    }
    // The budget holds for a while (more than one drain pass): no approval, no second node.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(p.pods_on("worker-0").contains(&"web-a".to_string()));
    assert_eq!(p.annotation("worker-0", "reboot-approved"), None);
    assert!(!p.cordoned("worker-1"), "a second node was taken");

    // web-b Ready: the budget allows one disruption; web-a's replacement lands on worker-1.
    p.set_pod_ready("web-b", true);
    p.wait("web-a evicted", 60, |p| {
        !p.pods_on("worker-0").contains(&"web-a".to_string())
    })
    .await;
    p.pod("web-c", "worker-1", ("ReplicaSet", "web"), web.clone());
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    // web-c was evicted from worker-1; its replacement runs on the updated worker-0.
    p.pod("web-d", "worker-0", ("ReplicaSet", "web"), web.clone());
    p.wait("worker-2 done", 120, |p| p.done("worker-2")).await;
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    // An updated node is seen so (and its taint removed) before the pool is Updated.
    for n in ["worker-0", "worker-1", "worker-2"] {
        assert!(!p.update_tainted(n), "{n} kept its update taint");
    }
    assert!(
        p.pods_on("worker-0").contains(&"agent-0".to_string()),
        "DaemonSet pod evicted"
    );
    p.assert_once(&["worker-0", "worker-1", "worker-2"]);
    assert_eq!(p.max_unavailable_seen().await, 1);
    let status = p.status();
    assert_eq!(status["updatedMachineCount"], 3);
    assert_eq!(status["readyMachineCount"], 3);
    assert_eq!(status["observedGeneration"], 1);

    // What an admin follows in `kubectl describe streampool worker`: the rollout's start and
    // completion on the pool, no routine Event per node, and the refused eviction once, not
    // once per drain pass.
    p.wait("the rollout's completion told", 30, |p| {
        p.event_reasons("").len() == 2
    })
    .await;
    assert_eq!(p.event_reasons(""), ["RolloutStarted", "RolloutCompleted"]);
    assert_eq!(p.event_reasons("worker-0"), ["EvictionBlocked"]);
    for n in ["worker-1", "worker-2"] {
        assert!(p.event_reasons(n).is_empty(), "{n}");
    }
    let events = p.events();
    let at = |reason: &str| {
        events
            .iter()
            .position(|e| e.reason == reason)
            .expect("event")
    };
    assert!(at("RolloutStarted") < at("EvictionBlocked"));
    assert!(at("EvictionBlocked") < at("RolloutCompleted"));
    let completed = &events[at("RolloutCompleted")];
    assert_eq!(completed.type_, "Normal");
    assert!(
        completed.note.contains("complete: all 3 nodes run it in "),
        "{}",
        completed.note
    );
    let blocked = &events[at("EvictionBlocked")];
    assert_eq!((blocked.type_.as_str(), blocked.count), ("Warning", 1));
    assert!(blocked.note.contains("default/web-a"), "{}", blocked.note);
    // The three drains read one pod watch, listed once, not the pods of each node.
    assert_eq!(p.controller_requests("pods", "list").await, 1);
    assert_eq!(p.controller_requests("pods", "watch").await, 1);
}

/// worker-1 has an x86-64-v2 CPU: streamd's preflight refuses rhel-10, the pool is Degraded
/// with that reason, and no node is taken afterwards.
#[tokio::test]
async fn an_old_cpu_refuses_and_stops_the_rollout() {
    let mut p = Pool::start("oldcpu", 3, &[("worker-1", "old-cpu")]).await;
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("pool Degraded", 120, |p| {
        p.condition("Degraded").0 == "True"
    })
    .await;
    let (_, reason, message) = p.condition("Degraded");
    assert_eq!(reason, "NodeRefused");
    assert!(
        message.starts_with("node worker-1: preflight check cpu-level failed"),
        "{message}"
    );
    let status = p.status();
    assert_eq!(status["degradedMachineCount"], 1);
    assert_eq!(status["nodes"][0]["name"], "worker-1");
    assert_eq!(status["nodes"][0]["state"], "Refused");
    // Whatever was in flight when worker-1 refused finishes; worker-2 is never taken.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(p.seen().approvals.get("worker-2").map(Vec::len), Some(0));
    assert!(!p.cordoned("worker-2"), "worker-2 cordoned");
    assert!(!p.cordoned("worker-1"), "the refusing node cordoned");

    // Reported once each, however often the pool was reconciled since.
    let events = p.events();
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "NodeRefused")
        .collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert_eq!(
        (
            refused[0].type_.as_str(),
            refused[0].node.as_str(),
            refused[0].count
        ),
        ("Warning", "worker-1", 1)
    );
    assert!(
        refused[0]
            .note
            .starts_with("node worker-1: preflight check cpu-level failed")
            && !refused[0].note.contains('\n'),
        "{}",
        refused[0].note
    );
    assert_eq!(
        p.event_reasons(""),
        ["RolloutStarted", "PoolDegraded"],
        "{events:?}"
    );
}

/// A paused pool gets readiness checks only (its summary names what the move would meet);
/// unpaused, it moves.
#[tokio::test]
async fn pause_stops_new_work_and_resume_continues() {
    let mut p = Pool::start("pause", 2, &[]).await;
    let mut paused = spec();
    paused["paused"] = json!(true);
    p.create_pool(paused);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("the readiness summary of the paused pool", 60, |p| {
        p.condition("Paused").0 == "True" && p.status()["readiness"] == "2 of 2 ready"
    })
    .await;
    assert_eq!(
        p.annotation("worker-0", "check-stream").as_deref(),
        Some("rhel-10")
    );
    for n in ["worker-0", "worker-1"] {
        assert_eq!(
            p.annotation(n, "desired-stream"),
            None,
            "paused pool targeted {n}"
        );
    }
    assert_eq!(p.condition("Updating").0, "False");

    p.patch_pool(json!({"spec": {"paused": false}})).await;
    for n in ["worker-0", "worker-1"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    assert_eq!(p.status()["observedGeneration"], 2);
    p.assert_once(&["worker-0", "worker-1"]);
    // A pool created paused starts its rollout when it is resumed.
    p.wait("the rollout's completion told", 30, |p| {
        p.event_reasons("").iter().any(|r| r == "RolloutCompleted")
    })
    .await;
    let mut reasons = p.event_reasons("");
    assert_eq!(reasons[0], "Paused", "{reasons:?}");
    // Told in the same pass, in either order of their times.
    reasons[1..3].sort();
    assert_eq!(
        reasons,
        ["Paused", "Resumed", "RolloutStarted", "RolloutCompleted"]
    );
}

/// A replica of the `web` ReplicaSet (the pods the PodDisruptionBudget counts) on `node`.
fn web_replica(p: &Pool, name: &str, node: &str) {
    p.pod(name, node, ("ReplicaSet", "web"), json!({"app": "web"}));
}

/// Makes worker-0's drain wait on a PodDisruptionBudget: its only web replica may not go.
fn block_worker0_drain(p: &Pool) {
    web_replica(p, "web-a", "worker-0");
    p.web_pdb(json!({"minAvailable": 1}));
}

/// A pool of `nodes` with `spec()` and one controller (no leader election), worker-0's drain
/// held by a PodDisruptionBudget.
async fn held_at_worker0(name: &str, nodes: usize) -> Pool {
    let mut p = Pool::start(name, nodes, &[]).await;
    block_worker0_drain(&p);
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    p
}

/// Waits until the API server has refused one of worker-0's evictions.
async fn wait_eviction_refused(p: &Pool) {
    p.wait("worker-0's eviction refused", 120, |p| {
        p.eviction_refused("worker-0")
    })
    .await;
}

/// The new controller works on for a few drain passes against the budget (it takes up the
/// drain, it does not start it again), then lets worker-0's drain go on (a second replica
/// elsewhere), waits for the pool to finish and checks that no node was drained or approved
/// twice, whoever led.
async fn release_and_finish(p: &Pool, mark: Option<String>) {
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(p.annotation("worker-0", "rollout-step"), mark);
    web_replica(p, "web-b", "worker-1");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    // web-b's replacement, so that worker-1's drain may go on too.
    web_replica(p, "web-c", "worker-0");
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    p.assert_once(&["worker-0", "worker-1"]);
    assert_eq!(p.max_unavailable_seen().await, 1);
}

async fn wait_draining(p: &Pool, node: &str) {
    p.wait(&format!("{node} draining"), 120, |p| {
        p.annotation(node, "rollout-step")
            .is_some_and(|s| s.starts_with("draining:"))
    })
    .await;
}

/// The controller is SIGKILLed while a drain waits for a PodDisruptionBudget; a new one takes
/// up the drain from the node's mark: one drain and one approval per node.
#[tokio::test]
async fn a_controller_killed_mid_drain_continues_without_a_second_approval() {
    let mut p = held_at_worker0("kill", 2).await;
    wait_draining(&p, "worker-0").await;
    let mark = p.annotation("worker-0", "rollout-step");
    p.kill_controller("a").await;
    p.start_controller("b", &["--leader-elect=false"]);
    release_and_finish(&p, mark).await;
}

fn leader_of(p: &Pool) -> Option<String> {
    testbed::harness::fleet::controller::leader(p.api())
}

/// Two replicas elect a leader on the Lease; the leader is SIGKILLed mid-drain and the other
/// takes over when the lease expires and continues the drain: one drain and one approval per
/// node. kube-lease-manager takes a free Lease with a server-side apply that conflicts on the
/// `holderIdentity` another field manager owns; the testbed's API server serves that.
#[tokio::test]
async fn a_leader_change_mid_drain_continues_without_a_second_approval() {
    let mut p = Pool::start("leader", 2, &[]).await;
    block_worker0_drain(&p);
    p.create_pool(spec());
    p.start_controller("a", &["--lease-seconds", "3"]);
    p.start_controller("b", &["--lease-seconds", "3"]);
    p.wait("a leader", 60, |p| leader_of(p).is_some()).await;
    wait_draining(&p, "worker-0").await;
    let mark = p.annotation("worker-0", "rollout-step");
    let first = leader_of(&p).expect("leader");
    p.kill_controller(&first).await;
    p.wait("the other replica leads", 60, |p| {
        leader_of(p).is_some_and(|l| l != first)
    })
    .await;
    release_and_finish(&p, mark).await;
}

/// The leader's writes are cut off from the API server just as worker-0's drain can finish (each
/// PATCH of its service account, its lease renewals too, held for 45 s before the server acts on
/// it): its approval of worker-0 is under way when the standby takes over and moves the pool on.
/// The cut-off leader stops acting before the standby may take over (it cannot see its renewal
/// stored), and the approval it had under way lands on a node the standby has changed, so it
/// fails on the node's resourceVersion: one drain and one approval per node, never more than one
/// node unavailable, also once every late write has landed.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_acting_before_the_standby_takes_over() {
    const HELD: Duration = Duration::from_secs(45);
    let mut p = Pool::start("partition", 2, &[]).await;
    block_worker0_drain(&p);
    p.create_pool(spec());
    p.start_controller("a", &["--lease-seconds", "6"]);
    p.wait("a leads", 60, |p| leader_of(p).as_deref() == Some("a"))
        .await;
    let standby = testbed::harness::fleet::controller::install_account(p.api(), "standby")
        .expect("a second service account");
    p.start_controller_as("b", &standby, &["--lease-seconds", "6"]);
    wait_draining(&p, "worker-0").await;
    let held = std::time::Instant::now();
    p.api()
        .control(ApiServerCmd::Fault(Fault::Delay {
            ms: u64::try_from(HELD.as_millis()).expect("ms"),
            user: Some(testbed::harness::fleet::controller::SERVICE_ACCOUNT.into()),
            verb: Some("patch".into()),
        }))
        .await
        .expect("cut the leader's writes off");
    // worker-0's drain may finish now: a's approval is the write it has under way.
    web_replica(&p, "web-b", "worker-1");
    p.wait("b leads", 60, |p| leader_of(p).as_deref() == Some("b"))
        .await;
    p.api()
        .control(ApiServerCmd::Fault(Fault::Clear))
        .await
        .expect("heal");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    web_replica(&p, "web-c", "worker-0");
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    // The writes a sent while cut off reach the server by now (the fault holds each before it
    // is acted on, whether or not the client still waits).
    tokio::time::sleep(
        (held + HELD + Duration::from_secs(3)).saturating_duration_since(std::time::Instant::now()),
    )
    .await;
    p.assert_once(&["worker-0", "worker-1"]);
    assert_eq!(p.max_unavailable_seen().await, 1);
    let log = p.fleet.dir().join("controller-a.log");
    p.wait("a to say it stopped acting", 60, |_| {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("could not prove holding it in time"))
    })
    .await;
}

/// worker-2, staged and waiting, is rebooted by its administrator while worker-0 is in flight:
/// it counts as unavailable (no node is taken while it is down), rpm-ostree boots the old
/// deployment (the stage was finalization-locked), streamd stages again with a new token, and
/// the pool finishes with one approval per node — never the pre-reboot token.
#[tokio::test]
async fn a_node_rebooted_by_someone_else_mid_rollout() {
    let mut p = Pool::start("reboot", 3, &[]).await;
    block_worker0_drain(&p);
    // One node staged at a time until worker-0 is held at its drain: with all three staging at
    // once, whichever is staged first is cordoned first, and on a loaded machine that was
    // worker-2 (CI saw it). Then the others stage while worker-0 holds the one slot.
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    wait_draining(&p, "worker-0").await;
    p.patch_pool(json!({"spec": {"maxConcurrentStaging": 3}}))
        .await;
    p.wait("worker-2 staged", 120, |p| {
        p.annotation("worker-2", "reboot-requested").is_some()
    })
    .await;
    let old = p.annotation("worker-2", "reboot-requested");
    p.fleet.reboot("worker-2").await.expect("reboot");
    p.wait("worker-2 asks again", 120, |p| {
        let token = p.annotation("worker-2", "reboot-requested");
        token.is_some() && token != old
    })
    .await;
    assert_eq!(
        p.annotation("worker-2", "current-stream").as_deref(),
        Some("rhel-9"),
        "someone else's reboot booted the locked stage"
    );
    web_replica(&p, "web-b", "worker-1");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    web_replica(&p, "web-c", "worker-0");
    for n in ["worker-1", "worker-2"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.assert_once(&["worker-0", "worker-1", "worker-2"]);
    let seen = p.seen();
    assert_ne!(
        seen.approvals["worker-2"].first(),
        old.as_ref(),
        "the pre-reboot token was approved"
    );
    // worker-0 in flight plus worker-2's own reboot: never a second node taken meanwhile.
    assert!(p.max_unavailable_seen().await <= 2);
}

/// Nodes the machine-config operator manages (the MCD's `currentConfig` annotation: streamd
/// switches to readiness mode) get the dry run only: the pool's readiness summary names the
/// old CPU, and no node is ever given the target, cordoned or approved.
#[tokio::test]
async fn an_mco_pool_gets_the_readiness_summary_only() {
    let mut p = Pool::start("mco", 3, &[("worker-1", "old-cpu")]).await;
    for n in p.fleet.nodes() {
        p.api()
            .update("v1", "Node", None, &n, |node| {
                node["metadata"]["annotations"]["machineconfiguration.openshift.io/currentConfig"] =
                    json!("rendered-worker-0123");
            })
            .expect("mcd annotation");
    }
    p.wait("streamd in readiness mode", 60, |p| {
        p.fleet
            .nodes()
            .iter()
            .all(|n| p.annotation(n, "mode").as_deref() == Some("readiness"))
    })
    .await;
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("the readiness summary", 120, |p| {
        p.status()["readiness"] == "2 of 3 ready; 1 refuse: cpu-level"
    })
    .await;
    let (status, reason, _) = p.condition("Updating");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ManagedByMachineConfigOperator")
    );
    for n in p.fleet.nodes() {
        assert_eq!(p.annotation(&n, "desired-stream"), None, "{n} targeted");
        assert_eq!(
            p.node(&n)["spec"]["unschedulable"],
            Value::Null,
            "{n} cordoned"
        );
    }
    assert!(p.seen().approvals.values().all(Vec::is_empty));
    // No node is taken out of service: the drains' pod watch never starts.
    assert_eq!(p.controller_requests("pods", "list").await, 0);
    assert_eq!(p.controller_requests("pods", "watch").await, 0);
}

/// The pool is deleted mid-rollout (`maxUnavailable` 2): worker-0, cordoned and held by a
/// PodDisruptionBudget, is released at once (uncordoned, its mark and the pool's request
/// removed, so streamd drops its stage and goes Idle), and worker-2 loses the request too;
/// worker-1, approved and rebooting, finishes its cycle (Done, uncordoned, its request kept: it
/// runs it) before the finalizer lets the pool go. Nothing is approved after the deletion.
#[tokio::test]
async fn deleting_a_pool_mid_rollout_releases_its_nodes() {
    let mut p = Pool::start_with("delete", 3, &[], |o| {
        o.reboot_downtime = Duration::from_secs(6);
    })
    .await;
    block_worker0_drain(&p);
    let mut s = spec();
    s["maxUnavailable"] = json!(2);
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    // Staging one at a time: worker-0 is taken (and held) first, then worker-1 is approved.
    p.wait("worker-1 approved while worker-0 drains", 120, |p| {
        p.annotation("worker-1", "rollout-step")
            .is_some_and(|s| s.starts_with("approved:"))
    })
    .await;
    assert!(
        p.annotation("worker-0", "rollout-step")
            .is_some_and(|s| s.starts_with("draining:"))
    );
    assert!(p.update_tainted("worker-0") && p.update_tainted("worker-2"));
    p.delete_pool().await;
    p.wait("worker-0 and worker-2 released", 30, |p| {
        p.released("worker-0") && p.released("worker-2")
    })
    .await;
    assert!(
        !p.pool().is_null(),
        "the pool went while worker-1 was still rebooting"
    );
    p.wait("the pool gone", 60, |p| p.pool().is_null()).await;
    // Released, whether moved or not: no node keeps the pool's update taint.
    for n in ["worker-0", "worker-1", "worker-2"] {
        assert!(!p.update_tainted(n), "{n} kept its update taint");
    }
    assert_eq!(
        p.annotation("worker-1", "current-stream").as_deref(),
        Some("rhel-10")
    );
    assert_eq!(
        p.annotation("worker-1", "desired-stream").as_deref(),
        Some("rhel-10")
    );
    assert_eq!(p.annotation("worker-1", "rollout-step"), None);
    assert!(!p.cordoned("worker-1"));
    for n in ["worker-0", "worker-2"] {
        p.wait(&format!("{n} Idle on rhel-9"), 60, |p| {
            p.annotation(n, "state").as_deref() == Some("Idle")
                && p.annotation(n, "staged-os-image").is_none()
        })
        .await;
        assert_eq!(p.annotation(n, "current-stream").as_deref(), Some("rhel-9"));
    }
    // The budget lets go now; still nothing is approved.
    web_replica(&p, "web-b", "worker-2");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = p.seen();
    assert_eq!(seen.approvals["worker-1"].len(), 1);
    assert!(seen.approvals["worker-0"].is_empty() && seen.approvals["worker-2"].is_empty());
    assert!(p.released("worker-0"));
}

/// worker-0, cordoned and held by a PodDisruptionBudget, is relabelled out of the pool's
/// selector: it is released (uncordoned, mark and request removed) and never approved, also
/// once the budget would let its drain finish; the pool goes on with the other two.
#[tokio::test]
async fn a_node_leaving_the_selector_is_released_and_never_approved() {
    let p = held_at_worker0("leave", 3).await;
    wait_eviction_refused(&p).await;
    p.relabel_out("worker-0");
    p.wait("worker-0 released", 30, |p| p.released("worker-0"))
        .await;
    // Released with the rest of the pool's keys (it is no longer the pool's to update).
    assert!(!p.update_tainted("worker-0"));
    web_replica(&p, "web-b", "worker-2");
    for n in ["worker-1", "worker-2"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    assert_eq!(p.status()["machineCount"], 2);
    assert!(p.seen().approvals["worker-0"].is_empty());
    assert!(p.released("worker-0"));
    assert_eq!(
        p.event_reasons("worker-0"),
        ["EvictionBlocked", "NodeReleased"]
    );
    assert_eq!(
        p.annotation("worker-0", "current-stream").as_deref(),
        Some("rhel-9")
    );
}

// Stalls with names and deadlines: a node whose streamd never acknowledges the target, and a
// node that does not come back from its reboot in time. Each is reported by name and deadline,
// and the pool goes on (or holds) exactly as far as `maxUnavailable` allows.

/// The pool's `status.nodes[]` entry of `node` in `state`.
fn reported(p: &Pool, node: &str, state: &str) -> bool {
    p.status()["nodes"]
        .as_array()
        .is_some_and(|ns| ns.iter().any(|n| n["name"] == node && n["state"] == state))
}

/// The Events of `reason` (type, node).
fn events_of(p: &Pool, reason: &str) -> Vec<(String, String)> {
    p.events()
        .into_iter()
        .filter(|e| e.reason == reason)
        .map(|e| (e.type_, e.node))
        .collect()
}

/// worker-0's streamd is stopped before the pool exists: it is given the target (one staging
/// slot) and never acknowledges it; after `agentTimeoutSeconds` it is `AgentNotResponding` (the
/// `Updating` reason, `status.nodes`, one Warning Event) and the slot goes to worker-1, which
/// moves. streamd back, worker-0 acknowledges and moves too.
#[tokio::test]
async fn a_silent_agent_frees_its_staging_slot_and_is_named() {
    let mut p = Pool::start("silent", 2, &[]).await;
    assert!(
        p.fleet
            .stop_streamd("worker-0")
            .await
            .expect("stop streamd")
    );
    let mut s = spec();
    s["agentTimeoutSeconds"] = json!(4);
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("worker-0 AgentNotResponding", 60, |p| {
        reported(p, "worker-0", "AgentNotResponding")
    })
    .await;
    let (status, reason, message) = p.condition("Updating");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AgentNotResponding")
    );
    assert!(
        message.starts_with("node worker-0: streamd did not acknowledge"),
        "{message}"
    );
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    assert!(!p.cordoned("worker-0"), "the silent node was cordoned");

    p.fleet
        .start_streamd("worker-0")
        .await
        .expect("start streamd");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    assert!(!reported(&p, "worker-0", "AgentNotResponding"));
    p.assert_once(&["worker-0", "worker-1"]);
    assert_eq!(
        events_of(&p, "AgentNotResponding"),
        [("Warning".to_string(), "worker-0".to_string())]
    );
}

/// Reboots take 8 s and `rebootTimeoutSeconds` is 2: worker-0 is `NodeNotReturning` while down,
/// still counts as unavailable (worker-1 is not taken in its place), and once it is back the pool
/// finishes; never more than one node unavailable.
#[tokio::test]
async fn a_node_not_back_in_time_is_named_and_still_holds_its_slot() {
    let mut p = Pool::start_with("noreturn", 2, &[], |o| {
        o.reboot_downtime = Duration::from_secs(8);
    })
    .await;
    let mut s = spec();
    s["rebootTimeoutSeconds"] = json!(2);
    // One staging slot: worker-0 is staged, so taken, first (with two at once, whichever was
    // staged first was taken first, and under load that was once worker-1); worker-1 stages
    // while worker-0 drains and reboots, so it waits, staged, while worker-0 holds the slot.
    s["maxConcurrentStaging"] = json!(1);
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("worker-0 NodeNotReturning", 120, |p| {
        reported(p, "worker-0", "NodeNotReturning")
    })
    .await;
    assert_eq!(p.condition("Updating").1, "NodeNotReturning");
    assert!(
        !p.cordoned("worker-1"),
        "worker-1 taken in worker-0's place"
    );
    assert!(p.seen().approvals["worker-1"].is_empty());
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    p.assert_once(&["worker-0", "worker-1"]);
    assert_eq!(p.max_unavailable_seen().await, 1);
    // Each node's reboot is as slow: each is told once.
    let warned = |n: &str| ("Warning".to_string(), n.to_string());
    assert_eq!(
        events_of(&p, "NodeNotReturning"),
        [warned("worker-0"), warned("worker-1")]
    );
}

// Drains that do not finish are not the end of the pool.

/// worker-0's drain is held by a PodDisruptionBudget past `drain.timeoutSeconds` with
/// `onTimeout: release`: it is uncordoned and set aside (Warning `DrainGivenUp`), worker-1 is
/// taken and moves, and worker-0, taken again last, moves once the budget lets its pod go; one
/// approval per node, never two nodes unavailable.
#[tokio::test]
async fn a_drain_past_its_timeout_is_set_aside_and_the_pool_moves_on() {
    let mut p = Pool::start("aside", 2, &[]).await;
    block_worker0_drain(&p);
    let mut s = spec();
    s["maxConcurrentStaging"] = json!(2);
    s["drain"] = json!({ "timeoutSeconds": 3, "onTimeout": "release" });
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("worker-0 set aside", 120, |p| {
        p.annotation("worker-0", "rollout-set-aside").is_some()
    })
    .await;
    p.wait("worker-1 done", 120, |p| p.done("worker-1")).await;
    assert!(p.seen().approvals["worker-0"].is_empty());
    // The budget lets web-a go once another replica runs.
    web_replica(&p, "web-b", "worker-1");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    assert_eq!(p.annotation("worker-0", "rollout-set-aside"), None);
    // worker-0 was drained again when taken back; each node approved once.
    let seen = p.seen();
    assert!(seen.drains["worker-0"].len() >= 2, "{:?}", seen.drains);
    assert_eq!(seen.drains["worker-1"].len(), 1, "{:?}", seen.drains);
    for n in ["worker-0", "worker-1"] {
        assert_eq!(seen.approvals[n].len(), 1, "{n}: {:?}", seen.approvals);
    }
    assert_eq!(p.max_unavailable_seen().await, 1);
    let given_up = p.event_reasons("worker-0");
    assert!(
        given_up.iter().any(|r| r == "DrainGivenUp")
            && given_up.iter().any(|r| r == "DrainTimeout"),
        "{given_up:?}"
    );
}

/// worker-0 is uncordoned by someone else while its drain waits on a PodDisruptionBudget: it is
/// cordoned again (Warning `NodeRecordoned`), never approved uncordoned, and moves once the
/// budget lets its pod go.
#[tokio::test]
async fn a_node_uncordoned_mid_drain_is_cordoned_again() {
    let p = held_at_worker0("recordon", 2).await;
    wait_eviction_refused(&p).await;
    p.api()
        .update("v1", "Node", None, "worker-0", |n| {
            n["spec"]["unschedulable"] = json!(false);
        })
        .expect("uncordon");
    // The Event follows the patch.
    p.wait("worker-0 cordoned again, told", 30, |p| {
        p.cordoned("worker-0")
            && p.event_reasons("worker-0")
                .iter()
                .any(|r| r == "NodeRecordoned")
    })
    .await;
    assert!(p.seen().approvals["worker-0"].is_empty());
    release_and_finish(&p, p.annotation("worker-0", "rollout-step")).await;
}

/// worker-1 is also labelled `infra`, which the custom pool `infra` selects: it is infra's (a
/// custom pool wins over `worker`, as in the machine-config operator), each pool moves its own
/// node once, and `worker` counts one machine.
#[tokio::test]
async fn a_custom_pool_wins_a_node_over_worker() {
    let mut p = Pool::start("custom", 2, &[]).await;
    p.api()
        .update("v1", "Node", None, "worker-1", |n| {
            n["metadata"]["labels"]["node-role.kubernetes.io/infra"] = json!("");
        })
        .expect("label");
    let mut infra = spec();
    infra["nodeSelector"] = json!({ "matchLabels": { "node-role.kubernetes.io/infra": "" } });
    p.create_named_pool("infra", infra);
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    for n in ["worker-0", "worker-1"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.wait("pool worker Updated", 30, |p| {
        p.condition("Updated").0 == "True"
    })
    .await;
    assert_eq!(p.status()["machineCount"], 1);
    assert_eq!(
        p.annotation("worker-1", "rollout-pool").as_deref(),
        Some("infra")
    );
    assert_eq!(
        p.annotation("worker-0", "rollout-pool").as_deref(),
        Some("worker")
    );
    p.assert_once(&["worker-0", "worker-1"]);
}

/// The pool's `drain.gracePeriodSeconds` (10) reaches the evicted pod as its
/// `deletionGracePeriodSeconds` (the pod's own would be 30): the Eviction carries it as
/// `deleteOptions`, the key the API server reads. The kubelet stand-in takes 60 s to stop a pod,
/// at most its grace period, so the drain waits out the pool's 10 s, not 60.
#[tokio::test]
async fn the_pools_grace_period_reaches_the_evicted_pod() {
    let mut p = Pool::start("grace", 1, &[]).await;
    p.api()
        .control(ApiServerCmd::PodRemoval { delay_ms: 60_000 })
        .await
        .expect("pod-removal");
    web_replica(&p, "web-a", "worker-0");
    let mut s = spec();
    s["drain"] = json!({ "timeoutSeconds": 120, "gracePeriodSeconds": 10 });
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    let web_a = |p: &Pool| {
        p.api()
            .get("v1", "Pod", Some("default"), "web-a")
            .unwrap_or(Value::Null)
    };
    p.wait("web-a evicted", 120, |p| {
        web_a(p)["metadata"]["deletionTimestamp"].is_string()
    })
    .await;
    assert_eq!(web_a(&p)["metadata"]["deletionGracePeriodSeconds"], 10);
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.assert_once(&["worker-0"]);
}

/// A drain is approved because its last pod went, not at a timer's next tick: with the drain's
/// backstop an hour long (`STREAMD_ROLLOUT_DRAIN_BACKSTOP_SECONDS`) and the pool's timeout ten
/// minutes, nothing but the shared pod watch's deletion event can wake the pool between the
/// eviction (the pod then terminating, removed by the kubelet stand-in 3 s later) and the
/// approval.
#[tokio::test]
async fn a_drain_is_approved_when_its_last_pod_goes() {
    let mut p = Pool::start("podwake", 1, &[]).await;
    p.api()
        .control(ApiServerCmd::PodRemoval { delay_ms: 3_000 })
        .await
        .expect("pod-removal");
    web_replica(&p, "web-a", "worker-0");
    p.create_pool(spec());
    p.set_controller_env(rollout::drain::BACKSTOP_ENV, "3600");
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("web-a evicted", 120, |p| {
        p.api()
            .get("v1", "Pod", Some("default"), "web-a")
            .is_ok_and(|pod| pod["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    p.wait("worker-0 approved", 120, |p| {
        p.annotation("worker-0", "reboot-approved").is_some()
    })
    .await;
    assert!(p.pods_on("worker-0").is_empty(), "approved with pods left");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.assert_once(&["worker-0"]);
}

/// The machine-config daemon marks the nodes while worker-0's drain waits on a
/// PodDisruptionBudget: the pool turns readiness-only and releases worker-0 (uncordoned, its mark
/// and the pool's request removed, Event `NodeReleased`) instead of leaving it cordoned; it is
/// never approved.
#[tokio::test]
async fn a_pool_that_becomes_mco_managed_mid_rollout_releases_its_nodes() {
    let p = held_at_worker0("mcoturn", 2).await;
    wait_eviction_refused(&p).await;
    for n in p.fleet.nodes() {
        p.api()
            .update("v1", "Node", None, &n, |node| {
                node["metadata"]["annotations"]["machineconfiguration.openshift.io/currentConfig"] =
                    json!("rendered-worker-0123");
            })
            .expect("mcd annotation");
    }
    p.wait("worker-0 released, told", 60, |p| {
        !p.cordoned("worker-0")
            && p.annotation("worker-0", "rollout-step").is_none()
            && p.annotation("worker-0", "desired-stream").is_none()
            && p.event_reasons("worker-0")
                .iter()
                .any(|r| r == "NodeReleased")
    })
    .await;
    p.wait("the pool readiness-only", 30, |p| {
        p.condition("Updating").1 == "ManagedByMachineConfigOperator"
    })
    .await;
    assert!(p.seen().approvals["worker-0"].is_empty());
    assert!(!p.cordoned("worker-1"));
}

/// worker-1 is cordoned by its admin: worker-0, staged and waiting for its reboot, is held by
/// unavailability the rollout did not cause, and the pool says so (`Updating` reason `Blocked`
/// naming worker-1, Warning Event `PoolBlocked`); uncordoned, the pool moves both.
#[tokio::test]
async fn a_pool_held_by_a_node_someone_else_cordoned_says_so() {
    let mut p = Pool::start("blocked", 2, &[]).await;
    let cordon = |p: &Pool, on: bool| {
        p.api()
            .update("v1", "Node", None, "worker-1", |n| {
                n["spec"]["unschedulable"] = json!(on);
            })
            .expect("cordon");
    };
    cordon(&p, true);
    p.create_pool(spec());
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("the pool Blocked, told", 120, |p| {
        let (_, reason, message) = p.condition("Updating");
        reason == "Blocked"
            && message.contains("worker-1 (cordoned)")
            && p.event_reasons("").iter().any(|r| r == "PoolBlocked")
    })
    .await;
    assert!(
        !p.cordoned("worker-0"),
        "worker-0 taken past maxUnavailable"
    );
    cordon(&p, false);
    for n in ["worker-0", "worker-1"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    p.assert_once(&["worker-0", "worker-1"]);
}

/// `drain.podSelector` limits the drain: worker-0's `app: web` pod is evicted, its
/// `app: cache` pod stays through the reboot.
#[tokio::test]
async fn a_pod_selector_limits_the_drain() {
    let mut p = Pool::start("podsel", 1, &[]).await;
    web_replica(&p, "web-a", "worker-0");
    p.pod(
        "cache-0",
        "worker-0",
        ("ReplicaSet", "cache"),
        json!({"app": "cache"}),
    );
    let mut s = spec();
    s["drain"] = json!({
        "timeoutSeconds": 120,
        "podSelector": { "matchLabels": { "app": "web" } },
    });
    p.create_pool(s);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    assert_eq!(p.pods_on("worker-0"), ["cache-0"]);
    p.assert_once(&["worker-0"]);
}

/// Issue 21 §3: a canary of one takes the first node of the planned order (zone `a` before zone
/// `b`, whatever the names), then the controller pauses the pool (`CanaryComplete`); a held
/// node is never targeted nor cordoned, and the pool goes on with the rest once unpaused.
#[tokio::test]
async fn a_canary_pauses_the_pool_and_a_held_node_is_left_alone() {
    let mut p = Pool::start("canary", 3, &[]).await;
    for (node, zone) in [("worker-0", "b"), ("worker-1", "b"), ("worker-2", "a")] {
        p.api()
            .update("v1", "Node", None, node, |n| {
                n["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!(zone);
                if node == "worker-1" {
                    n["metadata"]["annotations"]["osstream.openshift.io/rollout-hold"] =
                        json!("true");
                }
            })
            .expect("label");
    }
    let mut canary = spec();
    canary["canary"] = json!(1);
    p.create_pool(canary);
    p.start_controller("a", &["--leader-elect=false"]);
    p.wait("the canary's pause", 120, |p| {
        p.condition("Paused").1 == "CanaryComplete"
    })
    .await;
    assert!(p.done("worker-2"), "the canary is the first in the order");
    assert!(!p.cordoned("worker-0") && !p.cordoned("worker-1"));
    assert_eq!(p.pool()["spec"]["paused"], true);
    assert_eq!(p.status()["plannedOrder"], json!(["worker-0"]));
    assert!(reported(&p, "worker-1", "Held"));

    p.patch_pool(json!({"spec": {"paused": false}})).await;
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.wait("the pool goes on without the held node", 30, |p| {
        p.condition("Paused").0 == "False" && p.status()["plannedOrder"].is_null()
    })
    .await;
    assert_eq!(
        p.condition("Updated").0,
        "False",
        "a held node is not moved"
    );
    assert_eq!(p.annotation("worker-1", "desired-stream"), None);
    assert!(!p.update_tainted("worker-1"));
    p.assert_once(&["worker-2", "worker-0"]);
    let reasons = p.event_reasons("");
    for r in ["CanaryComplete", "Paused", "Resumed"] {
        assert!(reasons.iter().any(|x| x == r), "{r} not in {reasons:?}");
    }
}
