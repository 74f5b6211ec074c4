//! Every `x-kubernetes-validations` rule and OpenAPI bound of the generated StreamPool CRD,
//! evaluated offline (the `cel` crate, through the testbed API server's schema validator)
//! against tables of valid and invalid specs: a rule that does not compile with the
//! functions kube-apiserver and the evaluator share fails here.

use serde_json::{Value, json};
use testbed::fakes::apiserver::schema::{self, rules};

/// The served version's `openAPIV3Schema` of the generated CRD.
fn schema() -> Value {
    let crd: Value =
        serde_saphyr::from_str(&rollout::crd::crd_yaml().expect("render")).expect("yaml");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn digest() -> String {
    format!("sha256:{}", "0123456789abcdef".repeat(4))
}

/// A valid pool with `spec` merged over its spec.
fn pool(spec: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "osstream.openshift.io/v1alpha1",
        "kind": "StreamPool",
        "metadata": {"name": "workers"},
        "spec": {
            "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
            "target": {"stream": "rhel-10"},
        },
    });
    if let (Some(base), Some(extra)) = (obj["spec"].as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    obj
}

fn errors(obj: &Value) -> Vec<String> {
    schema::validate(&schema(), obj, None)
        .into_iter()
        .map(|e| format!("{}: {}", e.field, e.body))
        .collect()
}

#[test]
fn every_rule_compiles_with_what_kubernetes_and_the_evaluator_share() {
    let all = rules::collect(&schema());
    let paths: Vec<&str> = all.iter().map(|r| r.path.as_str()).collect();
    assert!(
        paths.contains(&"spec.maxUnavailable") && paths.contains(&"spec.target"),
        "{paths:?}"
    );
    for rule in &all {
        let compiled = rules::compile(&rule.rule);
        assert!(compiled.is_ok(), "{}: {:?}", rule.path, compiled.err());
        assert!(
            rule.message.is_some(),
            "{}: a rule without message",
            rule.path
        );
    }
}

#[test]
fn valid_pools_pass() {
    let d = digest();
    for spec in [
        json!({}),
        json!({"maxUnavailable": 0}),
        json!({"maxUnavailable": 3}),
        json!({"maxUnavailable": "0%"}),
        json!({"maxUnavailable": "9%"}),
        json!({"maxUnavailable": "100%"}),
        json!({"maxUnavailable": null}),
        json!({"target": {"stream": "rhel-9.6", "osImage": format!("quay.io/openshift/rhcos@{d}")}}),
        json!({"target": {"stream": "a", "osImage": format!("registry.example:5000/a/b@{d}"),
                          "extensionsImage": format!("quay.io/x/ext@{d}")}}),
        json!({"maxConcurrentStaging": 1000, "canary": 1, "minReadySeconds": 0,
               "agentTimeoutSeconds": 86400, "rebootTimeoutSeconds": 1}),
        json!({"drain": {"timeoutSeconds": 604800, "gracePeriodSeconds": 0, "onTimeout": "release"}}),
        json!({"windows": [{"start": "00:00", "durationMinutes": 10080},
                           {"start": "23:59", "durationMinutes": 1, "days": ["Mon", "Sun"],
                            "timeZone": "Europe/Berlin"}]}),
    ] {
        let obj = pool(spec.clone());
        assert_eq!(errors(&obj), Vec::<String>::new(), "{spec}");
    }
}

#[test]
fn invalid_pools_fail_with_kube_apiservers_messages() {
    let d = digest();
    let max_unavailable = "spec.maxUnavailable: Invalid value: \"\": maxUnavailable must be a count >= 0 or a percentage from 0% to 100%";
    let table: Vec<(Value, &str)> = vec![
        (json!({"maxUnavailable": -1}), max_unavailable),
        (json!({"maxUnavailable": "101%"}), max_unavailable),
        (json!({"maxUnavailable": "05%"}), max_unavailable),
        (json!({"maxUnavailable": "3"}), max_unavailable),
        (json!({"maxUnavailable": "-1%"}), max_unavailable),
        (json!({"maxUnavailable": "50 %"}), max_unavailable),
        (
            json!({"maxUnavailable": 1.5}),
            "spec.maxUnavailable: Invalid value: \"number\": spec.maxUnavailable in body must be of type integer,string: \"number\"",
        ),
        (
            json!({"target": {"stream": "RHEL-10"}}),
            "spec.target.stream: Invalid value: \"RHEL-10\": spec.target.stream in body should match",
        ),
        (
            json!({"target": {"stream": ""}}),
            "spec.target.stream: Invalid value: \"\": spec.target.stream in body should be at least 1 chars long",
        ),
        (
            json!({"target": {"stream": "a".repeat(254)}}),
            "spec.target.stream: Too long: may not be more than 253 bytes",
        ),
        (json!({"target": {}}), "spec.target.stream: Required value"),
        (
            json!({"target": {"stream": "rhel-10", "osImage": "quay.io/openshift/rhcos:4.21"}}),
            "spec.target.osImage: Invalid value: \"quay.io/openshift/rhcos:4.21\": spec.target.osImage in body should match",
        ),
        (
            json!({"target": {"stream": "rhel-10", "osImage": format!("quay.io/openshift/rhcos:4.21@{d}")}}),
            "spec.target.osImage: Invalid value:",
        ),
        (
            json!({"target": {"stream": "rhel-10", "extensionsImage": format!("quay.io/x/ext@{d}")}}),
            "spec.target: Invalid value: \"object\": extensionsImage requires osImage",
        ),
        (
            json!({"maxConcurrentStaging": 0}),
            "spec.maxConcurrentStaging: Invalid value: 0: spec.maxConcurrentStaging in body should be greater than or equal to 1",
        ),
        (
            json!({"maxConcurrentStaging": 1001}),
            "spec.maxConcurrentStaging: Invalid value: 1001: spec.maxConcurrentStaging in body should be less than or equal to 1000",
        ),
        (
            json!({"drain": {"timeoutSeconds": 604801}}),
            "spec.drain.timeoutSeconds: Invalid value: 604801: spec.drain.timeoutSeconds in body should be less than or equal to 604800",
        ),
        (
            json!({"drain": {"onTimeout": "abandon"}}),
            "spec.drain.onTimeout: Unsupported value: \"abandon\": supported values: \"retry\", \"release\"",
        ),
        (
            json!({"windows": [{"start": "24:00", "durationMinutes": 60}]}),
            "spec.windows[0].start: Invalid value: \"24:00\": spec.windows[0].start in body should match",
        ),
        (
            json!({"windows": [{"start": "10:00", "durationMinutes": 10081}]}),
            "spec.windows[0].durationMinutes: Invalid value: 10081: spec.windows[0].durationMinutes in body should be less than or equal to 10080",
        ),
        (
            json!({"windows": [{"start": "10:00"}]}),
            "spec.windows[0].durationMinutes: Required value",
        ),
        (
            json!({"windows": [{"start": "10:00", "durationMinutes": 5, "days": ["Monday"]}]}),
            "spec.windows[0].days[0]: Unsupported value: \"Monday\"",
        ),
        (
            json!({"windows": vec![json!({"start": "10:00", "durationMinutes": 5}); 17]}),
            "spec.windows: Too many: 17: must have at most 16 items",
        ),
        (
            json!({"windows": [{"start": "10:00", "durationMinutes": 5, "timeZone": ""}]}),
            "spec.windows[0].timeZone: Invalid value: \"\": spec.windows[0].timeZone in body should be at least 1 chars long",
        ),
    ];
    for (spec, want) in table {
        let got = errors(&pool(spec.clone()));
        assert!(
            got.iter().any(|e| e.starts_with(want)),
            "{spec}: {want:?} not in {got:#?}"
        );
    }
}

#[test]
fn status_conditions_are_a_map_on_type() {
    let mut obj = pool(json!({}));
    obj["status"] = json!({
        "machineCount": 1, "updatedMachineCount": 0, "readyMachineCount": 0,
        "unavailableMachineCount": 0, "degradedMachineCount": 0,
        "conditions": [
            {"type": "Updated", "status": "False", "reason": "", "message": ""},
            {"type": "Updated", "status": "True", "reason": "", "message": ""},
        ],
    });
    assert_eq!(
        errors(&obj),
        ["status.conditions[1]: Duplicate value: {\"type\":\"Updated\"}"]
    );
}
