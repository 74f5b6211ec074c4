//! `testbed bench --fleet N --strategy …`: the order in which a node is moved, with simulated
//! durations, and the model the measured figures are held against (issue 21 §7).
//!
//! `stage-first` (the default) is `streamd-rollout`'s order: every node pulls and stages while
//! it still serves, and only a staged node is cordoned, drained and approved. `drain-first` is
//! the machine-config operator's order, which the controller does not offer: the node is
//! cordoned and drained first, then the agent pulls and stages while the node is out, then its
//! reboot is approved. The bench plays that controller itself, over the node protocol (see
//! [`drain_first`]); it looks every 100 ms and drains without the controller's 5 s drain
//! passes, so it is, if anything, favoured.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::{Value, json};
use streamd::cluster::protocol::{
    DESIRED_OS_IMAGE, DESIRED_STREAM, OBSERVED_DESIRED, REBOOT_APPROVED, REBOOT_REQUESTED, STATE,
};

use crate::control::{ApiServerCmd, RpmOstreedCmd};
use crate::harness::fleet::Fleet;

/// How often the drain-first orchestration looks at a node.
const POLL: Duration = Duration::from_millis(100);
/// The namespace of the bench's pods.
const NAMESPACE: &str = "bench";

/// The order in which a node is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// `streamd-rollout`: stage while the node serves, then cordon, drain, approve.
    StageFirst,
    /// The machine-config operator's order, played by the bench: cordon, drain, stage, approve.
    DrainFirst,
}

/// The simulated durations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Simulated {
    /// How long a node's staging takes beyond the fake's own work (the fake rpm-ostreed's
    /// `slow` knob: a pull of a real image).
    pub pull: Duration,
    /// How long a node's one pod takes to stop once evicted (the API server's `pod-removal`
    /// delay); zero: the node runs no pod.
    pub drain: Duration,
    /// How long a rebooting node stays down (NotReady, streamd stopped).
    pub reboot: Duration,
}

impl Simulated {
    /// The grace period the drain gives the pod: long enough for it to stop by itself.
    pub fn grace_seconds(&self) -> i64 {
        i64::try_from(self.drain.as_secs()).unwrap_or(i64::MAX / 2) + 1
    }
}

/// What the figures are held against, from the simulated durations alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// ceil(N / M).
    pub rounds: usize,
    /// drain + reboot: the least a node can be unavailable.
    pub window_s: f64,
    /// The pipelined ideal: the first staging, then ceil(N / M) × (drain + reboot).
    pub pipelined_s: f64,
    /// Drain-first's ideal: ceil(N / M) × (drain + pull + reboot).
    pub drain_first_s: f64,
}

impl Model {
    /// The model for `nodes` nodes, `max_unavailable` at once (at least 1).
    pub fn new(nodes: usize, max_unavailable: usize, sim: &Simulated) -> Model {
        let rounds = nodes.div_ceil(max_unavailable.max(1));
        let (pull, drain, reboot) = (
            sim.pull.as_secs_f64(),
            sim.drain.as_secs_f64(),
            sim.reboot.as_secs_f64(),
        );
        let window_s = drain + reboot;
        Model {
            rounds,
            window_s,
            pipelined_s: pull + rounds as f64 * window_s,
            drain_first_s: rounds as f64 * (drain + pull + reboot),
        }
    }

    /// The figures against the model: the mean unavailable window over drain + reboot and the
    /// wall time over the pipelined ideal (issue 21 §7's goals: at most 1.1 each).
    pub fn ratios(&self, window_mean_s: f64, wall_s: f64) -> Value {
        let ratio = |x: f64, of: f64| {
            if of > 0.0 {
                Some(super::round2(x / of))
            } else {
                None
            }
        };
        json!({
            "rounds": self.rounds,
            "drain_plus_reboot_s": super::round2(self.window_s),
            "pipelined_ideal_s": super::round2(self.pipelined_s),
            "drain_first_ideal_s": super::round2(self.drain_first_s),
            "window_over_drain_plus_reboot": ratio(window_mean_s, self.window_s),
            "wall_over_pipelined_ideal": ratio(wall_s, self.pipelined_s),
            "wall_over_drain_first_ideal": ratio(wall_s, self.drain_first_s),
        })
    }
}

/// Slows every node's staging by `sim.pull` and, with a drain time, gives every node one
/// replicated pod that takes `sim.drain` to stop.
pub async fn prepare(fleet: &Fleet, sim: &Simulated) -> anyhow::Result<()> {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    for node in fleet.nodes() {
        fleet
            .control(RpmOstreedCmd::Slow { ms: ms(sim.pull) }.on(&node))
            .await?;
        if !sim.drain.is_zero() {
            let labels = json!({ "app": "bench" });
            fleet.add_pod(
                NAMESPACE,
                &format!("app-{node}"),
                &node,
                labels,
                Some(("ReplicaSet", "app")),
            )?;
        }
    }
    fleet
        .control(ApiServerCmd::PodRemoval {
            delay_ms: ms(sim.drain),
        })
        .await?;
    Ok(())
}

/// Moves every node drain-first, `max_unavailable` at a time in name order (a new one as soon
/// as one is back), to the rhel-10 image; an error after `timeout`.
pub async fn drain_first(
    fleet: &Fleet,
    max_unavailable: usize,
    sim: &Simulated,
    timeout: Duration,
) -> anyhow::Result<()> {
    let image = fleet
        .images()
        .iter()
        .find(|i| i.stream == "rhel-10")
        .context("the registry serves no rhel-10 image")?
        .pullspec
        .clone();
    let deadline = Instant::now() + timeout;
    let grace = sim.grace_seconds();
    futures::stream::iter(fleet.nodes())
        .map(|node| {
            let image = image.clone();
            async move { move_node(fleet, &node, &image, grace, deadline).await }
        })
        .buffer_unordered(max_unavailable.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// One node, as the machine-config operator moves it: cordon, drain, then the request (the
/// agent pulls and stages), the approval of its reboot, back `Done` and Ready, uncordon.
async fn move_node(
    fleet: &Fleet,
    node: &str,
    image: &str,
    grace: i64,
    deadline: Instant,
) -> anyhow::Result<()> {
    let api = fleet.apiserver();
    api.update("v1", "Node", None, node, |n| {
        n["spec"]["unschedulable"] = json!(true);
    })?;
    let on_node = |p: &Value| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node);
    for pod in api
        .list("v1", "Pod", Some(NAMESPACE))?
        .iter()
        .filter(|p| on_node(p))
    {
        let name = pod.pointer("/metadata/name").and_then(Value::as_str);
        api.delete_pod(NAMESPACE, name.unwrap_or_default(), grace)?;
    }
    until(deadline, "its pods to go", node, || {
        Ok(!api.list("v1", "Pod", Some(NAMESPACE))?.iter().any(on_node))
    })
    .await?;
    api.update("v1", "Node", None, node, |n| {
        n["metadata"]["annotations"][DESIRED_STREAM] = json!("rhel-10");
        n["metadata"]["annotations"][DESIRED_OS_IMAGE] = json!(image);
    })?;
    let mut token = None;
    until(deadline, "its agent to stage", node, || {
        let a = fleet.annotations(node)?;
        token = (a[STATE] == "Staged" && a.get(OBSERVED_DESIRED).is_some())
            .then(|| a[REBOOT_REQUESTED].as_str().map(String::from))
            .flatten();
        Ok(token.is_some())
    })
    .await?;
    api.update("v1", "Node", None, node, |n| {
        n["metadata"]["annotations"][REBOOT_APPROVED] = json!(token);
    })?;
    until(deadline, "it to come back Done and Ready", node, || {
        let n = api.get("v1", "Node", None, node)?;
        let ready = n
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        Ok(ready && fleet.annotations(node)?[STATE] == "Done")
    })
    .await?;
    api.update("v1", "Node", None, node, |n| {
        n["spec"]["unschedulable"] = json!(false);
        if let Some(a) = n["metadata"]["annotations"].as_object_mut() {
            a.remove(REBOOT_APPROVED);
        }
    })?;
    Ok(())
}

/// Polls `done` until it holds; an error past `deadline`.
async fn until(
    deadline: Instant,
    what: &str,
    node: &str,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    while !done()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what} on {node}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(pull: f64, drain: f64, reboot: f64) -> Simulated {
        Simulated {
            pull: Duration::from_secs_f64(pull),
            drain: Duration::from_secs_f64(drain),
            reboot: Duration::from_secs_f64(reboot),
        }
    }

    #[test]
    fn the_model_pipelines_the_first_staging_only() {
        let m = Model::new(4, 1, &sim(15.0, 6.0, 12.0));
        assert_eq!(m.rounds, 4);
        assert_eq!(m.window_s, 18.0);
        assert_eq!(m.pipelined_s, 15.0 + 4.0 * 18.0);
        assert_eq!(m.drain_first_s, 4.0 * 33.0);
        // ceil(N / M): 5 nodes two at a time take three rounds.
        let m = Model::new(5, 2, &sim(1.0, 2.0, 3.0));
        assert_eq!((m.rounds, m.pipelined_s, m.drain_first_s), (3, 16.0, 18.0));
    }

    #[test]
    fn ratios_are_against_the_model() {
        let r = Model::new(4, 1, &sim(15.0, 6.0, 12.0)).ratios(19.8, 95.7);
        assert_eq!(r["window_over_drain_plus_reboot"], 1.1);
        assert_eq!(r["wall_over_pipelined_ideal"], 1.1);
        assert_eq!(r["wall_over_drain_first_ideal"], 0.73);
        // Nothing simulated: no ratio rather than a division by zero.
        let r = Model::new(1, 1, &Simulated::default()).ratios(1.0, 1.0);
        assert_eq!(r["window_over_drain_plus_reboot"], Value::Null);
    }

    #[test]
    fn the_grace_period_outlasts_the_drain() {
        assert_eq!(sim(0.0, 6.5, 0.0).grace_seconds(), 7);
        assert_eq!(sim(0.0, 0.0, 0.0).grace_seconds(), 1);
    }
}
