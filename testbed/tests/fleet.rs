//! The fleet testbed: several node hosts, each with its own real streamd, against one API
//! server. The streamd binary is the workspace's (`cargo test --workspace` builds it; alone, run
//! `cargo build -p streamd` first).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::bench::strategy::{Simulated, Strategy};
use testbed::control::{ApiServerCmd, TestbedCmd};
use testbed::scratch::ScratchDir;
use testbed::{Fleet, FleetOptions};

const PREFIX: &str = "osstream.openshift.io/";

/// `target/<profile>/<name>`, next to this test's `deps/` directory, built by `package`.
fn workspace_bin(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p {package}`",
        bin.display()
    );
    bin
}

fn streamd_bin() -> PathBuf {
    workspace_bin("streamd", "streamd")
}

fn scratch(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("fleet-{name}")).expect("scratch dir")
}

fn annotation(fleet: &Fleet, node: &str, key: &str) -> Option<String> {
    fleet
        .annotations(node)
        .expect("node annotations")
        .get(format!("{PREFIX}{key}"))
        .and_then(Value::as_str)
        .map(String::from)
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kubectl annotate --overwrite node <node> k=v…` as the admin.
async fn annotate(fleet: &Fleet, node: &str, pairs: &[String]) {
    let out = tokio::process::Command::new("kubectl")
        .args(["annotate", "--overwrite", "node", node])
        .args(pairs)
        .env("KUBECONFIG", &fleet.env()["KUBECONFIG"])
        .env("HOME", fleet.dir())
        .output()
        .await
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl annotate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn node_ready(fleet: &Fleet, node: &str) -> String {
    let obj = fleet
        .apiserver()
        .get("v1", "Node", None, node)
        .expect("node");
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn boot_id(fleet: &Fleet, node: &str) -> Value {
    fleet
        .apiserver()
        .get("v1", "Node", None, node)
        .expect("node")["status"]["nodeInfo"]["bootID"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_runs_its_own_streamd_moves_and_reboots_on_its_own() {
    let dir = scratch("move");
    let fleet = Fleet::start(FleetOptions {
        streamd: Some(streamd_bin()),
        ..FleetOptions::new(dir.to_path_buf(), 3)
    })
    .await
    .expect("fleet starts");
    assert_eq!(fleet.nodes(), ["worker-0", "worker-1", "worker-2"]);
    for node in fleet.nodes() {
        wait_until(
            &format!("{node}'s streamd to report Idle"),
            Duration::from_secs(60),
            || annotation(&fleet, &node, "state").as_deref() == Some("Idle"),
        )
        .await;
        assert_eq!(node_ready(&fleet, &node), "True");
    }
    // Each agent authenticated as its own node.
    let stats = fleet.control(ApiServerCmd::STATS).await.expect("stats");
    for node in fleet.nodes() {
        assert!(
            stats["by_user"][format!("system:node:{node}")]["patch"].as_u64() >= Some(1),
            "{stats}"
        );
    }
    fleet
        .control(ApiServerCmd::ResetUnavailable)
        .await
        .expect("reset");

    // worker-1 alone moves to rhel-10: staged, approved, rebooted by its kubelet, Done.
    let before = boot_id(&fleet, "worker-1");
    let rhel10 = fleet.env()["TESTBED_RHEL10_IMAGE"].clone();
    annotate(
        &fleet,
        "worker-1",
        &[
            format!("{PREFIX}desired-stream=rhel-10"),
            format!("{PREFIX}desired-os-image={rhel10}"),
        ],
    )
    .await;
    wait_until(
        "worker-1's reboot request",
        Duration::from_secs(120),
        || annotation(&fleet, "worker-1", "reboot-requested").is_some(),
    )
    .await;
    let token = annotation(&fleet, "worker-1", "reboot-requested").expect("token");
    annotate(
        &fleet,
        "worker-1",
        &[format!("{PREFIX}reboot-approved={token}")],
    )
    .await;
    wait_until("worker-1 Done on rhel-10", Duration::from_secs(120), || {
        annotation(&fleet, "worker-1", "state").as_deref() == Some("Done")
    })
    .await;
    assert_eq!(
        annotation(&fleet, "worker-1", "current-stream").as_deref(),
        Some("rhel-10")
    );
    assert_ne!(boot_id(&fleet, "worker-1"), before, "the host rebooted");
    assert_eq!(node_ready(&fleet, "worker-1"), "True");
    for other in ["worker-0", "worker-2"] {
        assert_eq!(annotation(&fleet, other, "state").as_deref(), Some("Idle"));
    }
    let record = fleet
        .control(ApiServerCmd::Unavailable)
        .await
        .expect("record");
    assert_eq!(record["max"], 1, "{record}");
    assert!(
        record["timeline"]
            .as_array()
            .expect("timeline")
            .iter()
            .any(|e| e["nodes"] == json!(["worker-1"])),
        "{record}"
    );

    // An administrator reboots worker-2 by hand: NotReady meanwhile, a new streamd after.
    let pid = fleet.streamd_pid("worker-2").await.expect("pid");
    let before = boot_id(&fleet, "worker-2");
    let reboot = fleet
        .control(
            TestbedCmd::Reboot {
                fail_finalize: false,
            }
            .on("worker-2"),
        )
        .await
        .expect("reboot");
    assert_eq!(reboot["applied"], false, "nothing was staged: {reboot}");
    assert_ne!(boot_id(&fleet, "worker-2"), before);
    let new_pid = fleet.streamd_pid("worker-2").await.expect("pid");
    assert!(new_pid.is_some() && new_pid != pid, "{pid:?} → {new_pid:?}");
    let record = fleet
        .control(ApiServerCmd::Unavailable)
        .await
        .expect("record");
    assert!(
        record["timeline"]
            .as_array()
            .expect("timeline")
            .iter()
            .any(|e| e["nodes"] == json!(["worker-2"])),
        "{record}"
    );
    wait_until(
        "worker-2's new streamd to report",
        Duration::from_secs(60),
        || annotation(&fleet, "worker-2", "state").as_deref() == Some("Idle"),
    )
    .await;
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `testbed bench --fleet 2 --max-unavailable 1` in `dir` with `strategy` and `simulated` durations.
async fn two_node_bench(dir: &std::path::Path, strategy: Strategy, simulated: Simulated) -> Value {
    testbed::bench::fleet::run(&testbed::bench::fleet::FleetBenchOptions {
        dir: dir.to_path_buf(),
        nodes: 2,
        streamd: streamd_bin(),
        controller: workspace_bin("streamd-rollout", "rollout"),
        max_unavailable: 1,
        max_staging: 1,
        strategy,
        simulated,
    })
    .await
    .expect("the bench runs")
}

/// `testbed bench --fleet` at a small N: the real streamd-rollout (two replicas, leader election,
/// the shipped RBAC) moves the pool, and the figures come from the API server's own records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_bench_measures_the_real_controller() {
    let dir = scratch("bench");
    let simulated = Simulated {
        reboot: Duration::from_millis(500),
        ..Simulated::default()
    };
    let figures = two_node_bench(&dir, Strategy::StageFirst, simulated).await;
    let controller = &figures["controller"];
    assert!(
        controller["requests_total"].as_u64() > Some(0),
        "the controller made no requests: {figures:#}"
    );
    assert!(
        controller["requests_by_verb"]["patch"].as_u64() >= Some(2),
        "{figures:#}"
    );
    assert_eq!(figures["max_unavailable_seen"], 1, "{figures:#}");
    assert_eq!(figures["node_cycle_s"]["count"], 2, "{figures:#}");
    assert!(
        figures["agents"]["watches_open_max"]["max"].as_u64() >= Some(1),
        "{figures:#}"
    );
    drop(figures);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `testbed bench --fleet --strategy drain-first` (issue 21 §7): the bench moves the nodes in the
/// machine-config operator's order, so each node's pull is inside its unavailable window: the
/// window is at least drain + pull + reboot (a lower bound the simulated sleeps guarantee
/// whatever the load; staging first would leave the 3 s pull outside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_first_bench_pulls_while_the_node_is_out() {
    let dir = scratch("drainfirst");
    let sim = Simulated {
        pull: Duration::from_secs(3),
        drain: Duration::from_millis(500),
        reboot: Duration::from_millis(500),
    };
    let figures = two_node_bench(&dir, Strategy::DrainFirst, sim).await;
    let strategy = &figures["strategy"];
    assert_eq!(strategy["name"], "drain-first", "{figures:#}");
    assert_eq!(figures["max_unavailable_seen"], 1, "{figures:#}");
    let least = (sim.pull + sim.drain + sim.reboot).as_secs_f64();
    for node in ["worker-0", "worker-1"] {
        let windows = strategy["unavailable_window_s"]["by_node"][node]
            .as_array()
            .unwrap_or_else(|| panic!("no window for {node}: {figures:#}"));
        assert_eq!(windows.len(), 1, "{figures:#}");
        assert!(
            windows[0].as_f64() >= Some(least),
            "{node} was out less than drain + pull + reboot: {figures:#}"
        );
    }
    assert_eq!(strategy["model"]["drain_first_ideal_s"], 8.0, "{figures:#}");
    drop(figures);
    let _ = std::fs::remove_dir_all(&dir);
}
