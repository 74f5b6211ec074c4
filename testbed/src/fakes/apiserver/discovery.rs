//! The resource table and the discovery documents built from it (legacy, non-aggregated
//! discovery plus just enough OpenAPI v3 for kubectl's field-validation probe).

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Version the fake claims to be (OpenShift 4.19 ships Kubernetes 1.32).
pub(crate) const KUBE_VERSION: &str = "v1.32.4";

/// One served resource type. Adding an API group is adding entries to [`RESOURCES`].
#[derive(Debug)]
pub(crate) struct ResourceDef {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) singular: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    pub(crate) verbs: &'static [&'static str],
    pub(crate) short_names: &'static [&'static str],
    /// Whether `<plural>/status` exists (and writes to the main resource keep the old status).
    pub(crate) status_subresource: bool,
    /// Served from a CustomResourceDefinition: a create drops `status` (when there is a status
    /// subresource) and validation errors name the kind as `Kind.group`.
    pub(crate) custom: bool,
    /// The fields a `fieldSelector` may name (`None`: any dotted path, as the fake always
    /// allowed for nodes and events); others are a 400, as the real server's field-label
    /// conversion rejects them.
    pub(crate) field_labels: Option<&'static [&'static str]>,
    /// Whether the server keeps `metadata.generation` (1 on create, +1 on every write that
    /// changes more than `metadata` and `status`), as it does for custom resources and for
    /// types with a spec/status split such as PodDisruptionBudgets.
    pub(crate) generation: bool,
}

/// Field selectors custom resources support (apiextensions-apiserver: `GetAttrs` offers
/// `metadata.name` and `metadata.namespace` only, without `selectableFields`).
pub(crate) const OBJECT_META_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// The defaults every definition below starts from.
const BASE: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "",
    singular: "",
    kind: "",
    namespaced: false,
    verbs: &[],
    short_names: &[],
    status_subresource: false,
    custom: false,
    field_labels: None,
    generation: false,
};

impl ResourceDef {
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `nodes` or `plural.group`, as used in error messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub(crate) fn allows(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }
}

pub(crate) static NODES: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind: "Node",
    namespaced: false,
    verbs: &["get", "list", "watch", "patch", "update"],
    short_names: &["no"],
    status_subresource: true,
    custom: false,
    ..BASE
};

pub(crate) static EVENTS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    verbs: &[
        "create", "get", "list", "watch", "patch", "update", "delete",
    ],
    short_names: &["ev"],
    status_subresource: false,
    custom: false,
    ..BASE
};

/// `events.k8s.io/v1` Events, what kube-runtime's `events::Recorder` writes (the rollout
/// controller's Events). A minimal, separate addition: kube-apiserver stores both Event APIs in
/// one table and converts between them (`note` is core/v1's `message`, `regarding` its
/// `involvedObject`); the fake keeps them apart, so an Event written through one API is not
/// listed through the other. Its create validation is `validate::events_v1`.
pub(crate) static EVENTS_V1: ResourceDef = ResourceDef {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    verbs: CRUD_VERBS,
    short_names: &["ev"],
    field_labels: Some(OBJECT_META_FIELDS),
    ..BASE
};

pub(crate) static NAMESPACES: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "namespaces",
    singular: "namespace",
    kind: "Namespace",
    namespaced: false,
    verbs: &["create", "get", "list", "patch", "update", "watch"],
    short_names: &["ns"],
    status_subresource: false,
    custom: false,
    ..BASE
};

/// Pods: written by whoever runs workloads (the fleet testbed's workload helpers stand in for
/// the controllers and kubelets), deleted gracefully, evicted through `pods/eviction`.
pub(crate) static PODS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    plural: "pods",
    singular: "pod",
    kind: "Pod",
    namespaced: true,
    verbs: CRUD_VERBS,
    short_names: &["po"],
    status_subresource: true,
    // kubernetes/kubernetes: pkg/apis/core/v1/conversion.go, `AddFieldLabelConversionsForPod`.
    field_labels: Some(&[
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ]),
    ..BASE
};

/// `policy/v1` PodDisruptionBudgets; their status is the disruption controller's (`pods.rs`).
pub(crate) static PODDISRUPTIONBUDGETS: ResourceDef = ResourceDef {
    group: "policy",
    version: "v1",
    plural: "poddisruptionbudgets",
    singular: "poddisruptionbudget",
    kind: "PodDisruptionBudget",
    namespaced: true,
    verbs: CRUD_VERBS,
    short_names: &["pdb"],
    status_subresource: true,
    field_labels: Some(OBJECT_META_FIELDS),
    generation: true,
    ..BASE
};

/// `apps/v1` DaemonSets, as objects only (no controller runs their pods): a drain looks a
/// DaemonSet pod's owner up by name, as `kubectl drain` does.
pub(crate) static DAEMONSETS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    plural: "daemonsets",
    singular: "daemonset",
    kind: "DaemonSet",
    namespaced: true,
    verbs: CRUD_VERBS,
    short_names: &["ds"],
    status_subresource: true,
    field_labels: Some(OBJECT_META_FIELDS),
    generation: true,
    ..BASE
};

/// `coordination.k8s.io/v1` Leases (leader election; the fake kubelets' node leases).
pub(crate) static LEASES: ResourceDef = ResourceDef {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    singular: "lease",
    kind: "Lease",
    namespaced: true,
    verbs: CRUD_VERBS,
    field_labels: Some(OBJECT_META_FIELDS),
    ..BASE
};

/// `apiextensions.k8s.io/v1` CustomResourceDefinitions: a stored one is served (`crd.rs`).
pub(crate) static CUSTOMRESOURCEDEFINITIONS: ResourceDef = ResourceDef {
    group: "apiextensions.k8s.io",
    version: "v1",
    plural: "customresourcedefinitions",
    singular: "customresourcedefinition",
    kind: "CustomResourceDefinition",
    namespaced: false,
    verbs: CRUD_VERBS,
    short_names: &["crd", "crds"],
    status_subresource: true,
    field_labels: Some(OBJECT_META_FIELDS),
    generation: true,
    ..BASE
};

/// The verbs of a fully writable type (`deletecollection` is not served).
const CRUD_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// The cluster's OS image streams (an OpenShift CRD; its status is written by the
/// machine-config operator through the `status` subresource), as OpenShift 4.23 and later
/// serve it.
pub(crate) static OSIMAGESTREAMS: ResourceDef = OSIMAGESTREAMS_V1;

const OSIMAGESTREAMS_V1: ResourceDef = ResourceDef {
    group: "machineconfiguration.openshift.io",
    version: "v1",
    plural: "osimagestreams",
    singular: "osimagestream",
    kind: "OSImageStream",
    namespaced: false,
    verbs: CRUD_VERBS,
    short_names: &[],
    status_subresource: true,
    custom: true,
    field_labels: Some(OBJECT_META_FIELDS),
    generation: true,
};

/// The same CRD as OpenShift 4.21 and 4.22 serve it (TechPreviewNoUpgrade and the other
/// no-upgrade feature sets): `v1alpha1` only (openshift/api release-4.21, release-4.22:
/// payload-manifests/crds/0000_80_machine-config_01_osimagestreams*.crd.yaml).
pub(crate) static OSIMAGESTREAMS_V1ALPHA1: ResourceDef = ResourceDef {
    version: "v1alpha1",
    ..OSIMAGESTREAMS_V1
};

/// Which resources beyond the built-in ones are served: the version of the OSImageStream CRD
/// (each OpenShift release serves exactly one: v1alpha1 on 4.21/4.22, v1 from 4.23, none before
/// 4.21; the stored object is the same in every version, as a CRD's storage is) and the served
/// versions of the CustomResourceDefinitions posted to the server.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    osimagestreams: Option<&'static ResourceDef>,
    custom: Arc<[&'static ResourceDef]>,
}

impl Default for Served {
    fn default() -> Self {
        Served {
            osimagestreams: Some(&OSIMAGESTREAMS),
            custom: Arc::new([]),
        }
    }
}

impl Served {
    /// `"v1"`, `"v1alpha1"` or `None` (the CRD is not installed).
    pub(crate) fn new(version: Option<&str>) -> Result<Served, String> {
        let osimagestreams = match version {
            Some("v1") => Some(&OSIMAGESTREAMS),
            Some("v1alpha1") => Some(&OSIMAGESTREAMS_V1ALPHA1),
            None => None,
            Some(other) => {
                return Err(format!(
                    "osimagestreams are served as v1, v1alpha1 or not at all, not {other:?}"
                ));
            }
        };
        Ok(Served {
            osimagestreams,
            custom: Arc::new([]),
        })
    }

    /// The same, with the OSImageStream version of `other`.
    pub(crate) fn with_osimagestreams_of(&self, other: &Served) -> Served {
        Served {
            osimagestreams: other.osimagestreams,
            custom: self.custom.clone(),
        }
    }

    /// The same, serving exactly `custom` from CustomResourceDefinitions.
    pub(crate) fn with_custom(&self, custom: Vec<&'static ResourceDef>) -> Served {
        Served {
            osimagestreams: self.osimagestreams,
            custom: custom.into(),
        }
    }

    /// The served OSImageStream definition, if any.
    pub(crate) fn osimagestreams(&self) -> Option<&'static ResourceDef> {
        self.osimagestreams
    }

    /// Whether `def` is served.
    pub(crate) fn serves(&self, def: &ResourceDef) -> bool {
        if RESOURCES.iter().any(|d| std::ptr::eq(*d, def)) {
            def.kind != OSIMAGESTREAMS.kind
                || self.osimagestreams.is_some_and(|d| std::ptr::eq(d, def))
        } else {
            self.custom.iter().any(|d| std::ptr::eq(*d, def))
        }
    }

    fn resources(&self) -> impl Iterator<Item = &'static ResourceDef> + '_ {
        RESOURCES
            .iter()
            .copied()
            .filter(move |d| self.serves(d))
            .chain(self.custom.iter().copied())
    }
}

/// RBAC roles: stored and evaluated by the authorizer (`authz.rs`).
pub(crate) static CLUSTERROLES: ResourceDef = ResourceDef {
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "clusterroles",
    singular: "clusterrole",
    kind: "ClusterRole",
    namespaced: false,
    verbs: CRUD_VERBS,
    short_names: &[],
    status_subresource: false,
    custom: false,
    ..BASE
};

/// RBAC bindings of cluster roles to users and groups.
pub(crate) static CLUSTERROLEBINDINGS: ResourceDef = ResourceDef {
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "clusterrolebindings",
    singular: "clusterrolebinding",
    kind: "ClusterRoleBinding",
    namespaced: false,
    verbs: CRUD_VERBS,
    short_names: &[],
    status_subresource: false,
    custom: false,
    ..BASE
};

/// Namespaced RBAC roles.
pub(crate) static ROLES: ResourceDef = ResourceDef {
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "roles",
    singular: "role",
    kind: "Role",
    namespaced: true,
    verbs: CRUD_VERBS,
    ..BASE
};

/// Bindings of roles or cluster roles to subjects within one namespace.
pub(crate) static ROLEBINDINGS: ResourceDef = ResourceDef {
    group: "rbac.authorization.k8s.io",
    version: "v1",
    plural: "rolebindings",
    singular: "rolebinding",
    kind: "RoleBinding",
    namespaced: true,
    verbs: CRUD_VERBS,
    ..BASE
};

/// Every resource the server knows, core group first; [`Served`] says which are served.
pub(crate) static RESOURCES: &[&ResourceDef] = &[
    &NODES,
    &EVENTS,
    &NAMESPACES,
    &PODS,
    &OSIMAGESTREAMS,
    &OSIMAGESTREAMS_V1ALPHA1,
    &CLUSTERROLES,
    &CLUSTERROLEBINDINGS,
    &ROLES,
    &ROLEBINDINGS,
    &PODDISRUPTIONBUDGETS,
    &DAEMONSETS,
    &LEASES,
    &CUSTOMRESOURCEDEFINITIONS,
    &EVENTS_V1,
];

/// The served resource `plural` in `group/version`.
pub(crate) fn find(
    served: &Served,
    group: &str,
    version: &str,
    plural: &str,
) -> Option<&'static ResourceDef> {
    served
        .resources()
        .find(|d| d.group == group && d.version == version && d.plural == plural)
}

/// The served resource whose objects have `apiVersion` and `kind`.
pub(crate) fn find_kind(
    served: &Served,
    api_version: &str,
    kind: &str,
) -> Option<&'static ResourceDef> {
    served
        .resources()
        .find(|d| d.api_version() == api_version && d.kind == kind)
}

/// `GET /version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": KUBE_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-05-01T00:00:00Z",
        "goVersion": "go1.23.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub(crate) fn api_versions(server_addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_addr }],
    })
}

/// Distinct `(group, version)` pairs of the named API groups, in table order.
fn group_versions(served: &Served) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for d in served.resources().filter(|d| !d.group.is_empty()) {
        if !out.contains(&(d.group, d.version)) {
            out.push((d.group, d.version));
        }
    }
    out
}

fn api_group(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v }))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

fn versions_of(served: &Served, group: &str) -> Vec<&'static str> {
    group_versions(served)
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(_, v)| v)
        .collect()
}

/// `GET /apis`.
pub(crate) fn api_group_list(served: &Served) -> Value {
    let mut groups: Vec<&str> = Vec::new();
    for (g, _) in group_versions(served) {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut doc = api_group(g, &versions_of(served, g));
            if let Some(obj) = doc.as_object_mut() {
                obj.remove("kind");
                obj.remove("apiVersion");
            }
            doc
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/<group>`, if the group is served.
pub(crate) fn api_group_doc(served: &Served, group: &str) -> Option<Value> {
    let versions = versions_of(served, group);
    (!versions.is_empty()).then(|| api_group(group, &versions))
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`, if served.
pub(crate) fn api_resource_list(served: &Served, group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = served
        .resources()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for d in defs {
        resources.push(json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": d.verbs,
            "shortNames": d.short_names,
        }));
        if d.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": d.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if std::ptr::eq(d, &PODS) {
            // As kube-apiserver lists it: the Eviction kind of policy/v1, which `kubectl drain`
            // looks for before it evicts (kubectl: pkg/drain/drain.go, `CheckEvictionSupport`).
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// OpenAPI v3 path key of a group-version: `api/v1` or `apis/<group>/<version>`.
fn openapi_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3`: one entry per served group-version, addressed by content hash.
pub(crate) fn openapi_root(served: &Served) -> Value {
    let mut gvs = vec![("", "v1")];
    gvs.extend(group_versions(served));
    let mut paths = serde_json::Map::new();
    for (g, v) in gvs {
        if let Some(doc) = openapi_group_version(served, g, v) {
            let hash = format!("{:X}", Sha256::digest(doc.to_string().as_bytes()));
            let key = openapi_key(g, v);
            paths.insert(
                key.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}") }),
            );
        }
    }
    json!({ "paths": paths })
}

/// `GET /openapi/v3/<key>`. Only PATCH operations with their group-version-kind and the
/// `fieldValidation` parameter are described: that is what kubectl probes before it
/// sends a create with server-side field validation instead of downloading schemas.
pub(crate) fn openapi_group_version(served: &Served, group: &str, version: &str) -> Option<Value> {
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let defs: Vec<&ResourceDef> = served
        .resources()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for d in defs.into_iter().filter(|d| d.allows("patch")) {
        let path = if d.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{prefix}/{}/{{name}}", d.plural)
        };
        paths.insert(
            path,
            json!({ "patch": {
                "operationId": format!("patch{}", d.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": { "group": d.group, "version": d.version, "kind": d.kind },
                "parameters": [{ "name": "fieldValidation", "in": "query", "schema": { "type": "string", "uniqueItems": true } }],
                "responses": { "200": { "description": "OK" } },
            }}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": KUBE_VERSION },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP: &str = "machineconfiguration.openshift.io";

    #[test]
    fn one_osimagestream_version_is_served_at_a_time() {
        let v1 = Served::default();
        let alpha = Served::new(Some("v1alpha1")).expect("known");
        let none = Served::new(None).expect("known");
        assert!(Served::new(Some("v2")).is_err());
        assert!(find(&v1, GROUP, "v1", "osimagestreams").is_some());
        assert!(find(&v1, GROUP, "v1alpha1", "osimagestreams").is_none());
        assert!(find(&alpha, GROUP, "v1alpha1", "osimagestreams").is_some());
        assert!(find(&alpha, GROUP, "v1", "osimagestreams").is_none());
        assert!(find(&none, GROUP, "v1", "osimagestreams").is_none());
        assert!(
            find(&none, "", "v1", "nodes").is_some(),
            "the rest is always served"
        );
        let versions = |s: &Served| api_group_doc(s, GROUP).map(|d| d["versions"].clone());
        assert_eq!(
            versions(&alpha),
            Some(json!([{"groupVersion": format!("{GROUP}/v1alpha1"), "version": "v1alpha1"}]))
        );
        assert_eq!(versions(&none), None);
        assert!(api_resource_list(&alpha, GROUP, "v1").is_none());
        assert!(
            !api_group_list(&none).to_string().contains(GROUP),
            "no CRD, no group"
        );
        assert_eq!(
            find_kind(&alpha, &format!("{GROUP}/v1alpha1"), "OSImageStream").map(|d| d.version),
            Some("v1alpha1")
        );
    }
}
