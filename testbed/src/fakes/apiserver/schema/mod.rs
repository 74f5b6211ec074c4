//! Validation of a custom resource against its CRD's `openAPIV3Schema`, as kube-apiserver's
//! apiextensions server does on create, update, patch and the `status` subresource
//! (kubernetes/apiextensions-apiserver: pkg/registry/customresource/strategy.go and
//! validator.go; kube-openapi's pkg/validation/validate for the OpenAPI keywords; messages as
//! pkg/apiserver/validation/validation.go `kubeOpenAPIResultToFieldErrors` turns them into
//! apimachinery field errors). Then the `x-kubernetes-validations` CEL rules ([`rules`]),
//! unless a value has the wrong type (CEL does not run on an object of the wrong shape).
//!
//! Not modelled: pruning of unknown fields, defaulting, ratcheting of unchanged invalid values
//! on update, `format` checks, `uniqueItems`, `multipleOf`, `*Properties`, `allOf`/`oneOf`/
//! `anyOf`/`not`.

pub mod rules;

use serde_json::Value;

/// One field error: the field path and the error body (`Invalid value: …`), as
/// `field.Error.Field` and `field.Error.ErrorBody()` render them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `spec.target.stream`, `status.conditions[1]`, or `<nil>`.
    pub field: String,
    /// `Invalid value: "x": …`, `Required value`, `Too long: …`, …
    pub body: String,
}

impl FieldError {
    fn new(field: &str, body: String) -> Self {
        FieldError {
            field: if field.is_empty() {
                "<nil>".into()
            } else {
                field.into()
            },
            body,
        }
    }
}

/// The message of apiextensions-apiserver's `hasBlockingErr`: CEL rules are skipped when a
/// value has the wrong type.
const RULES_NOT_CHECKED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

/// Root fields the apiextensions server validates itself, whatever the schema says.
const ROOT_META: &[&str] = &["apiVersion", "kind", "metadata"];

/// The field errors of `obj` under `schema` (a version's `openAPIV3Schema`); `old` is the
/// stored object on an update (transition rules run only then). Empty: valid.
pub fn validate(schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut walk = Walk::default();
    walk.node(schema, obj, old, "");
    let mut errors = walk.openapi;
    if walk.type_error {
        errors.push(FieldError::new(
            "",
            format!("Invalid value: \"null\": {RULES_NOT_CHECKED}"),
        ));
    } else {
        errors.extend(walk.cel);
    }
    errors
}

#[derive(Default)]
struct Walk {
    openapi: Vec<FieldError>,
    cel: Vec<FieldError>,
    type_error: bool,
}

/// The JSON type name kube-openapi reports for a value.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() && n.as_f64().is_some_and(|f| f.fract() != 0.0) => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A bad value as `field.Error.ErrorBody` prints it: strings quoted (Go `%q`), numbers and
/// booleans as they are, anything else as JSON.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
            _ => n.to_string(),
        },
        Value::Null => "\"null\"".into(),
        other => other.to_string(),
    }
}

/// A schema bound (a JSON number, maybe written `1000.0`) as Go's `%v` prints a float64.
fn show_bound(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
        _ => v.to_string(),
    }
}

fn type_ok(schema: &Value, v: &Value) -> Result<(), String> {
    let actual = type_name(v);
    if schema["x-kubernetes-int-or-string"] == true {
        return match actual {
            "integer" | "string" => Ok(()),
            _ => Err("integer,string".into()),
        };
    }
    let Some(want) = schema["type"].as_str() else {
        return Ok(());
    };
    let ok = match want {
        "number" => matches!(actual, "integer" | "number"),
        other => other == actual,
    };
    if ok { Ok(()) } else { Err(want.into()) }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

impl Walk {
    fn invalid(&mut self, path: &str, v: &Value, detail: String) {
        self.openapi.push(FieldError::new(
            path,
            format!("Invalid value: {}: {detail}", show(v)),
        ));
    }

    fn node(&mut self, schema: &Value, v: &Value, old: Option<&Value>, path: &str) {
        if v.is_null() && schema["nullable"] == true {
            return;
        }
        if let Err(want) = type_ok(schema, v) {
            let actual = type_name(v);
            self.type_error = true;
            self.openapi.push(FieldError::new(
                path,
                format!(
                    "Invalid value: \"{actual}\": {path} in body must be of type {want}: \"{actual}\""
                ),
            ));
            return;
        }
        if let Some(allowed) = schema["enum"].as_array()
            && !allowed.contains(v)
        {
            let values: Vec<String> = allowed
                .iter()
                .map(|a| match a {
                    Value::String(s) => format!("{s:?}"),
                    other => format!("{:?}", other.to_string()),
                })
                .collect();
            self.openapi.push(FieldError::new(
                path,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    show(v),
                    values.join(", ")
                ),
            ));
        }
        match v {
            Value::String(s) => self.string(schema, s, v, path),
            Value::Number(n) => self.number(schema, n.as_f64().unwrap_or_default(), v, path),
            Value::Array(items) => self.array(schema, items, old, path),
            Value::Object(map) => self.object(schema, map, old, path),
            Value::Bool(_) | Value::Null => {}
        }
        self.rules(schema, v, old, path);
    }

    fn string(&mut self, schema: &Value, s: &str, v: &Value, path: &str) {
        let chars = s.chars().count() as u64;
        if let Some(max) = schema["maxLength"].as_u64()
            && chars > max
        {
            self.openapi.push(FieldError::new(
                path,
                // apimachinery ≥ v0.32 (field.TooLong); "byte" for 1 since v0.34.
                format!(
                    "Too long: may not be more than {max} {}",
                    if max == 1 { "byte" } else { "bytes" }
                ),
            ));
        }
        if let Some(min) = schema["minLength"].as_u64()
            && chars < min
        {
            self.invalid(
                path,
                v,
                format!("{path} in body should be at least {min} chars long"),
            );
        }
        if let Some(pattern) = schema["pattern"].as_str() {
            // kube-openapi compiles the pattern with Go's regexp (RE2), as the regex crate.
            match regex::Regex::new(pattern) {
                Ok(re) if re.is_match(s) => {}
                Ok(_) => self.invalid(path, v, format!("{path} in body should match '{pattern}'")),
                Err(err) => self.invalid(path, v, format!("pattern does not compile: {err}")),
            }
        }
    }

    fn number(&mut self, schema: &Value, n: f64, v: &Value, path: &str) {
        if let Some(max) = schema["maximum"].as_f64() {
            let exclusive = schema["exclusiveMaximum"] == true;
            if n > max || (exclusive && n == max) {
                let than = if exclusive {
                    "less than"
                } else {
                    "less than or equal to"
                };
                let bound = show_bound(&schema["maximum"]);
                self.invalid(path, v, format!("{path} in body should be {than} {bound}"));
            }
        }
        if let Some(min) = schema["minimum"].as_f64() {
            let exclusive = schema["exclusiveMinimum"] == true;
            if n < min || (exclusive && n == min) {
                let than = if exclusive {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                let bound = show_bound(&schema["minimum"]);
                self.invalid(path, v, format!("{path} in body should be {than} {bound}"));
            }
        }
    }

    fn array(&mut self, schema: &Value, items: &[Value], old: Option<&Value>, path: &str) {
        let len = items.len();
        if let Some(max) = schema["maxItems"].as_u64()
            && len as u64 > max
        {
            self.openapi.push(FieldError::new(
                path,
                format!(
                    "Too many: {len}: must have at most {max} {}",
                    if max == 1 { "item" } else { "items" }
                ),
            ));
        }
        if let Some(min) = schema["minItems"].as_u64()
            && (len as u64) < min
        {
            self.invalid(
                path,
                &Value::from(len),
                format!("{path} in body should have at least {min} items"),
            );
        }
        let map_keys: Vec<&str> = if schema["x-kubernetes-list-type"] == "map" {
            schema["x-kubernetes-list-map-keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect()
        } else {
            Vec::new()
        };
        let key_of = |item: &Value| -> Value {
            let mut key = serde_json::Map::new();
            for k in &map_keys {
                key.insert(
                    (*k).to_string(),
                    item.get(*k).cloned().unwrap_or(Value::Null),
                );
            }
            Value::Object(key)
        };
        let mut seen: Vec<Value> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            // Items of a map list correlate with the stored item of the same key (for
            // transition rules); other lists' items do not.
            let old_item = if map_keys.is_empty() {
                None
            } else {
                let key = key_of(item);
                if seen.contains(&key) {
                    self.openapi
                        .push(FieldError::new(&at, format!("Duplicate value: {key}")));
                }
                seen.push(key.clone());
                old.and_then(Value::as_array)
                    .and_then(|o| o.iter().find(|o| key_of(o) == key))
            };
            self.node(&schema["items"], item, old_item, &at);
        }
    }

    fn object(
        &mut self,
        schema: &Value,
        map: &serde_json::Map<String, Value>,
        old: Option<&Value>,
        path: &str,
    ) {
        for name in schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !map.contains_key(name) {
                self.openapi
                    .push(FieldError::new(&child(path, name), "Required value".into()));
            }
        }
        let props = schema["properties"].as_object();
        for (name, value) in map {
            if path.is_empty() && ROOT_META.contains(&name.as_str()) {
                continue;
            }
            let sub = match props.and_then(|p| p.get(name)) {
                Some(s) => s,
                None if schema["additionalProperties"].is_object() => {
                    &schema["additionalProperties"]
                }
                // Unknown fields: the real server prunes them; nothing to validate.
                None => continue,
            };
            let old_value = old.and_then(|o| o.get(name));
            self.node(sub, value, old_value, &child(path, name));
        }
    }

    fn rules(&mut self, schema: &Value, v: &Value, old: Option<&Value>, path: &str) {
        let Some(entries) = schema["x-kubernetes-validations"].as_array() else {
            return;
        };
        // What `field.Invalid(fldPath, sts.Type, …)` shows as the value: the schema's type
        // (empty for an int-or-string).
        let sts_type = schema["type"].as_str().unwrap_or_default();
        for entry in entries {
            let rule = rules::Rule::from_entry(path, entry);
            let detail = match rules::compile(&rule.rule) {
                Err(err) => Some(format!("{err}")),
                Ok(program) => {
                    let transition = program.references().has_variable("oldSelf");
                    if transition && old.is_none() {
                        continue;
                    }
                    match rules::evaluate(&program, schema, v, old.filter(|_| transition)) {
                        Ok(true) => None,
                        Ok(false) => Some(rule.failure_message()),
                        Err(err) => Some(format!("{}: {err}", rule.error_string())),
                    }
                }
            };
            if let Some(detail) = detail {
                let field = match entry["fieldPath"].as_str() {
                    Some(fp) if !fp.is_empty() => format!("{path}{fp}"),
                    _ => path.to_string(),
                };
                let body = match entry["reason"].as_str() {
                    Some("FieldValueRequired") => format!("Required value: {detail}"),
                    Some("FieldValueForbidden") => format!("Forbidden: {detail}"),
                    _ => format!("Invalid value: {sts_type:?}: {detail}"),
                };
                self.cel.push(FieldError::new(&field, body));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
                        "count": {"type": "integer", "minimum": 1.0, "maximum": 10.0, "nullable": true},
                        "day": {"type": "string", "enum": ["Mon", "Tue"]},
                        "list": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                        "max": {"x-kubernetes-int-or-string": true},
                        "keep": {
                            "type": "integer",
                            "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "may not shrink"}],
                        },
                    },
                    "x-kubernetes-validations": [{"rule": "!has(self.day) || has(self.count)"}],
                },
            },
        })
    }

    fn bodies(obj: Value, old: Option<Value>) -> Vec<String> {
        validate(&schema(), &obj, old.as_ref())
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.body))
            .collect()
    }

    #[test]
    fn openapi_keywords_speak_like_kube_apiserver() {
        assert!(
            bodies(
                json!({"spec": {"name": "ab", "count": null, "max": "5%"}}),
                None
            )
            .is_empty()
        );
        assert_eq!(
            bodies(
                json!({"spec": {"name": "Abcdef", "day": "Sun", "list": ["a", "b", "c"]}}),
                None
            ),
            [
                "spec.day: Unsupported value: \"Sun\": supported values: \"Mon\", \"Tue\"",
                "spec.list: Too many: 3: must have at most 2 items",
                "spec.name: Too long: may not be more than 5 bytes",
                "spec.name: Invalid value: \"Abcdef\": spec.name in body should match '^[a-z]+$'",
                "spec: Invalid value: \"object\": failed rule: !has(self.day) || has(self.count)",
            ]
        );
        assert_eq!(
            bodies(json!({"spec": {"name": "a", "count": 11}}), None),
            [
                "spec.count: Invalid value: 11: spec.count in body should be less than or equal to 10"
            ]
        );
        assert_eq!(
            bodies(json!({"spec": {"count": 0}}), None),
            [
                "spec.name: Required value",
                "spec.count: Invalid value: 0: spec.count in body should be greater than or equal to 1",
            ]
        );
    }

    #[test]
    fn a_wrong_type_stops_the_rules() {
        assert_eq!(
            bodies(
                json!({"spec": {"name": "a", "max": true, "day": "Mon"}}),
                None
            ),
            [
                "spec.max: Invalid value: \"boolean\": spec.max in body must be of type integer,string: \"boolean\"",
                format!("<nil>: Invalid value: \"null\": {RULES_NOT_CHECKED}").as_str(),
            ]
        );
    }

    #[test]
    fn transition_rules_run_on_update_only() {
        let obj = json!({"spec": {"name": "a", "keep": 1}});
        assert!(bodies(obj.clone(), None).is_empty());
        assert!(bodies(obj.clone(), Some(json!({"spec": {"keep": 1}}))).is_empty());
        assert_eq!(
            bodies(obj, Some(json!({"spec": {"keep": 2}}))),
            ["spec.keep: Invalid value: \"integer\": may not shrink"]
        );
    }
}
