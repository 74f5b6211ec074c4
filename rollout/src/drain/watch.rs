//! The pods of the nodes being drained, from one pod watch shared by every drain, and a pool's
//! reconcile woken as soon as one of them goes.
//!
//! One cluster-wide watch of the scheduled pods (field selector `spec.nodeName!=`) fills a
//! reflector store; a drain pass reads its node's pods from it, and a pod deleted, finished
//! (`Succeeded`/`Failed`) or newly bound on a node being drained wakes the pool that drains it at
//! once. A whole rollout so costs one pod LIST and one WATCH (and a relist when the watch's
//! resourceVersion expires), where a watch per drained node cost a LIST and a WATCH per node.
//! The store keeps of each pod only what a drain reads ([`kept`]): a pod's spec and status are
//! most of it, so the store holds about a name, labels and owner per pod.
//!
//! It runs only while a rollout has a node out of service: from the pass of a pool that cordons
//! a node, or has one Draining, Rebooting or Soaking ([`PodStore::hold`]), until no pool has had
//! one for [`LINGER`]. An idle cluster, and a rollout whose nodes only pull and stage (that may
//! take hours, or wait for a maintenance window), costs no pod request at all; the linger bridges
//! the moment between a node's uncordon and the next node's cordon (at `maxUnavailable: 1`, a
//! pass or two), so that a rollout does not list the pods once per node again.
//!
//! A relist (the watch failed or its resourceVersion expired) wakes every pool with a node being
//! drained, since a deletion may have gone unseen meanwhile; the drain's backstop pass
//! ([`super::BACKSTOP_SECONDS`]) covers a wake dropped from a full queue.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::MIRROR_ANNOTATION;
use crate::crd::StreamPool;

/// The watch stops once no pool has held it for this long.
pub const LINGER: Duration = Duration::from_secs(120);

/// The pods a drain may concern: those bound to a node.
const SCHEDULED: &str = "spec.nodeName!=";

/// The pod store could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NotRead {
    /// The watch's first list did not complete in time (it goes on; the pass is retried).
    #[error("the pod watch has not listed the pods within {0:?}")]
    Timeout(Duration),
    /// The watch ended before its first list completed.
    #[error("the pod watch ended before it listed the pods")]
    Ended,
}

/// Which pools hold the pod watch, and since when none does.
#[derive(Debug, Default)]
pub struct Demand {
    holders: BTreeSet<String>,
    idle_since: Option<Instant>,
}

impl Demand {
    /// `pool` holds the watch (`holds`) or no longer does, at `now`.
    pub fn hold(&mut self, pool: &str, holds: bool, now: Instant) {
        if holds {
            self.holders.insert(pool.to_string());
            self.idle_since = None;
        } else if self.holders.remove(pool) && self.holders.is_empty() {
            self.idle_since = Some(now);
        }
    }

    /// Some pool holds the watch.
    pub fn wanted(&self) -> bool {
        !self.holders.is_empty()
    }

    /// The watch may stop at `now`: no pool has held it for [`LINGER`].
    pub fn expired(&self, now: Instant) -> bool {
        self.holders.is_empty()
            && self
                .idle_since
                .is_none_or(|t| now.saturating_duration_since(t) >= LINGER)
    }
}

/// What the drains and the watch's task share.
#[derive(Default)]
struct Shared {
    demand: Demand,
    /// The store while the watch runs, the task's number, and the task.
    running: Option<(Store<Pod>, u64, Option<AbortHandle>)>,
    /// How many watches were started.
    started: u64,
    /// Each node being drained, and the pool draining it: woken by its pods' events.
    draining: BTreeMap<String, String>,
}

/// Where the watch's events go.
struct Source {
    /// Watches (long reads by design).
    client: kube::Client,
    wake: mpsc::Sender<ObjectRef<StreamPool>>,
}

/// The pods of the nodes being drained, from one shared watch started on demand.
pub struct PodStore {
    shared: Arc<Mutex<Shared>>,
    /// `None`: a fixed store, never watched (the reconcile tests).
    source: Option<Source>,
}

impl std::fmt::Debug for PodStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodStore").finish_non_exhaustive()
    }
}

impl PodStore {
    /// Watches with `watch_client` when a pool holds the store, and sends the pool to wake on
    /// `wake`.
    pub fn new(watch_client: kube::Client, wake: mpsc::Sender<ObjectRef<StreamPool>>) -> PodStore {
        PodStore {
            shared: Arc::default(),
            source: Some(Source {
                client: watch_client,
                wake,
            }),
        }
    }

    /// A store that holds `pods` and never watches.
    pub fn fixed(pods: Vec<Pod>) -> PodStore {
        let mut writer = Writer::<Pod>::default();
        writer.apply_watcher_event(&watcher::Event::Init);
        for p in pods {
            writer.apply_watcher_event(&watcher::Event::InitApply(kept(p)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let shared = Shared {
            running: Some((writer.as_reader(), 0, None)),
            ..Shared::default()
        };
        PodStore {
            shared: Arc::new(Mutex::new(shared)),
            source: None,
        }
    }

    /// `pool`'s pass: it drains `draining` (their pods' events wake it) and `holds` the watch
    /// (a node of its rollout is out of service), or no longer does; starts the watch when it is
    /// wanted and not running.
    pub fn hold(&self, pool: &str, draining: &[String], holds: bool) {
        let mut shared = lock(&self.shared);
        shared.draining.retain(|_, p| p != pool);
        for node in draining {
            shared.draining.insert(node.clone(), pool.to_string());
        }
        shared.demand.hold(pool, holds, Instant::now());
        if shared.demand.wanted() {
            self.start(&mut shared);
        }
    }

    /// Whether the watch runs (a fixed store counts as running).
    pub fn running(&self) -> bool {
        lock(&self.shared).running.is_some()
    }

    /// How many watches were started so far.
    pub fn started(&self) -> u64 {
        lock(&self.shared).started
    }

    /// The pods on `node`, once the watch listed them (started here if no pool holds it yet).
    pub async fn pods(&self, node: &str) -> Result<Vec<Pod>, NotRead> {
        let store = {
            let mut shared = lock(&self.shared);
            self.start(&mut shared);
            shared.running.as_ref().map(|(s, _, _)| s.clone())
        };
        let store = store.ok_or(NotRead::Ended)?;
        let timeout = crate::controller::REQUEST_TIMEOUT;
        tokio::time::timeout(timeout, store.wait_until_ready())
            .await
            .map_err(|_| NotRead::Timeout(timeout))?
            .map_err(|_| NotRead::Ended)?;
        let mut pods: Vec<Pod> = store
            .state()
            .iter()
            .filter(|p| node_of(p) == Some(node))
            .map(|p| p.as_ref().clone())
            .collect();
        // In namespace and name order, as the API server lists them (the store keeps no order).
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(pods)
    }

    /// Starts the watch unless it runs (or the store is fixed).
    fn start(&self, shared: &mut Shared) {
        let Some(source) = &self.source else { return };
        if shared.running.is_some() {
            return;
        }
        shared.started += 1;
        let number = shared.started;
        let writer = Writer::<Pod>::default();
        let store = writer.as_reader();
        let task = Follow {
            api: Api::all(source.client.clone()),
            shared: self.shared.clone(),
            wake: source.wake.clone(),
            number,
        };
        let abort = tokio::spawn(task.run(writer)).abort_handle();
        shared.running = Some((store, number, Some(abort)));
        tracing::info!("pod watch started for the drains");
    }
}

impl Drop for PodStore {
    fn drop(&mut self) {
        if let Some((_, _, Some(task))) = lock(&self.shared).running.take() {
            task.abort();
        }
    }
}

/// The node `pod` is bound to.
fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// `pod` as the store keeps it: what a drain reads ([`super::verdict`], [`super::pass`]) and the
/// store's keys, nothing else (no managedFields, containers or status beyond the phase; of the
/// annotations only the mirror pod's, of the volumes only the emptyDir ones).
pub fn kept(pod: Pod) -> Pod {
    let m = pod.metadata;
    let annotations = m.annotations.map(|a| {
        a.into_iter()
            .filter(|(k, _)| k == MIRROR_ANNOTATION)
            .collect::<BTreeMap<_, _>>()
    });
    Pod {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            labels: m.labels,
            annotations: annotations.filter(|a| !a.is_empty()),
            owner_references: m.owner_references,
            deletion_timestamp: m.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: pod.spec.map(|s| PodSpec {
            node_name: s.node_name,
            volumes: s.volumes.map(|vs| {
                vs.into_iter()
                    .filter(|v| v.empty_dir.is_some())
                    .map(|v| Volume {
                        name: v.name,
                        empty_dir: v.empty_dir,
                        ..Volume::default()
                    })
                    .collect()
            }),
            ..PodSpec::default()
        }),
        status: pod.status.map(|s| PodStatus {
            phase: s.phase,
            ..PodStatus::default()
        }),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
}

/// The pools `event` wakes: for a pod on a node being drained (`draining`: node → pool), its
/// pool when the pod is gone, finished, or new on the node (`known`: the store held it before);
/// after a relist, every pool draining a node (a deletion may have gone unseen). Being
/// terminated (`deletionTimestamp` set) or a readiness change lets no drain go on.
pub fn woken(
    event: &watcher::Event<Pod>,
    known: impl Fn(&Pod) -> bool,
    draining: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let pool = |p: &Pod| node_of(p).and_then(|n| draining.get(n)).cloned();
    match event {
        watcher::Event::Delete(p) => pool(p).into_iter().collect(),
        watcher::Event::Apply(p) if !known(p) || finished(p) => pool(p).into_iter().collect(),
        watcher::Event::InitDone => draining.values().cloned().collect(),
        watcher::Event::Apply(_) | watcher::Event::Init | watcher::Event::InitApply(_) => {
            BTreeSet::new()
        }
    }
}

/// The watch's task.
struct Follow {
    api: Api<Pod>,
    shared: Arc<Mutex<Shared>>,
    wake: mpsc::Sender<ObjectRef<StreamPool>>,
    /// Its number: a task ends only its own watch.
    number: u64,
}

impl Follow {
    /// Follows the watch into `writer` until no pool has held it for [`LINGER`].
    async fn run(self, mut writer: Writer<Pod>) {
        let reader = writer.as_reader();
        let config = watcher::Config::default().fields(SCHEDULED);
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut check = tokio::time::interval(LINGER / 4);
        check.tick().await;
        loop {
            tokio::select! {
                event = stream.next() => {
                    let event = match event {
                        None => break,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "watching the pods failed; retrying with backoff");
                            continue;
                        }
                        Some(Ok(event)) => event.modify(strip),
                    };
                    let known = |p: &Pod| reader.get(&ObjectRef::from_obj(p)).is_some();
                    let pools = woken(&event, known, &lock(&self.shared).draining);
                    writer.apply_watcher_event(&event);
                    for pool in pools {
                        self.send(&pool);
                    }
                }
                _ = check.tick() => {
                    let mut shared = lock(&self.shared);
                    if shared.demand.expired(Instant::now()) {
                        if shared.running.as_ref().is_some_and(|(_, n, _)| *n == self.number) {
                            shared.running = None;
                        }
                        tracing::info!("no rollout has a node out of service; pod watch stopped");
                        return;
                    }
                }
            }
        }
        let mut shared = lock(&self.shared);
        if shared
            .running
            .as_ref()
            .is_some_and(|(_, n, _)| *n == self.number)
        {
            shared.running = None;
        }
    }

    /// Wakes `pool`. A wake already queued for it makes this one redundant (the pool is then
    /// reconciled with what the store holds by then); one dropped because the queue is full of
    /// other pools' wakes is made up by the drain's backstop pass
    /// ([`super::BACKSTOP_SECONDS`] at the latest).
    fn send(&self, pool: &str) {
        tracing::debug!(pool, "pod change wakes the drain");
        if self.wake.try_send(ObjectRef::new(pool)).is_err() {
            tracing::debug!(pool, "wake queue full; the backstop pass makes up for it");
        }
    }
}

/// [`kept`] in place.
fn strip(pod: &mut Pod) {
    *pod = kept(std::mem::take(pod));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, Container, EmptyDirVolumeSource, PodCondition,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    fn pod(name: &str, node: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        }
    }

    fn draining() -> BTreeMap<String, String> {
        BTreeMap::from([("w1".to_string(), "worker".to_string())])
    }

    fn pools(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_pod_gone_finished_or_new_on_a_drained_node_wakes_its_pool() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let d = draining();
        let known = |_: &Pod| true;
        let new = |_: &Pod| false;
        let worker = pools(&["worker"]);
        assert_eq!(woken(&Delete(pod("a", "w1", "Running")), known, &d), worker);
        assert_eq!(woken(&Apply(pod("a", "w1", "Pending")), new, &d), worker);
        assert_eq!(
            woken(&Apply(pod("a", "w1", "Succeeded")), known, &d),
            worker
        );
        assert_eq!(woken(&Apply(pod("a", "w1", "Failed")), known, &d), worker);
        // Being terminated or a readiness change lets nothing go on.
        assert!(woken(&Apply(pod("a", "w1", "Running")), known, &d).is_empty());
        // Another node's pods wake no one.
        assert!(woken(&Delete(pod("a", "w2", "Running")), known, &d).is_empty());
        assert!(woken(&Apply(pod("a", "w2", "Pending")), new, &d).is_empty());
        // A relist may have missed a deletion: every draining pool looks again, once it is done.
        assert!(woken(&Init, known, &d).is_empty());
        assert!(woken(&InitApply(pod("a", "w1", "Running")), new, &d).is_empty());
        assert_eq!(woken(&InitDone, known, &d), worker);
    }

    #[test]
    fn the_watch_runs_while_a_pool_holds_it_and_a_linger_after() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        assert!(!d.wanted());
        assert!(d.expired(t0), "an idle controller watches no pod");
        d.hold("a", true, t0);
        d.hold("b", true, t0);
        assert!(d.wanted() && !d.expired(t0 + LINGER * 2));
        d.hold("a", false, t0 + LINGER);
        assert!(
            d.wanted() && !d.expired(t0 + LINGER * 3),
            "b still holds it"
        );
        // The last holder lets go: it stops only after the linger.
        let t1 = t0 + LINGER * 3;
        d.hold("b", false, t1);
        assert!(!d.wanted());
        assert!(!d.expired(t1 + LINGER / 2));
        // Held again within the linger (the next node's cordon): it goes on.
        d.hold("b", true, t1 + LINGER / 2);
        assert!(!d.expired(t1 + LINGER * 2));
        d.hold("b", false, t1 + LINGER * 2);
        assert!(d.expired(t1 + LINGER * 3));
        // A pool that never held it lets nothing go.
        let mut e = Demand::default();
        e.hold("a", true, t0);
        e.hold("c", false, t0);
        assert!(e.wanted());
    }

    #[test]
    fn the_store_keeps_what_a_drain_reads_and_no_more() {
        let mut p = pod("web", "w1", "Running");
        p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        p.metadata.annotations = Some(
            [
                (MIRROR_ANNOTATION.to_string(), "x".to_string()),
                ("big".to_string(), "y".repeat(1000)),
            ]
            .into(),
        );
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            name: "agent".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let spec = p.spec.as_mut().expect("spec");
        spec.containers = vec![Container::default(); 3];
        spec.volumes = Some(vec![
            Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
            Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource::default()),
                ..Volume::default()
            },
        ]);
        p.status.as_mut().expect("status").conditions = Some(vec![PodCondition::default()]);
        let k = kept(p.clone());
        assert_eq!(k.metadata.labels, p.metadata.labels);
        assert_eq!(k.metadata.owner_references, p.metadata.owner_references);
        assert_eq!(
            k.metadata.annotations,
            Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into())
        );
        assert_eq!(k.metadata.managed_fields, None);
        let spec = k.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("w1"));
        assert!(spec.containers.is_empty());
        let volumes = spec.volumes.as_ref().expect("volumes");
        assert_eq!(volumes.len(), 1);
        assert!(volumes[0].empty_dir.is_some());
        assert_eq!(k.status.as_ref().and_then(|s| s.conditions.clone()), None);
        assert_eq!(
            k.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
        // A drain decides alike on the pod and on what the store keeps of it.
        let settings = [
            super::super::Settings::default(),
            super::super::Settings {
                delete_empty_dir_data: true,
                ..super::super::Settings::default()
            },
        ];
        let mut plain = p.clone();
        plain.metadata.annotations = None;
        plain.metadata.owner_references = None;
        for s in &settings {
            for q in [&p, &plain] {
                let stripped = kept(q.clone());
                assert_eq!(
                    super::super::verdict(&stripped, s, 0),
                    super::super::verdict(q, s, 0)
                );
            }
        }
    }

    fn pod_json(name: &str, node: &str) -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "namespace": "ns", "resourceVersion": "2" },
            "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "i" }] },
            "status": { "phase": "Running" },
        })
    }

    /// The API server: answers the pod LIST with web-a on w1, the first WATCH with web-a's
    /// deletion (then the watch ends), and holds every later WATCH open; counts the LISTs in
    /// `lists`.
    fn serve(
        mut handle: mock::Handle<Request<Body>, Response<Body>>,
        lists: Arc<std::sync::atomic::AtomicUsize>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let (mut watches, mut held) = (0, Vec::new());
            while let Some((request, send)) = handle.next_request().await {
                let uri = request.uri().to_string();
                assert!(uri.starts_with("/api/v1/pods?"), "{uri}");
                assert!(uri.contains("fieldSelector=spec.nodeName%21%3D"), "{uri}");
                let body = if uri.contains("watch=true") {
                    watches += 1;
                    if watches > 1 {
                        held.push(send);
                        continue;
                    }
                    let event = json!({ "type": "DELETED", "object": pod_json("web-a", "w1") });
                    format!("{event}\n")
                } else {
                    lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    json!({
                        "apiVersion": "v1",
                        "kind": "PodList",
                        "metadata": { "resourceVersion": "1" },
                        "items": [pod_json("web-a", "w1"), pod_json("db-0", "w2")],
                    })
                    .to_string()
                };
                let response = Response::builder()
                    .body(Body::from(body.into_bytes()))
                    .expect("response");
                send.send_response(response);
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn one_watch_runs_while_held_wakes_the_drain_and_stops_after_the_linger() {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listed = || lists.load(std::sync::atomic::Ordering::SeqCst);
        let server = serve(handle, lists.clone());
        let (wake, mut woken) = mpsc::channel(8);
        let store = PodStore::new(kube::Client::new(service, "default"), wake);
        // Idle: no watch, no request.
        store.hold("worker", &[], false);
        tokio::time::sleep(LINGER).await;
        assert!(!store.running());
        assert_eq!(listed(), 0);
        store.hold("worker", &["w1".to_string()], true);
        assert!(store.running());
        let pods = store.pods("w2").await.expect("listed");
        assert_eq!(pods.len(), 1);
        assert!(
            pods[0]
                .spec
                .as_ref()
                .is_some_and(|s| s.containers.is_empty()),
            "kept whole"
        );
        // The list wakes the pools draining a node (a deletion may have gone unseen before it),
        // then web-a's deletion on w1 wakes the pool draining w1.
        for why in ["the list", "the deletion"] {
            let pool = tokio::time::timeout(Duration::from_secs(10), woken.recv())
                .await
                .unwrap_or_else(|_| panic!("{why} woke no pool"))
                .expect("a wake");
            assert_eq!(pool.name, "worker");
        }
        assert!(store.pods("w1").await.expect("listed").is_empty());
        // Held: it runs on, long past the linger, with no other LIST.
        tokio::time::sleep(LINGER * 3).await;
        assert!(store.running());
        assert_eq!(listed(), 1);
        // Let go: it runs through the linger, then stops.
        store.hold("worker", &[], false);
        tokio::time::sleep(LINGER / 2).await;
        assert!(store.running(), "stopped within the linger");
        tokio::time::sleep(LINGER).await;
        assert!(!store.running(), "still running after the linger");
        assert_eq!(store.started(), 1);
        // Held again: a new watch, listed anew.
        store.hold("worker", &["w1".to_string()], true);
        assert_eq!(store.started(), 2);
        assert_eq!(store.pods("w2").await.expect("listed").len(), 1);
        assert_eq!(listed(), 2);
        drop(store);
        server.abort();
        let _ = server.await;
    }
}
