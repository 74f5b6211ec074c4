//! The object-metadata validation kube-apiserver applies to every write, so that a
//! client writing a malformed label or annotation fails here as it would in a cluster.

use serde_json::Value;

use super::discovery::ResourceDef;
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
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, &causes))
    }
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
    use crate::apiserver::discovery::NODES;
    use serde_json::json;

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
}
