//! `testbed bench --fleet N`: moves a fleet of N real streamd agents from rhel-9 to rhel-10 and
//! measures, never asserts: API requests per node by verb and user, watches open per agent, the
//! most nodes unavailable at once (from the API server's own record) against `maxUnavailable`,
//! the wall time against the ideal of ceil(N / maxUnavailable) node cycles, and the agents' RSS
//! and CPU.
//!
//! The pool is driven by a reference driver inside the bench (it writes through the API server's
//! library API, so it makes no requests of its own): desired annotations on at most
//! `max_staging` nodes at a time, and for at most `max_unavailable` staged nodes at a time:
//! cordon, approve the exact token, wait for `Done` and `Ready`, uncordon. The rollout controller
//! replaces it when it drives the pool (its requests then count under its own user).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{Fleet, FleetOptions};
use crate::bench::{cpu_ticks, status_kib};

const PREFIX: &str = "osstream.openshift.io/";
/// USER_HZ on Linux.
const TICKS_PER_S: f64 = 100.0;

/// Fleet bench parameters.
#[derive(Debug, Clone)]
pub struct FleetBenchOptions {
    /// Directory for the fleet.
    pub dir: PathBuf,
    /// How many nodes.
    pub nodes: usize,
    /// The streamd binary.
    pub streamd: PathBuf,
    /// Nodes rebooting (cordoned) at once.
    pub max_unavailable: usize,
    /// Nodes asked to stage at once.
    pub max_staging: usize,
}

/// Per node: the most RSS seen and the CPU ticks of each streamd process it ran.
#[derive(Default)]
struct Usage {
    max_rss_kib: u64,
    ticks_by_pid: HashMap<u32, u64>,
}

/// Runs the bench and returns the figures.
pub async fn run(opts: &FleetBenchOptions) -> anyhow::Result<Value> {
    if opts.max_unavailable == 0 || opts.max_staging == 0 {
        bail!("max-unavailable and max-staging must be at least 1");
    }
    let started = Instant::now();
    let fleet = Fleet::start(FleetOptions {
        streamd: Some(opts.streamd.clone()),
        ..FleetOptions::new(&opts.dir, opts.nodes)
    })
    .await?;
    let up_s = started.elapsed().as_secs_f64();
    let nodes = fleet.nodes();
    wait_all(
        &fleet,
        &nodes,
        Duration::from_secs(60 + nodes.len() as u64),
        |a| state(a) == Some("Idle"),
    )
    .await
    .context("waiting for every agent to report Idle")?;
    let api = fleet.apiserver();
    api.control(&json!({"cmd": "reset-stats"})).await?;
    api.control(&json!({"cmd": "reset-unavailable"})).await?;

    let usage: Arc<Mutex<BTreeMap<String, Usage>>> = Arc::default();
    let sampler = {
        let pids = pids(&fleet).await;
        let usage = usage.clone();
        let fleet_pids = Arc::new(Mutex::new(pids));
        let sampled = fleet_pids.clone();
        (
            tokio::spawn(async move {
                loop {
                    let pids = sampled.lock().map(|p| p.clone()).unwrap_or_default();
                    sample(&usage, &pids);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }),
            fleet_pids,
        )
    };
    let rollout_started = Instant::now();
    let cycles = drive(&fleet, opts, &sampler.1).await;
    let wall_s = rollout_started.elapsed().as_secs_f64();
    // One last sample of the processes as they are now.
    if let Ok(p) = sampler.1.lock() {
        sample(&usage, &p);
    }
    sampler.0.abort();
    let cycles = cycles?;

    let stats = api.control(&json!({"cmd": "stats"})).await?;
    let record = api.control(&json!({"cmd": "unavailable"})).await?;
    let n = nodes.len() as f64;
    let mut agent_verbs: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_node_totals = Vec::new();
    let mut watches_max = Vec::new();
    let mut others = serde_json::Map::new();
    for (user, verbs) in stats["by_user"].as_object().into_iter().flatten() {
        if user.starts_with("system:node:") {
            let mut total = 0;
            for (verb, count) in verbs.as_object().into_iter().flatten() {
                let c = count.as_u64().unwrap_or(0);
                *agent_verbs.entry(verb.clone()).or_default() += c;
                total += c;
            }
            per_node_totals.push(total);
            watches_max.push(stats["watches_max"][user].as_u64().unwrap_or(0));
        } else {
            others.insert(user.clone(), verbs.clone());
        }
    }
    let per_node: BTreeMap<String, f64> = agent_verbs
        .iter()
        .map(|(v, c)| (v.clone(), round2(*c as f64 / n)))
        .collect();
    let usage = usage
        .lock()
        .map_err(|_| anyhow::anyhow!("usage lock poisoned"))?;
    let rss: Vec<u64> = usage.values().map(|u| u.max_rss_kib).collect();
    let cpu_s: Vec<f64> = usage
        .values()
        .map(|u| u.ticks_by_pid.values().sum::<u64>() as f64 / TICKS_PER_S)
        .collect();
    let mean_cycle_s = mean(&cycles);
    let rounds = nodes.len().div_ceil(opts.max_unavailable);
    let own = std::process::id();
    Ok(json!({
        "nodes": nodes.len(),
        "max_unavailable": opts.max_unavailable,
        "max_staging": opts.max_staging,
        "driver": "reference (in-process, no API requests)",
        "fleet_up_s": round2(up_s),
        "rollout_wall_s": round2(wall_s),
        "node_cycle_s": { "mean": round2(mean_cycle_s), "max": round2(cycles.iter().copied().fold(0.0, f64::max)) },
        "ideal_s": round2(rounds as f64 * mean_cycle_s),
        "ideal_rounds": rounds,
        "max_unavailable_seen": record["max"],
        "agent_requests_per_node": per_node,
        "agent_requests_per_node_total": {
            "mean": round2(per_node_totals.iter().sum::<u64>() as f64 / n),
            "max": per_node_totals.iter().max(),
        },
        "other_users_requests": others,
        "agent_watches_open_max": { "mean": round2(watches_max.iter().sum::<u64>() as f64 / n), "max": watches_max.iter().max() },
        "agent_rss_kib_max": { "mean": round2(rss.iter().sum::<u64>() as f64 / n), "max": rss.iter().max() },
        "agent_cpu_s": { "mean": round2(cpu_s.iter().sum::<f64>() / n), "max": round2(cpu_s.iter().copied().fold(0.0, f64::max)) },
        "testbed_process": {
            "rss_kib": status_kib(own, "VmRSS").ok(),
            "cpu_s": cpu_ticks(own).ok().map(|t| round2(t as f64 / TICKS_PER_S)),
        },
    }))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

fn state(a: &Value) -> Option<&str> {
    a.get(format!("{PREFIX}state")).and_then(Value::as_str)
}

async fn pids(fleet: &Fleet) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for node in fleet.nodes() {
        if let Ok(Some(pid)) = fleet.streamd_pid(&node).await {
            out.insert(node, pid);
        }
    }
    out
}

fn sample(usage: &Mutex<BTreeMap<String, Usage>>, pids: &BTreeMap<String, u32>) {
    let Ok(mut usage) = usage.lock() else {
        return;
    };
    for (node, pid) in pids {
        let u = usage.entry(node.clone()).or_default();
        if let Ok(rss) = status_kib(*pid, "VmRSS") {
            u.max_rss_kib = u.max_rss_kib.max(rss);
        }
        // A process that is gone keeps its last reading.
        if let Ok(ticks) = cpu_ticks(*pid) {
            u.ticks_by_pid.insert(*pid, ticks);
        }
    }
}

async fn wait_all(
    fleet: &Fleet,
    nodes: &[String],
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut pending = Vec::new();
        for n in nodes {
            if !pred(&fleet.annotations(n)?) {
                pending.push(n.clone());
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not reached within {timeout:?} on {pending:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(fleet: &Fleet, node: &str) -> bool {
    fleet
        .apiserver()
        .get("v1", "Node", None, node)
        .ok()
        .and_then(|n| {
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")
                .map(|c| c["status"] == "True")
        })
        .unwrap_or(false)
}

/// The reference driver; returns each node's cycle (approval to `Done` and `Ready`) in seconds.
async fn drive(
    fleet: &Fleet,
    opts: &FleetBenchOptions,
    pids: &Mutex<BTreeMap<String, u32>>,
) -> anyhow::Result<Vec<f64>> {
    let api = fleet.apiserver();
    let rhel10 = fleet.env()["TESTBED_RHEL10_IMAGE"].clone();
    let nodes = fleet.nodes();
    let mut requested: Vec<String> = Vec::new();
    let mut rebooting: BTreeMap<String, Instant> = BTreeMap::new();
    let mut done: Vec<String> = Vec::new();
    let mut cycles = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600 + 20 * nodes.len() as u64);
    while done.len() < nodes.len() {
        if Instant::now() > deadline {
            bail!(
                "the rollout did not finish: {} of {} done",
                done.len(),
                nodes.len()
            );
        }
        let staging = requested
            .iter()
            .filter(|n| !done.contains(n) && !rebooting.contains_key(*n))
            .filter(|n| {
                fleet.annotations(n).is_ok_and(|a| {
                    !a.get(format!("{PREFIX}reboot-requested"))
                        .is_some_and(|v| v.is_string())
                })
            })
            .count();
        for node in nodes
            .iter()
            .filter(|n| !requested.contains(n))
            .take(opts.max_staging.saturating_sub(staging))
            .cloned()
            .collect::<Vec<_>>()
        {
            api.update("v1", "Node", None, &node, |n| {
                n["metadata"]["annotations"][format!("{PREFIX}desired-stream")] = json!("rhel-10");
                n["metadata"]["annotations"][format!("{PREFIX}desired-os-image")] = json!(rhel10);
            })?;
            requested.push(node);
        }
        for node in requested.clone() {
            if done.contains(&node) {
                continue;
            }
            let a = fleet.annotations(&node)?;
            match state(&a) {
                Some("Degraded" | "Refused") => {
                    bail!(
                        "{node} is {:?}: {}",
                        state(&a),
                        a[format!("{PREFIX}reason")]
                    )
                }
                Some("Done") if rebooting.contains_key(&node) && ready(fleet, &node) => {
                    api.update("v1", "Node", None, &node, |n| {
                        if let Some(spec) = n["spec"].as_object_mut() {
                            spec.remove("unschedulable");
                        }
                    })?;
                    if let Some(at) = rebooting.remove(&node) {
                        cycles.push(at.elapsed().as_secs_f64());
                    }
                    if let Ok(Some(pid)) = fleet.streamd_pid(&node).await
                        && let Ok(mut p) = pids.lock()
                    {
                        p.insert(node.clone(), pid);
                    }
                    done.push(node);
                }
                Some("Staged")
                    if !rebooting.contains_key(&node) && rebooting.len() < opts.max_unavailable =>
                {
                    let Some(token) = a
                        .get(format!("{PREFIX}reboot-requested"))
                        .and_then(Value::as_str)
                        .map(String::from)
                    else {
                        continue;
                    };
                    api.update("v1", "Node", None, &node, |n| {
                        n["spec"]["unschedulable"] = json!(true);
                        n["metadata"]["annotations"][format!("{PREFIX}reboot-approved")] =
                            json!(token);
                    })?;
                    rebooting.insert(node.clone(), Instant::now());
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(cycles)
}
