//! Property tests of the rpm-ostree deployment dictionaries read off D-Bus.

use std::collections::{BTreeMap, HashMap};

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use zbus::zvariant::{Array, Dict, ObjectPath, OwnedValue, Signature, StructureBuilder, Value};

use streamd::backend::Deployment;

use super::{config, fail};

const CONFIG_KEY: &str = "ostree.container.image-config";

/// A model of a D-Bus value, turned into a real `zvariant::Value` per case.
#[derive(Debug, Clone)]
enum V {
    U8(u8),
    Bool(bool),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Path(String),
    Sig,
    Variant(Box<V>),
    StrArray(Vec<String>),
    I32Array(Vec<i32>),
    VarArray(Vec<V>),
    Dict(Vec<(String, V)>),
    IntDict(Vec<(i32, String)>),
    Struct(Vec<V>),
}

fn to_value(v: &V) -> Value<'static> {
    match v {
        V::U8(x) => Value::U8(*x),
        V::Bool(x) => Value::Bool(*x),
        V::I16(x) => Value::I16(*x),
        V::U16(x) => Value::U16(*x),
        V::I32(x) => Value::I32(*x),
        V::U32(x) => Value::U32(*x),
        V::I64(x) => Value::I64(*x),
        V::U64(x) => Value::U64(*x),
        V::F64(x) => Value::F64(*x),
        V::Str(s) => Value::from(s.clone()),
        V::Path(p) => Value::ObjectPath(ObjectPath::try_from(p.clone()).expect("object path")),
        V::Sig => Value::Signature(Signature::Str),
        V::Variant(b) => Value::Value(Box::new(to_value(b))),
        V::StrArray(xs) => {
            let mut a = Array::new(&Signature::Str);
            for x in xs {
                a.append(Value::from(x.clone())).expect("append s");
            }
            Value::Array(a)
        }
        V::I32Array(xs) => {
            let mut a = Array::new(&Signature::I32);
            for x in xs {
                a.append(Value::I32(*x)).expect("append i");
            }
            Value::Array(a)
        }
        V::VarArray(xs) => {
            let mut a = Array::new(&Signature::Variant);
            for x in xs {
                a.append(Value::Value(Box::new(to_value(x))))
                    .expect("append v");
            }
            Value::Array(a)
        }
        V::Dict(entries) => {
            let mut d = Dict::new(&Signature::Str, &Signature::Variant);
            for (k, x) in entries {
                d.append(Value::from(k.clone()), Value::Value(Box::new(to_value(x))))
                    .expect("append {sv}");
            }
            Value::Dict(d)
        }
        V::IntDict(entries) => {
            let mut d = Dict::new(&Signature::I32, &Signature::Str);
            for (k, s) in entries {
                d.append(Value::I32(*k), Value::from(s.clone()))
                    .expect("append {is}");
            }
            Value::Dict(d)
        }
        V::Struct(xs) => {
            let mut b = StructureBuilder::new();
            for x in xs {
                b = b.append_field(to_value(x));
            }
            Value::Structure(b.build().expect("structure"))
        }
    }
}

fn to_dict(m: &HashMap<String, V>) -> HashMap<String, OwnedValue> {
    m.iter()
        .map(|(k, v)| (k.clone(), to_value(v).try_to_owned().expect("owned")))
        .collect()
}

fn v_str() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z0-9.:/@-]{0,16}", 1 => any::<String>()]
}

fn labels_json() -> impl Strategy<Value = (String, BTreeMap<String, String>)> {
    let value = prop_oneof![
        v_str().prop_map(serde_json::Value::String),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<bool>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
    ];
    btree_map("[a-z.]{1,10}", value, 0..4).prop_map(|m| {
        let strings = m
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let labels: serde_json::Map<String, serde_json::Value> = m.into_iter().collect();
        let doc = serde_json::json!({ "architecture": "amd64", "config": { "Labels": labels } });
        (doc.to_string(), strings)
    })
}

fn config_json() -> impl Strategy<Value = String> {
    prop_oneof![
        labels_json().prop_map(|(j, _)| j),
        select(vec![
            "{}",
            "null",
            "[1]",
            r#"{"config":{"Labels":null}}"#,
            "{not json",
            r#"{"config":{"Labels":{"x":"y"}}"#,
            "",
        ])
        .prop_map(String::from),
    ]
}

fn arb_v() -> impl Strategy<Value = V> {
    let scalars = prop_oneof![
        any::<u8>().prop_map(V::U8),
        any::<bool>().prop_map(V::Bool),
        any::<i16>().prop_map(V::I16),
        any::<u16>().prop_map(V::U16),
        any::<i32>().prop_map(V::I32),
        any::<u32>().prop_map(V::U32),
        any::<i64>().prop_map(V::I64),
        any::<u64>().prop_map(V::U64),
        any::<f64>().prop_map(V::F64),
    ];
    let others = prop_oneof![
        3 => v_str().prop_map(V::Str),
        1 => config_json().prop_map(V::Str),
        1 => "(/[a-z0-9_]{1,6}){1,3}".prop_map(V::Path),
        1 => Just(V::Sig),
        2 => vec(v_str(), 0..4).prop_map(V::StrArray),
        1 => vec(any::<i32>(), 0..4).prop_map(V::I32Array),
        1 => vec((any::<i32>(), v_str()), 0..3).prop_map(V::IntDict),
    ];
    let leaf = prop_oneof![scalars, others];
    leaf.prop_recursive(3, 16, 4, |inner| {
        let key = prop_oneof![Just(CONFIG_KEY.to_string()), "[a-z.-]{1,12}"];
        prop_oneof![
            inner.clone().prop_map(|v| V::Variant(Box::new(v))),
            vec(inner.clone(), 0..4).prop_map(V::VarArray),
            vec((key, inner.clone()), 0..4).prop_map(V::Dict),
            vec(inner, 1..4).prop_map(V::Struct),
        ]
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    S,
    B,
    I,
    As,
    Meta,
}

/// The documented keys: name, type, required.
const FIELDS: [(&str, Kind, bool); 16] = [
    ("base-commit-meta", Kind::Meta, false),
    ("id", Kind::S, true),
    ("osname", Kind::S, true),
    ("serial", Kind::I, true),
    ("checksum", Kind::S, true),
    ("booted", Kind::B, false),
    ("staged", Kind::B, false),
    ("pinned", Kind::B, false),
    ("finalization-locked", Kind::B, false),
    ("version", Kind::S, false),
    ("container-image-reference", Kind::S, false),
    ("container-image-reference-digest", Kind::S, false),
    ("requested-packages", Kind::As, false),
    ("requested-base-removals", Kind::As, false),
    ("requested-local-packages", Kind::As, false),
    ("requested-base-local-replacements", Kind::As, false),
];

fn unwrap_v(v: &V) -> &V {
    match v {
        V::Variant(b) => unwrap_v(b),
        other => other,
    }
}

/// Whether `v` is acceptable for a key of `kind`: variants are looked through; an empty array
/// of any element type is an empty list; metadata of other types is skipped, and an image
/// config that is not JSON leaves the labels unknown ([`bad_image_config`]), not the
/// deployment unreadable.
fn conforms(kind: Kind, v: &V) -> bool {
    match (kind, unwrap_v(v)) {
        (Kind::S, V::Str(_)) | (Kind::B, V::Bool(_)) | (Kind::I, V::I32(_)) => true,
        (Kind::As, V::StrArray(_)) => true,
        (Kind::As, V::VarArray(xs)) => xs.iter().all(|x| matches!(unwrap_v(x), V::Str(_))),
        (Kind::As, V::I32Array(xs)) => xs.is_empty(),
        (Kind::Meta, V::IntDict(_) | V::Dict(_)) => true,
        _ => false,
    }
}

/// Whether the model's commit metadata holds an image config string that is not JSON (the
/// last entry of the key wins, as in a dictionary).
fn bad_image_config(model: &HashMap<String, V>) -> bool {
    match model.get("base-commit-meta").map(unwrap_v) {
        Some(V::Dict(entries)) => entries
            .iter()
            .rev()
            .find(|(k, _)| k == CONFIG_KEY)
            .is_some_and(|(_, x)| match unwrap_v(x) {
                V::Str(s) => serde_json::from_str::<serde_json::Value>(s).is_err(),
                _ => false,
            }),
        _ => false,
    }
}

fn conforming(kind: Kind) -> BoxedStrategy<V> {
    let base: BoxedStrategy<V> = match kind {
        Kind::S => v_str().prop_map(V::Str).boxed(),
        Kind::B => any::<bool>().prop_map(V::Bool).boxed(),
        Kind::I => any::<i32>().prop_map(V::I32).boxed(),
        Kind::As => prop_oneof![
            vec(v_str(), 0..3).prop_map(V::StrArray),
            vec(v_str().prop_map(V::Str), 0..3).prop_map(V::VarArray),
        ]
        .boxed(),
        Kind::Meta => {
            let key = prop_oneof![Just(CONFIG_KEY.to_string()), "[a-z.-]{1,12}"];
            let value = prop_oneof![
                labels_json().prop_map(|(j, _)| V::Str(j)),
                v_str().prop_map(V::Str),
                any::<i32>().prop_map(V::I32),
            ];
            vec((key, value), 0..3).prop_map(V::Dict).boxed()
        }
    };
    prop_oneof![3 => base.clone(), 1 => base.prop_map(|v| V::Variant(Box::new(v)))]
        .prop_filter("conforming", move |v| conforms(kind, v))
        .boxed()
}

/// A valid deployment dictionary: every required key, some optional ones.
fn valid_base() -> impl Strategy<Value = HashMap<String, V>> {
    let per_field: Vec<BoxedStrategy<Option<(String, V)>>> = FIELDS
        .iter()
        .map(|&(k, kind, required)| {
            let s = conforming(kind).prop_map(move |v| (k.to_string(), v));
            if required {
                s.prop_map(Some).boxed()
            } else {
                option::of(s).boxed()
            }
        })
        .collect();
    per_field.prop_map(|fs| fs.into_iter().flatten().collect())
}

fn field_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(FIELDS.iter().map(|f| f.0).collect::<Vec<_>>()).prop_map(String::from),
        1 => "[a-z-]{1,12}",
    ]
}

fn v_as_string(v: &V) -> Option<String> {
    match unwrap_v(v) {
        V::Str(s) => Some(s.clone()),
        _ => None,
    }
}

fn v_as_strings(v: &V) -> Vec<String> {
    match unwrap_v(v) {
        V::StrArray(xs) => xs.clone(),
        V::VarArray(xs) => xs.iter().filter_map(v_as_string).collect(),
        _ => Vec::new(),
    }
}

fn check_deployment(model: &HashMap<String, V>) -> Result<(), TestCaseError> {
    let failing: Vec<&str> = FIELDS
        .iter()
        .filter(|(k, kind, required)| match model.get(*k) {
            None => *required,
            Some(v) => !conforms(*kind, v),
        })
        .map(|f| f.0)
        .collect();
    match Deployment::from_dict(&to_dict(model)) {
        Ok(d) => {
            prop_assert!(
                failing.is_empty(),
                "accepted with bad {:?}: {:?}",
                failing,
                model
            );
            prop_assert_eq!(Some(d.id), model.get("id").and_then(v_as_string));
            prop_assert_eq!(Some(d.osname), model.get("osname").and_then(v_as_string));
            prop_assert_eq!(d.version, model.get("version").and_then(v_as_string));
            let serial = match model.get("serial").map(unwrap_v) {
                Some(V::I32(i)) => Some(*i),
                _ => None,
            };
            prop_assert_eq!(Some(d.serial), serial);
            let booted = match model.get("booted").map(unwrap_v) {
                Some(V::Bool(b)) => *b,
                _ => false,
            };
            prop_assert_eq!(d.booted, booted);
            prop_assert_eq!(d.image_labels_error.is_some(), bad_image_config(model));
            prop_assert_eq!(
                d.requested_packages,
                model
                    .get("requested-packages")
                    .map(v_as_strings)
                    .unwrap_or_default()
            );
        }
        Err(e) => {
            prop_assert!(
                failing.contains(&e.key.as_str()),
                "{} named, bad keys {:?}",
                e,
                failing
            );
            if e.problem == "missing" {
                prop_assert!(!model.contains_key(&e.key));
            }
            let prefix = format!("rpm-ostree deployment {}: ", e.key);
            prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn deployment_arbitrary_dicts_never_panic(entries in vec((field_key(), arb_v()), 0..8)) {
        let model: HashMap<String, V> = entries.into_iter().collect();
        check_deployment(&model)?;
    }

    #[test]
    fn deployment_valid_base_with_arbitrary_overrides(
        base in valid_base(),
        overrides in vec((field_key(), arb_v()), 0..3),
    ) {
        let mut model = base;
        model.extend(overrides);
        check_deployment(&model)?;
    }

    #[test]
    fn deployment_wrong_type_names_the_key(
        (base, i, v) in (valid_base(), 0..FIELDS.len(), arb_v())
            .prop_filter("a wrong-typed value", |(_, i, v)| !conforms(FIELDS[*i].1, v)),
    ) {
        let mut model = base;
        model.insert(FIELDS[i].0.to_string(), v);
        let e = Deployment::from_dict(&to_dict(&model))
            .err()
            .ok_or_else(|| fail(format!("accepted {model:?}")))?;
        prop_assert_eq!(e.key, FIELDS[i].0);
    }

    #[test]
    fn deployment_missing_required_key_is_named(base in valid_base(), i in 1usize..5) {
        let mut model = base;
        model.remove(FIELDS[i].0);
        let e = Deployment::from_dict(&to_dict(&model))
            .err()
            .ok_or_else(|| fail(format!("accepted {model:?}")))?;
        prop_assert_eq!(e.key, FIELDS[i].0);
        prop_assert_eq!(e.problem, "missing");
    }

    #[test]
    fn deployment_labels_are_the_string_labels(base in valid_base(), (json, want) in labels_json(), wrap in any::<bool>()) {
        let mut model = base;
        let cfg = if wrap { V::Variant(Box::new(V::Str(json))) } else { V::Str(json) };
        model.insert("base-commit-meta".into(), V::Dict(vec![(CONFIG_KEY.into(), cfg), ("version".into(), V::Str("x".into()))]));
        let d = Deployment::from_dict(&to_dict(&model)).map_err(|e| fail(e.to_string()))?;
        prop_assert_eq!(d.image_labels, want);
    }
}
