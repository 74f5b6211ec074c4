//! A mock API server for the reconcile tests, as kube-rs/controller-rs:src/fixtures.rs
//! `ApiServerVerifier`: a real `kube::Client` over tower-test's mock service, and a verifier
//! that takes the client's requests one by one, asserts each (method, path and query, the
//! meaningful parts of the body) against a named [`Scenario`], answers it with a canned object,
//! and fails on a request the scenario does not expect, or one it expects that never came.

use std::fmt::Write as _;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use serde_json::{Value, json};
use streamd::cluster::protocol::{
    DESIRED_OS_IMAGE, DESIRED_STREAM, OBSERVED_DESIRED, REBOOT_REQUESTED, STATE,
};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle};

use super::*;

use crate::node::{
    CHECK_EXTENSIONS_IMAGE, CHECK_OS_IMAGE, CHECK_STREAM, ROLLOUT_SET_ASIDE, ROLLOUT_TARGETED,
    ROLLOUT_UPDATED, UPDATE_TAINT,
};

use streamd::cluster::protocol::{DESIRED_EXTENSIONS_IMAGE, REBOOT_APPROVED};

/// The pool's pinned image: no OSImageStream is read.
const OS10: &str = "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010";
/// The label the pool selects its nodes by.
const ROLE: &str = "node-role.kubernetes.io/worker";
/// The path and query of every merge patch the controller writes.
const MANAGED: &str = "?&fieldManager=streamd-rollout";
const POOL_PATH: &str = "/apis/osstream.openshift.io/v1alpha1/streampools/worker";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events?";
const PDB_REFUSAL: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

impl Context {
    /// A context whose clients (both) talk to the returned verifier; no OSImageStream,
    /// `others` in the pools' cache, `nodes` in the node store, `pods` in the pod store, and
    /// writes fenced by `fence`.
    pub fn fenced(
        others: Vec<StreamPool>,
        nodes: Vec<Node>,
        pods: Vec<Pod>,
        fence: Fence,
    ) -> (Arc<Context>, ApiServerVerifier) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let (_, catalog) = watch::channel(None);
        let mut pools = Writer::<StreamPool>::default();
        for p in others {
            pools.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let mut node_store = Writer::<Node>::default();
        node_store.apply_watcher_event(&watcher::Event::Init);
        for n in nodes {
            node_store.apply_watcher_event(&watcher::Event::InitApply(n));
        }
        node_store.apply_watcher_event(&watcher::Event::InitDone);
        let ctx = Context {
            nodes: node_store.as_reader(),
            node_writes: written::Written::default(),
            pool_writes: written::Written::default(),
            status_written: std::sync::Mutex::default(),
            client: client.clone(),
            drain_client: client.clone(),
            pods: drain::watch::PodStore::fixed(pods),
            drain_backstop: drain::BACKSTOP_SECONDS,
            catalog,
            pools: pools.as_reader(),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: events::REPORTER.into(),
                    instance: Some("test".into()),
                },
            ),
            journal: Journal::default(),
            heartbeats: None,
            fence,
            node_name: None,
            failures: failures::Failures::default(),
            metrics: Arc::default(),
        };
        (Arc::new(ctx), ApiServerVerifier(handle))
    }
}

/// The API server side of [`Context::fenced`].
#[allow(missing_debug_implementations)] // tower-test's handle is not Debug
pub struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

/// The reconcile tests' scenarios: the pool they reconcile and, in [`Scenario::exchanges`],
/// exactly what the API server sees.
#[derive(Debug, Clone, Copy)]
pub enum Scenario {
    /// A new pool: the finalizer is added, each of its two fresh nodes gets the check keys, the
    /// target and the update taint in one write (no Event: routine), and the status is written.
    Create,
    /// A node being drained whose pod's eviction a PodDisruptionBudget refuses (429): no
    /// approval, the refusal in the status and an `EvictionBlocked` Event; looked at again.
    DrainBlocked,
    /// The pool's drain gives evicted pods 30 s and drains only `app: web` pods: web-a is
    /// evicted with `deleteOptions.gracePeriodSeconds` 30 (the Eviction API's key), cache-0
    /// stays, and a DaemonSet pod whose DaemonSet is gone (404) is evicted as an orphan.
    DrainSettings,
    /// A drained node's approval, conditioned on the node as listed, is answered 409 (it was
    /// uncordoned meanwhile): not approved, named in the status, looked at again.
    ApprovalConflict,
    /// Other pools overlap `worker`: a node the custom pool `infra` selects too is infra's, one
    /// that `infra` and `gpu` both select is left to all, and a control-plane node labelled
    /// worker is not taken by a pool that does not name the control plane; only w1 is worker's.
    Overlap,
    /// The pool's `nodeSelector` is empty: it selects nothing and is Degraded `InvalidSpec`;
    /// the node carrying its request is not released.
    EmptySelector,
    /// A node that left the pool's selector is released (its request withdrawn); another that
    /// left during its approved reboot is left until it is back.
    Release,
    /// The release of a node that left the selector is answered 409 (it changed since it was
    /// listed): not released, no Event, looked at again.
    ReleaseConflict,
    /// A pool deleted mid-rollout: its nodes (the one being drained, one it cordoned before
    /// nodes carried the pool's name, one that left the selector) are released, then only its
    /// own finalizer is removed.
    Deletion,
    /// A pool deleted while its node's approved reboot is under way: nothing is written, the
    /// finalizer stays, looked at again.
    DeletionWaits,
    /// The finalizer write of a new pool is answered 409: nothing else is done, looked at again
    /// after [`CONFLICT_RETRY`].
    FinalizerConflict,
    /// The status write is answered 409: the reconcile fails with it (and is retried by the
    /// error policy).
    StatusConflict,
    /// The replica cannot prove it holds the leader lease: it lists, and writes nothing.
    NotLeader,
    /// A node given the request long ago whose streamd never acknowledged it: the other node
    /// gets the staging slot, the pool's `Updating` reason is `AgentNotResponding`, told once in
    /// a Warning Event.
    AgentSilent,
    /// The machine-config daemon marked the pool's nodes mid-rollout: the node being drained
    /// is released (uncordoned, the request withdrawn), told in an Event.
    McoTakeover,
    /// A pool whose one node runs the target and whose status says so: nothing to do, no
    /// request at all (no node list, no status write).
    Idle,
    /// [`Scenario::Idle`]'s pool and status, with a second node that runs the target: a change of
    /// per-node progress only.
    Progress,
    /// [`Scenario::Progress`], written: the status with both nodes, once.
    ProgressWritten,
    /// [`Scenario::Create`]'s fresh nodes, one of which the controller wrote since the store
    /// copy: no request.
    Stale,
}

impl Scenario {
    /// The pool the reconcile is given.
    pub fn pool(self) -> StreamPool {
        let mut finalizers = vec![FINALIZER];
        let mut deleted = None;
        match self {
            Scenario::Create | Scenario::FinalizerConflict | Scenario::Stale => {
                finalizers.clear();
            }
            Scenario::Deletion | Scenario::DeletionWaits => {
                finalizers.insert(0, "example.com/keep");
                deleted = Some("2026-01-01T00:00:00Z");
            }
            _ => {}
        }
        let mut pool = pool_json(&finalizers, deleted);
        if let Scenario::Idle | Scenario::Progress | Scenario::ProgressWritten = self {
            pool["status"] = idle_status();
        }
        if let Scenario::EmptySelector = self {
            pool["spec"]["nodeSelector"] = json!({});
        }
        if let Scenario::DrainSettings = self {
            pool["spec"]["drain"] = json!({
                "gracePeriodSeconds": 30,
                "podSelector": { "matchLabels": { "app": "web" } },
            });
        }
        serde_json::from_value(pool).expect("a valid StreamPool")
    }

    /// The nodes in the controller's store: those of the scenario's [`list_nodes`] (the
    /// controller no longer lists them; the verifier does not expect that request).
    pub fn nodes(self) -> Vec<Node> {
        self.all_exchanges()
            .into_iter()
            .filter(Exchange::is_node_list)
            .filter_map(|e| match e.answer {
                Answer::Json(_, list) => Some(list["items"].clone()),
                Answer::Echo => None,
            })
            .flat_map(|items| serde_json::from_value::<Vec<Node>>(items).expect("valid Nodes"))
            .collect()
    }

    /// The pods in the drains' pod store.
    pub fn pods(self) -> Vec<Pod> {
        self.all_exchanges()
            .into_iter()
            .filter(Exchange::is_pod_list)
            .filter_map(|e| match e.answer {
                Answer::Json(_, list) => Some(list["items"].clone()),
                Answer::Echo => None,
            })
            .flat_map(|items| serde_json::from_value::<Vec<Pod>>(items).expect("valid Pods"))
            .collect()
    }

    /// The other pools in the controller's cache.
    pub fn others(self) -> Vec<StreamPool> {
        let pool = |name: &str, label: &str| -> StreamPool {
            let mut p = pool_json(&[FINALIZER], None);
            p["metadata"]["name"] = json!(name);
            p["spec"]["nodeSelector"] = json!({ "matchLabels": { label: "" } });
            serde_json::from_value(p).expect("a valid StreamPool")
        };
        match self {
            Scenario::Overlap => vec![
                pool("infra", "node-role.kubernetes.io/infra"),
                pool("gpu", "gpu"),
            ],
            _ => Vec::new(),
        }
    }

    /// The requests the reconcile makes, in order, each with its answer.
    fn exchanges(self) -> Vec<Exchange> {
        let mut all = self.all_exchanges();
        all.retain(|e| !e.is_node_list() && !e.is_pod_list());
        all
    }

    /// [`Scenario::exchanges`], with the node list that seeds the store.
    fn all_exchanges(self) -> Vec<Exchange> {
        match self {
            Scenario::Create => create(),
            Scenario::DrainBlocked => drain_blocked(),
            Scenario::DrainSettings => drain_settings(),
            Scenario::ApprovalConflict => approval_conflict(),
            Scenario::Overlap => overlap(),
            Scenario::EmptySelector => vec![
                list_nodes(&[done("w1")]),
                patch_status(json!({
                    "machineCount": 0,
                    "conditions": [
                        { "type": "Updating", "status": "False", "reason": "InvalidSpec", "message": "spec.nodeSelector is empty…" },
                        { "type": "Updated", "status": "False", "reason": "NotUpdated" },
                        { "type": "Degraded", "status": "True", "reason": "InvalidSpec", "message": "spec.nodeSelector is empty…" },
                        { "type": "Paused", "status": "False", "reason": "NotPaused" },
                    ],
                })),
                warning_pool("PoolDegraded", "InvalidSpec: spec.nodeSelector is empty"),
            ],
            Scenario::Release => release(),
            Scenario::ReleaseConflict => vec![
                list_nodes(&[done("w1"), staged(Fixture::new("w3", false), "t3")]),
                patch_node("w3", Want::Exact(release_body(true, false, "13")))
                    .answer(StatusCode::CONFLICT, conflict()),
                patch_status(updated_status()),
            ],
            Scenario::Deletion => deletion(),
            Scenario::DeletionWaits => vec![list_nodes(&[approved_rebooting("w1", true)])],
            Scenario::FinalizerConflict => vec![
                list_nodes(&[Fixture::new("w1", true)]),
                patch_pool(json!({ "metadata": {
                    "finalizers": [FINALIZER],
                    "resourceVersion": "10",
                } }))
                .answer(StatusCode::CONFLICT, conflict()),
            ],
            Scenario::StatusConflict => vec![
                list_nodes(&[done("w1")]),
                patch_status(updated_status()).answer(StatusCode::CONFLICT, conflict()),
            ],
            Scenario::NotLeader => vec![list_nodes(&[Fixture::new("w1", true)])],
            Scenario::AgentSilent => agent_silent(),
            Scenario::McoTakeover => mco_takeover(),
            Scenario::Idle => vec![list_nodes(&[done("w1")])],
            Scenario::Progress => vec![list_nodes(&[done("w1"), done("w2")])],
            Scenario::ProgressWritten => vec![
                list_nodes(&[done("w1"), done("w2")]),
                patch_status(json!({ "machineCount": 2, "updatedMachineCount": 2 })),
            ],
            Scenario::Stale => {
                let mut all = create();
                all.truncate(1);
                all
            }
        }
    }
}

fn create() -> Vec<Exchange> {
    let fresh = [
        Fixture::new("w1", true),
        Fixture::new("w2", true),
        Fixture::new("infra-0", false),
    ];
    // One write per node, only if it is as listed (`w<n>` at resourceVersion `1<n>`): the check
    // keys, the target (the time it is given the request, in Unix seconds, `1…` until 2033) and
    // the update taint (both still to update: evicted pods should prefer updated nodes).
    let first = |n: &str, rv: &str| {
        patch_node(
            n,
            Want::Includes(json!({
                "metadata": { "annotations": {
                    CHECK_STREAM: "rhel-10",
                    CHECK_OS_IMAGE: OS10,
                    CHECK_EXTENSIONS_IMAGE: null,
                    DESIRED_STREAM: "rhel-10",
                    DESIRED_OS_IMAGE: OS10,
                    DESIRED_EXTENSIONS_IMAGE: null,
                    ROLLOUT_POOL: "worker",
                    ROLLOUT_TARGETED: "1…",
                    ROLLOUT_UPDATED: null,
                }, "resourceVersion": rv },
                "spec": { "taints": [{ "key": UPDATE_TAINT, "effect": "PreferNoSchedule" }] },
            })),
        )
    };
    vec![
        list_nodes(&fresh),
        patch_pool(json!({ "metadata": {
            "finalizers": [FINALIZER],
            "resourceVersion": "10",
        } })),
        first("w1", "11"),
        first("w2", "12"),
        patch_status(json!({
            "observedGeneration": 2,
            "target": format!("rhel-10 {OS10}"),
            "machineCount": 2,
            "updatedMachineCount": 0,
            "readyMachineCount": 0,
            "unavailableMachineCount": 0,
            "degradedMachineCount": 0,
            "noHeartbeatMachineCount": 0,
            "conditions": conditions(
                ("True", "Updating", "0 of 2 nodes updated; 0 unavailable (max 1)"),
                ("False", "NotUpdated"),
                ("False", "AsExpected"),
            ),
            "nodes": null,
            "readiness": "0 of 2 ready; 2 not checked",
        })),
        rollout_started(2, 2),
    ]
}

/// The pods on w1 in the pod store (no request: the reconcile reads the store).
fn list_pods(pods: &[Value]) -> Exchange {
    Exchange::new(
        Method::GET,
        "/api/v1/pods?&fieldSelector=spec.nodeName%3Dw1",
        Want::Empty,
    )
    .answer(
        StatusCode::OK,
        json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods }),
    )
}

/// The lookup of DaemonSet `shop/<name>`: found, or 404.
fn daemon_set(name: &str, exists: bool) -> Exchange {
    let get = Exchange::new(
        Method::GET,
        &format!("/apis/apps/v1/namespaces/shop/daemonsets/{name}"),
        Want::Empty,
    );
    if exists {
        get.answer(
            StatusCode::OK,
            json!({
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": { "name": name, "namespace": "shop" },
                "spec": { "selector": {}, "template": {} },
            }),
        )
    } else {
        let message = format!("daemonsets.apps \"{name}\" not found");
        get.answer(StatusCode::NOT_FOUND, api_status(404, "NotFound", &message))
    }
}

fn labelled(mut pod: Value, app: &str) -> Value {
    pod["metadata"]["labels"] = json!({ "app": app });
    pod
}

fn release() -> Vec<Exchange> {
    vec![
        list_nodes(&[
            done("w1"),
            staged(Fixture::new("w3", false), "t3"),
            approved_rebooting("w4", false),
            Fixture::new("infra-0", false),
        ]),
        patch_node("w3", Want::Exact(release_body(true, false, "13"))),
        event(
            "NodeReleased",
            "w3",
            "node w3: released because it left the pool's selector; the pool's request withdrawn",
        ),
        patch_status(updated_status()),
    ]
}

fn deletion() -> Vec<Exchange> {
    let draining = staged(Fixture::new("w1", true), "t1")
        .with(ROLLOUT_STEP, "draining:1:t1")
        .cordoned();
    // Cordoned by the pool before nodes carried its name: only the mark tells.
    let mut marked = staged(Fixture::new("w5", true), "t5")
        .with(ROLLOUT_STEP, "draining:1:t5")
        .cordoned();
    marked.annotations.retain(|(k, _)| k != ROLLOUT_POOL);
    let mut left = done("w3");
    left.selected = false;
    vec![
        list_nodes(&[draining, Fixture::new("w2", true), marked, left]),
        patch_node("w1", Want::Exact(release_body(true, true, "11"))),
        event(
            "NodeReleased",
            "w1",
            "node w1: released because the pool is deleted; uncordoned; the pool's request withdrawn",
        ),
        patch_node("w5", Want::Exact(release_body(true, true, "15"))),
        event(
            "NodeReleased",
            "w5",
            "node w5: released because the pool is deleted",
        ),
        // It runs the pool's request: it keeps it.
        patch_node("w3", Want::Exact(release_body(false, false, "13"))),
        event(
            "NodeReleased",
            "w3",
            "node w3: released because the pool is deleted",
        ),
        patch_pool(json!({ "metadata": {
            "finalizers": ["example.com/keep"],
            "resourceVersion": "10",
        } })),
    ]
}

mod scenarios;
use scenarios::{
    agent_silent, approval_conflict, drain_blocked, drain_settings, mco_takeover, overlap,
};

impl ApiServerVerifier {
    /// Answers the requests of `scenario` in order; the task panics at the first one that
    /// differs, at a request past the scenario's end, or when the client goes away (every
    /// clone of it dropped: the reconcile is over) before the scenario's last request came.
    pub fn run(mut self, scenario: Scenario) -> JoinHandle<()> {
        tokio::spawn(async move {
            for (i, want) in scenario.exchanges().into_iter().enumerate() {
                let Some((request, send)) = self.0.next_request().await else {
                    panic!(
                        "{scenario:?}: request {i} never came: {} {}",
                        want.method, want.uri
                    );
                };
                let (parts, body) = request.into_parts();
                assert_eq!(
                    (&parts.method, parts.uri.to_string()),
                    (&want.method, want.uri.clone()),
                    "{scenario:?}: request {i}"
                );
                let bytes = body.collect_bytes().await.expect("a request body");
                let what = format!("{scenario:?}: request {i} ({} {})", want.method, want.uri);
                let echo = want.body.check(&bytes, &what);
                let (status, reply) = match want.answer {
                    Answer::Echo => (StatusCode::OK, echo),
                    Answer::Json(s, v) => (s, serde_json::to_vec(&v).expect("json")),
                };
                let response = Response::builder()
                    .status(status)
                    .body(Body::from(reply))
                    .expect("a response");
                send.send_response(response);
            }
            if let Some((request, _)) = self.0.next_request().await {
                panic!(
                    "{scenario:?}: unexpected request {} {}",
                    request.method(),
                    request.uri()
                );
            }
        })
    }
}

/// One request the controller is expected to make, and the API server's answer.
struct Exchange {
    method: Method,
    /// Path and query, as the client sends them.
    uri: String,
    body: Want,
    answer: Answer,
}

impl Exchange {
    fn new(method: Method, uri: &str, body: Want) -> Exchange {
        Exchange {
            method,
            uri: uri.into(),
            body,
            answer: Answer::Echo,
        }
    }

    /// The nodes' list, which seeds the store ([`Scenario::nodes`]).
    fn is_node_list(&self) -> bool {
        self.method == Method::GET && self.uri == "/api/v1/nodes?"
    }

    fn is_pod_list(&self) -> bool {
        self.method == Method::GET && self.uri.starts_with("/api/v1/pods?")
    }

    fn answer(mut self, status: StatusCode, body: Value) -> Exchange {
        self.answer = Answer::Json(status, body);
        self
    }
}

/// What a request's body must be.
enum Want {
    /// None (a read).
    Empty,
    /// Exactly this JSON.
    Exact(Value),
    /// JSON with at least these members (see [`includes`]).
    Includes(Value),
}

impl Want {
    /// Asserts `body`; returns it (an echo answers with it).
    fn check(&self, body: &[u8], what: &str) -> Vec<u8> {
        let value = || -> Value {
            serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("{what}: the body is not JSON: {e}"))
        };
        match self {
            Want::Empty => assert!(body.is_empty(), "{what}: a body on a read"),
            Want::Exact(want) => assert_eq!(&value(), want, "{what}"),
            Want::Includes(want) => {
                let got = value();
                let mut miss = String::new();
                includes(&got, want, "", &mut miss);
                assert!(miss.is_empty(), "{what}:{miss}\nbody: {got:#}");
            }
        }
        body.to_vec()
    }
}

/// The answer to a request.
enum Answer {
    /// 200 with the request's own body (an Event created as asked).
    Echo,
    /// This status and body.
    Json(StatusCode, Value),
}

/// Appends to `miss` where `got` lacks what `want` has: every member of an object (others may
/// be there), every element of an array (same length, in order), equal scalars; a string that
/// `want` ends with `…` only needs that start.
fn includes(got: &Value, want: &Value, at: &str, miss: &mut String) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let here = format!("{at}.{k}");
                match g.get(k) {
                    Some(gv) => includes(gv, wv, &here, miss),
                    None => {
                        let _ = write!(miss, "\n  {here}: missing");
                    }
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                includes(gv, wv, &format!("{at}[{i}]"), miss);
            }
        }
        (Value::String(g), Value::String(w))
            if w.strip_suffix('…').is_some_and(|p| g.starts_with(p)) => {}
        _ if got == want => {}
        _ => {
            let _ = write!(miss, "\n  {at}: {got} is not {want}");
        }
    }
}

fn list_nodes(nodes: &[Fixture]) -> Exchange {
    Exchange::new(Method::GET, "/api/v1/nodes?", Want::Empty).answer(
        StatusCode::OK,
        json!({
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": { "resourceVersion": "100" },
            "items": nodes.iter().map(Fixture::json).collect::<Vec<_>>(),
        }),
    )
}

fn patch_node(name: &str, body: Want) -> Exchange {
    // The controller reads nothing of the patched node but that it is one.
    let answer = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name } });
    Exchange::new(
        Method::PATCH,
        &format!("/api/v1/nodes/{name}{MANAGED}"),
        body,
    )
    .answer(StatusCode::OK, answer)
}

/// The update taint set on `name` (which has no other taint), conditional on `rv`.
fn taint_node(name: &str, rv: &str) -> Exchange {
    patch_node(
        name,
        Want::Exact(json!({
            "metadata": { "resourceVersion": rv },
            "spec": { "taints": [{ "key": UPDATE_TAINT, "effect": "PreferNoSchedule" }] },
        })),
    )
}

fn patch_pool(body: Value) -> Exchange {
    let answer = pool_json(&[FINALIZER], None);
    Exchange::new(
        Method::PATCH,
        &format!("{POOL_PATH}{MANAGED}"),
        Want::Exact(body),
    )
    .answer(StatusCode::OK, answer)
}

fn patch_status(status: Value) -> Exchange {
    let answer = pool_json(&[FINALIZER], None);
    Exchange::new(
        Method::PATCH,
        &format!("{POOL_PATH}/status{MANAGED}"),
        Want::Includes(json!({ "metadata": { "resourceVersion": "10" }, "status": status })),
    )
    .answer(StatusCode::OK, answer)
}

/// A Normal Event about the pool with `node` related, whose note starts with `note`.
fn event(reason: &str, node: &str, note: &str) -> Exchange {
    event_of("Normal", reason, node, note)
}

/// A Warning Event, as [`event`].
fn warning(reason: &str, node: &str, note: &str) -> Exchange {
    event_of("Warning", reason, node, note)
}

/// The `RolloutStarted` Event of a pool with `left` of `nodes` to move to the pinned image.
fn rollout_started(left: usize, nodes: usize) -> Exchange {
    Exchange::new(
        Method::POST,
        EVENTS_PATH,
        Want::Includes(json!({
            "type": "Normal",
            "reason": "RolloutStarted",
            "note": format!("rollout to rhel-10 {OS10} started: {left} of {nodes} nodes to update"),
            "regarding": { "kind": "StreamPool", "name": "worker" },
        })),
    )
}

/// A Warning Event about the pool alone, whose note starts with `note`.
fn warning_pool(reason: &str, note: &str) -> Exchange {
    Exchange::new(
        Method::POST,
        EVENTS_PATH,
        Want::Includes(json!({
            "type": "Warning",
            "reason": reason,
            "note": format!("{note}…"),
            "regarding": { "kind": "StreamPool", "name": "worker" },
        })),
    )
}

fn event_of(type_: &str, reason: &str, node: &str, note: &str) -> Exchange {
    Exchange::new(
        Method::POST,
        EVENTS_PATH,
        Want::Includes(json!({
            "type": type_,
            "reason": reason,
            "note": format!("{note}…"),
            "reportingController": "streamd-rollout",
            "regarding": { "kind": "StreamPool", "name": "worker" },
            "related": { "kind": "Node", "name": node },
        })),
    )
}

/// The Updating, Updated and Degraded conditions (and Paused, false), without transition
/// times: (status, reason, message) or (status, reason).
fn conditions(
    updating: (&str, &str, &str),
    updated: (&str, &str),
    degraded: (&str, &str),
) -> Value {
    json!([
        { "type": "Updating", "status": updating.0, "reason": updating.1, "message": updating.2 },
        { "type": "Updated", "status": updated.0, "reason": updated.1 },
        { "type": "Degraded", "status": degraded.0, "reason": degraded.1, "message": "" },
        { "type": "Paused", "status": "False", "reason": "NotPaused" },
    ])
}

/// The status of a pool whose one node runs the target.
fn updated_status() -> Value {
    json!({
        "machineCount": 1,
        "updatedMachineCount": 1,
        "readyMachineCount": 1,
        "unavailableMachineCount": 0,
        "conditions": conditions(
            ("False", "Updated", ""),
            ("True", "Updated"),
            ("False", "AsExpected"),
        ),
        "nodes": null,
        "readiness": "1 of 1 ready",
    })
}

/// The whole status [`Scenario::Idle`]'s reconcile builds (the transition times kept).
fn idle_status() -> Value {
    let at = "2026-01-01T00:00:00Z";
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({ "type": type_, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": at, "observedGeneration": 2 })
    };
    json!({
        "observedGeneration": 2,
        "target": format!("rhel-10 {OS10}"),
        "machineCount": 1,
        "updatedMachineCount": 1,
        "readyMachineCount": 1,
        "unavailableMachineCount": 0,
        "degradedMachineCount": 0,
        "noHeartbeatMachineCount": 0,
        "conditions": [
            condition("Updating", "False", "Updated", ""),
            condition("Updated", "True", "Updated", "1 of 1 nodes run the target"),
            condition("Degraded", "False", "AsExpected", ""),
            condition("Paused", "False", "NotPaused", ""),
        ],
        "readiness": "1 of 1 ready",
    })
}

/// The release of a node listed at `resource_version`, written out key by key.
fn release_body(withdraw: bool, uncordon: bool, resource_version: &str) -> Value {
    let mut annotations = json!({
        ROLLOUT_POOL: null,
        CHECK_STREAM: null,
        CHECK_OS_IMAGE: null,
        CHECK_EXTENSIONS_IMAGE: null,
        ROLLOUT_SET_ASIDE: null,
        ROLLOUT_UPDATED: null,
    });
    if withdraw {
        annotations[DESIRED_STREAM] = Value::Null;
        annotations[DESIRED_OS_IMAGE] = Value::Null;
        annotations[DESIRED_EXTENSIONS_IMAGE] = Value::Null;
        annotations[ROLLOUT_TARGETED] = Value::Null;
    }
    if uncordon {
        annotations[ROLLOUT_STEP] = Value::Null;
        annotations[REBOOT_APPROVED] = Value::Null;
    }
    let mut body = json!({ "metadata": {
        "annotations": annotations,
        "resourceVersion": resource_version,
    } });
    if uncordon {
        body["spec"] = json!({ "unschedulable": false });
    }
    body
}

fn conflict() -> Value {
    api_status(
        409,
        "Conflict",
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

fn api_status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// The pool `worker` (resourceVersion 10, generation 2): nodes labelled [`ROLE`], stream
/// rhel-10 pinned to [`OS10`], the defaults otherwise; no status.
fn pool_json(finalizers: &[&str], deleted: Option<&str>) -> Value {
    let mut pool = json!({
        "apiVersion": "osstream.openshift.io/v1alpha1",
        "kind": "StreamPool",
        "metadata": {
            "name": "worker",
            "uid": "0b5e6a5c-0000-4000-8000-000000000001",
            "resourceVersion": "10",
            "generation": 2,
            "finalizers": finalizers,
        },
        "spec": {
            "nodeSelector": { "matchLabels": { ROLE: "" } },
            "target": { "stream": "rhel-10", "osImage": OS10 },
        },
    });
    if let Some(at) = deleted {
        pool["metadata"]["deletionTimestamp"] = json!(at);
    }
    pool
}

fn pod(name: &str, owner: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": "owner",
                "uid": "0b5e6a5c-0000-4000-8000-000000000002",
                "controller": true,
            }],
        },
        "spec": { "nodeName": "w1", "containers": [] },
        "status": { "phase": "Running" },
    })
}

/// A Ready node as listed; `w<n>` has resourceVersion `1<n>`.
#[derive(Clone)]
struct Fixture {
    name: String,
    selected: bool,
    cordoned: bool,
    annotations: Vec<(String, String)>,
    /// Labels besides the pool's role (each with the value `""`).
    labels: Vec<String>,
}

impl Fixture {
    /// A fresh node (no key of the controller) that the pool selects or not.
    fn new(name: &str, selected: bool) -> Fixture {
        Fixture {
            name: name.into(),
            selected,
            cordoned: false,
            annotations: Vec::new(),
            labels: Vec::new(),
        }
    }

    fn label(mut self, key: &str) -> Fixture {
        self.labels.push(key.into());
        self
    }

    fn with(mut self, key: &str, value: &str) -> Fixture {
        self.annotations.retain(|(k, _)| k != key);
        self.annotations.push((key.into(), value.into()));
        self
    }

    fn cordoned(mut self) -> Fixture {
        self.cordoned = true;
        self
    }

    fn json(&self) -> Value {
        let digits = self.name.trim_start_matches(|c: char| !c.is_ascii_digit());
        let resource_version = format!("1{digits}");
        let mut labels = if self.selected {
            json!({ ROLE: "", "kubernetes.io/hostname": self.name })
        } else {
            json!({ "kubernetes.io/hostname": self.name })
        };
        for key in &self.labels {
            labels[key] = json!("");
        }
        let annotations: serde_json::Map<String, Value> = self
            .annotations
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "resourceVersion": resource_version,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": { "unschedulable": self.cordoned },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
        })
    }
}

/// `n` given the pool's request (streamd acknowledged it, in `state`).
fn on_target(n: Fixture, state: &str) -> Fixture {
    let pool: StreamPool = serde_json::from_value(pool_json(&[], None)).expect("a StreamPool");
    let hash = resolve_target(&pool.spec.target, None)
        .0
        .expect("the pool's target")
        .observed_hash();
    n.with(ROLLOUT_POOL, "worker")
        .with(DESIRED_STREAM, "rhel-10")
        .with(DESIRED_OS_IMAGE, OS10)
        .with(OBSERVED_DESIRED, &hash)
        .with(STATE, state)
}

/// `n` staged and asking to reboot with `token`.
fn staged(n: Fixture, token: &str) -> Fixture {
    on_target(n, "Staged").with(REBOOT_REQUESTED, token)
}

/// A selected node that runs the pool's request.
fn done(name: &str) -> Fixture {
    on_target(Fixture::new(name, true), "Done")
}

/// A node rebooting into the target the pool approved, still cordoned.
fn approved_rebooting(name: &str, selected: bool) -> Fixture {
    on_target(Fixture::new(name, selected), "Rebooting")
        .with(ROLLOUT_STEP, "approved:t9")
        .with(REBOOT_APPROVED, "t9")
        .cordoned()
}
