//! streamd-rollout with real streamd agents: the fleet testbed (`testbed::Fleet`: one fake API
//! server and registry, N node hosts each with its own bus, fake rpm-ostreed, host root, real
//! streamd and a stand-in kubelet that reboots the host on streamd's request). The controller
//! runs as its service account with the shipped CRD and RBAC, and resolves `rhel-10` through the
//! cluster's OSImageStream. The streamd binary is the workspace's (`cargo test --workspace`
//! builds it; alone, run `cargo build -p streamd` first).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::{Fleet, FleetOptions};

mod common;

const P: &str = "osstream.openshift.io/";

fn streamd_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory")
        .join("streamd");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p streamd`",
        bin.display()
    );
    bin
}

struct Pool {
    fleet: Fleet,
    controller: Option<tokio::process::Child>,
    log: PathBuf,
}

impl Pool {
    async fn start(name: &str, nodes: usize, overrides: &[(&str, &str)]) -> Pool {
        let dir = std::env::temp_dir().join(format!("rollout-fleet-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opts = FleetOptions::new(&dir, nodes);
        opts.streamd = Some(streamd_bin());
        opts.host_overrides = overrides
            .iter()
            .map(|(n, f)| (n.to_string(), f.to_string()))
            .collect();
        let fleet = Fleet::start(opts).await.expect("fleet");
        let kubeconfig = common::install(fleet.apiserver());
        let log = dir.join("controller.log");
        let controller = common::controller(&kubeconfig, "a", &["--leader-elect=false"], &log);
        Pool {
            fleet,
            controller: Some(controller),
            log,
        }
    }

    fn annotation(&self, node: &str, key: &str) -> Option<String> {
        self.fleet
            .annotations(node)
            .expect("annotations")
            .get(format!("{P}{key}"))
            .and_then(Value::as_str)
            .map(String::from)
    }

    fn status(&self) -> Value {
        self.fleet
            .apiserver()
            .get(
                "osstream.openshift.io/v1alpha1",
                "StreamPool",
                None,
                "worker",
            )
            .map(|p| p["status"].clone())
            .unwrap_or_default()
    }

    fn condition(&self, type_: &str) -> (String, String, String) {
        let s = self.status();
        let c = s["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or_default();
        let f = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        (f("status"), f("reason"), f("message"))
    }

    fn done(&self, node: &str) -> bool {
        let n = self
            .fleet
            .apiserver()
            .get("v1", "Node", None, node)
            .expect("node");
        self.annotation(node, "state").as_deref() == Some("Done")
            && self.annotation(node, "current-stream").as_deref() == Some("rhel-10")
            && n["spec"]["unschedulable"] != true
            && self.annotation(node, "rollout-step").is_none()
    }

    async fn wait(&self, what: &str, secs: u64, mut check: impl FnMut(&Pool) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if check(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut nodes = String::new();
        for n in self.fleet.nodes() {
            nodes.push_str(&format!(
                "{n}: {}\n",
                self.fleet.annotations(&n).unwrap_or_default()
            ));
        }
        panic!(
            "timed out waiting for {what}\nstatus: {:#}\nnodes:\n{nodes}controller:\n{}",
            self.status(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    fn create_pool(&self, paused: bool) {
        self.fleet
            .apiserver()
            .create(json!({
                "apiVersion": "osstream.openshift.io/v1alpha1",
                "kind": "StreamPool",
                "metadata": { "name": "worker" },
                "spec": {
                    "nodeSelector": { "matchLabels": { "node-role.kubernetes.io/worker": "" } },
                    "target": { "stream": "rhel-10" },
                    "maxUnavailable": 1,
                    "paused": paused,
                },
            }))
            .expect("pool");
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(c) = &mut self.controller {
            let _ = c.start_kill();
        }
    }
}

/// Three real streamd nodes move rhel-9 → rhel-10 one at a time; a PodDisruptionBudget
/// refuses the eviction of worker-0's pod until a second replica runs elsewhere.
#[tokio::test]
async fn real_nodes_move_rhel9_to_rhel10_one_at_a_time() {
    let p = Pool::start("move", 3, &[]).await;
    let web = json!({"app": "web"});
    p.fleet
        .add_pod(
            "default",
            "web-a",
            "worker-0",
            web.clone(),
            Some(("ReplicaSet", "web")),
        )
        .expect("pod");
    p.fleet
        .apiserver()
        .create(json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "name": "web", "namespace": "default" },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } },
        }))
        .expect("pdb");
    p.create_pool(false);
    p.wait("worker-0's eviction refused", 120, |p| {
        p.status()["nodes"].as_array().is_some_and(|ns| {
            ns.iter().any(|n| {
                n["name"] == "worker-0" && n["reason"].as_str().unwrap_or_default().contains("429")
            })
        })
    })
    .await;
    assert_eq!(p.annotation("worker-0", "reboot-approved"), None);
    p.fleet
        .add_pod(
            "default",
            "web-b",
            "worker-2",
            web.clone(),
            Some(("ReplicaSet", "web")),
        )
        .expect("pod");
    p.wait("worker-0 done", 120, |p| p.done("worker-0")).await;
    p.fleet
        .add_pod(
            "default",
            "web-c",
            "worker-0",
            web.clone(),
            Some(("ReplicaSet", "web")),
        )
        .expect("pod");
    for n in ["worker-1", "worker-2"] {
        p.wait(&format!("{n} done"), 120, |p| p.done(n)).await;
    }
    p.wait("pool Updated", 30, |p| p.condition("Updated").0 == "True")
        .await;
    let rec = p
        .fleet
        .apiserver()
        .control(&json!({"cmd": "unavailable"}))
        .await
        .expect("record");
    assert_eq!(rec["max"], 1, "{rec}");
    assert_eq!(p.status()["updatedMachineCount"], 3);
}

/// A node with an x86-64-v2 CPU refuses rhel-10 in streamd's preflight; the pool is Degraded
/// with that reason, and the paused pool's readiness summary named it before the move.
#[tokio::test]
async fn an_old_cpu_refuses_and_stops_the_rollout() {
    let p = Pool::start("oldcpu", 3, &[("worker-1", "old-cpu")]).await;
    p.create_pool(false);
    p.wait("pool Degraded", 120, |p| {
        p.condition("Degraded").0 == "True"
    })
    .await;
    let (_, reason, message) = p.condition("Degraded");
    assert_eq!(reason, "NodeRefused");
    assert!(
        message.contains("worker-1") && message.contains("cpu-level"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let taken = ["worker-0", "worker-2"]
        .into_iter()
        .filter(|n| p.annotation(n, "reboot-approved").is_some())
        .count();
    assert!(taken <= 1, "nodes approved after the refusal: {taken}");
}
