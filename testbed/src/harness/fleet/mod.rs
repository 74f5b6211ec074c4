//! A fleet: one fake API server and one registry for N node hosts, each its own private bus,
//! fake rpm-ostreed (with systemd, logind and bootc), host root and real `streamd` process with
//! its own node identity and kubeconfig. Each node also has a stand-in kubelet that keeps its
//! Node's `Ready` condition and boot facts true and reboots the host when streamd asks for it
//! (the Node is not Ready while the host is down, streamd restarts after it boots).
//!
//! This is the library the rollout end-to-end tests and `testbed bench --fleet` use
//! ([`controller`] runs the rollout controller on it as deployed);
//! `testbed up --nodes N` runs one in the background. See docs/testbed.md, "Fleets".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::control::{self, Request, TestbedCmd};
use crate::fakes::apiserver::{ApiServer, ApiServerConfig};
use crate::fakes::registry::Registry;
use crate::fakes::rpmostreed::RpmOstreeVersion;
use crate::fixtures::images::TestImage;
use crate::fixtures::openshift::{FeatureSet, OpenShift};
use crate::harness::cluster::{admin_env, image_env, prepare_cluster, start_registry, write_env};
use crate::harness::control_socket::serve_control;
use crate::harness::node_host::{HostSetup, NodeHost};
use crate::harness::testbed::Backend;

pub mod controller;

/// How often a stand-in kubelet looks for a reboot request.
const KUBELET_PERIOD: Duration = Duration::from_millis(200);
/// How long streamd gets to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start a fleet.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Directory holding everything (created if missing); node `worker-<i>` lives in
    /// `DIR/nodes/worker-<i>`.
    pub dir: PathBuf,
    /// How many nodes (`worker-0` …).
    pub nodes: usize,
    /// Host fixture of every node (`crate::fixtures::NAMES`) …
    pub host: String,
    /// … except these nodes' (node name → fixture), e.g. one `old-cpu` node.
    pub host_overrides: BTreeMap<String, String>,
    /// The OS update tool of every node.
    pub backend: Backend,
    /// The rpm-ostree release every node's fake rpm-ostreed plays.
    pub rpm_ostree: RpmOstreeVersion,
    /// The OpenShift release every node's MachineConfig was rendered by.
    pub openshift: OpenShift,
    /// The cluster's feature set (default: [`OpenShift::default_feature_set`]).
    pub feature_set: Option<FeatureSet>,
    /// The streamd binary each node runs; `None`: none is started (start them yourself).
    pub streamd: Option<PathBuf>,
    /// How long a rebooting node stays down (NotReady, streamd stopped) before it boots.
    pub reboot_downtime: Duration,
}

impl FleetOptions {
    /// `nodes` `default` rpm-ostree nodes in `dir`, no streamd, 500 ms reboots.
    pub fn new(dir: impl Into<PathBuf>, nodes: usize) -> FleetOptions {
        FleetOptions {
            dir: dir.into(),
            nodes,
            host: "default".into(),
            host_overrides: BTreeMap::new(),
            backend: Backend::default(),
            rpm_ostree: RpmOstreeVersion::default(),
            openshift: OpenShift::default(),
            feature_set: None,
            streamd: None,
            reboot_downtime: Duration::from_millis(500),
        }
    }
}

/// One node of the fleet.
struct FleetNode {
    name: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    host: NodeHost,
    streamd: tokio::sync::Mutex<Option<Child>>,
    /// Held for the whole of a reboot, so two never overlap.
    rebooting: tokio::sync::Mutex<()>,
}

struct Inner {
    apiserver: ApiServer,
    nodes: Vec<FleetNode>,
    streamd: Option<PathBuf>,
    reboot_downtime: Duration,
}

/// A running fleet. Dropping it stops every streamd, kubelet, bus and fake.
pub struct Fleet {
    dir: PathBuf,
    registry: Registry,
    inner: Arc<Inner>,
    env: BTreeMap<String, String>,
    kubelets: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

/// Node `i`'s name.
pub fn node_name(i: usize) -> String {
    format!("worker-{i}")
}

impl Fleet {
    /// Starts the registry, the API server (with streamd's RBAC and the OSImageStream, as
    /// `Testbed` has them) and every node host, then each node's kubelet and (if configured)
    /// streamd; writes `DIR/env` last.
    pub async fn start(opts: FleetOptions) -> anyhow::Result<Fleet> {
        if opts.nodes == 0 {
            bail!("a fleet needs at least one node");
        }
        let dir = std::path::absolute(&opts.dir)
            .with_context(|| format!("resolving {}", opts.dir.display()))?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = std::fs::remove_file(dir.join("env"));
        let (registry, pull_secret) = start_registry(&dir).await?;
        let apiserver = ApiServer::start(ApiServerConfig {
            dir: dir.clone(),
            node_name: node_name(0),
        })
        .await
        .context("starting the fake API server")?;
        let feature_set = opts
            .feature_set
            .unwrap_or(opts.openshift.default_feature_set());
        prepare_cluster(&apiserver, &registry, opts.openshift, feature_set)?;
        let mut nodes = Vec::with_capacity(opts.nodes);
        for i in 0..opts.nodes {
            let name = node_name(i);
            let node_dir = dir.join("nodes").join(&name);
            let kubeconfig = apiserver.add_node(&name, &node_dir)?;
            let fixture = opts.host_overrides.get(&name).unwrap_or(&opts.host);
            let host = NodeHost::start(
                &node_dir,
                &HostSetup {
                    node: &name,
                    host: fixture,
                    backend: opts.backend,
                    rpm_ostree: opts.rpm_ostree,
                    real_libostree: false,
                    openshift: opts.openshift,
                    registry: &registry,
                    kubeconfig: &kubeconfig,
                    pull_secret: &pull_secret,
                },
            )
            .await
            .with_context(|| format!("starting node {name}"))?;
            nodes.push(FleetNode {
                name,
                dir: node_dir,
                kubeconfig,
                host,
                streamd: tokio::sync::Mutex::new(None),
                rebooting: tokio::sync::Mutex::new(()),
            });
        }
        let inner = Arc::new(Inner {
            apiserver,
            nodes,
            streamd: opts.streamd.clone(),
            reboot_downtime: opts.reboot_downtime,
        });
        for node in &inner.nodes {
            inner.report_boot(node)?;
            if inner.streamd.is_some() {
                inner.start_streamd(node).await?;
            }
        }
        let kubelets = (0..inner.nodes.len())
            .map(|i| tokio::spawn(kubelet(Arc::downgrade(&inner), i)))
            .collect();
        let mut env = image_env(&registry, &pull_secret);
        env.extend(admin_env(&dir, inner.apiserver.url()));
        env.insert("TESTBED_NODES".into(), opts.nodes.to_string());
        let control = Arc::downgrade(&inner);
        serve_control(&dir.join("control.sock"), move |cmd| {
            let inner = control.upgrade();
            async move { inner.context("the fleet has stopped")?.dispatch(cmd).await }
        })?;
        write_env(&dir, &env)?;
        Ok(Fleet {
            dir,
            registry,
            inner,
            env,
            kubelets,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The variables of `DIR/env` (`KUBECONFIG` is the admin's).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The environment of node `node`'s streamd (and `streamctl` on that node).
    pub fn node_env(&self, node: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let n = self.inner.node(node)?;
        Ok(n.host.streamd_env(&n.kubeconfig))
    }

    /// The node names, `worker-0` first.
    pub fn nodes(&self) -> Vec<String> {
        self.inner.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// Node `node`'s directory (its host root, state, `streamd.log`, …).
    pub fn node_dir(&self, node: &str) -> anyhow::Result<&Path> {
        Ok(&self.inner.node(node)?.dir)
    }

    /// The API server (objects, stats, the unavailable-node record, faults).
    pub fn apiserver(&self) -> &ApiServer {
        &self.inner.apiserver
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The images the registry serves (`rhel-9` first).
    pub fn images(&self) -> &[TestImage] {
        self.registry.images()
    }

    /// Node `node`'s annotations.
    pub fn annotations(&self, node: &str) -> anyhow::Result<Value> {
        let obj = self.inner.apiserver.get("v1", "Node", None, node)?;
        Ok(obj
            .pointer("/metadata/annotations")
            .cloned()
            .unwrap_or_else(|| json!({})))
    }

    /// Creates a Running, Ready pod `namespace/name` bound to `node` with `labels`, owned
    /// (as controller) by `owner` (`(kind, name)`, e.g. `("ReplicaSet", "web-5d8f")`, with
    /// `apps/v1`; `None`: an unreplicated pod), as its controller and kubelet would.
    pub fn add_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: Value,
        owner: Option<(&str, &str)>,
    ) -> anyhow::Result<Value> {
        self.inner.node(node)?;
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace, "labels": labels },
            "spec": {
                "nodeName": node,
                "containers": [{ "name": "app", "image": "quay.io/testbed/app:1" }],
            },
        });
        if let Some((kind, owner_name)) = owner {
            // A stable uid per owner, as a real owner has one.
            let uid = format!(
                "{:x}",
                sha2::Sha256::digest(format!("{kind}/{namespace}/{owner_name}").as_bytes())
            );
            pod["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": format!("{}-{}-{}-{}-{}", &uid[0..8], &uid[8..12], &uid[12..16], &uid[16..20], &uid[20..32]),
                "controller": true,
                "blockOwnerDeletion": true,
            }]);
        }
        let api = &self.inner.apiserver;
        api.create(pod)?;
        api.update_status("v1", "Pod", Some(namespace), name, |p| {
            p["status"] = json!({
                "phase": "Running",
                "conditions": [
                    { "type": "Initialized", "status": "True" },
                    { "type": "Ready", "status": "True" },
                    { "type": "ContainersReady", "status": "True" },
                    { "type": "PodScheduled", "status": "True" },
                ],
            });
        })
    }

    /// Reboots `node` now, as its administrator would (see the module documentation).
    pub async fn reboot(&self, node: &str) -> anyhow::Result<Value> {
        self.inner.reboot(self.inner.node(node)?).await
    }

    /// Starts `node`'s streamd (the fleet's binary); an error if it runs.
    pub async fn start_streamd(&self, node: &str) -> anyhow::Result<()> {
        self.inner.start_streamd(self.inner.node(node)?).await
    }

    /// Stops `node`'s streamd with SIGTERM (SIGKILL after 10 s); returns whether one ran.
    pub async fn stop_streamd(&self, node: &str) -> anyhow::Result<bool> {
        self.inner.stop_streamd(self.inner.node(node)?).await
    }

    /// Kills `node`'s streamd with SIGKILL (a crash); returns whether one ran.
    pub async fn kill_streamd(&self, node: &str) -> anyhow::Result<bool> {
        let mut slot = self.inner.node(node)?.streamd.lock().await;
        match slot.take() {
            Some(mut child) => {
                child.kill().await.context("killing streamd")?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The process id of `node`'s streamd, if it runs.
    pub async fn streamd_pid(&self, node: &str) -> anyhow::Result<Option<u32>> {
        let mut slot = self.inner.node(node)?.streamd.lock().await;
        let Some(child) = slot.as_mut() else {
            return Ok(None);
        };
        Ok(match child.try_wait()? {
            None => child.id(),
            Some(_) => None,
        })
    }

    /// Runs one control command (what `DIR/control.sock` takes as JSON).
    pub async fn control(&self, cmd: impl Into<Request>) -> anyhow::Result<Value> {
        self.inner.dispatch(cmd.into()).await
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for k in &self.kubelets {
            k.abort();
        }
    }
}

impl Inner {
    fn node(&self, name: &str) -> anyhow::Result<&FleetNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name:?} in the fleet"))
    }

    async fn start_streamd(&self, node: &FleetNode) -> anyhow::Result<()> {
        let bin = self
            .streamd
            .as_ref()
            .context("the fleet was started without a streamd binary")?;
        let mut slot = node.streamd.lock().await;
        if let Some(child) = slot.as_mut()
            && child.try_wait()?.is_none()
        {
            bail!("streamd already runs on {}", node.name);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.join("streamd.log"))
            .context("opening streamd.log")?;
        let mut cmd = Command::new(bin);
        cmd.envs(node.host.streamd_env(&node.kubeconfig));
        *slot = Some(spawn_logged(cmd, bin, log)?);
        Ok(())
    }

    async fn stop_streamd(&self, node: &FleetNode) -> anyhow::Result<bool> {
        let Some(mut child) = node.streamd.lock().await.take() else {
            return Ok(false);
        };
        if let Some(pid) = child.id() {
            let pid = rustix::process::Pid::from_raw(i32::try_from(pid)?)
                .context("streamd has no valid pid")?;
            // Gone already is fine: the wait below reaps it.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(STOP_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                node = node.name,
                "streamd did not stop within 10 s of SIGTERM, killing it"
            );
            child.kill().await.context("killing streamd")?;
        }
        Ok(true)
    }

    /// What the node's kubelet reports: `Ready` (or not) and the booted host's facts.
    fn report(&self, node: &FleetNode, ready: bool) -> anyhow::Result<()> {
        let (boot_id, kernel) = node.host.boot_facts()?;
        let now = crate::fakes::apiserver::clock::now_rfc3339();
        let (status, reason, message) = if ready {
            ("True", "KubeletReady", "kubelet is posting ready status")
        } else {
            // What the node lifecycle controller writes once the kubelet stops posting.
            (
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            )
        };
        self.apiserver
            .update_status("v1", "Node", None, &node.name, |n| {
                if ready {
                    n["status"]["nodeInfo"]["bootID"] = json!(boot_id);
                    n["status"]["nodeInfo"]["kernelVersion"] = json!(kernel);
                }
                if let Some(conditions) = n
                    .pointer_mut("/status/conditions")
                    .and_then(Value::as_array_mut)
                {
                    for c in conditions.iter_mut().filter(|c| c["type"] == "Ready") {
                        if c["status"] != status {
                            c["lastTransitionTime"] = json!(now);
                        }
                        c["status"] = json!(status);
                        c["reason"] = json!(reason);
                        c["message"] = json!(message);
                        c["lastHeartbeatTime"] = json!(now);
                    }
                }
            })
            .map(|_| ())
    }

    fn report_boot(&self, node: &FleetNode) -> anyhow::Result<()> {
        self.report(node, true)
    }

    /// The node goes down (NotReady, streamd stopped as a shutdown stops it), the host boots
    /// the staged deployment as the single-node testbed's reboot does, the node comes back
    /// Ready with its new boot id and streamd starts again (if the fleet runs streamd).
    async fn reboot(&self, node: &FleetNode) -> anyhow::Result<Value> {
        let _once = node.rebooting.lock().await;
        tracing::info!(node = node.name, "fleet node rebooting");
        self.report(node, false)?;
        self.stop_streamd(node).await?;
        tokio::time::sleep(self.reboot_downtime).await;
        let out = node.host.reboot(false).await?;
        self.report_boot(node)?;
        if self.streamd.is_some() {
            self.start_streamd(node).await?;
        }
        Ok(out)
    }

    async fn dispatch(&self, request: Request) -> anyhow::Result<Value> {
        let node = || {
            let name = request
                .node
                .as_deref()
                .context("this command needs a \"node\"")?;
            self.node(name)
        };
        match request.command {
            control::Command::Testbed(cmd) => match cmd {
                TestbedCmd::Reboot { fail_finalize } => {
                    if fail_finalize {
                        bail!("fail-finalize is for the single-node testbed");
                    }
                    self.reboot(node()?).await
                }
                TestbedCmd::StartStreamd => {
                    self.start_streamd(node()?).await?;
                    Ok(json!({}))
                }
                TestbedCmd::StopStreamd => {
                    Ok(json!({ "stopped": self.stop_streamd(node()?).await? }))
                }
                TestbedCmd::Nodes => Ok(json!(
                    self.nodes.iter().map(|n| &n.name).collect::<Vec<_>>()
                )),
            },
            control::Command::Apiserver(cmd) => self.apiserver.control(cmd).await,
            host => node()?.host.control(host).await,
        }
    }
}

/// Spawns `cmd` (running `bin`) with its output in `log`, killed when the handle is dropped.
fn spawn_logged(mut cmd: Command, bin: &Path, log: std::fs::File) -> anyhow::Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// A node's stand-in kubelet: when the host is asked to reboot (rpm-ostree's
/// `FinalizeDeployment` with reboot, or logind's `Reboot`), the node reboots.
async fn kubelet(inner: Weak<Inner>, index: usize) {
    loop {
        tokio::time::sleep(KUBELET_PERIOD).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Some(node) = inner.nodes.get(index) else {
            return;
        };
        if node.host.reboot_requested()
            && let Err(err) = inner.reboot(node).await
        {
            tracing::warn!(node = node.name, error = %format!("{err:#}"), "fleet node reboot failed");
        }
    }
}
