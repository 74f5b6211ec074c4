//! The object-metadata validation kube-apiserver applies to every write, so that a
//! client writing a malformed label or annotation fails here as it would in a cluster.

use serde_json::Value;

use super::crd;
use super::discovery::{
    CUSTOMRESOURCEDEFINITIONS, EVENTS_V1, OSIMAGESTREAMS, PODDISRUPTIONBUDGETS, PODS, ResourceDef,
};
use super::schema;
use super::status::ApiError;

/// Kubernetes' limit on the total size of an object's annotations.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Checks `metadata` of an object about to be stored as `name`.
pub(crate) fn object(def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
    let Some(meta) = obj.get("metadata").and_then(Value::as_object) else {
        return Err(ApiError::bad_request("object has no metadata"));
    };
    let mut causes = Vec::new();
    if !is_dns_subdomain(name) {
        causes.push((
            "metadata.name".to_string(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    for (field, is_labels) in [("labels", true), ("annotations", false)] {
        let Some(map) = meta.get(field) else {
            continue;
        };
        if map.is_null() {
            continue;
        }
        let Some(map) = map.as_object() else {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {} into Go struct field ObjectMeta.metadata.{field} of type map[string]string",
                json_type(map)
            )));
        };
        let mut total = 0;
        for (key, value) in map {
            let Some(value) = value.as_str() else {
                return Err(ApiError::bad_request(format!(
                    "json: cannot unmarshal {} into Go struct field ObjectMeta.metadata.{field} of type string",
                    json_type(value)
                )));
            };
            total += key.len() + value.len();
            if !is_qualified_name(key) {
                causes.push((
                    format!("metadata.{field}"),
                    format!("Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (an optional DNS subdomain prefix and '/' may precede it)"),
                ));
            }
            if is_labels && !is_label_value(value) {
                causes.push((
                    "metadata.labels".to_string(),
                    format!("Invalid value: {value:?}: a valid label must be an empty string or consist of at most 63 alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                ));
            }
        }
        if !is_labels && total > MAX_ANNOTATIONS_BYTES {
            causes.push((
                "metadata.annotations".to_string(),
                format!("Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"),
            ));
        }
    }
    if def.group == OSIMAGESTREAMS.group && def.plural == OSIMAGESTREAMS.plural {
        os_image_stream(name, obj, &mut causes);
    } else if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) {
        crd::validate(name, obj, &mut causes);
    } else if std::ptr::eq(def, &PODDISRUPTIONBUDGETS) {
        // kubernetes/kubernetes: pkg/apis/policy/validation/validation.go,
        // `ValidatePodDisruptionBudgetSpec`.
        let spec = &obj["spec"];
        if !spec["minAvailable"].is_null() && !spec["maxUnavailable"].is_null() {
            causes.push((
                "spec".into(),
                "Invalid value: \"object\": minAvailable and maxUnavailable cannot be both set"
                    .into(),
            ));
        }
    } else if std::ptr::eq(def, &EVENTS_V1) {
        events_v1(obj, &mut causes);
    } else if std::ptr::eq(def, &PODS) {
        // kubernetes/kubernetes: pkg/apis/core/validation/validation.go, `validateContainers`.
        let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
        if containers.is_none_or(Vec::is_empty) {
            causes.push(("spec.containers".into(), "Required value".into()));
        }
        for (i, c) in containers.into_iter().flatten().enumerate() {
            for field in ["name", "image"] {
                if c[field].as_str().is_none_or(str::is_empty) {
                    causes.push((
                        format!("spec.containers[{i}].{field}"),
                        "Required value".into(),
                    ));
                }
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, &causes))
    }
}

/// Checks a custom resource against the `openAPIV3Schema` of its version in `crd` (the stored
/// CustomResourceDefinition) and its CEL rules; `old` is the stored object on an update.
pub(crate) fn custom_resource(
    crd: Option<&Value>,
    def: &ResourceDef,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(schema) = crd
        .and_then(|crd| crd.pointer("/spec/versions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|v| v["name"] == def.version)
        .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
    else {
        return Ok(());
    };
    let errors = schema::validate(schema, obj, old);
    if errors.is_empty() {
        return Ok(());
    }
    let causes: Vec<(String, String)> = errors.into_iter().map(|e| (e.field, e.body)).collect();
    Err(ApiError::invalid(def, name, &causes))
}

/// The checks kube-apiserver applies to an `events.k8s.io/v1` Event
/// (kubernetes/kubernetes:pkg/apis/core/validation/events.go `ValidateEventCreate` with
/// `legacyValidateEvent`'s branch for Events with an `eventTime`; `note` and `regarding` are the
/// internal `Message` and `InvolvedObject`, hence the field names). Applied to every write: the
/// update's immutability checks (`ValidateEventUpdate`) are not modelled.
fn events_v1(obj: &Value, causes: &mut Vec<(String, String)>) {
    let text = |k: &str| obj[k].as_str().unwrap_or_default();
    let namespace = obj.pointer("/metadata/namespace").and_then(Value::as_str);
    let regarding_ns = obj
        .pointer("/regarding/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // An Event about a cluster-scoped object lives in `default` or `kube-system`.
    if regarding_ns.is_empty() && !matches!(namespace, Some("default" | "kube-system")) {
        causes.push((
            "involvedObject.namespace".into(),
            "Invalid value: \"\": does not match event.namespace".into(),
        ));
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        causes.push(("reportingController".into(), "Required value".into()));
    } else if !is_qualified_name(controller) {
        causes.push((
            "reportingController".into(),
            format!("Invalid value: {controller:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        let value = text(field);
        if value.is_empty() {
            causes.push((field.into(), "Required value".into()));
        } else if value.len() > limit {
            causes.push((
                field.into(),
                format!("Invalid value: \"\": can have at most {limit} characters"),
            ));
        }
    }
    if text("note").len() > 1024 {
        causes.push((
            "message".into(),
            "Invalid value: \"\": can have at most 1024 characters".into(),
        ));
    }
    if obj["eventTime"].is_null() {
        causes.push(("eventTime".into(), "Required value".into()));
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        causes.push((
            "type".into(),
            format!("Invalid value: \"\": has invalid value: {}", text("type")),
        ));
    }
    if let Some(count) = obj.pointer("/series/count")
        && count.as_i64().is_none_or(|c| c < 2)
    {
        causes.push((
            "series.count".into(),
            "Invalid value: should be at least 2".into(),
        ));
    }
}

/// Longest image reference the OSImageStream API accepts.
const MAX_IMAGE_LEN: usize = 447;
/// Most streams `status.availableStreams` may list.
const MAX_STREAMS: usize = 100;

/// The schema and CEL rules of the OSImageStream CRD (openshift/api
/// `machineconfiguration/v1`), with its messages.
fn os_image_stream(name: &str, obj: &Value, causes: &mut Vec<(String, String)>) {
    let mut invalid = |field: String, message: String| causes.push((field, message));
    if name != "cluster" {
        invalid(
            "<nil>".into(),
            "Invalid value: \"object\": osimagestream is a singleton, .metadata.name must be 'cluster'".into(),
        );
    }
    let subdomain = |field: String, value: &str, invalid: &mut dyn FnMut(String, String)| {
        if !is_dns_subdomain(value) {
            invalid(
                field,
                format!(
                    "Invalid value: {value:?}: a RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character."
                ),
            );
        }
    };
    if let Some(default) = obj.pointer("/spec/defaultStream").and_then(Value::as_str) {
        subdomain("spec.defaultStream".into(), default, &mut invalid);
    }
    let Some(status) = obj.get("status").filter(|s| !s.is_null()) else {
        return;
    };
    let Some(streams) = status.get("availableStreams").and_then(Value::as_array) else {
        invalid("status.availableStreams".into(), "Required value".into());
        return;
    };
    if streams.is_empty() || streams.len() > MAX_STREAMS {
        invalid(
            "status.availableStreams".into(),
            format!(
                "Invalid value: {}: must have 1 to {MAX_STREAMS} items",
                streams.len()
            ),
        );
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, entry) in streams.iter().enumerate() {
        let at = |field: &str| format!("status.availableStreams[{i}].{field}");
        match entry.get("name").and_then(Value::as_str) {
            Some(n) if names.contains(&n) => invalid(
                format!("status.availableStreams[{i}]"),
                format!("Duplicate value: {{\"name\":{n:?}}}"),
            ),
            Some(n) => {
                subdomain(at("name"), n, &mut invalid);
                names.push(n);
            }
            None => invalid(at("name"), "Required value".into()),
        }
        for field in ["osImage", "osExtensionsImage"] {
            match entry.get(field).and_then(Value::as_str) {
                Some(image) => {
                    for problem in image_problems(image) {
                        invalid(at(field), format!("Invalid value: \"string\": {problem}"));
                    }
                }
                None => invalid(at(field), "Required value".into()),
            }
        }
    }
    match status.get("defaultStream").and_then(Value::as_str) {
        Some(d) if names.contains(&d) => {}
        Some(_) => invalid(
            "status".into(),
            "Invalid value: \"object\": defaultStream must reference a stream name from availableStreams".into(),
        ),
        None => invalid("status.defaultStream".into(), "Required value".into()),
    }
}

/// The `ImageDigestFormat` rules: 1..447 characters, `host[:port][/namespace]/name@sha256:<64 hex>`.
fn image_problems(image: &str) -> Vec<&'static str> {
    let mut problems = Vec::new();
    if image.is_empty() || image.len() > MAX_IMAGE_LEN {
        problems.push("must be 1 to 447 characters long");
    }
    let parts: Vec<&str> = image.split('@').collect();
    let digest_ok = parts.len() == 2
        && parts[1].strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        });
    if !digest_ok {
        problems.push("the OCI Image reference must end with a valid '@sha256:<digest>' suffix, where '<digest>' is 64 characters long");
    }
    if !is_oci_name(parts[0]) {
        problems.push("the OCI Image name should follow the host[:port][/namespace]/name format, resembling a valid URL without the scheme");
    }
    problems
}

/// `^([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(:[0-9]{2,5})?/([a-zA-Z0-9-_]{0,61}/)?[a-zA-Z0-9-_.]*?$`
fn is_oci_name(name: &str) -> bool {
    let word = |s: &str, extra: &[u8]| {
        s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || extra.contains(&c))
    };
    let Some((host, path)) = name.split_once('/') else {
        return false;
    };
    let hostname = match host.split_once(':') {
        Some((h, port)) => {
            if !(2..=5).contains(&port.len()) || !port.bytes().all(|c| c.is_ascii_digit()) {
                return false;
            }
            h
        }
        None => host,
    };
    let labels: Vec<&str> = hostname.split('.').collect();
    let host_ok = labels.len() >= 2 && labels.iter().all(|l| !l.is_empty() && word(l, b""));
    let path_ok = match path.split_once('/') {
        Some((ns, rest)) => ns.len() <= 61 && word(ns, b"_") && word(rest, b"_."),
        None => word(path, b"_."),
    };
    host_ok && path_ok
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
}

/// A label or annotation key: `[prefix/]name`.
fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name_part(name),
        None => is_name_part(key),
    }
}

fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_name_part(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::NODES;
    use serde_json::json;

    #[test]
    fn os_image_stream_rules() {
        let hex = "0123456789abcdef".repeat(4);
        let img = |repo: &str| format!("{repo}@sha256:{hex}");
        let good = json!({"metadata": {}, "spec": {}, "status": {
        "defaultStream": "rhel-9",
        "availableStreams": [
            {"name": "rhel-9", "osImage": img("127.0.0.1:5000/openshift/rhcos"), "osExtensionsImage": img("quay.io/x")},
        ]}});
        assert!(object(&OSIMAGESTREAMS, "cluster", &good).is_ok());
        let message = |name: &str, obj: &Value| {
            object(&OSIMAGESTREAMS, name, obj)
                .map_err(|e| (e.code, e.message))
                .err()
        };
        let (code, msg) = message("other", &good).expect("not a singleton");
        assert_eq!(code, 422);
        assert!(
            msg.starts_with(
                "OSImageStream.machineconfiguration.openshift.io \"other\" is invalid: <nil>"
            ),
            "{msg}"
        );
        let mut bad = good.clone();
        bad["status"]["availableStreams"][0]["osImage"] = json!("quay.io/x/rhcos:latest");
        bad["status"]["availableStreams"][0]["osExtensionsImage"] = json!(img("localhost/a/b/c"));
        bad["status"]["defaultStream"] = json!("rhel-10");
        let (_, msg) = message("cluster", &bad).expect("bad images");
        for fragment in [
            "status.availableStreams[0].osImage: Invalid value: \"string\": the OCI Image reference must end",
            "status.availableStreams[0].osExtensionsImage: Invalid value: \"string\": the OCI Image name should follow",
            "defaultStream must reference a stream name from availableStreams",
        ] {
            assert!(msg.contains(fragment), "{msg} lacks {fragment}");
        }
        let mut dup = good.clone();
        let first = dup["status"]["availableStreams"][0].clone();
        if let Some(list) = dup["status"]["availableStreams"].as_array_mut() {
            list.push(first);
        }
        assert!(message("cluster", &dup).is_some_and(|(_, m)| m.contains("Duplicate value")));
        assert!(
            message("cluster", &json!({"metadata": {}})).is_none(),
            "status is optional"
        );
    }

    #[test]
    fn rejects_bad_keys_values_and_types() {
        let good = json!({"metadata":{"labels":{"node-role.kubernetes.io/worker":""},"annotations":{"osstream.openshift.io/desired-stream":"rhel-10 (any text)"}}});
        assert!(object(&NODES, "worker-0", &good).is_ok());

        let bad_value = json!({"metadata":{"labels":{"a":"has space"}}});
        assert_eq!(
            object(&NODES, "worker-0", &bad_value).map_err(|e| e.code),
            Err(422)
        );
        let bad_key = json!({"metadata":{"annotations":{"Bad_Prefix/x":"v"}}});
        assert_eq!(
            object(&NODES, "worker-0", &bad_key).map_err(|e| e.code),
            Err(422)
        );
        let not_string = json!({"metadata":{"annotations":{"a":1}}});
        assert_eq!(
            object(&NODES, "worker-0", &not_string).map_err(|e| e.code),
            Err(400)
        );
        assert_eq!(
            object(&NODES, "Worker_0", &good).map_err(|e| e.code),
            Err(422)
        );
    }

    #[test]
    fn events_v1_need_the_new_apis_fields() {
        use crate::fakes::apiserver::discovery::EVENTS_V1;
        let good = json!({
            "metadata": {"name": "worker.1", "namespace": "default"},
            "eventTime": "2026-12-01T10:00:00.000000Z",
            "type": "Normal",
            "reason": "NodeTargeted",
            "action": "Target",
            "note": "x",
            "reportingController": "streamd-rollout",
            "reportingInstance": "a",
            "regarding": {"kind": "StreamPool", "name": "worker"},
        });
        assert!(object(&EVENTS_V1, "worker.1", &good).is_ok());
        let mut elsewhere = good.clone();
        elsewhere["metadata"]["namespace"] = json!("ns1");
        let mut no_time = good.clone();
        no_time["eventTime"] = Value::Null;
        let mut long_note = good.clone();
        long_note["note"] = json!("x".repeat(1025));
        let mut bad_type = good.clone();
        bad_type["type"] = json!("Info");
        let mut no_action = good;
        no_action["action"] = json!("");
        for bad in [elsewhere, no_time, long_note, bad_type, no_action] {
            assert_eq!(
                object(&EVENTS_V1, "worker.1", &bad).map_err(|e| e.code),
                Err(422),
                "{bad}"
            );
        }
    }
}
