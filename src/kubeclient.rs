//! The Kubernetes client: this node's Node object (watch, merge patch) and its Events.
//!
//! An edge over kube-rs: the watcher resumes from resourceVersion and relists on 410 Gone; this
//! module only narrows it to one node and to annotations.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};

/// The field manager streamd patches as.
pub const FIELD_MANAGER: &str = "streamd";
/// Namespace of node Events (where the kubelet posts them too).
const EVENT_NAMESPACE: &str = "default";

/// What the node watch yields.
#[derive(Debug, Clone)]
pub enum NodeUpdate {
    /// The node's annotations after a change (or after a relist).
    Annotations(BTreeMap<String, String>),
    /// The Node object was deleted.
    Deleted,
    /// The watch failed; kube-rs retries with backoff.
    Error(String),
}

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Progress.
    Normal,
    /// Something needs attention.
    Warning,
}

fn to_update(
    ev: Result<watcher::Event<Node>, watcher::Error>,
    uid: &OnceLock<String>,
) -> Option<NodeUpdate> {
    match ev {
        Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
            if let Some(u) = &n.metadata.uid {
                let _ = uid.set(u.clone());
            }
            Some(NodeUpdate::Annotations(
                n.metadata.annotations.unwrap_or_default(),
            ))
        }
        Ok(watcher::Event::Delete(_)) => Some(NodeUpdate::Deleted),
        Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
        Err(e) => Some(NodeUpdate::Error(e.to_string())),
    }
}

/// Client for one node.
#[derive(Clone)]
pub struct NodeClient {
    nodes: Api<Node>,
    events: Api<Event>,
    name: String,
    /// The node's uid, learnt from the watch; Events carry it so `kubectl describe node`
    /// shows them.
    uid: Arc<OnceLock<String>>,
}

impl NodeClient {
    /// Reads the kubeconfig (client certificates and bearer tokens both work) and builds a client.
    pub async fn new(kubeconfig: &Path, node: &str) -> anyhow::Result<Self> {
        let kc = Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading kubeconfig {}", kubeconfig.display()))?;
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        Ok(NodeClient {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, EVENT_NAMESPACE),
            name: node.to_string(),
            uid: Arc::default(),
        })
    }

    /// The underlying client, for watches of other objects (e.g. [`crate::streams::watch`]).
    pub fn client(&self) -> kube::Client {
        self.nodes.clone().into()
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Watches only this node (field selector), resuming from resourceVersion.
    pub fn watch(&self) -> impl Stream<Item = NodeUpdate> + Send + 'static {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let uid = self.uid.clone();
        watcher(self.nodes.clone(), cfg)
            .default_backoff()
            .filter_map(move |ev| std::future::ready(to_update(ev, &uid)))
    }

    /// Merge-patches the node and returns its annotations afterwards.
    pub async fn patch(
        &self,
        patch: &serde_json::Value,
    ) -> anyhow::Result<BTreeMap<String, String>> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        let node = self
            .nodes
            .patch(&self.name, &params, &Patch::Merge(patch))
            .await
            .with_context(|| format!("patching node {}", self.name))?;
        Ok(node.metadata.annotations.unwrap_or_default())
    }

    /// Posts an Event about this node.
    pub async fn event(&self, kind: EventType, reason: &str, message: &str) -> anyhow::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = format!("{}.{:x}", self.name, now.as_nanosecond());
        let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let ev: Event = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": EVENT_NAMESPACE },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.name,
                "uid": self.uid.get(),
            },
            "reason": reason,
            "message": crate::protocol::one_line_reason(message),
            "type": match kind { EventType::Normal => "Normal", EventType::Warning => "Warning" },
            "source": { "component": FIELD_MANAGER, "host": self.name },
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self.name,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
        }))
        .context("building an event")?;
        self.events
            .create(&PostParams::default(), &ev)
            .await
            .with_context(|| format!("posting event {reason}"))?;
        Ok(())
    }
}
