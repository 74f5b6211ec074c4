//! Cordon, drain, evictions and PodDisruptionBudgets.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::control::ApiServerCmd;

use super::{Env, Identity, Raw, parse, write};
use crate::common::NODE;

#[tokio::test]
async fn kubectl_cordon_and_uncordon_are_recorded_as_unavailability() {
    let env = Env::start("cordon").await;
    env.control(ApiServerCmd::ResetUnavailable).await;
    let out = env.kubectl(&["cordon", NODE]).await;
    assert!(out.contains("cordoned"), "{out}");
    assert_eq!(env.node().await["spec"]["unschedulable"], true);
    let table = env.kubectl(&["get", "node", NODE]).await;
    assert!(table.contains("Ready,SchedulingDisabled"), "{table}");
    env.kubectl(&["uncordon", NODE]).await;
    assert!(env.node().await["spec"].get("unschedulable").is_none());
    let record = env.control(ApiServerCmd::Unavailable).await;
    assert_eq!(record["max"], 1, "{record}");
    assert_eq!(record["now"], json!([]), "{record}");
    let sets: Vec<Value> = record["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|e| e["nodes"].clone())
        .collect();
    assert_eq!(sets, [json!([]), json!([NODE]), json!([])], "{record}");
}

/// A pod of ReplicaSet `web-rs` bound to `node`, created by the admin and made Running and
/// Ready as its kubelet would.
fn web_pod(env: &Env, name: &str, node: &str) {
    env.server
        .create(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": { "app": "web" },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs",
                    "uid": "5f0c3a63-6a4e-4e52-9a0c-2a8c4fbb7d11", "controller": true,
                }],
            },
            "spec": { "nodeName": node, "containers": [{ "name": "web", "image": "quay.io/x/web:1" }] },
        }))
        .expect("create pod");
    env.server
        .update_status("v1", "Pod", Some("default"), name, |pod| {
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
            });
        })
        .expect("pod status");
}

#[tokio::test]
async fn kubectl_drain_evicts_through_the_disruption_budget() {
    let env = Env::start("drain").await;
    env.server
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}))
        .expect("second node");
    web_pod(&env, "web-a", NODE);
    web_pod(&env, "web-b", NODE);
    let pdb = write(
        &env,
        "pdb.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      app: web\n",
    );
    env.kubectl(&["create", "-f", &pdb]).await;
    let status = parse(&env.kubectl(&["get", "pdb", "web", "-o", "json"]).await)["status"].clone();
    assert_eq!(
        (
            &status["currentHealthy"],
            &status["desiredHealthy"],
            &status["disruptionsAllowed"],
            &status["expectedPods"]
        ),
        (&json!(2), &json!(1), &json!(1), &json!(2)),
        "{status}"
    );
    env.control(ApiServerCmd::PodRemoval { delay_ms: 300 })
        .await;
    let pods = parse(
        &env.kubectl(&[
            "get",
            "pods",
            "-A",
            "-o",
            "json",
            "--field-selector",
            &format!("spec.nodeName={NODE}"),
        ])
        .await,
    );
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(2));
    // One eviction is allowed, the second is refused until a replacement is Ready elsewhere.
    let out = env
        .run(
            &env.path("kubeconfig-admin"),
            &["drain", NODE, "--ignore-daemonsets", "--timeout=8s"],
        )
        .await;
    assert!(!out.ok, "drain cannot finish: {}", out.stdout);
    assert!(
        out.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        out.stderr
    );
    assert_eq!(
        env.node().await["spec"]["unschedulable"],
        true,
        "drain cordons first"
    );
    let left = parse(&env.kubectl(&["get", "pods", "-o", "json"]).await);
    assert_eq!(left["items"].as_array().map(Vec::len), Some(1), "{left}");
    web_pod(&env, "web-c", "worker-1");
    let out = env
        .kubectl(&["drain", NODE, "--ignore-daemonsets", "--timeout=30s"])
        .await;
    assert!(out.contains("drained"), "{out}");
    let left = parse(
        &env.kubectl(&[
            "get",
            "pods",
            "-o",
            "json",
            "--field-selector",
            &format!("spec.nodeName={NODE}"),
        ])
        .await,
    );
    assert_eq!(left["items"], json!([]));
    let err = env
        .kubectl_fails(&["get", "pods", "--field-selector", "spec.host=x"])
        .await;
    assert!(
        err.contains("field label not supported: spec.host"),
        "{err}"
    );
}

/// `POST` an Eviction of `name` to the eviction path of `path_name`, with `extra` fields (such as
/// `deleteOptions`), as the admin.
async fn evict(env: &Env, path_name: &str, name: &str, extra: Value) -> Raw {
    let mut body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let path = format!("/api/v1/namespaces/default/pods/{path_name}/eviction");
    env.raw(
        "POST",
        &path,
        Identity::Admin,
        Some(("application/json", &body.to_string())),
    )
    .await
}

#[tokio::test]
async fn eviction_statuses_and_graceful_deletion_are_the_real_ones() {
    let env = Env::start("evict").await;
    for name in ["web-a", "web-b"] {
        web_pod(&env, name, NODE);
    }
    env.server
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("pdb");
    let raw = evict(&env, "web-a", "web-a", json!({})).await;
    assert_eq!(raw.status, 429, "{}", raw.body);
    assert_eq!(
        raw.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests", "code": 429,
            "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}})
    );
    let raw = evict(&env, "web-a", "web-b", json!({})).await;
    assert_eq!(
        (raw.status, raw.json()["message"].clone()),
        (
            400,
            json!("name in URL does not match name in Eviction object")
        )
    );
    // A second budget over the same pods: the eviction subresource cannot decide.
    env.server
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-2", "namespace": "default"},
            "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("second pdb");
    let raw = evict(&env, "web-a", "web-a", json!({})).await;
    assert_eq!(raw.status, 500, "{}", raw.body);
    assert_eq!(
        raw.json()["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    env.kubectl(&["delete", "pdb", "web"]).await;

    // Allowed: 201 Success, the pod terminates gracefully (deletionTimestamp, then gone).
    env.control(ApiServerCmd::PodRemoval { delay_ms: 1500 })
        .await;
    let raw = evict(
        &env,
        "web-a",
        "web-a",
        json!({"deleteOptions": {"gracePeriodSeconds": 20}}),
    )
    .await;
    assert_eq!(raw.status, 201, "{}", raw.body);
    assert_eq!(raw.json()["status"], "Success");
    let pod = parse(&env.kubectl(&["get", "pod", "web-a", "-o", "json"]).await);
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 20, "{pod}");
    assert!(pod["metadata"]["deletionTimestamp"].is_string(), "{pod}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while env
        .run(&env.path("kubeconfig-admin"), &["get", "pod", "web-a"])
        .await
        .ok
    {
        assert!(Instant::now() < deadline, "web-a never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Dry run and preconditions are honoured (a failed precondition still took the disruption,
    // as on a real server: the delete comes after the budget update).
    let raw = evict(
        &env,
        "web-b",
        "web-b",
        json!({"deleteOptions": {"dryRun": ["All"]}}),
    )
    .await;
    assert_eq!(raw.status, 201, "{}", raw.body);
    env.kubectl(&["get", "pod", "web-b"]).await;
    let raw = evict(
        &env,
        "web-b",
        "web-b",
        json!({"deleteOptions": {"preconditions": {"uid": "nope"}}}),
    )
    .await;
    assert_eq!(raw.status, 409, "{}", raw.body);
    let pdb = parse(&env.kubectl(&["get", "pdb", "web-2", "-o", "json"]).await);
    assert!(pdb["status"]["disruptedPods"]["web-b"].is_string(), "{pdb}");
    let raw = evict(&env, "nope", "nope", json!({})).await;
    assert_eq!(raw.status, 404, "{}", raw.body);
    // An unscheduled pod is deleted at once whatever the grace period.
    env.server
        .create(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending"},
            "spec": {"containers": [{"name": "c", "image": "quay.io/x/c:1"}]}}),
        )
        .expect("pending pod");
    let pending = parse(&env.kubectl(&["get", "pod", "pending", "-o", "json"]).await);
    assert_eq!(pending["status"], json!({"phase": "Pending"}));
    assert_eq!(pending["spec"]["terminationGracePeriodSeconds"], 30);
    env.kubectl(&["delete", "pod", "pending", "--wait=false"])
        .await;
    env.kubectl_fails(&["get", "pod", "pending"]).await;
}
