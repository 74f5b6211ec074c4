//! What the controller reads of a Node: the node protocol's keys, Ready, cordon, who manages
//! the OS, and the controller's own progress mark (`rollout-step`). Pure: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
// The readiness protocol's keys are streamd's own (one definition for both halves).
pub use streamd::cluster::protocol::{
    CHECK_EXTENSIONS_IMAGE, CHECK_OS_IMAGE, CHECK_STREAM, MODE, READINESS,
};
use streamd::cluster::protocol::{
    CheckId, FAILED_CHECKS, Inputs, OBSERVED_DESIRED, REASON, REBOOT_REQUESTED, STATE, State,
    UnknownCheck, parse_check_ids, parse_failed_checks,
};

/// Written by the controller only: how far it got with the node, so that a restart or a new
/// leader continues without a second drain or approval. Values: `draining:<unix seconds the
/// drain started>:<reboot-requested token>` (the node is cordoned by the controller and being
/// drained) and `approved:<unix seconds>:<token>` (that token was copied into `reboot-approved`
/// then; `rebootTimeoutSeconds` counts from it; an older controller wrote `approved:<token>`,
/// without the time). Removed when
/// the controller uncordons the node. Its presence also means "the controller cordoned this
/// node": a node someone else cordoned never carries it.
pub const ROLLOUT_STEP: &str = "osstream.openshift.io/rollout-step";

/// Written by the controller only, with the `desired-*` keys: the Unix seconds it gave the node
/// the pool's request, from which `agentTimeoutSeconds` counts (a node whose streamd does not
/// acknowledge the request by then is `AgentNotResponding`).
pub const ROLLOUT_TARGETED: &str = "osstream.openshift.io/rollout-targeted";

/// Written by the controller only, when it uncordons a node that is back on the pool's request:
/// the Unix seconds it did so, from which `spec.minReadySeconds` counts (the node soaks, counted
/// unavailable, before the slot it frees goes to the next node).
pub const ROLLOUT_UPDATED: &str = "osstream.openshift.io/rollout-updated";

/// Written by the controller only, when a drain that ran past `drain.timeoutSeconds` is given up
/// (`drain.onTimeout: release`): the `reboot-requested` token it gave up on. The node is
/// uncordoned and waits until every other node had its turn; a new token (or an admin removing
/// the key) ends it.
pub const ROLLOUT_SET_ASIDE: &str = "osstream.openshift.io/rollout-set-aside";

/// Written by the controller only, with the `check-*` or `desired-*` keys: the StreamPool whose
/// request the node carries. It finds a node that left the pool's selector by it (to release
/// it), and a pool being deleted finds its nodes by it.
pub const ROLLOUT_POOL: &str = "osstream.openshift.io/rollout-pool";

/// The taint (effect `PreferNoSchedule`) the controller keeps on the pool's nodes still to
/// update, so that pods evicted by a drain prefer nodes already updated; removed once the node
/// runs the pool's request or is released. As the machine-config operator's node controller
/// keeps `UpdateInProgress:PreferNoSchedule` on the nodes whose desired config is not the pool's
/// target (openshift/machine-config-operator:pkg/daemon/constants/constants.go
/// `NodeUpdateInProgressTaint`; pkg/controller/node/node_controller.go, release-4.21, the loop
/// "Taint all the nodes in the node pool" of `syncMachineConfigPool`); its own key, so the two
/// never remove each other's.
pub const UPDATE_TAINT: &str = "osstream.openshift.io/update-in-progress";

/// The zone label the order groups nodes by (as the machine-config operator's node controller).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A node label or annotation that keeps the node out of the rollout (any value but `false`):
/// it is not given the target nor cordoned, carries no update taint, and its own
/// unavailability does not count against `maxUnavailable`. A node already taken (cordoned by
/// the controller) finishes its cycle first (see `crate::waves`).
pub const HOLD: &str = "osstream.openshift.io/rollout-hold";

/// The machine-config daemon's mark on a node it manages
/// (openshift/machine-config-operator:pkg/daemon/constants/constants.go
/// `CurrentMachineConfigAnnotationKey`).
pub const MCD_CURRENT_CONFIG: &str = "machineconfiguration.openshift.io/currentConfig";

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The node's taints with [`UPDATE_TAINT`] (`on`) or without it, the others kept as they are:
/// a merge patch replaces the whole list, so it is written only conditional on the node's
/// `resourceVersion`.
pub fn taints_with_update(node: &Node, on: bool) -> Vec<Taint> {
    let mut list: Vec<Taint> = taints(node)
        .iter()
        .filter(|t| t.key != UPDATE_TAINT)
        .cloned()
        .collect();
    if on {
        list.push(Taint {
            key: UPDATE_TAINT.into(),
            effect: "PreferNoSchedule".into(),
            ..Taint::default()
        });
    }
    list
}

/// The controller's progress with one node, parsed from [`ROLLOUT_STEP`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Cordoned by the controller; draining since `started` (Unix seconds) for `token`.
    Draining {
        /// Unix seconds when the drain started.
        started: u64,
        /// The `reboot-requested` token the drain is for.
        token: String,
    },
    /// `token` was approved, at `since` (Unix seconds; `None`: an older controller's mark).
    Approved {
        /// When the approval was written.
        since: Option<u64>,
        /// The approved token.
        token: String,
    },
    /// A value the controller cannot read (edited by hand): the node is treated as taken by
    /// the controller (cordoned), so it is never drained a second time from scratch nor
    /// forgotten cordoned.
    Unknown,
}

impl Step {
    /// Parses the annotation value.
    pub fn parse(value: &str) -> Step {
        if let Some(rest) = value.strip_prefix("draining:") {
            if let Some((secs, token)) = rest.split_once(':')
                && let Ok(started) = secs.parse()
                && !token.is_empty()
            {
                return Step::Draining {
                    started,
                    token: token.to_string(),
                };
            }
        } else if let Some(rest) = value.strip_prefix("approved:")
            && !rest.is_empty()
        {
            // Tokens are `<hash>.<boot>`: a leading all-digit field before ':' is the time.
            if let Some((secs, token)) = rest.split_once(':')
                && let Ok(since) = secs.parse()
                && !token.is_empty()
            {
                return Step::Approved {
                    since: Some(since),
                    token: token.to_string(),
                };
            }
            return Step::Approved {
                since: None,
                token: rest.to_string(),
            };
        }
        Step::Unknown
    }

    /// When the approval was written (`None`: not approved, or an older controller's mark).
    pub fn approved_at(&self) -> Option<u64> {
        match self {
            Step::Approved { since, .. } => *since,
            _ => None,
        }
    }

    /// The annotation value.
    pub fn render(&self) -> String {
        match self {
            Step::Draining { started, token } => format!("draining:{started}:{token}"),
            Step::Approved {
                since: Some(since),
                token,
            } => format!("approved:{since}:{token}"),
            Step::Approved { since: None, token } => format!("approved:{token}"),
            Step::Unknown => "unknown".to_string(),
        }
    }
}

/// What the node's streamd heartbeat Lease says (streamd's `cluster::heartbeat`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Heartbeat {
    /// No Lease read: heartbeats off, an older streamd, or the Leases unreadable.
    #[default]
    Unknown,
    /// Renewed within its duration.
    Alive,
    /// Ran out; the last renewal, as the Lease gives it.
    Stale {
        /// `spec.renewTime`, RFC 3339.
        renewed: String,
    },
}

/// One node as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// The Ready condition is `True`.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// All annotations.
    pub annotations: BTreeMap<String, String>,
    /// The node's streamd heartbeat.
    pub heartbeat: Heartbeat,
    /// It carries [`UPDATE_TAINT`].
    pub update_tainted: bool,
    /// Its [`ZONE_LABEL`].
    pub zone: Option<String>,
    /// `metadata.creationTimestamp`, Unix seconds.
    pub created: Option<i64>,
    /// Its [`HOLD`] label, else annotation.
    pub hold: Option<String>,
}

impl NodeView {
    /// Reads a Node object.
    pub fn from_node(node: &Node) -> NodeView {
        let label = |key: &str| node.metadata.labels.as_ref().and_then(|l| l.get(key));
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            ready,
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            annotations: node.metadata.annotations.clone().unwrap_or_default(),
            heartbeat: Heartbeat::Unknown,
            update_tainted: taints(node).iter().any(|t| t.key == UPDATE_TAINT),
            zone: label(ZONE_LABEL).cloned(),
            created: node
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
            hold: label(HOLD)
                .or_else(|| node.metadata.annotations.as_ref().and_then(|a| a.get(HOLD)))
                .cloned(),
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// streamd's `state`; `None` when absent or unknown (no streamd, or an older one).
    pub fn state(&self) -> Option<State> {
        self.get(STATE).and_then(|s| s.parse().ok())
    }

    /// streamd's `reason`.
    pub fn reason(&self) -> &str {
        self.get(REASON).unwrap_or_default()
    }

    /// streamd's `failed-checks`: the checks a `Refused` node failed (none when absent), and
    /// the ids this controller does not know.
    pub fn failed_checks(&self) -> (Vec<CheckId>, Vec<UnknownCheck>) {
        self.get(FAILED_CHECKS)
            .map(parse_failed_checks)
            .unwrap_or_default()
    }

    /// streamd's `observed-desired`.
    pub fn observed(&self) -> Option<&str> {
        self.get(OBSERVED_DESIRED)
    }

    /// streamd's `reboot-requested` token.
    pub fn reboot_requested(&self) -> Option<&str> {
        self.get(REBOOT_REQUESTED)
    }

    /// The node protocol's input keys as set now.
    pub fn inputs(&self) -> Inputs {
        Inputs::from_annotations(&self.annotations)
    }

    /// The controller's progress mark.
    pub fn step(&self) -> Option<Step> {
        self.get(ROLLOUT_STEP).map(Step::parse)
    }

    /// When the controller gave the node the pool's request ([`ROLLOUT_TARGETED`]); `None`:
    /// not written (an older controller) or unreadable.
    pub fn targeted_at(&self) -> Option<u64> {
        self.get(ROLLOUT_TARGETED).and_then(|v| v.parse().ok())
    }

    /// When the controller last uncordoned the node back on the pool's request
    /// ([`ROLLOUT_UPDATED`]).
    pub fn updated_at(&self) -> Option<u64> {
        self.get(ROLLOUT_UPDATED).and_then(|v| v.parse().ok())
    }

    /// Whether the controller gave up draining the node for `token` ([`ROLLOUT_SET_ASIDE`]).
    pub fn set_aside_for(&self, token: &str) -> bool {
        self.get(ROLLOUT_SET_ASIDE) == Some(token)
    }

    /// Whether the machine-config operator manages the node's OS (the readiness protocol's
    /// definition): streamd runs in `readiness` mode, or the machine-config daemon has marked
    /// the node.
    pub fn mco_managed(&self) -> bool {
        self.get(MODE) == Some("readiness")
            || self.get(MCD_CURRENT_CONFIG).is_some_and(|v| !v.is_empty())
    }

    /// The readiness entry streamd wrote for `stream`, if it parses.
    pub fn readiness(&self, stream: &str) -> Option<ReadinessEntry> {
        let all: BTreeMap<String, ReadinessEntry> =
            serde_json::from_str(self.get(READINESS)?).ok()?;
        all.get(stream).cloned()
    }
}

/// One stream's entry of the `readiness` annotation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessEntry {
    /// Every check passed.
    pub ready: bool,
    /// The ids of the checks that failed, as written ([`ReadinessEntry::failed_checks`]).
    #[serde(default)]
    pub failed: Vec<String>,
    /// Why, for a human.
    #[serde(default)]
    pub reason: String,
    /// The request hash (as `observed-desired`) the entry is for.
    #[serde(default)]
    pub checked: String,
}

impl ReadinessEntry {
    /// The failed checks, and the ids this controller does not know.
    pub fn failed_checks(&self) -> (Vec<CheckId>, Vec<UnknownCheck>) {
        parse_check_ids(self.failed.iter().map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_round_trips_and_tolerates_garbage() {
        for step in [
            Step::Draining {
                started: 1700000000,
                token: "0123456789abcdef.0123456789ab.x:y".into(),
            },
            Step::Approved {
                since: None,
                token: "abc.def".into(),
            },
            Step::Approved {
                since: Some(1700000000),
                token: "abc.def".into(),
            },
        ] {
            assert_eq!(Step::parse(&step.render()), step);
        }
        for bad in [
            "",
            "draining:",
            "draining:x:tok",
            "draining:12:",
            "approved:",
            "other",
        ] {
            assert_eq!(Step::parse(bad), Step::Unknown, "{bad:?}");
        }
    }

    #[test]
    fn mco_managed_by_mode_or_mcd_annotation() {
        let mut n = NodeView::default();
        assert!(!n.mco_managed());
        n.annotations.insert(MODE.into(), "manage".into());
        assert!(!n.mco_managed());
        n.annotations.insert(MODE.into(), "readiness".into());
        assert!(n.mco_managed());
        n.annotations.remove(MODE);
        n.annotations
            .insert(MCD_CURRENT_CONFIG.into(), "rendered-worker-1".into());
        assert!(n.mco_managed());
    }

    #[test]
    fn failed_checks_are_read_from_their_own_key() {
        let mut n = NodeView::default();
        assert_eq!(n.failed_checks(), (vec![], vec![]));
        n.annotations.insert(
            REASON.into(),
            "preflight check fips failed: mismatch".into(),
        );
        assert_eq!(n.failed_checks(), (vec![], vec![]), "the prose is not read");
        n.annotations
            .insert(FAILED_CHECKS.into(), "cpu-level,quantum".into());
        assert_eq!(
            n.failed_checks(),
            (
                vec![CheckId::CpuLevel],
                vec![UnknownCheck("quantum".into())]
            )
        );
    }

    #[test]
    fn readiness_entry_parses_or_is_absent() {
        let mut n = NodeView::default();
        n.annotations.insert(
            READINESS.into(),
            r#"{"rhel-10":{"ready":false,"failed":["cpu-level"],"reason":"r","osImage":"q","checked":"00"}}"#
                .into(),
        );
        let e = n.readiness("rhel-10").expect("entry");
        assert_eq!(e.failed_checks(), (vec![CheckId::CpuLevel], vec![]));
        assert!(n.readiness("rhel-11").is_none());
        n.annotations.insert(READINESS.into(), "{not json".into());
        assert!(n.readiness("rhel-10").is_none());
    }
}
