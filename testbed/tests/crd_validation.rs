//! The StreamPool CRD (docs/deploy/rollout/crd.yaml) installed in the fake API server and
//! driven by the real `kubectl`: a StreamPool its schema or CEL rules refuse is answered 422
//! `Invalid` as kube-apiserver words it and stores nothing; a valid one is stored; a
//! controller's status write goes through the `status` subresource and is validated too.

mod common;

use common::{Out, run_kubectl, start_apiserver};
use serde_json::Value;
use testbed::scratch::ScratchDir;

/// The generated CRD, as the deploy manifests ship it.
const CRD: &str = include_str!("../../docs/deploy/rollout/crd.yaml");

fn digest() -> String {
    format!("sha256:{}", "0123456789abcdef".repeat(4))
}

fn pool(name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: osstream.openshift.io/v1alpha1\nkind: StreamPool\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      node-role.kubernetes.io/worker: \"\"\n{extra_spec}"
    )
}

async fn kubectl(dir: &ScratchDir, args: &[&str]) -> Out {
    run_kubectl(dir, &dir.join("kubeconfig-admin"), args).await
}

async fn apply(dir: &ScratchDir, file: &str, text: &str) -> Out {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write manifest");
    kubectl(dir, &["apply", "-f", path.to_str().expect("utf-8 path")]).await
}

async fn get_pool(dir: &ScratchDir, name: &str) -> Option<Value> {
    let out = kubectl(dir, &["get", "streampool", name, "-o", "json"]).await;
    out.ok
        .then(|| serde_json::from_str(&out.stdout).expect("json"))
}

#[tokio::test]
async fn kubectl_apply_meets_the_streampool_schema_and_rules() {
    let (dir, _server) = start_apiserver("crd-validation", "apply").await;
    let out = apply(&dir, "crd.yaml", CRD).await;
    assert!(out.ok, "{}", out.stderr);

    let bad = pool(
        "bad",
        &format!(
            "  maxUnavailable: \"150%\"\n  maxConcurrentStaging: 0\n  target:\n    stream: RHEL_10\n    extensionsImage: quay.io/x/ext@{}\n  windows:\n  - start: \"25:00\"\n    durationMinutes: 60\n    days: [Mon, Someday]\n",
            digest()
        ),
    );
    let out = apply(&dir, "bad.yaml", &bad).await;
    assert!(!out.ok, "a bad pool was accepted: {}", out.stdout);
    for fragment in [
        "The StreamPool \"bad\" is invalid",
        "spec.maxConcurrentStaging: Invalid value: 0: spec.maxConcurrentStaging in body should be greater than or equal to 1",
        "spec.target.stream: Invalid value: \"RHEL_10\": spec.target.stream in body should match",
        "spec.windows[0].start: Invalid value: \"25:00\"",
        "spec.windows[0].days[1]: Unsupported value: \"Someday\": supported values: \"Mon\"",
        "spec.maxUnavailable: Invalid value: \"\": maxUnavailable must be a count >= 0 or a percentage from 0% to 100%",
        "spec.target: Invalid value: \"object\": extensionsImage requires osImage",
    ] {
        assert!(
            out.stderr.contains(fragment),
            "{fragment:?} not in {}",
            out.stderr
        );
    }
    assert!(
        get_pool(&dir, "bad").await.is_none(),
        "an invalid pool was stored"
    );

    let tagged = pool(
        "tagged",
        "  target:\n    stream: rhel-10\n    osImage: quay.io/openshift/rhcos:4.21\n",
    );
    let out = apply(&dir, "tagged.yaml", &tagged).await;
    assert!(!out.ok, "a tag-only osImage was accepted");
    assert!(
        out.stderr.contains("spec.target.osImage: Invalid value: \"quay.io/openshift/rhcos:4.21\": spec.target.osImage in body should match"),
        "{}",
        out.stderr
    );

    let good = pool(
        "good",
        &format!(
            "  maxUnavailable: \"25%\"\n  target:\n    stream: rhel-10\n    osImage: quay.io/openshift/rhcos@{d}\n    extensionsImage: quay.io/openshift/ext@{d}\n  windows:\n  - start: \"22:30\"\n    durationMinutes: 120\n    days: [Sat, Sun]\n    timeZone: Europe/Berlin\n",
            d = digest()
        ),
    );
    let out = apply(&dir, "good.yaml", &good).await;
    assert!(out.ok, "{}", out.stderr);
    let stored = get_pool(&dir, "good").await.expect("stored");
    assert_eq!(stored["spec"]["maxUnavailable"], "25%");

    // An update the rules refuse changes nothing.
    let out = apply(&dir, "good.yaml", &good.replace("\"25%\"", "-1")).await;
    assert!(!out.ok, "a negative maxUnavailable was accepted");
    assert!(
        out.stderr.contains("maxUnavailable must be a count"),
        "{}",
        out.stderr
    );
    let after = get_pool(&dir, "good").await.expect("still stored");
    assert_eq!(
        after["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );
    assert_eq!(after["spec"], stored["spec"]);
}

#[tokio::test]
async fn status_writes_are_validated_too() {
    let (dir, _server) = start_apiserver("crd-validation", "status").await;
    assert!(apply(&dir, "crd.yaml", CRD).await.ok);
    let good = pool("workers", "  target:\n    stream: rhel-10\n");
    let out = apply(&dir, "pool.yaml", &good).await;
    assert!(out.ok, "{}", out.stderr);

    let status = r#"{"status":{"machineCount":3,"updatedMachineCount":1,"readyMachineCount":1,"unavailableMachineCount":1,"degradedMachineCount":0,"conditions":[{"type":"Updating","status":"True","reason":"Moving","message":"1 of 3"}]}}"#;
    let patch = |body: &str| {
        [
            "patch",
            "streampool",
            "workers",
            "--subresource=status",
            "--type=merge",
            "-p",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([body.to_string()])
        .collect::<Vec<_>>()
    };
    let args = patch(status);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kubectl(&dir, &args).await;
    assert!(out.ok, "{}", out.stderr);
    let stored = get_pool(&dir, "workers").await.expect("stored");
    assert_eq!(stored["status"]["machineCount"], 3);

    let bad = status.replace("\"True\"", "\"Maybe\"");
    let args = patch(&bad);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kubectl(&dir, &args).await;
    assert!(!out.ok, "an invalid status was accepted");
    assert!(
        out.stderr.contains("status.conditions[0].status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\""),
        "{}",
        out.stderr
    );
    let after = get_pool(&dir, "workers").await.expect("stored");
    assert_eq!(after["status"], stored["status"]);
}
