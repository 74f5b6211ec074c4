//! The patch formats kube-apiserver accepts for JSON resources: JSON merge patch
//! (RFC 7386), strategic merge patch (approximated) and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// Why a patch could not be applied.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PatchError {
    /// The patch document itself is malformed (answered with 400).
    Malformed(String),
    /// The patch is well-formed but does not apply to the object (answered with 422).
    Failed(String),
}

/// Applies an RFC 7386 JSON merge patch to `target`.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.as_str()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The merge key of the strategic-merge lists the served types have; other lists are replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" | "addresses" => Some("type"),
        _ => None,
    }
}

/// Applies a strategic merge patch: maps merge like a merge patch, `$patch: delete|replace`
/// directives are honoured, `conditions`/`addresses` lists merge by `type`, and the
/// ordering/retain directives (`$setElementOrder/…`, `$retainKeys`) are ignored.
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Malformed(
            "a strategic merge patch must be a JSON object".into(),
        ));
    };
    if directive(patch) == Some("delete") {
        return Err(PatchError::Malformed(
            "$patch: delete is not allowed at the top level".into(),
        ));
    }
    merge_map(target, patch)
}

fn directive(map: &Map<String, Value>) -> Option<&str> {
    map.get("$patch").and_then(Value::as_str)
}

/// `map` without its `$`-prefixed directive keys, recursively.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(target: &mut Value, patch: &Map<String, Value>) -> Result<(), PatchError> {
    match directive(patch) {
        None | Some("merge") => {}
        Some("replace") => {
            *target = strip_directives(&Value::Object(patch.clone()));
            return Ok(());
        }
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "unknown patch directive {other:?}"
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(vm) if directive(vm) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(vm) => merge_map(t.entry(k.as_str()).or_insert(Value::Null), vm)?,
            Value::Array(items) => {
                let key = merge_key(k).filter(|_| items.iter().all(Value::is_object));
                match (key, t.get_mut(k)) {
                    (Some(key), Some(Value::Array(existing))) => {
                        merge_list(existing, items, key)?;
                    }
                    _ => {
                        let items: Vec<Value> = items
                            .iter()
                            .filter(|i| !is_delete_directive(i))
                            .map(strip_directives)
                            .collect();
                        t.insert(k.clone(), Value::Array(items));
                    }
                }
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn is_delete_directive(v: &Value) -> bool {
    v.as_object().and_then(directive) == Some("delete")
}

fn merge_list(existing: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), PatchError> {
    for item in items {
        let Some(obj) = item.as_object() else {
            continue;
        };
        let Some(id) = obj.get(key) else {
            return Err(PatchError::Malformed(format!(
                "list element is missing its merge key {key:?}"
            )));
        };
        let pos = existing.iter().position(|e| e.get(key) == Some(id));
        match (directive(obj), pos) {
            (Some("delete"), _) => existing.retain(|e| e.get(key) != Some(id)),
            (_, Some(pos)) => merge_map(&mut existing[pos], obj)?,
            (_, None) => {
                let mut fresh = Value::Null;
                merge_map(&mut fresh, obj)?;
                existing.push(fresh);
            }
        }
    }
    Ok(())
}

/// Applies an RFC 6902 JSON patch; the document is only replaced if every operation succeeds.
pub(crate) fn json_patch(mut doc: Value, patch: &Value) -> Result<Value, PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::Malformed("a JSON patch must be an array of operations".into())
    })?;
    for (i, op) in ops.iter().enumerate() {
        let op = op
            .as_object()
            .ok_or_else(|| PatchError::Malformed(format!("operation {i} is not an object")))?;
        let field = |name: &str| -> Result<&Value, PatchError> {
            op.get(name)
                .ok_or_else(|| PatchError::Malformed(format!("operation {i} is missing {name:?}")))
        };
        let pointer = |name: &str| -> Result<(String, Vec<String>), PatchError> {
            let raw = field(name)?.as_str().ok_or_else(|| {
                PatchError::Malformed(format!("operation {i}: {name:?} is not a string"))
            })?;
            Ok((raw.to_string(), parse_pointer(raw)?))
        };
        let name = field("op")?.as_str().unwrap_or_default();
        let (path_str, path) = pointer("path")?;
        match name {
            "add" => add(&mut doc, &path, field("value")?.clone())?,
            "remove" => {
                remove(&mut doc, &path)?;
            }
            "replace" => *lookup_mut(&mut doc, &path)? = field("value")?.clone(),
            "move" => {
                let (from_str, from) = pointer("from")?;
                if path.len() > from.len() && path.starts_with(&from) {
                    return Err(PatchError::Failed(format!(
                        "cannot move {from_str:?} into its own child {path_str:?}"
                    )));
                }
                let value = remove(&mut doc, &from)?;
                add(&mut doc, &path, value)?;
            }
            "copy" => {
                let (_, from) = pointer("from")?;
                let value = lookup_mut(&mut doc, &from)?.clone();
                add(&mut doc, &path, value)?;
            }
            "test" => {
                let want = field("value")?;
                let have = lookup_mut(&mut doc, &path)?;
                if !json_eq(have, want) {
                    return Err(PatchError::Failed(format!(
                        "testing value {path_str} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(PatchError::Malformed(format!(
                    "operation {i}: unknown op {other:?}"
                )));
            }
        }
    }
    Ok(doc)
}

/// Splits an RFC 6901 JSON pointer into unescaped reference tokens (`~1` → `/`, `~0` → `~`).
fn parse_pointer(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer.strip_prefix('/').ok_or_else(|| {
        PatchError::Malformed(format!("JSON pointer {pointer:?} must start with '/'"))
    })?;
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(PatchError::Malformed(format!(
                            "JSON pointer {pointer:?} has an invalid '~' escape"
                        )));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

/// An array index token: decimal digits without leading zeros.
fn array_index(token: &str) -> Option<usize> {
    let well_formed = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    well_formed.then(|| token.parse().ok()).flatten()
}

fn not_found(path: &[String]) -> PatchError {
    PatchError::Failed(format!(
        "path {:?} does not exist",
        format!("/{}", path.join("/"))
    ))
}

fn lookup_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for token in path {
        cur = match cur {
            Value::Object(m) => m.get_mut(token),
            Value::Array(a) => array_index(token).and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| not_found(path))?;
    }
    Ok(cur)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match lookup_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) if last == "-" => {
            a.push(value);
            Ok(())
        }
        Value::Array(a) => match array_index(last) {
            Some(i) if i <= a.len() => {
                a.insert(i, value);
                Ok(())
            }
            _ => Err(PatchError::Failed(format!(
                "array index {last:?} is out of range"
            ))),
        },
        _ => Err(not_found(path)),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(PatchError::Failed(
            "cannot remove the whole document".into(),
        ));
    };
    match lookup_mut(doc, parent)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| not_found(path)),
        Value::Array(a) => match array_index(last) {
            Some(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(not_found(path)),
        },
        _ => Err(not_found(path)),
    }
}

/// JSON equality as RFC 6902 `test` defines it: numbers compare by value.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_appendix_a() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }

    fn apply(doc: Value, patch: Value) -> Result<Value, PatchError> {
        json_patch(doc, &patch)
    }

    #[test]
    fn json_patch_rfc6902_appendix_a() {
        let ok = [
            // A.1 – A.7
            (
                json!({"foo":"bar"}),
                json!([{"op":"add","path":"/baz","value":"qux"}]),
                json!({"baz":"qux","foo":"bar"}),
            ),
            (
                json!({"foo":["bar","baz"]}),
                json!([{"op":"add","path":"/foo/1","value":"qux"}]),
                json!({"foo":["bar","qux","baz"]}),
            ),
            (
                json!({"baz":"qux","foo":"bar"}),
                json!([{"op":"remove","path":"/baz"}]),
                json!({"foo":"bar"}),
            ),
            (
                json!({"foo":["bar","qux","baz"]}),
                json!([{"op":"remove","path":"/foo/1"}]),
                json!({"foo":["bar","baz"]}),
            ),
            (
                json!({"baz":"qux","foo":"bar"}),
                json!([{"op":"replace","path":"/baz","value":"boo"}]),
                json!({"baz":"boo","foo":"bar"}),
            ),
            (
                json!({"foo":{"bar":"baz","waldo":"fred"},"qux":{"corge":"grault"}}),
                json!([{"op":"move","from":"/foo/waldo","path":"/qux/thud"}]),
                json!({"foo":{"bar":"baz"},"qux":{"corge":"grault","thud":"fred"}}),
            ),
            (
                json!({"foo":["all","grass","cows","eat"]}),
                json!([{"op":"move","from":"/foo/1","path":"/foo/3"}]),
                json!({"foo":["all","cows","eat","grass"]}),
            ),
            // A.8
            (
                json!({"baz":"qux","foo":["a",2,"c"]}),
                json!([{"op":"test","path":"/baz","value":"qux"},{"op":"test","path":"/foo/1","value":2}]),
                json!({"baz":"qux","foo":["a",2,"c"]}),
            ),
            // A.10, A.11
            (
                json!({"foo":"bar"}),
                json!([{"op":"add","path":"/child","value":{"grandchild":{}}}]),
                json!({"foo":"bar","child":{"grandchild":{}}}),
            ),
            (
                json!({"foo":"bar"}),
                json!([{"op":"add","path":"/baz","value":"qux","xyz":123}]),
                json!({"foo":"bar","baz":"qux"}),
            ),
            // A.14
            (
                json!({"/":9,"~1":10}),
                json!([{"op":"test","path":"/~01","value":10}]),
                json!({"/":9,"~1":10}),
            ),
            // A.16
            (
                json!({"foo":["bar"]}),
                json!([{"op":"add","path":"/foo/-","value":["abc","def"]}]),
                json!({"foo":["bar",["abc","def"]]}),
            ),
            (
                json!({"a":{"b":1}}),
                json!([{"op":"copy","from":"/a","path":"/c"},{"op":"test","path":"/c/b","value":1.0}]),
                json!({"a":{"b":1},"c":{"b":1}}),
            ),
        ];
        for (doc, patch, want) in ok {
            assert_eq!(apply(doc, patch.clone()), Ok(want), "patch {patch}");
        }

        // A.9, A.12, A.15
        assert!(matches!(
            apply(json!({"baz":"qux"}), json!([{"op":"test","path":"/baz","value":"bar"}])),
            Err(PatchError::Failed(m)) if m.contains("test failed")
        ));
        assert!(matches!(
            apply(
                json!({"foo":"bar"}),
                json!([{"op":"add","path":"/baz/bat","value":"qux"}])
            ),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(
            apply(
                json!({"/":9,"~1":10}),
                json!([{"op":"test","path":"/~01","value":"10"}])
            ),
            Err(PatchError::Failed(_))
        ));
    }

    #[test]
    fn json_patch_is_atomic_and_rejects_malformed_documents() {
        let doc = json!({"a": 1});
        let patch = json!([{"op":"add","path":"/b","value":2},{"op":"remove","path":"/zzz"}]);
        assert!(matches!(
            json_patch(doc.clone(), &patch),
            Err(PatchError::Failed(_))
        ));
        for bad in [
            json!({"op":"add"}),
            json!([{"path":"/a"}]),
            json!([{"op":"frobnicate","path":"/a"}]),
            json!([{"op":"add","path":"a","value":1}]),
            json!([{"op":"add","path":"/a~2","value":1}]),
            json!([{"op":"replace","path":"/a"}]),
        ] {
            assert!(
                matches!(json_patch(doc.clone(), &bad), Err(PatchError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            apply(
                json!({"a":[1]}),
                json!([{"op":"add","path":"/a/01","value":2}])
            ),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(
            apply(
                json!({"a":{"b":{}}}),
                json!([{"op":"move","from":"/a","path":"/a/b/c"}])
            ),
            Err(PatchError::Failed(_))
        ));
    }

    #[test]
    fn json_patch_escapes_annotation_keys() {
        let doc =
            json!({"metadata":{"annotations":{"osstream.openshift.io/desired-stream":"rhel-9"}}});
        let patch = json!([
            {"op":"test","path":"/metadata/annotations/osstream.openshift.io~1desired-stream","value":"rhel-9"},
            {"op":"replace","path":"/metadata/annotations/osstream.openshift.io~1desired-stream","value":"rhel-10"},
        ]);
        assert_eq!(
            json_patch(doc, &patch),
            Ok(
                json!({"metadata":{"annotations":{"osstream.openshift.io/desired-stream":"rhel-10"}}})
            )
        );
    }

    #[test]
    fn strategic_merge_patch_merges_conditions_by_type_and_honours_directives() {
        let mut node = json!({
            "metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"taints": [{"key": "x"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DiskPressure", "status": "False"},
            ]},
        });
        let patch = json!({
            "metadata": {"labels": {"a": null, "c": "3"}},
            "spec": {"taints": [{"key": "y"}]},
            "status": {
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "Custom"}],
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "DiskPressure", "$patch": "delete"},
                    {"type": "Custom", "status": "True"},
                ],
            },
        });
        strategic_merge_patch(&mut node, &patch).expect("patch applies");
        assert_eq!(
            node,
            json!({
                "metadata": {"labels": {"b": "2", "c": "3"}},
                "spec": {"taints": [{"key": "y"}]},
                "status": {"conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Custom", "status": "True"},
                ]},
            })
        );

        let mut obj = json!({"spec": {"a": 1, "b": 2}, "keep": true});
        strategic_merge_patch(&mut obj, &json!({"spec": {"$patch": "replace", "c": 3}}))
            .expect("replace applies");
        assert_eq!(obj, json!({"spec": {"c": 3}, "keep": true}));
        strategic_merge_patch(&mut obj, &json!({"spec": {"$patch": "delete"}}))
            .expect("delete applies");
        assert_eq!(obj, json!({"keep": true}));
        assert!(strategic_merge_patch(&mut obj, &json!([1])).is_err());
    }
}
