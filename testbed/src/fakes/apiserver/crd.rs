//! CustomResourceDefinitions: a CRD posted to `apiextensions.k8s.io/v1` is validated, defaulted
//! and marked Established, and each of its served versions becomes a served resource (discovery,
//! CRUD, watch, the `status` subresource, its scope), as kube-apiserver's apiextensions server
//! does. Deleting the CRD stops serving it and deletes its objects.

use std::sync::Mutex;

use serde_json::{Value, json};

use super::clock;
use super::discovery::{OBJECT_META_FIELDS, ResourceDef};

/// The verbs of a custom resource (apiextensions-apiserver serves `deletecollection` too; the
/// fake serves none of that verb anywhere).
const CR_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// Every definition handed out so far, so that re-serving an unchanged CRD reuses its
/// definitions instead of leaking new ones (definitions are `'static`, like the built-in table).
static INTERNED: Mutex<Vec<&'static ResourceDef>> = Mutex::new(Vec::new());

fn leak_str(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The served versions of a (validated) CRD as resource definitions.
pub(crate) fn served_defs(crd: &Value) -> Vec<&'static ResourceDef> {
    let spec = &crd["spec"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let group = text(&spec["group"]);
    let names = &spec["names"];
    let plural = text(&names["plural"]);
    let kind = text(&names["kind"]);
    let singular = match names["singular"].as_str() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => kind.to_lowercase(),
    };
    let short_names: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let namespaced = spec["scope"] == "Namespaced";
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    let mut defs = Vec::new();
    for version in spec["versions"].as_array().into_iter().flatten() {
        if version["served"] != true {
            continue;
        }
        let candidate = ResourceDef {
            group: "",
            version: "",
            plural: "",
            singular: "",
            kind: "",
            namespaced,
            verbs: CR_VERBS,
            short_names: &[],
            status_subresource: version.pointer("/subresources/status").is_some(),
            custom: true,
            field_labels: Some(OBJECT_META_FIELDS),
            generation: true,
        };
        let name = text(&version["name"]);
        let existing = interned.iter().copied().find(|d| {
            d.group == group
                && d.version == name
                && d.plural == plural
                && d.singular == singular
                && d.kind == kind
                && d.namespaced == namespaced
                && d.status_subresource == candidate.status_subresource
                && d.short_names
                    .iter()
                    .copied()
                    .eq(short_names.iter().map(String::as_str))
        });
        let def = match existing {
            Some(def) => def,
            None => {
                let short: Vec<&'static str> = short_names.iter().map(|s| leak_str(s)).collect();
                let def: &'static ResourceDef = Box::leak(Box::new(ResourceDef {
                    group: leak_str(&group),
                    version: leak_str(&name),
                    plural: leak_str(&plural),
                    singular: leak_str(&singular),
                    kind: leak_str(&kind),
                    short_names: Box::leak(short.into_boxed_slice()),
                    ..candidate
                }));
                interned.push(def);
                def
            }
        };
        defs.push(def);
    }
    defs
}

/// The defaults the real server applies to a CRD on every write
/// (kubernetes/apiextensions-apiserver: pkg/apis/apiextensions/v1/defaults.go,
/// `SetDefaults_CustomResourceDefinitionSpec`): `names.singular` is the lower-cased kind,
/// `names.listKind` is `<kind>List`, `conversion.strategy` is `None`.
pub(crate) fn default(crd: &mut Value) {
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !kind.is_empty() {
            if names
                .get("singular")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                names.insert("singular".into(), json!(kind.to_lowercase()));
            }
            if names
                .get("listKind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                names.insert("listKind".into(), json!(format!("{kind}List")));
            }
        }
    }
    spec.entry("conversion")
        .or_insert_with(|| json!({ "strategy": "None" }));
}

/// The field errors of a CRD stored as `name` (the subset of
/// kubernetes/apiextensions-apiserver: pkg/apis/apiextensions/validation/validation.go,
/// `ValidateCustomResourceDefinition`, that a client can get wrong by mistake).
pub(crate) fn validate(name: &str, crd: &Value, causes: &mut Vec<(String, String)>) {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec
        .pointer("/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name != format!("{plural}.{group}") {
        causes.push((
            "metadata.name".into(),
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if group.is_empty() {
        causes.push(("spec.group".into(), "Required value".into()));
    } else if !group.contains('.') {
        causes.push((
            "spec.group".into(),
            format!("Invalid value: {group:?}: should be a domain with at least one dot"),
        ));
    }
    for field in ["plural", "kind"] {
        if spec
            .pointer(&format!("/names/{field}"))
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push((format!("spec.names.{field}"), "Required value".into()));
        }
    }
    match spec["scope"].as_str() {
        Some("Cluster" | "Namespaced") => {}
        other => causes.push((
            "spec.scope".into(),
            format!(
                "Unsupported value: {:?}: supported values: \"Cluster\", \"Namespaced\"",
                other.unwrap_or_default()
            ),
        )),
    }
    let versions = spec["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push((
            "spec.versions".into(),
            "Invalid value: \"null\": must have exactly one version marked as storage version"
                .into(),
        ));
        return;
    }
    let storage = versions.iter().filter(|v| v["storage"] == true).count();
    if storage != 1 {
        causes.push((
            "spec.versions".into(),
            format!(
                "Invalid value: {storage}: must have exactly one version marked as storage version"
            ),
        ));
    }
    if !versions.iter().any(|v| v["served"] == true) {
        causes.push((
            "spec.versions".into(),
            "Invalid value: \"[]\": must serve at least one version".into(),
        ));
    }
    for (i, version) in versions.iter().enumerate() {
        if version.pointer("/schema/openAPIV3Schema").is_none() {
            causes.push((
                format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "Required value: schemas are required".into(),
            ));
        }
    }
}

/// The status the API server's naming and establishing controllers give an accepted CRD
/// (kubernetes/apiextensions-apiserver: pkg/controller/status/naming_controller.go and
/// pkg/controller/establish/establishing_controller.go).
pub(crate) fn established_status(crd: &Value) -> Value {
    let now = clock::now_rfc3339();
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == true)
        .map(|v| v["name"].clone())
        .collect();
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "storedVersions": storage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "metadata": { "name": "streampools.osstream.openshift.io" },
            "spec": {
                "group": "osstream.openshift.io",
                "scope": "Cluster",
                "names": { "plural": "streampools", "kind": "StreamPool", "shortNames": ["sp"] },
                "versions": [{
                    "name": "v1alpha1", "served": true, "storage": true,
                    "schema": { "openAPIV3Schema": { "type": "object" } },
                    "subresources": { "status": {} },
                }],
            },
        })
    }

    #[test]
    fn served_versions_become_interned_definitions() {
        let mut c = crd();
        default(&mut c);
        assert_eq!(c["spec"]["names"]["singular"], "streampool");
        assert_eq!(c["spec"]["names"]["listKind"], "StreamPoolList");
        let defs = served_defs(&c);
        assert_eq!(defs.len(), 1);
        let d = defs[0];
        assert_eq!(
            (
                d.group,
                d.version,
                d.plural,
                d.kind,
                d.namespaced,
                d.status_subresource
            ),
            (
                "osstream.openshift.io",
                "v1alpha1",
                "streampools",
                "StreamPool",
                false,
                true
            )
        );
        assert_eq!(d.short_names, &["sp"]);
        assert!(
            std::ptr::eq(d, served_defs(&c)[0]),
            "re-serving reuses the definition"
        );
        let mut causes = Vec::new();
        validate("streampools.osstream.openshift.io", &c, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn invalid_crds_name_their_fields() {
        let mut c = crd();
        c["spec"]["scope"] = json!("Global");
        c["spec"]["versions"][0]["storage"] = json!(false);
        let mut causes = Vec::new();
        validate("pools.osstream.openshift.io", &c, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["metadata.name", "spec.scope", "spec.versions"],
            "{causes:?}"
        );
    }
}
