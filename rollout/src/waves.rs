//! How gently a pool moves: the order it takes its nodes in, nodes held out of the rollout, the
//! soak after a node is back, the canary and the maintenance windows. Pure: the planner asks,
//! the controller resolves the inputs ([`Waves`]) from the spec, the pool and the clock.

use std::cmp::Ordering;

use crate::node::NodeView;

pub use crate::node::{HOLD, ZONE_LABEL};

/// On the StreamPool, written by the controller with `spec.paused: true` when its canary is
/// done: the pool's resolved target (`<stream> <os image>`) the canary ran for. Setting
/// `spec.paused: false` lets the pool go on; the canary is not run again for that target
/// (removing the annotation runs it again).
pub const CANARY_DONE: &str = "osstream.openshift.io/canary-done";

/// What the planner needs beyond the pool's core settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Waves {
    /// The node the controller runs on: taken last, once no other node of the pool is on its
    /// way (as the machine-config operator defers its own node).
    pub controller_node: Option<String>,
    /// `spec.minReadySeconds`: how long a node is counted unavailable after it is back and
    /// uncordoned, before the slot it frees is given to the next node.
    pub min_ready_seconds: u64,
    /// `spec.canary`: how many nodes are moved before the pool pauses; `None`: no canary.
    pub canary: Option<usize>,
    /// The canary already ran for the pool's current target ([`CANARY_DONE`]).
    pub canary_done: bool,
    /// Whether a maintenance window is open now (or no windows are set).
    pub window: WindowNow,
}

/// Where the maintenance windows stand now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowNow {
    /// A window is open (or none is set): new nodes may be cordoned.
    pub open: bool,
    /// Seconds until that changes; `None`: never (no windows).
    pub change_in: Option<u64>,
}

impl Default for WindowNow {
    fn default() -> Self {
        WindowNow {
            open: true,
            change_in: None,
        }
    }
}

/// Whether `n` is held out of the rollout ([`HOLD`]).
pub fn held(n: &NodeView) -> bool {
    n.hold.as_deref().is_some_and(|v| v != "false")
}

/// The order nodes are taken in, as the machine-config operator's node controller sorts its
/// candidates (openshift/machine-config-operator:pkg/controller/node/node_controller.go,
/// release-4.21, `sortNodeList`: by [`ZONE_LABEL`], one zone after the other so that the nodes
/// unavailable at once share a zone; within a zone and for the nodes without the label (last)
/// oldest first), then by name for a stable order; the controller's own node last
/// (`filterControlPlaneCandidateNodes` defers the operator's node).
pub fn order(nodes: &mut [&NodeView], controller_node: Option<&str>) {
    nodes.sort_by(|a, b| compare(a, b, controller_node));
}

fn compare(a: &NodeView, b: &NodeView, controller_node: Option<&str>) -> Ordering {
    let own = |n: &NodeView| controller_node == Some(n.name.as_str());
    let zone = |n: &NodeView| (n.zone.is_none(), n.zone.clone());
    // Nodes without a creation time (never from the API server) sort as the youngest.
    let age = |n: &NodeView| n.created.unwrap_or(i64::MAX);
    own(a)
        .cmp(&own(b))
        .then_with(|| zone(a).cmp(&zone(b)))
        .then_with(|| age(a).cmp(&age(b)))
        .then_with(|| a.name.cmp(&b.name))
}

/// Whether `n`, back and uncordoned by the controller at `updated_at`, still soaks at `now`
/// (counted unavailable); with the seconds left.
pub fn soaking(n: &NodeView, min_ready_seconds: u64, now: u64) -> Option<u64> {
    let end = n.updated_at()?.saturating_add(min_ready_seconds);
    (end > now).then(|| end - now)
}

/// How many more nodes the canary lets the pool take: `None` without a canary (or once it ran
/// for the target); `taken` counts the nodes updated or in flight.
pub fn canary_slots(waves: &Waves, taken: usize) -> Option<usize> {
    let n = waves.canary.filter(|_| !waves.canary_done)?;
    Some(n.saturating_sub(taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, zone: Option<&str>, created: Option<i64>) -> NodeView {
        NodeView {
            name: name.into(),
            zone: zone.map(Into::into),
            created,
            ..NodeView::default()
        }
    }

    /// What, the nodes, the controller's node, the order wanted.
    type Row = (
        &'static str,
        Vec<NodeView>,
        Option<&'static str>,
        Vec<&'static str>,
    );

    fn names(nodes: &[NodeView], own: Option<&str>) -> Vec<String> {
        let mut refs: Vec<&NodeView> = nodes.iter().collect();
        order(&mut refs, own);
        refs.iter().map(|n| n.name.clone()).collect()
    }

    #[test]
    fn order_is_zone_by_zone_oldest_first_unlabelled_and_own_node_last() {
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("by name when nothing else differs", vec![n("b", None, None), n("a", None, None)], None, vec!["a", "b"]),
            ("oldest first, not by name", vec![n("a", None, Some(20)), n("b", None, Some(10))], None, vec!["b", "a"]),
            ("one zone after the other", vec![
                n("a1", Some("a"), Some(30)), n("b1", Some("b"), Some(10)),
                n("a2", Some("a"), Some(20)), n("b2", Some("b"), Some(5)),
             ], None, vec!["a2", "a1", "b2", "b1"]),
            ("nodes without a zone last, oldest first", vec![
                n("x", None, Some(1)), n("y", Some("z"), Some(99)), n("w", None, Some(0)),
             ], None, vec!["y", "w", "x"]),
            ("the controller's node last, whatever its zone and age", vec![
                n("ctl", Some("a"), Some(0)), n("b1", Some("b"), Some(9)), n("u", None, Some(5)),
             ], Some("ctl"), vec!["b1", "u", "ctl"]),
            ("a controller node outside the pool changes nothing", vec![n("b", None, None), n("a", None, None)],
             Some("elsewhere"), vec!["a", "b"]),
        ];
        for (what, nodes, own, want) in table {
            assert_eq!(names(&nodes, own), want, "{what}");
        }
    }

    #[test]
    fn order_is_a_total_order_independent_of_the_input_order() {
        let nodes = vec![
            n("c", Some("a"), Some(3)),
            n("a", Some("a"), Some(3)),
            n("d", None, None),
            n("b", Some("b"), Some(1)),
            n("e", None, Some(2)),
        ];
        let want = names(&nodes, Some("a"));
        let mut rotated = nodes.clone();
        for _ in 0..nodes.len() {
            rotated.rotate_left(1);
            assert_eq!(names(&rotated, Some("a")), want);
            let mut reversed = rotated.clone();
            reversed.reverse();
            assert_eq!(names(&reversed, Some("a")), want);
        }
    }

    #[test]
    fn hold_is_any_value_but_false() {
        let mut node = NodeView::default();
        assert!(!held(&node));
        for (v, want) in [
            ("true", true),
            ("", true),
            ("ticket-42", true),
            ("false", false),
        ] {
            node.hold = Some(v.into());
            assert_eq!(held(&node), want, "{v:?}");
        }
    }

    #[test]
    fn soak_counts_from_the_uncordon() {
        let mut node = NodeView::default();
        assert_eq!(soaking(&node, 60, 1_000), None, "never uncordoned by us");
        node.annotations
            .insert(crate::node::ROLLOUT_UPDATED.into(), "1000".into());
        assert_eq!(soaking(&node, 0, 1_000), None);
        assert_eq!(soaking(&node, 60, 1_000), Some(60));
        assert_eq!(soaking(&node, 60, 1_059), Some(1));
        assert_eq!(soaking(&node, 60, 1_060), None);
    }

    #[test]
    fn canary_slots_count_down_and_end_once_done() {
        let w = |canary, canary_done| Waves {
            canary,
            canary_done,
            ..Waves::default()
        };
        assert_eq!(canary_slots(&w(None, false), 3), None);
        assert_eq!(canary_slots(&w(Some(2), false), 0), Some(2));
        assert_eq!(canary_slots(&w(Some(2), false), 1), Some(1));
        assert_eq!(canary_slots(&w(Some(2), false), 5), Some(0));
        assert_eq!(canary_slots(&w(Some(2), true), 0), None);
    }
}
