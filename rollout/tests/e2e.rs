//! streamd-rollout end to end: the real binary, with the shipped CRD and RBAC (it runs as its
//! service account), against the testbed's fake API server (CRDs, the status subresource, pods
//! with graceful deletion, PodDisruptionBudgets, the Eviction API, cordon, the server's own
//! record of unavailable nodes).
//!
//! The node side is played by [`Agent`], which follows docs/protocol.md as streamd does (state,
//! observed-desired, a new reboot token per staging and per boot, `Done` after the reboot, the
//! node NotReady while it reboots). The fleet testbed with real streamd processes
//! (`testbed up --nodes N`) was not there when these tests were written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use streamd::cluster::protocol::{Inputs, State};
use testbed::apiserver::{ApiServer, ApiServerConfig};

mod common;

const OS9: &str = "quay.io/openshift/rhcos@sha256:0909090909090909090909090909090909090909090909090909090909090909";
const OS10: &str = "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010";
const P: &str = "osstream.openshift.io/";

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rollout-e2e-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// What the agents saw: every approved token per node, in order.
type Approvals = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// A fake cluster with `nodes` worker nodes on rhel-9, the CRD and the RBAC applied.
struct Cluster {
    api: Arc<ApiServer>,
    client: kube::Client,
    dir: PathBuf,
    sa_kubeconfig: PathBuf,
    approvals: Approvals,
    /// Nodes whose agent refuses the move (old CPU).
    refuse: Arc<Mutex<Vec<String>>>,
    /// Nodes to reboot now (someone else's reboot).
    reboot: Arc<Mutex<Vec<String>>>,
    controllers: Vec<tokio::process::Child>,
}

async fn client_for(path: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

impl Cluster {
    async fn start(name: &str, nodes: usize) -> Cluster {
        let dir = scratch(name);
        let api = Arc::new(
            ApiServer::start(ApiServerConfig {
                dir: dir.clone(),
                node_name: "w1".into(),
            })
            .await
            .expect("apiserver"),
        );
        let seed = api.get("v1", "Node", None, "w1").expect("w1");
        for i in 2..=nodes {
            let name = format!("w{i}");
            let mut node = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": { "name": name, "labels": seed["metadata"]["labels"].clone() },
                "spec": {},
            });
            node["metadata"]["labels"]["kubernetes.io/hostname"] = json!(name);
            api.create(node).expect("node");
            let status = seed["status"].clone();
            api.update_status("v1", "Node", None, &name, |n| n["status"] = status)
                .expect("node status");
        }
        let sa_kubeconfig = common::install(&api);
        let client = client_for(&dir.join("kubeconfig-admin")).await;
        let cluster = Cluster {
            api,
            client,
            dir,
            sa_kubeconfig,
            approvals: Approvals::default(),
            refuse: Arc::default(),
            reboot: Arc::default(),
            controllers: Vec::new(),
        };
        for i in 1..=nodes {
            let name = format!("w{i}");
            cluster
                .patch_node(
                    &name,
                    json!({"metadata": {"annotations": {
                        format!("{P}state"): "Idle",
                        format!("{P}current-stream"): "rhel-9",
                        format!("{P}current-os-image"): OS9,
                    }}}),
                )
                .await;
            tokio::spawn(agent(
                cluster.api.clone(),
                cluster.client.clone(),
                name,
                cluster.approvals.clone(),
                cluster.refuse.clone(),
                cluster.reboot.clone(),
            ));
        }
        cluster
    }

    async fn patch_node(&self, name: &str, patch: Value) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch node");
    }

    /// Starts a controller replica (SIGKILLed when the test drops it).
    fn start_controller(&mut self, identity: &str, extra: &[&str]) {
        let log = self.dir.join(format!("controller-{identity}.log"));
        let child = common::controller(&self.sa_kubeconfig, identity, extra, &log);
        self.controllers.push(child);
    }

    fn pool(&self, name: &str) -> Value {
        self.api
            .get("osstream.openshift.io/v1alpha1", "StreamPool", None, name)
            .expect("pool")
    }

    fn node(&self, name: &str) -> Value {
        self.api.get("v1", "Node", None, name).expect("node")
    }

    fn annotation(&self, node: &str, key: &str) -> Option<String> {
        self.node(node)["metadata"]["annotations"][format!("{P}{key}")]
            .as_str()
            .map(String::from)
    }

    /// Waits until `check` holds, printing the controller's log on a timeout.
    async fn wait(&self, what: &str, secs: u64, mut check: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if check(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut logs = String::new();
        for entry in std::fs::read_dir(&self.dir).expect("dir").flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("controller-")
            {
                logs.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
        for n in self.api.list("v1", "Node", None).unwrap_or_default() {
            eprintln!(
                "node {} unschedulable={} annotations={}",
                n["metadata"]["name"], n["spec"]["unschedulable"], n["metadata"]["annotations"]
            );
        }
        panic!(
            "timed out waiting for {what}\npool: {:#}\nlogs:\n{logs}",
            self.api
                .list("osstream.openshift.io/v1alpha1", "StreamPool", None)
                .unwrap_or_default()
                .first()
                .map(|p| p["status"].clone())
                .unwrap_or_default()
        );
    }

    fn create_pool(&self, spec: Value) {
        self.api
            .create(json!({
                "apiVersion": "osstream.openshift.io/v1alpha1",
                "kind": "StreamPool",
                "metadata": { "name": "worker" },
                "spec": spec,
            }))
            .expect("pool");
    }

    /// A Running, Ready pod on `node`, owned by `owner` (`kind`, `name`).
    fn pod(&self, name: &str, node: &str, owner: (&str, &str), labels: Value) {
        self.api
            .create(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "labels": labels,
                    "ownerReferences": [{
                        "apiVersion": "apps/v1",
                        "kind": owner.0,
                        "name": owner.1,
                        "uid": format!("uid-{}", owner.1),
                        "controller": true,
                    }],
                },
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{ "name": "c", "image": "quay.io/example/app@sha256:abababababababababababababababababababababababababababababababab" }],
                },
            }))
            .expect("pod");
        self.set_pod_ready(name, true);
    }

    fn set_pod_ready(&self, name: &str, ready: bool) {
        self.api
            .update_status("v1", "Pod", Some("default"), name, |p| {
                p["status"] = json!({
                    "phase": "Running",
                    "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
                });
            })
            .expect("pod status");
    }

    fn pods_on(&self, node: &str) -> Vec<String> {
        self.api
            .list("v1", "Pod", None)
            .expect("pods")
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect()
    }

    fn condition(&self, pool: &str, type_: &str) -> (String, String, String) {
        let p = self.pool(pool);
        let c = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or_default();
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        (s("status"), s("reason"), s("message"))
    }

    async fn max_unavailable_seen(&self) -> u64 {
        let rec = self
            .api
            .control(&json!({"cmd": "unavailable"}))
            .await
            .expect("unavailable");
        rec["max"].as_u64().unwrap_or(u64::MAX)
    }

    fn done(&self, node: &str) -> bool {
        let n = self.node(node);
        self.annotation(node, "state").as_deref() == Some("Done")
            && self.annotation(node, "current-os-image").as_deref() == Some(OS10)
            && n["spec"]["unschedulable"] != true
            && self.annotation(node, "rollout-step").is_none()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.controllers {
            let _ = c.start_kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn set_ready(api: &ApiServer, node: &str, ready: bool) {
    api.update_status("v1", "Node", None, node, |n| {
        for c in n["status"]["conditions"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if c["type"] == "Ready" {
                c["status"] = json!(if ready { "True" } else { "False" });
            }
        }
    })
    .expect("node ready");
}

/// The node side of docs/protocol.md, as streamd plays it with `reboot = on-approval`: a
/// request is checked and staged, `reboot-requested` carries `<observed>.<boot>.<staging>`, an
/// approval of exactly that token reboots the node (NotReady for a moment) into the image, and
/// any other boot (someone else's reboot) discards the stage and asks again with a new token.
async fn agent(
    api: Arc<ApiServer>,
    client: kube::Client,
    name: String,
    approvals: Approvals,
    refuse: Arc<Mutex<Vec<String>>>,
    reboot: Arc<Mutex<Vec<String>>>,
) {
    let nodes: Api<Node> = Api::all(client);
    let pp = PatchParams {
        field_manager: Some("streamd".into()),
        ..PatchParams::default()
    };
    let patch = |a: Value| json!({"metadata": {"annotations": a}});
    let mut boot: u64 = 1;
    let mut staging: u64 = 0;
    let mut staged: Option<(String, u64, String)> = None; // (observed, boot, token)
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(node) = nodes.get(&name).await else {
            continue;
        };
        let a = node.metadata.annotations.clone().unwrap_or_default();
        let get = |k: &str| a.get(&format!("{P}{k}")).cloned();
        let someone_reboots = {
            let mut r = reboot.lock().expect("lock");
            let hit = r.contains(&name);
            r.retain(|n| n != &name);
            hit
        };
        if someone_reboots {
            set_ready(&api, &name, false);
            tokio::time::sleep(Duration::from_millis(800)).await;
            boot += 1;
            set_ready(&api, &name, true);
            continue;
        }
        // The readiness protocol: a dry run of check-* (images given by the pool here).
        if let (Some(stream), Some(os)) = (get("check-stream"), get("check-os-image")) {
            let check = Inputs {
                stream: Some(stream.clone()),
                os_image: Some(os.clone()),
                extensions_image: get("check-extensions-image"),
                reboot_approved: None,
            };
            if let Ok(Some(d)) = check.desired() {
                let refused = refuse.lock().expect("lock").contains(&name);
                let entry = if refused {
                    json!({"ready": false, "failed": ["cpu-level"], "reason": "preflight check cpu-level failed: x86-64-v2", "osImage": os, "checked": d.observed_hash()})
                } else {
                    json!({"ready": true, "failed": [], "reason": "", "osImage": os, "checked": d.observed_hash()})
                };
                let value = json!({ stream: entry }).to_string();
                if get("readiness").as_deref() != Some(value.as_str()) {
                    let _ = nodes
                        .patch(
                            &name,
                            &pp,
                            &Patch::Merge(&patch(json!({ format!("{P}readiness"): value }))),
                        )
                        .await;
                }
            }
        }
        let inputs = Inputs {
            reboot_approved: None,
            ..Inputs::from_annotations(&a)
        };
        let Ok(Some(desired)) = inputs.desired() else {
            continue;
        };
        let h = desired.observed_hash();
        let state = get("state").and_then(|s| s.parse::<State>().ok());
        if get("current-os-image").as_deref() == Some(&desired.os_image.to_string()) {
            if state != Some(State::Done) || get("observed-desired").as_deref() != Some(&h) {
                let _ = nodes
                    .patch(
                        &name,
                        &pp,
                        &Patch::Merge(&patch(json!({
                            format!("{P}state"): "Done", format!("{P}reason"): "",
                            format!("{P}observed-desired"): h, format!("{P}reboot-requested"): null,
                        }))),
                    )
                    .await;
            }
            continue;
        }
        if refuse.lock().expect("lock").contains(&name) {
            if state != Some(State::Refused) {
                let _ = nodes
                    .patch(&name, &pp, &Patch::Merge(&patch(json!({
                        format!("{P}state"): "Refused",
                        format!("{P}reason"): "preflight check cpu-level failed: this CPU is x86-64-v2; rhel-10 needs x86-64-v3",
                        format!("{P}observed-desired"): h,
                    }))))
                    .await;
            }
            continue;
        }
        let current = staged
            .as_ref()
            .filter(|(o, b, _)| *o == h && *b == boot)
            .map(|(_, _, t)| t.clone());
        let Some(token) = current else {
            // A new request or a new boot: stage (again), with a new token.
            let _ = nodes
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(&patch(json!({
                        format!("{P}state"): "Staging", format!("{P}reason"): "",
                        format!("{P}observed-desired"): h, format!("{P}reboot-requested"): null,
                    }))),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            staging += 1;
            let token = format!("{h}.{boot:012x}.{staging:012x}");
            let _ = nodes
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(&patch(json!({
                        format!("{P}state"): "Staged",
                        format!("{P}reboot-requested"): token,
                    }))),
                )
                .await;
            staged = Some((h, boot, token));
            continue;
        };
        if get("reboot-approved").as_deref() == Some(token.as_str()) {
            approvals
                .lock()
                .expect("lock")
                .entry(name.clone())
                .or_default()
                .push(token.clone());
            let _ = nodes
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(&patch(json!({ format!("{P}state"): "Rebooting" }))),
                )
                .await;
            set_ready(&api, &name, false);
            tokio::time::sleep(Duration::from_millis(500)).await;
            boot += 1;
            let _ = nodes
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(&patch(json!({
                        format!("{P}state"): "Done",
                        format!("{P}current-stream"): desired.stream,
                        format!("{P}current-os-image"): desired.os_image.to_string(),
                        format!("{P}reboot-requested"): null,
                    }))),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            set_ready(&api, &name, true);
        }
    }
}

/// [`spec`] with one node staging at a time, so that w1 is the first to ask for a reboot
/// whatever the machine's load.
fn one_by_one() -> Value {
    let mut s = spec(json!(1), false);
    s["maxConcurrentStaging"] = json!(1);
    s
}

/// A pool of the worker nodes, target rhel-10 by image.
fn spec(max_unavailable: Value, paused: bool) -> Value {
    json!({
        "nodeSelector": { "matchLabels": { "node-role.kubernetes.io/worker": "" } },
        "target": { "stream": "rhel-10", "osImage": OS10 },
        "maxUnavailable": max_unavailable,
        "paused": paused,
        "drain": { "timeoutSeconds": 120 },
    })
}

/// Four nodes move rhel-9 → rhel-10 one at a time; a PodDisruptionBudget refuses the first
/// eviction until another replica is Ready; DaemonSet and mirror pods stay; every node is
/// approved exactly once; the API server never saw more than one node unavailable.
#[tokio::test]
async fn a_pool_moves_one_node_at_a_time_past_a_pdb() {
    let mut c = Cluster::start("pdb", 4).await;
    let web = json!({"app": "web"});
    c.pod("web-a", "w1", ("ReplicaSet", "web"), web.clone());
    c.pod("web-b", "w2", ("ReplicaSet", "web"), web.clone());
    c.pod("web-c", "w3", ("ReplicaSet", "web"), web.clone());
    c.set_pod_ready("web-c", false);
    c.pod(
        "ds-w1",
        "w1",
        ("DaemonSet", "agent"),
        json!({"app": "agent"}),
    );
    c.api
        .create(json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "name": "web", "namespace": "default" },
            "spec": { "maxUnavailable": 1, "selector": { "matchLabels": { "app": "web" } } },
        }))
        .expect("pdb");
    c.create_pool(one_by_one());
    c.start_controller("a", &["--leader-elect=false"]);

    // w1 is taken first and its web pod's eviction is refused (web-c is not Ready).
    c.wait("w1 cordoned and its eviction refused", 60, |c| {
        c.node("w1")["spec"]["unschedulable"] == true
            && c.pool("worker")["status"]["nodes"]
                .as_array()
                .is_some_and(|ns| {
                    ns.iter().any(|n| {
                        n["name"] == "w1"
                            && n["reason"].as_str().unwrap_or_default().contains("429")
                    })
                })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(c.pods_on("w1").contains(&"web-a".to_string()));
    assert_eq!(
        c.annotation("w1", "reboot-approved"),
        None,
        "approved before drained"
    );
    assert!(
        c.node("w2")["spec"]["unschedulable"] != true,
        "a second node was taken"
    );

    // The budget allows one disruption once web-c is Ready; a "ReplicaSet" puts web-a's
    // replacement on w4 (still schedulable) when it is gone.
    c.set_pod_ready("web-c", true);
    c.wait("web-a evicted", 30, |c| {
        !c.pods_on("w1").contains(&"web-a".to_string())
    })
    .await;
    c.pod("web-d", "w4", ("ReplicaSet", "web"), web.clone());
    for node in ["w1", "w2", "w3", "w4"] {
        c.wait(&format!("{node} done"), 90, |c| c.done(node)).await;
        if node == "w2" {
            c.wait("web-b evicted", 30, |c| {
                !c.pods_on("w2").contains(&"web-b".to_string())
            })
            .await;
            c.pod("web-e", "w1", ("ReplicaSet", "web"), web.clone());
        }
        if node == "w3" {
            c.pod("web-f", "w1", ("ReplicaSet", "web"), web.clone());
        }
    }
    c.wait("pool Updated", 30, |c| {
        c.condition("worker", "Updated").0 == "True"
    })
    .await;
    assert!(
        c.pods_on("w1").contains(&"ds-w1".to_string()),
        "DaemonSet pod evicted"
    );
    let approvals = c.approvals.lock().expect("lock").clone();
    for node in ["w1", "w2", "w3", "w4"] {
        assert_eq!(
            approvals.get(node).map(Vec::len),
            Some(1),
            "{node}: {approvals:?}"
        );
    }
    assert_eq!(c.max_unavailable_seen().await, 1);
    let status = c.pool("worker")["status"].clone();
    assert_eq!(status["updatedMachineCount"], 4);
    assert_eq!(status["readyMachineCount"], 4);
    assert_eq!(status["observedGeneration"], 1);
}

/// A node that refuses (old CPU) stops the rollout with its reason; the nodes not yet taken
/// stay uncordoned and unapproved.
#[tokio::test]
async fn a_refusing_node_stops_the_rollout_with_its_reason() {
    let mut c = Cluster::start("refuse", 3).await;
    c.refuse.lock().expect("lock").push("w2".into());
    c.create_pool(spec(json!(1), false));
    c.start_controller("a", &["--leader-elect=false"]);
    c.wait("pool Degraded", 60, |c| {
        c.condition("worker", "Degraded").0 == "True"
    })
    .await;
    let (_, reason, message) = c.condition("worker", "Degraded");
    assert_eq!(reason, "NodeRefused");
    assert!(
        message.contains("node w2: preflight check cpu-level failed"),
        "{message}"
    );
    let status = c.pool("worker")["status"].clone();
    assert_eq!(status["degradedMachineCount"], 1);
    assert_eq!(status["nodes"][0]["name"], "w2");
    assert_eq!(status["nodes"][0]["state"], "Refused");
    // Whatever was in flight when w2 refused finishes; nothing new is taken afterwards.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let taken: Vec<&str> = ["w1", "w3"]
        .into_iter()
        .filter(|n| c.annotation(n, "reboot-approved").is_some() || c.done(n))
        .collect();
    assert!(taken.len() <= 1, "nodes taken after the refusal: {taken:?}");
    for n in ["w1", "w3"] {
        if !taken.contains(&n) {
            assert!(c.node(n)["spec"]["unschedulable"] != true, "{n} cordoned");
        }
    }
    assert_eq!(c.node("w2")["spec"]["unschedulable"], Value::Null);
}

/// A paused pool gets readiness checks only; unpaused, it moves.
#[tokio::test]
async fn pause_stops_new_work_and_resume_continues() {
    let mut c = Cluster::start("pause", 2).await;
    c.create_pool(spec(json!(1), true));
    c.start_controller("a", &["--leader-elect=false"]);
    c.wait("Paused condition", 30, |c| {
        c.condition("worker", "Paused").0 == "True"
    })
    .await;
    c.wait("check-stream written", 30, |c| {
        c.annotation("w1", "check-stream").as_deref() == Some("rhel-10")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.annotation("w1", "desired-stream"),
        None,
        "a paused pool targeted a node"
    );
    assert_eq!(c.condition("worker", "Updating").0, "False");

    let pools: Api<kube::api::DynamicObject> = Api::all_with(
        c.client.clone(),
        &kube::discovery::ApiResource {
            group: "osstream.openshift.io".into(),
            version: "v1alpha1".into(),
            api_version: "osstream.openshift.io/v1alpha1".into(),
            kind: "StreamPool".into(),
            plural: "streampools".into(),
        },
    );
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    for node in ["w1", "w2"] {
        c.wait(&format!("{node} done"), 60, |c| c.done(node)).await;
    }
    c.wait("pool Updated", 30, |c| {
        c.condition("worker", "Updated").0 == "True"
    })
    .await;
    assert_eq!(c.pool("worker")["status"]["observedGeneration"], 2);
}

/// The controller is SIGKILLed while a drain waits for a PodDisruptionBudget; a new one takes
/// up the drain from the node's mark: the node is approved once, no second node is taken.
#[tokio::test]
async fn a_controller_killed_mid_drain_continues_without_a_second_approval() {
    let mut c = Cluster::start("kill", 2).await;
    c.pod("web-a", "w1", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.api
        .create(json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "name": "web", "namespace": "default" },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } },
        }))
        .expect("pdb");
    c.create_pool(one_by_one());
    c.start_controller("a", &["--leader-elect=false"]);
    c.wait("w1 draining", 60, |c| {
        c.annotation("w1", "rollout-step")
            .is_some_and(|s| s.starts_with("draining:"))
    })
    .await;
    let mark = c.annotation("w1", "rollout-step");
    let mut first = c.controllers.remove(0);
    first.kill().await.expect("kill");
    c.pod("web-b", "w2", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.start_controller("b", &["--leader-elect=false"]);
    c.wait("w1 done", 60, |c| c.done("w1")).await;
    assert!(mark.is_some());
    // web-b's replacement, so that w2's drain may go on too.
    c.pod("web-c", "w1", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.wait("w2 done", 60, |c| c.done("w2")).await;
    let approvals = c.approvals.lock().expect("lock").clone();
    assert_eq!(approvals.get("w1").map(Vec::len), Some(1), "{approvals:?}");
    assert_eq!(approvals.get("w2").map(Vec::len), Some(1), "{approvals:?}");
    assert_eq!(c.max_unavailable_seen().await, 1);
}

/// A node rebooted by someone else while another is in flight: it counts as unavailable (no
/// new node is taken while it is down), its stage is discarded and it asks again with a new
/// token, and the pool still finishes with one approval per node.
#[tokio::test]
async fn a_node_rebooted_by_someone_else_mid_rollout() {
    let mut c = Cluster::start("reboot", 3).await;
    c.create_pool(one_by_one());
    c.start_controller("a", &["--leader-elect=false"]);
    c.wait("w1 taken", 60, |c| {
        c.annotation("w1", "rollout-step").is_some()
    })
    .await;
    c.wait("w3 staged", 30, |c| {
        c.annotation("w3", "state").as_deref() == Some("Staged")
    })
    .await;
    let old = c.annotation("w3", "reboot-requested");
    c.reboot.lock().expect("lock").push("w3".into());
    for node in ["w1", "w2", "w3"] {
        c.wait(&format!("{node} done"), 90, |c| c.done(node)).await;
    }
    let approvals = c.approvals.lock().expect("lock").clone();
    for node in ["w1", "w2", "w3"] {
        assert_eq!(
            approvals.get(node).map(Vec::len),
            Some(1),
            "{node}: {approvals:?}"
        );
    }
    assert_ne!(
        approvals.get("w3").and_then(|t| t.first()).cloned(),
        old,
        "the pre-reboot token was approved"
    );
    // w3's own reboot plus the node in flight: never a second node taken while w3 was down.
    assert!(c.max_unavailable_seen().await <= 2);
}

fn leader_of(c: &Cluster) -> Option<String> {
    let lease = c
        .api
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("streamd-rollout"),
            "streamd-rollout",
        )
        .ok()?;
    lease["spec"]["holderIdentity"].as_str().map(String::from)
}

/// Two replicas elect a leader on the Lease; the leader is SIGKILLed mid-drain and the other
/// takes over when the lease expires, continuing the drain without a second approval.
/// kube-lease-manager takes a free Lease with a server-side apply that conflicts on the
/// `holderIdentity` another field manager owns; the testbed's API server serves that.
#[tokio::test]
async fn a_leader_change_mid_drain_continues_without_a_second_approval() {
    let mut c = Cluster::start("leader", 2).await;
    c.pod("web-a", "w1", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.api
        .create(json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": { "name": "web", "namespace": "default" },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } },
        }))
        .expect("pdb");
    c.create_pool(one_by_one());
    c.start_controller("a", &["--lease-seconds", "3"]);
    c.start_controller("b", &["--lease-seconds", "3"]);
    c.wait("a leader", 30, |c| leader_of(c).is_some()).await;
    c.wait("w1 draining", 60, |c| {
        c.annotation("w1", "rollout-step")
            .is_some_and(|s| s.starts_with("draining:"))
    })
    .await;
    let first = leader_of(&c).expect("leader");
    let index = usize::from(first == "b");
    c.controllers[index].kill().await.expect("kill");
    c.pod("web-b", "w2", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.wait("the other replica leads", 30, |c| {
        leader_of(c).is_some_and(|l| l != first)
    })
    .await;
    c.wait("w1 done", 60, |c| c.done("w1")).await;
    c.pod("web-c", "w1", ("ReplicaSet", "web"), json!({"app": "web"}));
    c.wait("w2 done", 60, |c| c.done("w2")).await;
    let approvals = c.approvals.lock().expect("lock").clone();
    assert_eq!(approvals.get("w1").map(Vec::len), Some(1), "{approvals:?}");
    assert_eq!(approvals.get("w2").map(Vec::len), Some(1), "{approvals:?}");
    assert_eq!(c.max_unavailable_seen().await, 1);
}

/// A pool of nodes the machine-config operator manages (the MCD's `currentConfig` annotation,
/// streamd in `readiness` mode) gets the dry run only: its readiness summary, never a desired
/// key, a cordon or an approval.
#[tokio::test]
async fn an_mco_pool_gets_the_readiness_summary_only() {
    let mut c = Cluster::start("mco", 3).await;
    c.refuse.lock().expect("lock").push("w2".into());
    for n in ["w1", "w2", "w3"] {
        c.patch_node(
            n,
            json!({"metadata": {"annotations": {
                "machineconfiguration.openshift.io/currentConfig": "rendered-worker-0123",
                format!("{P}mode"): "readiness",
            }}}),
        )
        .await;
    }
    c.create_pool(spec(json!(1), false));
    c.start_controller("a", &["--leader-elect=false"]);
    c.wait("the readiness summary", 30, |c| {
        c.pool("worker")["status"]["readiness"] == "2 of 3 ready; 1 refuse: cpu-level"
    })
    .await;
    let (status, reason, _) = c.condition("worker", "Updating");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ManagedByMachineConfigOperator")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in ["w1", "w2", "w3"] {
        assert_eq!(c.annotation(n, "desired-stream"), None, "{n} targeted");
        assert_eq!(
            c.node(n)["spec"]["unschedulable"],
            Value::Null,
            "{n} cordoned"
        );
    }
}
