//! RBAC for ServiceAccounts.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use testbed::control::ApiServerCmd;

use super::{Env, write};
use crate::common::Watch;

#[tokio::test]
async fn a_service_account_gets_exactly_what_rbac_binds() {
    let env = Env::start("rbac").await;
    let sa = "system:serviceaccount:streamd:streamd-rollout";
    let reply = env
        .control(ApiServerCmd::AddUser {
            user: sa.to_string(),
        })
        .await;
    let kubeconfig = PathBuf::from(reply["kubeconfig"].as_str().expect("kubeconfig path"));
    let as_sa = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        let env = &env;
        async move { env.run(&kubeconfig, args).await }
    };
    let out = as_sa(&["get", "pods", "-A"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(r#"pods is forbidden: User "system:serviceaccount:streamd:streamd-rollout" cannot list resource "pods" in API group "" at the cluster scope"#),
        "{}",
        out.stderr
    );
    // (`kubectl create namespace` would send protobuf, which the fake does not read.)
    let rbac = write(
        &env,
        "rbac.yaml",
        r#"apiVersion: v1
kind: Namespace
metadata: {name: streamd}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: rollout}
rules:
- {apiGroups: [""], resources: [pods], verbs: [list, watch]}
- {apiGroups: [""], resources: [pods/eviction], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rollout}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: rollout}
subjects: [{kind: ServiceAccount, name: streamd-rollout, namespace: streamd}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: rollout-lease, namespace: streamd}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rollout-lease, namespace: streamd}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: rollout-lease}
subjects: [{kind: ServiceAccount, name: streamd-rollout}]
"#,
    );
    env.kubectl(&["create", "-f", &rbac]).await;
    assert!(as_sa(&["get", "pods", "-A"]).await.ok);
    assert!(
        as_sa(&["get", "lease", "-n", "streamd", "x"])
            .await
            .stderr
            .contains("NotFound")
    );
    let out = as_sa(&["get", "lease", "-n", "default", "x"]).await;
    assert!(
        out.stderr.contains("Forbidden"),
        "a Role grants only its namespace: {}",
        out.stderr
    );
    let out = as_sa(&["delete", "pod", "-n", "default", "x"]).await;
    assert!(out.stderr.contains("Forbidden"), "{}", out.stderr);
    let stats = env.control(ApiServerCmd::STATS).await;
    assert!(
        stats["by_resource"][sa]["pods"]["list"].as_u64() >= Some(2),
        "{stats}"
    );
    assert!(
        stats["by_resource"][sa]["leases"]["get"].as_u64() >= Some(2),
        "{stats}"
    );

    let mut watch = Watch::spawn(
        &env.dir,
        &kubeconfig,
        &["get", "pods", "-A", "-w", "-o", "json"],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = env.control(ApiServerCmd::STATS).await;
        if stats["watches_open"][sa] == 1 {
            assert_eq!(stats["watches_max"][sa], 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the watch is never counted open: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.child.kill().await.expect("kill kubectl -w");
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.control(ApiServerCmd::STATS).await["watches_open"][sa] != 0 {
        assert!(Instant::now() < deadline, "the closed watch stays counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
