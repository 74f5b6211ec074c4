//! Lease conflicts and server-side apply conflicts.

use serde_json::json;

use super::{Env, Identity, parse, write};

#[tokio::test]
async fn leases_conflict_on_a_stale_resource_version() {
    let env = Env::start("lease").await;
    let lease = write(
        &env,
        "lease.yaml",
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: streamd-rollout\n  namespace: default\nspec:\n  holderIdentity: a\n  leaseDurationSeconds: 15\n",
    );
    env.kubectl(&["create", "-f", &lease]).await;
    let first = parse(
        &env.kubectl(&["get", "lease", "streamd-rollout", "-o", "json"])
            .await,
    );
    let mut taken = first.clone();
    taken["spec"]["holderIdentity"] = json!("b");
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/streamd-rollout";
    let raw = env
        .raw(
            "PUT",
            path,
            Identity::Admin,
            Some(("application/json", &taken.to_string())),
        )
        .await;
    assert_eq!(raw.status, 200, "{}", raw.body);
    // The other candidate still holds the old resourceVersion: it loses.
    let mut stale = first.clone();
    stale["spec"]["holderIdentity"] = json!("c");
    let raw = env
        .raw(
            "PUT",
            path,
            Identity::Admin,
            Some(("application/json", &stale.to_string())),
        )
        .await;
    assert_eq!(raw.status, 409, "{}", raw.body);
    assert_eq!(raw.json()["reason"], "Conflict");
    let now = parse(
        &env.kubectl(&["get", "lease", "streamd-rollout", "-o", "json"])
            .await,
    );
    assert_eq!(now["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn server_side_apply_conflicts_on_another_managers_field() {
    let env = Env::start("apply").await;
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: l\n  namespace: default\nspec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 15\n"
        )
    };
    let a = write(&env, "a.yaml", &lease("a"));
    let b = write(&env, "b.yaml", &lease("b"));
    // An apply creates the object.
    env.kubectl(&["apply", "--server-side", "--field-manager=a", "-f", &a])
        .await;
    let err = env
        .kubectl_fails(&["apply", "--server-side", "--field-manager=b", "-f", &b])
        .await;
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "a" using coordination.k8s.io/v1: .spec.holderIdentity"#),
        "{err}"
    );
    // Re-applying the same values is shared ownership, not a conflict.
    env.kubectl(&["apply", "--server-side", "--field-manager=b", "-f", &a])
        .await;
    // Once an ordinary patch removed the holder, nobody owns it: b's apply goes through.
    env.kubectl(&[
        "patch",
        "lease",
        "l",
        "--type=strategic",
        "--field-manager=b",
        "-p",
        r#"{"spec":{"holderIdentity":null}}"#,
    ])
    .await;
    env.kubectl(&["apply", "--server-side", "--field-manager=b", "-f", &b])
        .await;
    let now = parse(&env.kubectl(&["get", "lease", "l", "-o", "json"]).await);
    assert_eq!(now["spec"]["holderIdentity"], "b");
    let err = env
        .kubectl_fails(&["apply", "--server-side", "--field-manager=a", "-f", &a])
        .await;
    assert!(err.contains(r#"conflict with "b""#), "{err}");
    env.kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=a",
        "--force-conflicts",
        "-f",
        &a,
    ])
    .await;
    let now = parse(&env.kubectl(&["get", "lease", "l", "-o", "json"]).await);
    assert_eq!(now["spec"]["holderIdentity"], "a");
    let raw = env
        .raw(
            "PATCH",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
            Identity::Admin,
            Some(("application/apply-patch+yaml", &lease("c"))),
        )
        .await;
    assert_eq!(raw.status, 422, "fieldManager is required: {}", raw.body);
}
