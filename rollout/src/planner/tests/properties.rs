//! Property tests of [`plan`]: pools of up to eight nodes in every stand a node can have for
//! the pool's request (and some it should not: a mark on a node not given the request, a mark
//! edited by hand, a node cordoned by someone else or claimed by another pool), checked against
//! what the rollout promises. proptest shrinks a failure to a smallest pool.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use streamd::cluster::protocol::{REASON, REBOOT_REQUESTED};

use crate::node::CHECK_STREAM;

use super::*;

/// `now` of the test pool; a drain started here or later has not timed out.
const RECENT: u64 = 9_900;
/// Long before `now`: past the drain timeout.
const OLD: u64 = 1_000;

/// Where a generated node stands for the pool's request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape {
    /// Not given the request.
    Fresh,
    Staging,
    /// Staged, asking to reboot.
    Staged,
    Done,
    Refused,
    /// Cordoned and being drained by the controller, since long (`old`) or not.
    Draining {
        old: bool,
    },
    /// Its token approved by the controller; then in `state`.
    Approved {
        state: &'static str,
    },
    /// The controller's mark on a node not given the request (it was retargeted).
    StrayMark,
    /// A mark edited by hand, on a staged node.
    Garbled,
    /// Given the request long ago (past `agentTimeoutSeconds`), never acknowledged.
    Silent,
}

/// One generated node: its shape, its `reboot-requested` token and the token in the
/// controller's mark (equal or not), and what else may be true of it.
#[derive(Debug, Clone)]
struct Gen {
    shape: Shape,
    requested: &'static str,
    marked: &'static str,
    ready: bool,
    /// Cordoned by someone else.
    cordoned: bool,
    /// Without the check keys.
    unchecked: bool,
    /// Another pool selects it too.
    claimed: bool,
    /// Held out of the rollout (`rollout-hold`).
    held: bool,
}

impl Gen {
    /// It carries the pool's request.
    fn given(&self) -> bool {
        !matches!(self.shape, Shape::Fresh | Shape::StrayMark)
    }

    /// It carries the controller's mark.
    fn marked(&self) -> bool {
        matches!(
            self.shape,
            Shape::Draining { .. } | Shape::Approved { .. } | Shape::StrayMark | Shape::Garbled
        )
    }

    fn view(&self, name: &str) -> NodeView {
        let staged = |n: NodeView| set(in_state(n, "Staged"), REBOOT_REQUESTED, self.requested);
        let approved = Step::Approved {
            since: None,
            token: self.marked.into(),
        };
        let n = node(name);
        let mut n = match self.shape {
            Shape::Fresh => n,
            Shape::Staging => in_state(n, "Staging"),
            Shape::Silent => set(targeted(n), ROLLOUT_TARGETED, "1000"),
            Shape::Staged => staged(n),
            Shape::Done => in_state(n, "Done"),
            Shape::Refused => set(
                in_state(n, "Refused"),
                REASON,
                "preflight check cpu-level failed: x86-64-v2",
            ),
            Shape::Draining { old } => step(
                staged(n),
                draining(self.marked, if old { OLD } else { RECENT }),
            ),
            Shape::Approved { state: "Staged" } => step(staged(n), approved),
            Shape::Approved { state } => step(in_state(n, state), approved),
            Shape::StrayMark => step(n, approved),
            Shape::Garbled => step(staged(n), Step::Unknown),
        };
        n.ready = self.ready;
        n.unschedulable |= self.cordoned;
        if self.unchecked {
            n.annotations.remove(CHECK_STREAM);
        }
        if self.held {
            n.hold = Some("true".into());
        }
        n
    }
}

fn gen_node() -> impl Strategy<Value = Gen> {
    let shape = prop_oneof![
        Just(Shape::Fresh),
        Just(Shape::Staging),
        Just(Shape::Silent),
        Just(Shape::Staged),
        Just(Shape::Done),
        Just(Shape::Refused),
        any::<bool>().prop_map(|old| Shape::Draining { old }),
        select(vec!["Staged", "Rebooting", "Done", "Degraded"])
            .prop_map(|state| Shape::Approved { state }),
        Just(Shape::StrayMark),
        Just(Shape::Garbled),
    ];
    let token = || select(vec!["t1", "t2"]);
    (
        shape,
        token(),
        token(),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(shape, requested, marked, ready, cordoned, unchecked, claimed, held)| Gen {
                shape,
                requested,
                marked,
                ready,
                cordoned,
                unchecked,
                claimed,
                held,
            },
        )
}

fn gen_pool() -> impl Strategy<Value = PoolInput> {
    let max = prop_oneof![
        Just(None),
        (0i32..4).prop_map(|n| Some(IntOrString::Int(n))),
        select(vec!["25%", "50%", "100%", "half"])
            .prop_map(|s| Some(IntOrString::String(s.into()))),
    ];
    (
        max,
        0usize..4,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        any::<bool>(),
        gen_waves(),
    )
        .prop_map(
            |(max_unavailable, max_concurrent_staging, paused, unresolved, release, waves)| {
                PoolInput {
                    target: if unresolved {
                        Err("spec.target: no OSImageStream".into())
                    } else {
                        Ok(target())
                    },
                    max_unavailable,
                    max_concurrent_staging,
                    paused,
                    drain_on_timeout: if release {
                        OnTimeout::Release
                    } else {
                        OnTimeout::Retry
                    },
                    waves,
                    ..pool()
                }
            },
        )
}

/// A canary or none, a window open or closed, the controller on `w0` or elsewhere.
fn gen_waves() -> impl Strategy<Value = Waves> {
    (
        prop::option::weighted(0.3, 0usize..3),
        any::<bool>(),
        prop::bool::weighted(0.8),
        any::<bool>(),
    )
        .prop_map(|(canary, canary_done, open, own)| Waves {
            controller_node: own.then(|| "w0".to_string()),
            canary,
            canary_done,
            window: waves::WindowNow {
                open,
                change_in: Some(60),
            },
            ..Waves::default()
        })
}

/// Nodes `w0`… and an order to list them in.
fn gen_nodes() -> impl Strategy<Value = (Vec<Gen>, Vec<usize>)> {
    vec(gen_node(), 1..9).prop_flat_map(|gens| {
        let order = Just((0..gens.len()).collect::<Vec<_>>()).prop_shuffle();
        (Just(gens), order)
    })
}

/// Not Ready, cordoned, or taken by the controller (the module's definition).
fn unavailable_now(n: &NodeView) -> bool {
    !n.ready || n.unschedulable || n.annotations.contains_key(ROLLOUT_STEP)
}

/// What the rollout promises of one plan.
fn check(
    input: &PoolInput,
    gens: &[Gen],
    nodes: &[NodeView],
    p: &Plan,
) -> Result<(), TestCaseError> {
    let free: Vec<(&Gen, &NodeView)> = gens.iter().zip(nodes).filter(|(g, _)| !g.claimed).collect();
    let of = |name: &str| free.iter().find(|(_, n)| n.name == name).copied();
    let mut disruptive = BTreeSet::new();
    for a in &p.actions {
        let name = a.node();
        let Some((g, n)) = of(name) else {
            return Err(TestCaseError::fail(format!(
                "{a:?} for a node another pool claims"
            )));
        };
        if !matches!(a, Action::Check { .. }) {
            prop_assert!(
                disruptive.insert(name),
                "two steps for {name}: {:?}",
                p.actions
            );
        }
        check_step(input, p, g, n, a)?;
    }

    // Checks: exactly the nodes without the check keys that are not given the request (all
    // of them while the request or maxUnavailable is invalid).
    let usable =
        input.target.is_ok() && max_unavailable(input.max_unavailable.as_ref(), free.len()).is_ok();
    // A node silent past its agent deadline is named (and, above, never targeted again or
    // cordoned).
    for (g, n) in free
        .iter()
        .filter(|(g, _)| usable && g.shape == Shape::Silent && !g.held)
    {
        prop_assert!(
            p.summary
                .issues
                .iter()
                .any(|i| i.name == n.name && i.state == "AgentNotResponding"),
            "{:?} not named",
            g
        );
    }
    // In the planned order (the controller's node last): compared as a set.
    let mut checks: Vec<&str> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Check { .. }))
        .map(Action::node)
        .collect();
    checks.sort_unstable();
    let mut want: Vec<&str> = free
        .iter()
        .filter(|(g, _)| g.unchecked && !(g.given() && usable))
        .map(|(_, n)| n.name.as_str())
        .collect();
    want.sort_unstable();
    prop_assert_eq!(checks, want);

    let targets = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Target { .. }))
        .count();
    prop_assert!(targets <= input.max_concurrent_staging, "{targets} targets");

    check_capacity(input, &free, p)?;
    // A node of two custom pools is listed, and does not make the pool Degraded.
    for (g, n) in gens.iter().zip(nodes).filter(|(g, _)| g.claimed) {
        prop_assert!(
            p.summary
                .issues
                .iter()
                .any(|i| i.name == n.name && i.state == "Conflict"),
            "{:?} not listed",
            g
        );
    }
    Ok(())
}

/// What the rollout promises of action `a` for node `n` (generated as `g`).
fn check_step(
    input: &PoolInput,
    p: &Plan,
    g: &Gen,
    n: &NodeView,
    a: &Action,
) -> Result<(), TestCaseError> {
    let name = a.node();
    match a {
        Action::Check { .. } => {}
        Action::Target { .. } => {
            prop_assert!(!g.given(), "{name} given the request again");
            // A node the controller already took (its mark) finishes its cycle, held or not.
            prop_assert!(!g.held || g.marked(), "{name} held, and given the request");
            prop_assert!(
                !input.paused && p.summary.degraded.is_none(),
                "{a:?} while paused or degraded"
            );
        }
        Action::Cordon { token, .. } => {
            prop_assert_eq!(
                token.as_str(),
                g.requested,
                "{} cordoned for another token",
                name
            );
            prop_assert!(!input.paused, "{a:?} while paused");
            if g.marked() {
                // Drained again only for a token not drained or approved yet (or a mark
                // it cannot read): never a second drain and approval of one token.
                let stale = g.marked != g.requested
                    && matches!(
                        g.shape,
                        Shape::Draining { .. } | Shape::Approved { state: "Staged" }
                    );
                prop_assert!(stale || g.shape == Shape::Garbled, "{a:?} of {g:?}");
            } else {
                prop_assert!(
                    g.shape == Shape::Staged && n.ready && !n.unschedulable,
                    "{a:?} of {g:?}"
                );
                prop_assert!(!g.held, "{name} held, and cordoned");
                prop_assert!(input.waves.window.open, "{a:?} outside the windows");
                prop_assert!(p.summary.degraded.is_none(), "{a:?} while degraded");
            }
        }
        Action::Drain { token, .. } => {
            // The only step that approves: for the token being drained (past its timeout only
            // with `onTimeout: retry`); never for a token already approved.
            let retried = input.drain_on_timeout == OnTimeout::Retry;
            prop_assert!(
                g.shape == Shape::Draining { old: false }
                    || (retried && g.shape == Shape::Draining { old: true }),
                "{:?} of {:?}",
                a,
                g
            );
            prop_assert_eq!(token.as_str(), g.requested);
            prop_assert_eq!(g.marked, g.requested, "{:?} of {:?}", a, g);
            prop_assert!(!input.paused, "{a:?} while paused");
        }
        Action::Recordon { .. } => {
            prop_assert!(
                matches!(g.shape, Shape::Draining { .. }) && !n.unschedulable,
                "{:?} of {:?}",
                a,
                g
            );
        }
        Action::SetAside { token, .. } => {
            // Only a drain past its timeout, under `onTimeout: release`, for its own token.
            prop_assert_eq!(input.drain_on_timeout, OnTimeout::Release);
            prop_assert_eq!(g.shape, Shape::Draining { old: true }, "{:?} of {:?}", a, g);
            prop_assert_eq!(token.as_str(), g.requested);
            prop_assert_eq!(g.marked, g.requested, "{:?} of {:?}", a, g);
        }
        Action::Release { .. } => {
            return Err(TestCaseError::fail(format!(
                "{a:?} without the machine-config operator"
            )));
        }
        Action::Uncordon { .. } => {
            prop_assert_eq!(
                g.shape,
                Shape::Approved { state: "Done" },
                "{:?} of {:?}",
                a,
                g
            );
            prop_assert!(n.ready, "{a:?} of a node not Ready");
        }
    }
    Ok(())
}

/// Never more than maxUnavailable unavailable (a pool already over it takes none).
fn check_capacity(
    input: &PoolInput,
    free: &[(&Gen, &NodeView)],
    p: &Plan,
) -> Result<(), TestCaseError> {
    let available = |name: &str| {
        free.iter()
            .any(|(_, n)| n.name == name && !unavailable_now(n))
    };
    let before = free
        .iter()
        .filter(|(g, n)| (g.marked() || !g.held) && unavailable_now(n))
        .count();
    let taken = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Cordon { node, .. } if available(node)))
        .count();
    if let Some(canary) = input.waves.canary.filter(|_| !input.waves.canary_done) {
        prop_assert!(taken <= canary, "{taken} taken by a canary of {canary}");
    }
    match max_unavailable(input.max_unavailable.as_ref(), free.len()) {
        Ok(limit) => prop_assert!(
            taken == 0 || before + taken <= limit,
            "{before} unavailable + {taken} taken > {limit}"
        ),
        Err(_) => prop_assert_eq!(taken, 0),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn plans_keep_the_rollouts_promises(input in gen_pool(), (gens, order) in gen_nodes()) {
        let nodes: Vec<NodeView> =
            gens.iter().enumerate().map(|(i, g)| g.view(&format!("w{i}"))).collect();
        let input = PoolInput {
            claimed: nodes
                .iter()
                .zip(&gens)
                .filter(|(_, g)| g.claimed)
                .map(|(n, _)| (n.name.clone(), "infra".to_string()))
                .collect(),
            ..input
        };
        let p = plan(&input, &nodes);
        check(&input, &gens, &nodes, &p)?;
        // The plan depends on the nodes, not on the order they are listed in.
        let listed: Vec<NodeView> = order.iter().map(|&i| nodes[i].clone()).collect();
        prop_assert_eq!(plan(&input, &listed), p);
    }
}
