//! CustomResourceDefinitions posted to the fake API server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Env, Identity, parse, write};
use crate::common::Watch;

const STREAMPOOL_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: streampools.osstream.openshift.io
spec:
  group: osstream.openshift.io
  scope: Cluster
  names:
    plural: streampools
    kind: StreamPool
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

#[tokio::test]
async fn posted_crd_is_served_with_generation_status_and_watch() {
    let env = Env::start("crd").await;
    let crd = write(&env, "crd.yaml", STREAMPOOL_CRD);
    env.kubectl(&["create", "-f", &crd]).await;
    env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=10s",
        "crd/streampools.osstream.openshift.io",
    ])
    .await;
    let stored = parse(
        &env.kubectl(&[
            "get",
            "crd",
            "streampools.osstream.openshift.io",
            "-o",
            "json",
        ])
        .await,
    );
    assert_eq!(stored["spec"]["names"]["singular"], "streampool");
    assert_eq!(stored["spec"]["names"]["listKind"], "StreamPoolList");
    assert_eq!(stored["status"]["storedVersions"], json!(["v1alpha1"]));
    let resources = env
        .kubectl(&[
            "api-resources",
            "--api-group=osstream.openshift.io",
            "-o",
            "wide",
        ])
        .await;
    assert!(
        resources.contains("streampools")
            && resources.contains("StreamPool")
            && resources.contains("false"),
        "cluster-scoped StreamPool in discovery: {resources}"
    );

    let mut watch = Watch::spawn(
        &env.dir,
        &env.path("kubeconfig-admin"),
        &[
            "get",
            "streampools",
            "-w",
            "-o",
            "json",
            "--output-watch-events",
        ],
    );
    let pool = write(
        &env,
        "pool.yaml",
        "apiVersion: osstream.openshift.io/v1alpha1\nkind: StreamPool\nmetadata:\n  name: workers\nspec:\n  stream: rhel-10\nstatus:\n  updated: 3\n",
    );
    env.kubectl(&["create", "-f", &pool]).await;
    let created = parse(
        &env.kubectl(&["get", "streampool", "workers", "-o", "json"])
            .await,
    );
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(
        created.get("status").is_none(),
        "create drops status: {created}"
    );
    env.kubectl(&[
        "patch",
        "streampool",
        "workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"stream":"rhel-9"}}"#,
    ])
    .await;
    env.kubectl(&[
        "patch",
        "streampool",
        "workers",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"observedGeneration":2},"spec":{"stream":"ignored"}}"#,
    ])
    .await;
    let pool = parse(
        &env.kubectl(&["get", "streampool", "workers", "-o", "json"])
            .await,
    );
    assert_eq!(pool["metadata"]["generation"], 2, "{pool}");
    assert_eq!(
        pool["spec"]["stream"], "rhel-9",
        "status writes keep spec: {pool}"
    );
    assert_eq!(pool["status"]["observedGeneration"], 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch.events().len() < 3 {
        watch.read_more(deadline).await;
    }
    let kinds: Vec<Value> = watch.events().iter().map(|e| e["type"].clone()).collect();
    assert_eq!(
        kinds[..3],
        [json!("ADDED"), json!("MODIFIED"), json!("MODIFIED")]
    );

    let err = env
        .kubectl_fails(&[
            "get",
            "streampools",
            "--field-selector",
            "spec.stream=rhel-9",
        ])
        .await;
    assert!(err.contains("is not a known field selector"), "{err}");

    env.kubectl(&["delete", "crd", "streampools.osstream.openshift.io"])
        .await;
    let raw = env
        .raw(
            "GET",
            "/apis/osstream.openshift.io/v1alpha1/streampools",
            Identity::Admin,
            None,
        )
        .await;
    assert_eq!(raw.status, 404, "no longer served: {}", raw.body);
    let bad = write(
        &env,
        "bad.yaml",
        &STREAMPOOL_CRD.replace("name: streampools.osstream", "name: pools.osstream"),
    );
    let err = env.kubectl_fails(&["create", "-f", &bad]).await;
    assert!(
        err.contains(r#"metadata.name: Invalid value: "pools.osstream.openshift.io": must be spec.names.plural+"."+spec.group"#),
        "{err}"
    );
}
