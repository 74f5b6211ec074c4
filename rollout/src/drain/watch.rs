//! The pods of the nodes being drained, kept by one watch per node, and a pool's reconcile woken
//! as soon as one of them goes.
//!
//! A drain's first pass over a node lists the node's pods (field selector `spec.nodeName`) and
//! starts a watch from that list's resourceVersion; the following passes read the pods the
//! watch keeps instead of listing again, and a pod deleted, finished (`Succeeded`/`Failed`) or
//! newly bound on the node wakes the pool that drains it at once.
//!
//! Why a watch per node being drained, not a cluster-wide pod watch: a drain concerns at most
//! `maxUnavailable` nodes at a time, and each watch holds and streams only that node's pods
//! (about a hundred at most), where a cluster-wide watch would hold every pod of the cluster
//! (or, metadata-only, not know their nodes) and stream every pod status change for the
//! controller's whole life. The cost here is one LIST and one WATCH per drain, in place of a LIST
//! every pass.
//!
//! A watch ends when its drain completes ([`PodWatches::stop`]), when no pass read it for
//! [`IDLE`] (the drain was given up: released, set aside, the pool deleted), or when the API
//! server ends or breaks it; the next pass of that node then lists again and starts a new one
//! (a watch the server closed normally wakes its pool so that this happens at once).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::crd::StreamPool;

/// A node's watch that no pass read for this long ends.
pub const IDLE: Duration = Duration::from_secs(300);

/// How long the API server keeps one watch open (kube-runtime's watcher asks for 290 s).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// The pods of one watched node, shared by the pass and the watch's task.
#[derive(Debug)]
struct Watched {
    /// The pool draining the node: the one woken.
    pool: String,
    /// The node's pods by `namespace/name`.
    pods: BTreeMap<String, Pod>,
    /// `false` once the watch ended: the next pass lists again.
    live: bool,
    /// When a pass last read the pods.
    used: Instant,
}

type Shared = Arc<Mutex<Watched>>;

/// The watches of the nodes being drained.
pub struct PodWatches {
    /// Lists the pods (bounded requests).
    client: kube::Client,
    /// Watches them, and wakes pools on this channel; `None`: no watch, every pass lists.
    follow: Option<(kube::Client, mpsc::Sender<ObjectRef<StreamPool>>)>,
    nodes: Arc<Mutex<BTreeMap<String, (Shared, AbortHandle)>>>,
}

impl std::fmt::Debug for PodWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWatches").finish_non_exhaustive()
    }
}

impl PodWatches {
    /// Lists with `client`, watches with `watch_client` (long reads by design) and sends the pool
    /// to wake on `wake`.
    pub fn new(
        client: kube::Client,
        watch_client: kube::Client,
        wake: mpsc::Sender<ObjectRef<StreamPool>>,
    ) -> PodWatches {
        PodWatches {
            client,
            follow: Some((watch_client, wake)),
            nodes: Arc::default(),
        }
    }

    /// Without watches: every pass lists the node's pods.
    pub fn listing(client: kube::Client) -> PodWatches {
        PodWatches {
            client,
            follow: None,
            nodes: Arc::default(),
        }
    }

    /// The pods on `node`, which `pool` drains: from its watch, or listed (and a watch started)
    /// when it has none that is live.
    pub async fn pods(&self, pool: &str, node: &str) -> kube::Result<Vec<Pod>> {
        let watched = lock(&self.nodes).get(node).map(|(w, _)| w.clone());
        if let Some(w) = watched {
            let mut w = lock(&w);
            if w.live {
                w.used = Instant::now();
                pool.clone_into(&mut w.pool);
                return Ok(w.pods.values().cloned().collect());
            }
        }
        let fields = format!("spec.nodeName={node}");
        let list = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&fields))
            .await?;
        if let Some((watch_client, wake)) = &self.follow {
            let watched = Arc::new(Mutex::new(Watched {
                pool: pool.to_string(),
                pods: list.items.iter().map(|p| (id(p), kept(p))).collect(),
                live: true,
                used: Instant::now(),
            }));
            let task = Follow {
                api: Api::all(watch_client.clone()),
                node: node.to_string(),
                fields,
                version: list.metadata.resource_version.unwrap_or_default(),
                watched: watched.clone(),
                nodes: self.nodes.clone(),
                wake: wake.clone(),
            };
            let mut nodes = lock(&self.nodes);
            let abort = tokio::spawn(task.run()).abort_handle();
            if let Some((_, old)) = nodes.insert(node.to_string(), (watched, abort)) {
                old.abort();
            }
        }
        Ok(list.items)
    }

    /// The drain of `node` is complete: its watch ends.
    pub fn stop(&self, node: &str) {
        if let Some((_, task)) = lock(&self.nodes).remove(node) {
            task.abort();
        }
    }
}

/// A pod's `namespace/name`.
fn id(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `pod` as the watch keeps it: without `managedFields`, which a drain never reads and which
/// are often the largest part of a pod.
fn kept(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    pod.metadata.managed_fields = None;
    pod
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `event` may let a drain go on: a pod gone, finished, or new on the node.
pub fn wakes(event: &WatchEvent<Pod>) -> bool {
    match event {
        WatchEvent::Added(_) | WatchEvent::Deleted(_) => true,
        WatchEvent::Modified(p) => p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed"),
        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => false,
    }
}

/// One node's watch task.
struct Follow {
    api: Api<Pod>,
    node: String,
    fields: String,
    version: String,
    watched: Shared,
    nodes: Arc<Mutex<BTreeMap<String, (Shared, AbortHandle)>>>,
    wake: mpsc::Sender<ObjectRef<StreamPool>>,
}

impl Follow {
    async fn run(self) {
        let ended = self.follow().await;
        let pool = {
            let mut w = lock(&self.watched);
            w.live = false;
            w.pods.clear();
            w.pool.clone()
        };
        {
            let mut nodes = lock(&self.nodes);
            if nodes
                .get(&self.node)
                .is_some_and(|(w, _)| Arc::ptr_eq(w, &self.watched))
            {
                nodes.remove(&self.node);
            }
        }
        match ended {
            Ended::Stopped => {}
            // Listed again and watched anew at the next pass, at once: no change is missed.
            Ended::Closed => self.send(&pool),
            Ended::Failed(e) => {
                tracing::warn!(node = %self.node, error = %e, "watching the pods of a drained node failed; listing at the next pass");
            }
        }
    }

    /// Follows the watch until it ends or the drain no longer reads it.
    async fn follow(&self) -> Ended {
        let params = WatchParams::default()
            .fields(&self.fields)
            .timeout(WATCH_TIMEOUT_SECONDS);
        let stream = match self.api.watch(&params, &self.version).await {
            Ok(s) => s,
            Err(e) => return Ended::Failed(e.to_string()),
        };
        let mut stream = std::pin::pin!(stream);
        let mut check = tokio::time::interval(IDLE / 10);
        loop {
            tokio::select! {
                event = stream.next() => {
                    let event = match event {
                        None => return Ended::Closed,
                        Some(Err(e)) => return Ended::Failed(e.to_string()),
                        Some(Ok(WatchEvent::Error(e))) => return Ended::Failed(e.message.clone()),
                        Some(Ok(event)) => event,
                    };
                    let (wake, pool) = {
                        let mut w = lock(&self.watched);
                        match &event {
                            WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                                w.pods.insert(id(p), kept(p));
                            }
                            WatchEvent::Deleted(p) => {
                                w.pods.remove(&id(p));
                            }
                            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {}
                        }
                        (wakes(&event), w.pool.clone())
                    };
                    if wake {
                        tracing::debug!(node = %self.node, pool = %pool, "pod change wakes the drain");
                        self.send(&pool);
                    }
                }
                _ = check.tick() => {
                    let w = lock(&self.watched);
                    if w.used.elapsed() > IDLE {
                        return Ended::Stopped;
                    }
                }
            }
        }
    }

    /// Wakes `pool`. A wake already queued for it makes this one redundant (the pool is then
    /// reconciled with what the watch holds by then); one dropped because the queue is full of
    /// other pools' wakes is made up by the drain's backstop pass
    /// ([`super::BACKSTOP_SECONDS`] at the latest).
    fn send(&self, pool: &str) {
        if self.wake.try_send(ObjectRef::new(pool)).is_err() {
            tracing::debug!(node = %self.node, pool, "wake queue full; the backstop pass makes up for it");
        }
    }
}

/// Why a node's watch ended.
enum Ended {
    /// No pass read it for [`IDLE`] (a completed drain aborts its task).
    Stopped,
    /// The API server closed it (its timeout).
    Closed,
    /// It failed.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn pod(phase: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_pod_gone_finished_or_new_wakes_the_drain() {
        assert!(wakes(&WatchEvent::Deleted(pod("Running"))));
        assert!(wakes(&WatchEvent::Added(pod("Pending"))));
        assert!(wakes(&WatchEvent::Modified(pod("Succeeded"))));
        assert!(wakes(&WatchEvent::Modified(pod("Failed"))));
        // Being terminated (deletionTimestamp set) or a readiness change lets nothing go on.
        assert!(!wakes(&WatchEvent::Modified(pod("Running"))));
        let gone = kube::core::Status::failure("too old", "Expired").with_code(410);
        assert!(!wakes(&WatchEvent::Error(gone.boxed())));
    }
}
