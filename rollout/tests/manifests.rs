//! The shipped manifests match the code: the CRD is the one generated from the Rust types, and
//! the RBAC grants exactly the requests the controller makes.

use std::path::Path;

fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/deploy/rollout")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn crd_yaml_is_the_generated_one() {
    let generated = rollout::crd::crd_yaml().expect("render");
    assert!(
        manifest("crd.yaml") == generated,
        "docs/deploy/rollout/crd.yaml is stale: regenerate it with `streamd-rollout crd > docs/deploy/rollout/crd.yaml`"
    );
    for fixed in [
        "name: streampools.osstream.openshift.io",
        "group: osstream.openshift.io",
        "kind: StreamPool",
        "plural: streampools",
        "scope: Cluster",
        "name: v1alpha1",
        "status: {}",
    ] {
        assert!(generated.contains(fixed), "missing {fixed:?}");
    }
}

#[test]
fn rbac_is_least_privilege() {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&manifest("rbac.yaml")).expect("yaml");
    let mut rules = Vec::new();
    for d in &docs {
        for r in d["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> String {
                r[k].as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            };
            rules.push(format!(
                "{} {} {} [{}] {}",
                d["kind"].as_str().unwrap_or_default(),
                list("apiGroups"),
                list("resources"),
                list("resourceNames"),
                list("verbs")
            ));
        }
    }
    assert_eq!(
        rules,
        vec![
            "ClusterRole osstream.openshift.io streampools [] list,watch,patch",
            "ClusterRole osstream.openshift.io streampools/status [] patch",
            "ClusterRole  nodes [] list,watch,patch",
            "ClusterRole  pods [] list",
            "ClusterRole  pods/eviction [] create",
            "ClusterRole apps daemonsets [] get",
            "ClusterRole machineconfiguration.openshift.io osimagestreams [] list,watch",
            "Role coordination.k8s.io leases [] create",
            "Role coordination.k8s.io leases [streamd-rollout] get,patch,list,watch",
            "Role coordination.k8s.io leases [] list",
            "Role events.k8s.io events [] create,patch",
        ]
    );
}

/// The controller's service account may patch every Node, so its pods run on the control plane
/// only: selected there, tolerating the control-plane taint under both its names.
#[test]
fn the_controller_runs_on_control_plane_nodes_only() {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&manifest("deployment.yaml")).expect("yaml");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        serde_json::json!({"node-role.kubernetes.io/control-plane": ""})
    );
    let mut tolerated: Vec<String> = pod["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{} {} {}",
                t["key"].as_str().unwrap_or_default(),
                t["operator"].as_str().unwrap_or_default(),
                t["effect"].as_str().unwrap_or_default()
            )
        })
        .collect();
    tolerated.sort();
    assert_eq!(
        tolerated,
        [
            "node-role.kubernetes.io/control-plane Exists NoSchedule",
            "node-role.kubernetes.io/master Exists NoSchedule",
        ]
    );
}
