//! What the planner takes and gives: a pool's settings ([`PoolInput`]), the actions it plans
//! ([`Action`]) and the status it derives ([`Summary`], [`Plan`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use streamd::cluster::protocol::Desired;

use crate::crd::{NodeIssue, OnTimeout};
use crate::node::{CHECK_EXTENSIONS_IMAGE, CHECK_OS_IMAGE, CHECK_STREAM, NodeView};
use crate::waves::Waves;

/// The check-* keys the pool asks its not-yet-moved nodes to dry-run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckKeys {
    /// `check-stream`.
    pub stream: String,
    /// `check-os-image`; `None`: the node resolves it from OSImageStream.
    pub os_image: Option<String>,
    /// `check-extensions-image`.
    pub extensions_image: Option<String>,
}

impl CheckKeys {
    /// The key/value pairs to write (`None`: remove).
    pub fn annotations(&self) -> [(&'static str, Option<&str>); 3] {
        [
            (CHECK_STREAM, Some(self.stream.as_str())),
            (CHECK_OS_IMAGE, self.os_image.as_deref()),
            (CHECK_EXTENSIONS_IMAGE, self.extensions_image.as_deref()),
        ]
    }

    /// Whether `node` carries exactly these keys already.
    pub(super) fn set_on(&self, node: &NodeView) -> bool {
        self.annotations()
            .iter()
            .all(|(k, v)| node.annotations.get(*k).map(String::as_str) == *v)
    }
}

/// The pool, resolved.
#[derive(Debug, Clone)]
pub struct PoolInput {
    /// The request every node gets, or why there is none (bad spec, OSImageStream not served).
    pub target: Result<Desired, String>,
    /// What the not-yet-moved nodes are asked to dry-run (`None` with a bad stream name).
    pub check: Option<CheckKeys>,
    /// What else in the spec is malformed (e.g. `drain.podSelector`): the pool is Degraded
    /// `InvalidSpec` and nothing but the readiness dry run is done.
    pub spec_error: Option<String>,
    /// `spec.maxUnavailable` as given (default 1).
    pub max_unavailable: Option<IntOrString>,
    /// `spec.maxConcurrentStaging`, resolved.
    pub max_concurrent_staging: usize,
    /// `spec.paused`.
    pub paused: bool,
    /// `spec.drain.timeoutSeconds`, resolved.
    pub drain_timeout_seconds: u64,
    /// `spec.drain.onTimeout`, resolved.
    pub drain_on_timeout: OnTimeout,
    /// `spec.agentTimeoutSeconds`, resolved.
    pub agent_timeout_seconds: u64,
    /// `spec.rebootTimeoutSeconds`, resolved.
    pub reboot_timeout_seconds: u64,
    /// Unix seconds now (the deadlines).
    pub now: u64,
    /// Nodes another custom pool selects too (node → the other pools): the machine-config
    /// operator leaves such a node to neither, and so does the controller (each pool lists it
    /// and goes on with its other nodes).
    pub claimed: BTreeMap<String, String>,
    /// Order, soak, canary and maintenance windows.
    pub waves: Waves,
}

/// One step for one node; the executor does it with one Node patch (a drain pass lists and
/// evicts pods first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the check-* keys (read-only dry run on the node).
    Check {
        /// Node name.
        node: String,
    },
    /// Write the desired-* keys: the node pulls and stages the target.
    Target {
        /// Node name.
        node: String,
    },
    /// Cordon the node and mark [`Step::Draining`](crate::node::Step::Draining) for `token`, started `now`.
    Cordon {
        /// Node name.
        node: String,
        /// The node's `reboot-requested`.
        token: String,
    },
    /// One drain pass; when no pod is left, approve `token` (and mark [`Step::Approved`](crate::node::Step::Approved)).
    Drain {
        /// Node name.
        node: String,
        /// The node's `reboot-requested`, copied verbatim into `reboot-approved`.
        token: String,
    },
    /// Uncordon the node and remove the controller's mark and the spent approval.
    Uncordon {
        /// Node name.
        node: String,
    },
    /// Cordon again a node someone uncordoned while it was drained (its mark and drain start
    /// are kept; the drain goes on at the next pass).
    Recordon {
        /// Node name.
        node: String,
    },
    /// Give up the drain for `token` (`drain.onTimeout: release`): uncordon the node, remove the
    /// controller's mark and set it aside for that token; the pool moves on.
    SetAside {
        /// Node name.
        node: String,
        /// The `reboot-requested` token whose drain is given up.
        token: String,
    },
    /// Release the node as [`release`](super::release) says (the pool's nodes became the machine-config
    /// operator's).
    Release {
        /// Node name.
        node: String,
    },
}

impl Action {
    /// The node it is for.
    pub fn node(&self) -> &str {
        match self {
            Action::Check { node }
            | Action::Target { node }
            | Action::Cordon { node, .. }
            | Action::Drain { node, .. }
            | Action::Uncordon { node }
            | Action::Recordon { node }
            | Action::SetAside { node, .. }
            | Action::Release { node } => node,
        }
    }
}

/// Why the pool is Degraded: it takes no new node until the cause is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degraded {
    /// CamelCase cause: `TargetUnresolved`, `InvalidSpec`, `NodeDegraded`, `NodeRefused`.
    pub reason: &'static str,
    /// One line for a human.
    pub message: String,
}

/// Why the rollout waits although it is not Degraded: a node past one of its deadlines, or
/// unavailability the rollout did not cause (the `Updating` condition's reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// `AgentNotResponding`, `DrainTimeout`, `NodeNotReturning` or `Blocked`.
    pub reason: &'static str,
    /// One line for a human.
    pub message: String,
}

/// What the planner saw, for the pool's status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Nodes selected.
    pub machines: usize,
    /// Nodes on the target, finished and uncordoned.
    pub updated: usize,
    /// Updated nodes that are Ready and schedulable.
    pub ready: usize,
    /// Nodes not Ready, cordoned or being moved.
    pub unavailable: usize,
    /// Nodes Degraded or Refused for the pool's request.
    pub degraded_nodes: usize,
    /// `maxUnavailable` resolved against the pool size.
    pub max_unavailable: usize,
    /// Why the rollout takes no new nodes; `None`: it does.
    pub degraded: Option<Degraded>,
    /// The first stall found (every stalled node is also an issue).
    pub stall: Option<Stall>,
    /// Seconds until the planner wants to look again although nothing may change in the
    /// cluster: a drain pass, a drain retry after its timeout, the next deadline.
    pub recheck_after: Option<u64>,
    /// Nodes an admin should look at.
    pub issues: Vec<NodeIssue>,
    /// Nodes being drained (their blockers are added by the executor).
    pub draining: Vec<String>,
    /// Nodes whose drain ran past its timeout.
    pub timed_out: Vec<String>,
    /// The readiness line, e.g. `12 of 14 ready; 2 refuse: cpu-level`.
    pub readiness: Option<String>,
    /// The pool's nodes are the machine-config operator's: readiness only.
    pub mco_managed: bool,
    /// Nodes whose streamd heartbeat ran out (each also an issue).
    pub agents_down: usize,
    /// The nodes still to move, in the order the rollout takes them (those in flight first
    /// where they stand): the planned order.
    pub upcoming: Vec<String>,
    /// The canary moved its nodes: the pool is to be paused.
    pub canary_complete: bool,
    /// The pool is paused after its canary (not by hand).
    pub canary_paused: bool,
    /// The nodes on their way, in the planned order.
    pub progress: Vec<Progress>,
}

/// Where one node on its way stands, for the pool's `status.progress`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Node name.
    pub name: String,
    /// `Staging`, `WaitingForReboot`, `Draining`, `Rebooting` or `Soaking`.
    pub step: &'static str,
    /// Unix seconds the step started, when the controller wrote it down.
    pub since: Option<u64>,
    /// streamd's last `reason` on the node (while staging: its state).
    pub reason: String,
}

/// The next actions and the status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// In order; each is independent of the others' success.
    pub actions: Vec<Action>,
    /// For the pool's status.
    pub summary: Summary,
    /// Nodes whose [`crate::node::UPDATE_TAINT`] is to be set (`true`: still to update) or
    /// removed (`false`: updated, or the pool is the machine-config operator's); written after
    /// the actions, each conditional on the node as listed.
    pub taints: Vec<(String, bool)>,
}

/// Error in `spec.maxUnavailable`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.maxUnavailable {0:?}: expected a count >= 0 or a percentage such as \"25%\"")]
pub struct MaxUnavailableError(pub String);

/// `maxUnavailable` for a pool of `nodes` nodes: a count, or a percentage rounded down, and at
/// least 1 — as the machine-config operator's node controller
/// (openshift/machine-config-operator:pkg/controller/node/node_controller.go `maxUnavailable`,
/// `intstrutil.GetScaledValueFromIntOrPercent(…, roundUp=false)`, 0 → 1).
pub fn max_unavailable(
    value: Option<&IntOrString>,
    nodes: usize,
) -> Result<usize, MaxUnavailableError> {
    let scaled = match value {
        None => 1,
        Some(IntOrString::Int(n)) => {
            usize::try_from(*n).map_err(|_| MaxUnavailableError(n.to_string()))?
        }
        Some(IntOrString::String(s)) => {
            let percent: usize = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| MaxUnavailableError(s.clone()))?;
            percent.saturating_mul(nodes) / 100
        }
    };
    Ok(scaled.max(1))
}
