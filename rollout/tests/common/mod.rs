//! The harness of the end-to-end tests: a fleet testbed of real streamd nodes
//! (`testbed::Fleet`: one fake API server and registry, N node hosts each with its own bus, fake
//! rpm-ostreed, host root, real streamd and a stand-in kubelet that reboots the host on
//! streamd's request), the shipped CRD and RBAC applied, streamd-rollout replicas started as
//! their service account, and a record of what the API server saw happen to the Nodes (every
//! approval and every drain mark, from a watch of the server, not from the nodes' account).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use serde_json::{Value, json};
use testbed::control::ApiServerCmd;
use testbed::fakes::apiserver::ApiServer;
use testbed::scratch::ScratchDir;
use testbed::{Fleet, FleetOptions};

/// The node protocol's key prefix.
pub const P: &str = "osstream.openshift.io/";
/// The StreamPool's apiVersion.
pub const POOLS: &str = "osstream.openshift.io/v1alpha1";

/// The streamd binary next to the test executable (`cargo test --workspace` builds it; alone,
/// run `cargo build -p streamd` first).
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

/// What the API server saw, per node, in order: every `reboot-approved` value set and every
/// `draining:` mark of the controller, each time it appears (a value set again after it was
/// removed counts again). A second approval or drain shows as a second entry.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Node → the approved tokens.
    pub approvals: BTreeMap<String, Vec<String>>,
    /// Node → the drain marks (`draining:<started>:<token>`).
    pub drains: BTreeMap<String, Vec<String>>,
    /// (list, node) → the value last seen, `None` once removed.
    last: BTreeMap<(&'static str, String), Option<String>>,
}

impl Seen {
    fn record(&mut self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let last = &mut self.last;
        let mut push = |which: &'static str,
                        list: &mut BTreeMap<String, Vec<String>>,
                        value: Option<&String>| {
            let seen = last.entry((which, name.clone())).or_default();
            let entries = list.entry(name.clone()).or_default();
            if value.is_some() && seen.as_ref() != value {
                entries.extend(value.cloned());
            }
            *seen = value.cloned();
        };
        push(
            "approvals",
            &mut self.approvals,
            annotations.get(&format!("{P}reboot-approved")),
        );
        let step = annotations
            .get(&format!("{P}rollout-step"))
            .filter(|s| s.starts_with("draining:"));
        push("drains", &mut self.drains, step);
    }
}

/// One Event about the pool.
#[derive(Debug, Clone)]
pub struct PoolEvent {
    /// `eventTime` (RFC 3339 with microseconds: sorts as text).
    pub time: String,
    /// `Normal` or `Warning`.
    pub type_: String,
    /// PascalCase reason.
    pub reason: String,
    /// The related Node's name; empty for an Event about the pool alone.
    pub node: String,
    /// The note.
    pub note: String,
    /// `series.count`, 1 without a series.
    pub count: u64,
}

/// A fleet of real streamd nodes on rhel-9 with the controller's CRD and RBAC.
pub struct Pool {
    /// The fleet (nodes `worker-0` …).
    pub fleet: Fleet,
    /// The cluster admin's client.
    pub admin: kube::Client,
    sa_kubeconfig: PathBuf,
    controllers: Vec<(String, tokio::process::Child)>,
    /// Environment of the replicas started from now on.
    controller_env: Vec<(String, String)>,
    seen: Arc<Mutex<Seen>>,
    watch: tokio::task::JoinHandle<()>,
    name: String,
    started: Instant,
    /// The fleet's directory; after the fleet, so it goes once the fleet stopped (kept when a
    /// test failed).
    _dir: ScratchDir,
}

impl Pool {
    /// `nodes` nodes (`overrides`: node → host fixture), no controller yet.
    pub async fn start(name: &str, nodes: usize, overrides: &[(&str, &str)]) -> Pool {
        Pool::start_with(name, nodes, overrides, |_| {}).await
    }

    /// [`Pool::start`] with the fleet's options changed by `tweak`.
    pub async fn start_with(
        name: &str,
        nodes: usize,
        overrides: &[(&str, &str)],
        tweak: impl FnOnce(&mut FleetOptions),
    ) -> Pool {
        let dir = ScratchDir::new(&format!("rollout-{name}")).expect("scratch dir");
        let started = Instant::now();
        let mut opts = FleetOptions::new(dir.to_path_buf(), nodes);
        opts.streamd = Some(streamd_bin());
        opts.host_overrides = overrides
            .iter()
            .map(|(n, f)| (n.to_string(), f.to_string()))
            .collect();
        tweak(&mut opts);
        let fleet = Fleet::start(opts).await.expect("fleet");
        let sa_kubeconfig =
            testbed::harness::fleet::controller::install(fleet.apiserver()).expect("CRD and RBAC");
        let admin = client_for(&fleet.dir().join("kubeconfig-admin")).await;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watch = {
            let seen = seen.clone();
            let nodes: Api<Node> = Api::all(admin.clone());
            tokio::spawn(async move {
                let mut events = Box::pin(watcher(nodes, watcher::Config::default()));
                while let Some(event) = events.next().await {
                    if let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event {
                        seen.lock().expect("lock").record(&n);
                    }
                }
            })
        };
        Pool {
            fleet,
            admin,
            sa_kubeconfig,
            controllers: Vec::new(),
            controller_env: Vec::new(),
            seen,
            watch,
            name: name.to_string(),
            started,
            _dir: dir,
        }
    }

    /// The API server.
    pub fn api(&self) -> &ApiServer {
        self.fleet.apiserver()
    }

    /// Starts a controller replica `streamd-rollout run --identity <identity> <extra…>` as the
    /// service account, its log in `controller-<identity>.log`; SIGKILLed when the pool drops.
    pub fn start_controller(&mut self, identity: &str, extra: &[&str]) {
        let kubeconfig = self.sa_kubeconfig.clone();
        self.start_controller_as(identity, &kubeconfig, extra);
    }

    /// [`Pool::start_controller`] with the credentials of `kubeconfig`.
    pub fn start_controller_as(&mut self, identity: &str, kubeconfig: &Path, extra: &[&str]) {
        let log = self.fleet.dir().join(format!("controller-{identity}.log"));
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_streamd-rollout"))
            .args([
                "run",
                "--identity",
                identity,
                "--lease-namespace",
                "streamd-rollout",
            ])
            .args(extra)
            .envs(self.controller_env.iter().cloned())
            .env("KUBECONFIG", kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log"))
            .kill_on_drop(true)
            .spawn()
            .expect("streamd-rollout");
        self.controllers.push((identity.to_string(), child));
    }

    /// Sets `key=value` in the environment of the replicas started from now on.
    pub fn set_controller_env(&mut self, key: &str, value: &str) {
        self.controller_env
            .push((key.to_string(), value.to_string()));
    }

    /// SIGKILLs the replica `identity`.
    pub async fn kill_controller(&mut self, identity: &str) {
        let i = self
            .controllers
            .iter()
            .position(|(id, _)| id == identity)
            .expect("no such replica");
        let (_, mut child) = self.controllers.remove(i);
        child.kill().await.expect("kill");
    }

    /// Creates StreamPool `worker` with `spec`.
    pub fn create_pool(&self, spec: Value) {
        self.create_named_pool("worker", spec);
    }

    /// Creates StreamPool `name` with `spec`.
    pub fn create_named_pool(&self, name: &str, spec: Value) {
        self.api()
            .create(json!({
                "apiVersion": POOLS,
                "kind": "StreamPool",
                "metadata": { "name": name },
                "spec": spec,
            }))
            .expect("pool");
    }

    fn pools(&self) -> Api<kube::api::DynamicObject> {
        Api::all_with(
            self.admin.clone(),
            &kube::discovery::ApiResource {
                group: "osstream.openshift.io".into(),
                version: "v1alpha1".into(),
                api_version: POOLS.into(),
                kind: "StreamPool".into(),
                plural: "streampools".into(),
            },
        )
    }

    /// Merge-patches StreamPool `worker` as an admin does.
    pub async fn patch_pool(&self, patch: Value) {
        use kube::api::{Patch, PatchParams};
        self.pools()
            .patch("worker", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch pool");
    }

    /// Deletes StreamPool `worker` as an admin does (`kubectl delete streampool worker`).
    pub async fn delete_pool(&self) {
        self.pools()
            .delete("worker", &kube::api::DeleteParams::default())
            .await
            .expect("delete pool");
    }

    /// Takes `node` out of the pool's selector (removes its worker role label).
    pub fn relabel_out(&self, node: &str) {
        self.api()
            .update("v1", "Node", None, node, |n| {
                if let Some(labels) = n["metadata"]["labels"].as_object_mut() {
                    labels.remove("node-role.kubernetes.io/worker");
                }
            })
            .expect("relabel");
    }

    /// The pool's status shows `node`'s drain held by a PodDisruptionBudget (state
    /// `EvictionBlocked`, its 429 in the reason).
    pub fn eviction_refused(&self, node: &str) -> bool {
        self.status()["nodes"].as_array().is_some_and(|ns| {
            ns.iter().any(|n| {
                n["name"] == node
                    && n["state"] == "EvictionBlocked"
                    && n["reason"].as_str().unwrap_or_default().contains("429")
            })
        })
    }

    /// `node` carries none of the pool's keys or marks and is schedulable: the controller let
    /// it go.
    pub fn released(&self, node: &str) -> bool {
        [
            "desired-stream",
            "desired-os-image",
            "check-stream",
            "rollout-step",
            "reboot-approved",
            "rollout-pool",
        ]
        .iter()
        .all(|k| self.annotation(node, k).is_none())
            && !self.cordoned(node)
    }

    /// StreamPool `worker` (`Null` when there is none).
    pub fn pool(&self) -> Value {
        self.api()
            .get(POOLS, "StreamPool", None, "worker")
            .unwrap_or_default()
    }

    /// The pool's status.
    pub fn status(&self) -> Value {
        self.pool()["status"].clone()
    }

    /// `(status, reason, message)` of the pool's condition `type_`.
    pub fn condition(&self, type_: &str) -> (String, String, String) {
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

    /// Node `node`.
    pub fn node(&self, node: &str) -> Value {
        self.api().get("v1", "Node", None, node).expect("node")
    }

    /// Whether `node` is cordoned.
    pub fn cordoned(&self, node: &str) -> bool {
        self.node(node)["spec"]["unschedulable"] == true
    }

    /// Whether `node` carries the controller's `update-in-progress:PreferNoSchedule` taint.
    pub fn update_tainted(&self, node: &str) -> bool {
        self.node(node)["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["key"] == format!("{P}update-in-progress")
                        && t["effect"] == "PreferNoSchedule"
                })
            })
    }

    /// The node protocol's `key` on `node`.
    pub fn annotation(&self, node: &str, key: &str) -> Option<String> {
        self.node(node)["metadata"]["annotations"][format!("{P}{key}")]
            .as_str()
            .map(String::from)
    }

    /// `node` runs rhel-10, is `Done`, uncordoned and released by the controller.
    pub fn done(&self, node: &str) -> bool {
        self.annotation(node, "state").as_deref() == Some("Done")
            && self.annotation(node, "current-stream").as_deref() == Some("rhel-10")
            && !self.cordoned(node)
            && self.annotation(node, "rollout-step").is_none()
    }

    /// A Running, Ready pod `default/name` on `node` owned by `owner` (`(kind, name)`).
    /// A DaemonSet owner is created too (once per DaemonSet): the drain looks it up.
    pub fn pod(&self, name: &str, node: &str, owner: (&str, &str), labels: Value) {
        if owner.0 == "DaemonSet" {
            self.api()
                .create(json!({
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": { "name": owner.1, "namespace": "default" },
                    "spec": { "selector": { "matchLabels": labels }, "template": {} },
                }))
                .expect("the DaemonSet");
        }
        self.fleet
            .add_pod("default", name, node, labels, Some(owner))
            .expect("pod");
    }

    /// Sets pod `default/name`'s Ready condition.
    pub fn set_pod_ready(&self, name: &str, ready: bool) {
        self.api()
            .update_status("v1", "Pod", Some("default"), name, |p| {
                for c in p["status"]["conditions"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                        c["status"] = json!(if ready { "True" } else { "False" });
                    }
                }
            })
            .expect("pod status");
    }

    /// The pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<String> {
        self.api()
            .list("v1", "Pod", None)
            .expect("pods")
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect()
    }

    /// PodDisruptionBudget `default/web` over the pods labelled `app=web`, with `budget`
    /// (`{"minAvailable": 1}` or `{"maxUnavailable": 1}`).
    pub fn web_pdb(&self, budget: Value) {
        let mut spec = json!({ "selector": { "matchLabels": { "app": "web" } } });
        spec.as_object_mut()
            .expect("object")
            .extend(budget.as_object().expect("budget").clone());
        self.api()
            .create(json!({
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": { "name": "web", "namespace": "default" },
                "spec": spec,
            }))
            .expect("pdb");
    }

    /// The Events about StreamPool `worker` (events.k8s.io/v1, namespace `default` as for any
    /// cluster-scoped object), oldest first.
    pub fn events(&self) -> Vec<PoolEvent> {
        let mut events: Vec<PoolEvent> = self
            .api()
            .list("events.k8s.io/v1", "Event", Some("default"))
            .unwrap_or_default()
            .iter()
            .filter(|e| {
                e["regarding"]["kind"] == "StreamPool" && e["regarding"]["name"] == "worker"
            })
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                PoolEvent {
                    time: s(&e["eventTime"]),
                    type_: s(&e["type"]),
                    reason: s(&e["reason"]),
                    node: s(&e["related"]["name"]),
                    note: s(&e["note"]),
                    count: e["series"]["count"].as_u64().unwrap_or(1),
                }
            })
            .collect();
        events.sort_by(|a, b| a.time.cmp(&b.time));
        events
    }

    /// The reasons of the Events about node `node` (`""`: about the pool only), in order.
    pub fn event_reasons(&self, node: &str) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|e| e.node == node)
            .map(|e| e.reason)
            .collect()
    }

    /// How many `verb` requests on `resource` (e.g. `pods`) the controllers' service account
    /// made so far.
    pub async fn controller_requests(&self, resource: &str, verb: &str) -> u64 {
        let stats = self
            .api()
            .control(ApiServerCmd::STATS)
            .await
            .expect("stats");
        let user = testbed::harness::fleet::controller::SERVICE_ACCOUNT;
        stats["by_resource"][user][resource][verb]
            .as_u64()
            .unwrap_or_default()
    }

    /// The most nodes the API server saw unavailable at once.
    pub async fn max_unavailable_seen(&self) -> u64 {
        let rec = self
            .api()
            .control(ApiServerCmd::Unavailable)
            .await
            .expect("unavailable");
        rec["max"].as_u64().unwrap_or(u64::MAX)
    }

    /// The approvals and drain marks the API server saw so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("lock").clone()
    }

    /// Asserts every node of `nodes` was drained once and approved once.
    pub fn assert_once(&self, nodes: &[&str]) {
        let seen = self.seen();
        for n in nodes {
            assert_eq!(
                seen.approvals.get(*n).map(Vec::len),
                Some(1),
                "{n}: approvals {:?}",
                seen.approvals
            );
            assert_eq!(
                seen.drains.get(*n).map(Vec::len),
                Some(1),
                "{n}: drains {:?}",
                seen.drains
            );
        }
    }

    /// Waits until `check` holds; on a timeout, panics with the pool, the nodes and the
    /// controllers' logs.
    pub async fn wait(&self, what: &str, secs: u64, mut check: impl FnMut(&Pool) -> bool) {
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
                "{n}: unschedulable={} {}\n",
                self.node(&n)["spec"]["unschedulable"],
                self.fleet.annotations(&n).unwrap_or_default()
            ));
        }
        let mut logs = String::new();
        for (id, _) in &self.controllers {
            let log = self.fleet.dir().join(format!("controller-{id}.log"));
            logs.push_str(&std::fs::read_to_string(log).unwrap_or_default());
        }
        panic!(
            "timed out waiting for {what}\nstatus: {:#}\nnodes:\n{nodes}controllers:\n{logs}",
            self.status()
        );
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.watch.abort();
        for (_, c) in &mut self.controllers {
            let _ = c.start_kill();
        }
        // The wall time of each test, for the CI budget (docs/pools.md).
        eprintln!("{}: {:.1?}", self.name, self.started.elapsed());
    }
}

async fn client_for(path: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

/// A pool of the worker nodes, target rhel-10 (resolved through OSImageStream), with
/// `maxUnavailable` 1 and staging one node at a time, so that nodes ask for their reboot in
/// name order whatever the machine's load.
pub fn spec() -> Value {
    json!({
        "nodeSelector": { "matchLabels": { "node-role.kubernetes.io/worker": "" } },
        "target": { "stream": "rhel-10" },
        "maxUnavailable": 1,
        "maxConcurrentStaging": 1,
        "drain": { "timeoutSeconds": 120 },
    })
}
