//! The shipped manifests match the code: the CRD is the one generated from the Rust types, and
//! the RBAC grants exactly the requests the controller makes.

use std::path::Path;

fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/deploy/rollout")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Deployment of deployment.yaml.
fn deployment() -> serde_json::Value {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&manifest("deployment.yaml")).expect("yaml");
    docs.into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")
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
            "ClusterRole  pods [] list,watch",
            "ClusterRole  pods/eviction [] create",
            "ClusterRole apps daemonsets [] get",
            "ClusterRole machineconfiguration.openshift.io osimagestreams [] list,watch",
            "Role coordination.k8s.io leases [] create",
            "Role coordination.k8s.io leases [streamd-rollout] get,patch,list,watch",
            "Role coordination.k8s.io leases [] list,watch",
            "Role events.k8s.io events [] create,patch",
        ]
    );
}

/// The controller's service account may patch every Node, so its pods run on the control plane
/// only: selected there, tolerating the control-plane taint under both its names.
#[test]
fn the_controller_runs_on_control_plane_nodes_only() {
    let deployment = deployment();
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

/// The CRD's schema as JSON.
fn crd_schema() -> serde_json::Value {
    let crd: serde_json::Value =
        serde_saphyr::from_str(&rollout::crd::crd_yaml().expect("render")).expect("yaml");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every `format` in the schema is one Kubernetes knows (the API server warns about and drops
/// others), every integer has bounds, and the CEL rules sit on the fields they judge.
#[test]
fn the_schema_speaks_kubernetes() {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        if let Some(map) = v.as_object() {
            if let Some(f) = map.get("format").and_then(|f| f.as_str())
                && !["int32", "int64", "date-time"].contains(&f)
            {
                out.push(format!("{path}: format {f}"));
            }
            if map.get("type").and_then(|t| t.as_str()) == Some("integer")
                && path.contains(".spec")
                && !(map.contains_key("minimum") && map.contains_key("maximum"))
            {
                out.push(format!("{path}: integer without bounds"));
            }
            for (k, child) in map {
                walk(child, &format!("{path}.{k}"), out);
            }
        } else if let Some(items) = v.as_array() {
            for (i, child) in items.iter().enumerate() {
                walk(child, &format!("{path}[{i}]"), out);
            }
        }
    }
    let schema = crd_schema();
    let mut wrong = Vec::new();
    walk(&schema, "", &mut wrong);
    assert!(wrong.is_empty(), "{wrong:#?}");

    let spec = &schema["properties"]["spec"]["properties"];
    let rule = |v: &serde_json::Value| v["x-kubernetes-validations"][0]["rule"].clone();
    assert_eq!(
        rule(&spec["maxUnavailable"]),
        rollout::crd::MAX_UNAVAILABLE_RULE
    );
    assert_eq!(
        rule(&spec["target"]),
        rollout::crd::EXTENSIONS_NEED_OS_IMAGE_RULE
    );
    let status = &schema["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    assert_eq!(
        status["conditions"]["items"]["properties"]["status"]["enum"],
        serde_json::json!(["True", "False", "Unknown"])
    );
    assert_eq!(status["nodes"]["maxItems"], 20);
    assert_eq!(status["plannedOrder"]["maxItems"], 20);
}

/// The schema's patterns take what the controller takes: the stream pattern exactly streamd's
/// stream names, the image pattern every digest-pinned reference streamd parses (and no tag).
#[test]
fn the_patterns_agree_with_the_controllers_parse() {
    use streamd::cluster::protocol::validate_stream;
    let stream = regex::Regex::new(rollout::crd::STREAM_PATTERN).expect("pattern");
    for name in [
        "rhel-10", "rhel-9.6", "a", "0", "a.b.c", "rhel--10", "", "-rhel", "rhel-", "RHEL-10",
        "rhel_10", "rhel..10", ".rhel", "rhel.", "rhel 10", "rhel/10", "é",
    ] {
        assert_eq!(
            stream.is_match(name),
            validate_stream(name).is_ok(),
            "{name:?}"
        );
    }
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let pinned = regex::Regex::new(rollout::crd::DIGEST_PINNED_PATTERN).expect("pattern");
    for (image, want) in [
        (format!("quay.io/openshift/rhcos@{digest}"), true),
        (format!("registry.example:5000/a/b/c@{digest}"), true),
        (format!("quay.io/openshift/rhcos:4.21@{digest}"), false),
        ("quay.io/openshift/rhcos:4.21".to_string(), false),
        ("quay.io/openshift/rhcos".to_string(), false),
        (
            format!("quay.io/openshift/rhcos@{}", digest.to_uppercase()),
            false,
        ),
        (format!("quay.io/x y@{digest}"), false),
        (format!("@{digest}"), false),
    ] {
        assert_eq!(pinned.is_match(&image), want, "{image}");
        if want {
            let parsed = image.parse::<streamd::image::reference::ImageRef>();
            assert!(parsed.is_ok(), "{image}: {parsed:?}");
        }
    }
}

/// The Deployment serves the metrics port and probes it: liveness on `/healthz`, readiness on
/// `/readyz`; the log level comes from `RUST_LOG`.
#[test]
fn the_deployment_probes_the_metrics_port() {
    let deployment = deployment();
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["args"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "--metrics-bind-address=0.0.0.0:8080")),
        "{}",
        c["args"]
    );
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let env: Vec<&str> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for name in ["RUST_LOG", "NODE_NAME", "POD_NAME", "POD_NAMESPACE"] {
        assert!(env.contains(&name), "{name} not in {env:?}");
    }
}
