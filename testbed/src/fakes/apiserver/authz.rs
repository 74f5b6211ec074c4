//! Authorization as a cluster with `--authorization-mode=Node,RBAC` and the NodeRestriction
//! admission plugin decides it, for the identities the fake knows: `admin` (a cluster admin)
//! may do anything; a node (`system:node:<name>`, group `system:nodes`) gets the Node
//! authorizer's rules and may write only its own Node; everyone is also granted what stored
//! ClusterRoleBindings bind to them (RBAC, cluster scope only). The rest is 403 `Forbidden`.

use serde_json::Value;

use super::discovery::{
    CLUSTERROLEBINDINGS, CLUSTERROLES, EVENTS, NODES, PODS, ROLEBINDINGS, ROLES, ResourceDef,
};
use super::status::ApiError;
use super::store::Store;

/// The user name of the bearer-token identity.
const ADMIN: &str = "admin";
/// Prefix of node identities' user names.
const NODE_PREFIX: &str = "system:node:";
/// Prefix of service accounts' user names (`system:serviceaccount:<namespace>:<name>`).
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
/// RBAC's API group, which `roleRef.apiGroup` must name.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// What a resource request asks to do.
pub(crate) struct Attributes<'a> {
    pub(crate) user: &'a str,
    pub(crate) verb: &'a str,
    pub(crate) def: &'static ResourceDef,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    pub(crate) subresource: Option<&'a str>,
}

impl Attributes<'_> {
    /// `plural` or `plural/subresource`, as RBAC rules name it.
    fn resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{sub}", self.def.plural),
            None => self.def.plural.to_string(),
        }
    }
}

/// `Ok` if the request is allowed, else the 403 the real server sends.
pub(crate) fn authorize(store: &Store, attrs: &Attributes<'_>) -> Result<(), ApiError> {
    if attrs.user == ADMIN {
        return Ok(());
    }
    let node = attrs.user.strip_prefix(NODE_PREFIX);
    let mut groups = vec!["system:authenticated".to_string()];
    if node.is_some() {
        groups.push("system:nodes".into());
    }
    // The service account token authenticator's groups (kubernetes/apiserver:
    // pkg/authentication/serviceaccount/util.go, `MakeGroupNames`).
    if let Some((ns, _)) = attrs
        .user
        .strip_prefix(SERVICE_ACCOUNT_PREFIX)
        .and_then(|rest| rest.split_once(':'))
    {
        groups.push("system:serviceaccounts".into());
        groups.push(format!("system:serviceaccounts:{ns}"));
    }
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let authorized = node.is_some_and(|node| node_authorizer_allows(node, attrs))
        || rbac_allows(store, attrs, &groups);
    if !authorized {
        let scope = match attrs.namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_string(),
        };
        return Err(ApiError::forbidden(
            attrs.def,
            attrs.name,
            &format!(
                "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
                attrs.user,
                attrs.verb,
                attrs.resource(),
                attrs.def.group
            ),
        ));
    }
    // NodeRestriction admission, after authorization: whatever RBAC grants, a node changes only
    // its own Node. Admission sees only existing objects; a missing one stays a 404.
    let write = matches!(attrs.verb, "create" | "update" | "patch" | "delete");
    if let (Some(node), Some(name)) = (node, attrs.name)
        && std::ptr::eq(attrs.def, &NODES)
        && write
        && name != node
        && store.get(&NODES, None, name).is_ok()
    {
        return Err(ApiError::forbidden(
            attrs.def,
            attrs.name,
            &format!("node {node:?} is not allowed to modify node {name:?}"),
        ));
    }
    Ok(())
}

/// The Node authorizer's static rules for the kinds the fake serves: read nodes and write its
/// own (status too), post events, read pods. Nothing else, in particular no custom resources.
fn node_authorizer_allows(node: &str, attrs: &Attributes<'_>) -> bool {
    let read = matches!(attrs.verb, "get" | "list" | "watch");
    let def = attrs.def;
    if std::ptr::eq(def, &NODES) {
        read || attrs.name == Some(node)
    } else if std::ptr::eq(def, &EVENTS) {
        matches!(attrs.verb, "create" | "update" | "patch")
    } else {
        std::ptr::eq(def, &PODS) && read
    }
}

/// Whether a stored ClusterRoleBinding, or a RoleBinding of the request's namespace, grants
/// the request to the user or one of `groups`.
fn rbac_allows(store: &Store, attrs: &Attributes<'_>, groups: &[&str]) -> bool {
    let (cluster, _) = store.list(&CLUSTERROLEBINDINGS, None, |b| {
        binds(b, attrs.user, groups, None)
    });
    let namespaced = match attrs.namespace {
        Some(ns) => {
            store
                .list(&ROLEBINDINGS, Some(ns), |b| {
                    binds(b, attrs.user, groups, Some(ns))
                })
                .0
        }
        None => Vec::new(),
    };
    let grants = |binding: &Value, ns: Option<&str>| {
        let role_ref = &binding["roleRef"];
        if role_ref["apiGroup"] != RBAC_GROUP {
            return false;
        }
        let Some(name) = role_ref["name"].as_str() else {
            return false;
        };
        let role = match (role_ref["kind"].as_str(), ns) {
            (Some("ClusterRole"), _) => store.get(&CLUSTERROLES, None, name),
            (Some("Role"), Some(ns)) => store.get(&ROLES, Some(ns), name),
            _ => return false,
        };
        role.is_ok_and(|role| {
            role["rules"]
                .as_array()
                .is_some_and(|rules| rules.iter().any(|rule| rule_allows(rule, attrs)))
        })
    };
    cluster.iter().any(|b| grants(b, None)) || namespaced.iter().any(|b| grants(b, attrs.namespace))
}

/// Whether `binding` (in namespace `ns`, if a RoleBinding) names the user or one of its groups.
fn binds(binding: &Value, user: &str, groups: &[&str], ns: Option<&str>) -> bool {
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects
            .iter()
            .any(|s| match (s["kind"].as_str(), s["name"].as_str()) {
                (Some("User"), Some(name)) => name == user,
                (Some("Group"), Some(name)) => groups.contains(&name),
                (Some("ServiceAccount"), Some(name)) => {
                    // A RoleBinding's subject may leave its namespace out: the binding's own.
                    let sa_ns = s["namespace"].as_str().or(ns).unwrap_or_default();
                    user == format!("{SERVICE_ACCOUNT_PREFIX}{sa_ns}:{name}")
                }
                _ => false,
            })
    })
}

/// One PolicyRule: verbs, apiGroups and resources must match (`*` matches all); non-empty
/// resourceNames restrict it to requests naming one of them.
fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let has = |field: &str, want: &str| {
        rule[field]
            .as_array()
            .is_some_and(|list| list.iter().any(|v| v == "*" || v == want))
    };
    let names_ok = match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => {
            attrs.name.is_some_and(|n| names.iter().any(|v| v == n))
        }
        _ => true,
    };
    has("verbs", attrs.verb)
        && has("apiGroups", attrs.def.group)
        && has("resources", &attrs.resource())
        && names_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::OSIMAGESTREAMS;
    use serde_json::json;

    fn attrs<'a>(
        user: &'a str,
        verb: &'a str,
        def: &'static ResourceDef,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            user,
            verb,
            def,
            namespace: None,
            name,
            subresource: None,
        }
    }

    #[test]
    fn node_rules_node_restriction_and_rbac() {
        let store = Store::new([1; 16]);
        store.seed("worker-0").expect("seed");
        store
            .create(&NODES, None, json!({"metadata": {"name": "worker-1"}}))
            .expect("second node");
        let node = "system:node:worker-0";
        let allowed = |a: &Attributes<'_>| authorize(&store, a).map_err(|e| (e.code, e.message));
        assert!(allowed(&attrs(node, "patch", &NODES, Some("worker-0"))).is_ok());
        assert!(allowed(&attrs(node, "watch", &NODES, None)).is_ok());
        let (code, msg) = allowed(&attrs(node, "patch", &NODES, Some("worker-1"))).unwrap_err();
        assert_eq!(code, 403);
        assert_eq!(
            msg,
            "nodes \"worker-1\" is forbidden: User \"system:node:worker-0\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let (_, msg) = allowed(&attrs(node, "list", &OSIMAGESTREAMS, None)).unwrap_err();
        assert_eq!(
            msg,
            "osimagestreams.machineconfiguration.openshift.io is forbidden: User \"system:node:worker-0\" \
             cannot list resource \"osimagestreams\" in API group \"machineconfiguration.openshift.io\" at the cluster scope"
        );
        assert!(allowed(&attrs("admin", "delete", &OSIMAGESTREAMS, Some("cluster"))).is_ok());

        store
            .create(
                &CLUSTERROLES,
                None,
                json!({"metadata": {"name": "r"}, "rules": [
                    {"apiGroups": ["machineconfiguration.openshift.io"], "resources": ["osimagestreams"], "verbs": ["watch"]},
                    {"apiGroups": ["*"], "resources": ["osimagestreams"], "verbs": ["get"], "resourceNames": ["cluster"]},
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]},
                ]}),
            )
            .expect("role");
        store
            .create(
                &CLUSTERROLEBINDINGS,
                None,
                json!({"metadata": {"name": "b"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "r"},
                    "subjects": [{"kind": "Group", "name": "system:nodes", "apiGroup": "rbac.authorization.k8s.io"}]}),
            )
            .expect("binding");
        assert!(allowed(&attrs(node, "watch", &OSIMAGESTREAMS, None)).is_ok());
        assert!(allowed(&attrs(node, "get", &OSIMAGESTREAMS, Some("cluster"))).is_ok());
        assert!(allowed(&attrs(node, "get", &OSIMAGESTREAMS, Some("other"))).is_err());
        assert!(allowed(&attrs(node, "list", &OSIMAGESTREAMS, None)).is_err());
        assert!(allowed(&attrs(node, "patch", &OSIMAGESTREAMS, Some("cluster"))).is_err());
        // Granted by the binding, still stopped by NodeRestriction; a missing node is the
        // handler's 404.
        let (code, msg) = allowed(&attrs(node, "delete", &NODES, Some("worker-1"))).unwrap_err();
        assert_eq!(code, 403);
        assert_eq!(
            msg,
            "nodes \"worker-1\" is forbidden: node \"worker-0\" is not allowed to modify node \"worker-1\""
        );
        assert!(allowed(&attrs(node, "delete", &NODES, Some("worker-9"))).is_ok());
        // A group the user is not in grants nothing.
        assert!(allowed(&attrs("someone", "get", &OSIMAGESTREAMS, Some("cluster"))).is_err());
    }
}
