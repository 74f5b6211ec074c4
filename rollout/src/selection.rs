//! Which pool a node belongs to, decided as the machine-config operator decides it for
//! MachineConfigPools (openshift/machine-config-operator, release-4.21: pkg/helpers/helpers.go
//! `GetPoolsForNode`, `ListPools`; pkg/controller/node/node_controller.go `getNodesForPool`).
//! Pure: selectors and labels in, a verdict out.
//!
//! - An empty selector selects nothing (`ListPools`: "a pool with a nil or empty selector …
//!   should match nothing, not everything"), and the pool is refused (`InvalidSpec`).
//! - A control-plane node is taken only by a pool whose selector names the control-plane role
//!   (`node-role.kubernetes.io/control-plane` or `…/master`) — a pool selecting `worker` does not
//!   take a node that is also a control-plane node.
//! - Among the pools that select a node: more than one custom pool (any name but `master` and
//!   `worker`) — the node is left alone and each of them says so; one custom pool — it wins over
//!   `worker` (and `master` wins over it); otherwise `master`, then `worker`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

/// The MachineConfigPool name of the control plane, which wins over every other pool.
pub const MASTER_POOL: &str = "master";
/// The MachineConfigPool name every custom pool wins over.
pub const WORKER_POOL: &str = "worker";
/// The labels that make a node a control-plane node.
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// Why a pool's `nodeSelector` is refused: empty (it would select every node) or malformed.
pub fn selector_error(selector: &LabelSelector) -> Option<String> {
    let empty = selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty);
    if empty {
        return Some(
            "spec.nodeSelector is empty: it would select every node, the control plane too; name the pool's nodes by label (e.g. node-role.kubernetes.io/worker: \"\")"
                .into(),
        );
    }
    Selector::try_from(selector.clone())
        .err()
        .map(|e| format!("spec.nodeSelector: {}", e.0))
}

/// Whether `selector` names the control-plane role (a `matchLabels` key, or a
/// `matchExpressions` key with `In` or `Exists`).
pub fn names_control_plane(selector: &LabelSelector) -> bool {
    let labels = selector
        .match_labels
        .iter()
        .flatten()
        .any(|(k, _)| CONTROL_PLANE_LABELS.contains(&k.as_str()));
    let expressions = selector.match_expressions.iter().flatten().any(|e| {
        CONTROL_PLANE_LABELS.contains(&e.key.as_str())
            && matches!(e.operator.as_str(), "In" | "Exists")
    });
    labels || expressions
}

/// Whether a pool with `selector` takes a node labelled `labels`: the selector is valid and not
/// empty, it matches, and a control-plane node only when the selector names that role.
pub fn takes(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if selector_error(selector).is_some() {
        return false;
    }
    let control_plane = CONTROL_PLANE_LABELS.iter().any(|k| labels.contains_key(*k));
    if control_plane && !names_control_plane(selector) {
        return false;
    }
    Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

/// Which of the pools that take a node gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No pool takes it.
    None,
    /// This pool.
    Pool(String),
    /// Several custom pools: none gets it; each of them reports it.
    Conflict(Vec<String>),
}

/// The owner among `pools`, the names of the pools that take a node (`GetPoolsForNode`).
pub fn owner(pools: &[&str]) -> Owner {
    let mut custom: Vec<String> = pools
        .iter()
        .filter(|p| **p != MASTER_POOL && **p != WORKER_POOL)
        .map(|p| p.to_string())
        .collect();
    custom.sort();
    custom.dedup();
    let has = |name: &str| pools.contains(&name);
    if custom.len() > 1 {
        return Owner::Conflict(custom);
    }
    if has(MASTER_POOL) {
        return Owner::Pool(MASTER_POOL.into());
    }
    if let Some(one) = custom.pop() {
        return Owner::Pool(one);
    }
    if has(WORKER_POOL) {
        return Owner::Pool(WORKER_POOL.into());
    }
    Owner::None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn by_labels(keys: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                keys.iter()
                    .map(|k| (k.to_string(), String::new()))
                    .collect(),
            ),
            ..LabelSelector::default()
        }
    }

    fn labels(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| (k.to_string(), String::new()))
            .collect()
    }

    const WORKER: &str = "node-role.kubernetes.io/worker";
    const CP: &str = "node-role.kubernetes.io/control-plane";
    const MASTER: &str = "node-role.kubernetes.io/master";

    #[test]
    fn selectors_that_take_a_node() {
        let exists = |key: &str| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: "Exists".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        };
        let not_in_cp = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: CP.into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        };
        #[rustfmt::skip]
        let table: Vec<(&str, LabelSelector, Vec<&str>, bool)> = vec![
            ("worker pool, worker", by_labels(&[WORKER]), vec![WORKER], true),
            ("worker pool, other node", by_labels(&[WORKER]), vec!["infra"], false),
            ("empty selector: nothing", LabelSelector::default(), vec![WORKER], false),
            ("worker pool, control plane that is also a worker", by_labels(&[WORKER]), vec![WORKER, CP], false),
            ("worker pool, an old master label", by_labels(&[WORKER]), vec![WORKER, MASTER], false),
            ("control-plane pool, control plane", by_labels(&[CP]), vec![WORKER, CP], true),
            ("master pool by label", by_labels(&[MASTER]), vec![MASTER], true),
            ("control plane by Exists", exists(CP), vec![CP], true),
            ("a DoesNotExist on the role is not naming it", not_in_cp, vec![CP], false),
        ];
        for (name, sel, node, want) in table {
            assert_eq!(takes(&sel, &labels(&node)), want, "{name}");
        }
    }

    #[test]
    fn empty_and_malformed_selectors_are_refused() {
        let e = selector_error(&LabelSelector::default()).expect("empty");
        assert!(e.starts_with("spec.nodeSelector is empty"), "{e}");
        let empty_maps = LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(Vec::new()),
        };
        assert!(selector_error(&empty_maps).is_some());
        let bad = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Near".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        };
        assert!(
            selector_error(&bad).is_some_and(|e| e.starts_with("spec.nodeSelector: ")),
            "{:?}",
            selector_error(&bad)
        );
        assert_eq!(selector_error(&by_labels(&[WORKER])), None);
    }

    #[test]
    fn owners_follow_the_mco() {
        let pool = |p: &str| Owner::Pool(p.into());
        #[rustfmt::skip]
        let table: Vec<(&[&str], Owner)> = vec![
            (&[], Owner::None),
            (&["worker"], pool("worker")),
            (&["infra"], pool("infra")),
            (&["worker", "infra"], pool("infra")),
            (&["infra", "worker"], pool("infra")),
            (&["master", "infra"], pool("master")),
            (&["master", "worker"], pool("master")),
            (&["worker", "infra", "gpu"], Owner::Conflict(vec!["gpu".into(), "infra".into()])),
            (&["master", "infra", "gpu"], Owner::Conflict(vec!["gpu".into(), "infra".into()])),
        ];
        for (pools, want) in table {
            assert_eq!(owner(pools), want, "{pools:?}");
        }
    }
}
