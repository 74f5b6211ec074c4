//! `testbed bench --fleet N`: a fleet of N real streamd agents moved from rhel-9 to rhel-10 by the
//! real rollout controller, measured, never asserted.
//!
//! The controller runs as deployed ([`controller`]): the shipped CRD and RBAC, two
//! `streamd-rollout` replicas as its service account with leader election on. Once every agent is
//! Idle and a replica leads, the bench creates a StreamPool (target `rhel-10` through the
//! cluster's OSImageStream, `maxUnavailable` M, `maxConcurrentStaging` S) and waits until the
//! pool reports `Updated`. It records API requests by user and verb (controller vs agents) and
//! watches open (the API server's stats), the most nodes unavailable at once and each node's
//! time unavailable (the API server's own record), the nodes `Staging` at once (sampled) and
//! the pulling transactions at once (the fake rpm-ostreeds' records), and the RSS and CPU of the
//! replicas and of every agent process.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use streamd::cluster::protocol::STATE;

use super::strategy::{self, Model, Simulated, Strategy};
use super::{cpu_ticks, round2, status_kib};
use crate::control::{ApiServerCmd, RpmOstreedCmd};
use crate::fakes::apiserver::clock::unix_ms;
use crate::harness::fleet::controller::{self, Replica, SERVICE_ACCOUNT};
use crate::harness::fleet::{Fleet, FleetOptions};

/// USER_HZ on Linux.
const TICKS_PER_S: f64 = 100.0;
/// Replicas of the controller: two, as docs/deploy/rollout/deployment.yaml runs it, so the
/// standby's lease polling is part of the cost.
const REPLICAS: usize = 2;
/// How often the bench looks at the pool and the nodes (through the library API: no requests).
const POLL: Duration = Duration::from_millis(100);
/// How often it samples the processes' RSS and CPU.
const SAMPLE: Duration = Duration::from_millis(500);

/// Fleet bench parameters.
#[derive(Debug, Clone)]
pub struct FleetBenchOptions {
    /// Directory for the fleet.
    pub dir: PathBuf,
    /// How many nodes.
    pub nodes: usize,
    /// The streamd binary.
    pub streamd: PathBuf,
    /// The `streamd-rollout` binary.
    pub controller: PathBuf,
    /// The pool's `maxUnavailable`.
    pub max_unavailable: usize,
    /// The pool's `maxConcurrentStaging`.
    pub max_staging: usize,
    /// The order in which a node is moved.
    pub strategy: Strategy,
    /// The simulated pull, drain and reboot.
    pub simulated: Simulated,
}

/// One process's most RSS seen and CPU ticks at its last sample.
#[derive(Default, Clone, Copy)]
struct Usage {
    max_rss_kib: u64,
    ticks: u64,
}

/// Usage by owner (a node or a replica) and process id (an agent restarts after its reboot).
#[derive(Default)]
struct Sampler(BTreeMap<String, HashMap<u32, Usage>>);

impl Sampler {
    fn sample(&mut self, owner: &str, pid: u32) {
        let u = self
            .0
            .entry(owner.to_string())
            .or_default()
            .entry(pid)
            .or_default();
        // A process that is gone keeps its last reading.
        if let Ok(rss) = status_kib(pid, "VmRSS") {
            u.max_rss_kib = u.max_rss_kib.max(rss);
        }
        if let Ok(ticks) = cpu_ticks(pid) {
            u.ticks = ticks;
        }
    }

    /// `(most RSS of any of its processes in KiB, CPU seconds of all of them)`.
    fn of(&self, owner: &str) -> (u64, f64) {
        let procs = self.0.get(owner).into_iter().flat_map(HashMap::values);
        let rss = procs.clone().map(|u| u.max_rss_kib).max().unwrap_or(0);
        let ticks: u64 = procs.map(|u| u.ticks).sum();
        (rss, ticks as f64 / TICKS_PER_S)
    }
}

/// Runs the bench and returns the figures.
pub async fn run(opts: &FleetBenchOptions) -> anyhow::Result<Value> {
    if opts.max_unavailable == 0 || opts.max_staging == 0 {
        bail!("max-unavailable and max-staging must be at least 1");
    }
    require(&opts.streamd, "streamd", "--streamd")?;
    // streamd runs its verification helper from its own directory (src/host/verify.rs `HELPER`).
    require(
        &opts.streamd.with_file_name("streamd-verify"),
        "streamd",
        "--streamd",
    )?;
    require(&opts.controller, "rollout", "--controller")?;
    let started = Instant::now();
    let fleet = Fleet::start(FleetOptions {
        streamd: Some(opts.streamd.clone()),
        reboot_downtime: opts.simulated.reboot,
        ..FleetOptions::new(&opts.dir, opts.nodes)
    })
    .await?;
    strategy::prepare(&fleet, &opts.simulated).await?;
    match opts.strategy {
        Strategy::StageFirst => stage_first(opts, &fleet, started).await,
        Strategy::DrainFirst => drain_first(opts, &fleet, started).await,
    }
}

/// The rollout controller moves the fleet (see the module documentation).
async fn stage_first(
    opts: &FleetBenchOptions,
    fleet: &Fleet,
    started: Instant,
) -> anyhow::Result<Value> {
    let nodes = fleet.nodes();
    let api = fleet.apiserver();
    let kubeconfig = controller::install(api)?;
    let mut replicas = (0..REPLICAS)
        .map(|i| {
            let identity = format!("streamd-rollout-{i}");
            let log = fleet.dir().join(format!("controller-{identity}.log"));
            Replica::start(&opts.controller, &kubeconfig, &identity, &log)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    all_idle(fleet).await?;
    wait_for(
        "a controller replica to take the lease (see DIR/controller-*.log)",
        Duration::from_secs(60),
        || controller::leader(api).is_some(),
    )
    .await?;
    wait_for_settled_watches(fleet).await?;
    let up_s = started.elapsed().as_secs_f64();
    for r in &mut replicas {
        r.pid()?;
    }
    // The leader's start (lease, lists, watches) apart from the migration.
    let startup = api.control(ApiServerCmd::STATS).await?;
    api.control(ApiServerCmd::ResetStats).await?;
    api.control(ApiServerCmd::ResetUnavailable).await?;

    let t0_ms = unix_ms();
    let t0 = Instant::now();
    api.create(json!({
        "apiVersion": "osstream.openshift.io/v1alpha1",
        "kind": "StreamPool",
        "metadata": { "name": "worker" },
        "spec": {
            "nodeSelector": { "matchLabels": { "node-role.kubernetes.io/worker": "" } },
            "target": { "stream": "rhel-10" },
            "maxUnavailable": opts.max_unavailable,
            "maxConcurrentStaging": opts.max_staging,
            "drain": { "gracePeriodSeconds": opts.simulated.grace_seconds() },
        },
    }))
    .context("creating the StreamPool")?;
    let watched = watch_rollout(fleet, &mut replicas, t0).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let watched = watched?;

    let stats = api.control(ApiServerCmd::STATS).await?;
    let record = api.control(ApiServerCmd::Unavailable).await?;
    let cycles = unavailable_spells(&record, unix_ms());
    let pulls = pulling_transactions(fleet).await?;
    let leader = controller::leader(api);
    let n = nodes.len() as f64;

    let mut agent_verbs: BTreeMap<String, u64> = BTreeMap::new();
    // "<resource> <verb>" → count.
    let mut agent_resources: BTreeMap<String, u64> = BTreeMap::new();
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
            let by_resource = stats["by_resource"][user].as_object().into_iter().flatten();
            for (resource, verbs) in by_resource {
                for (verb, count) in verbs.as_object().into_iter().flatten() {
                    *agent_resources
                        .entry(format!("{resource} {verb}"))
                        .or_default() += count.as_u64().unwrap_or(0);
                }
            }
        } else if user != SERVICE_ACCOUNT {
            others.insert(user.clone(), verbs.clone());
        }
    }
    let controller_verbs = &stats["by_user"][SERVICE_ACCOUNT];
    let controller_total: u64 = controller_verbs
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, c)| c.as_u64())
        .sum();
    let usage = &watched.usage;
    let agents: Vec<(u64, f64)> = nodes.iter().map(|node| usage.of(node)).collect();
    let agent_rss: Vec<u64> = agents.iter().map(|(rss, _)| *rss).collect();
    let agent_cpu: Vec<f64> = agents.iter().map(|(_, cpu)| *cpu).collect();
    let cycle_s: Vec<f64> = cycles.iter().map(|(_, s)| *s).collect();
    let rounds = nodes.len().div_ceil(opts.max_unavailable);
    let own = std::process::id();
    Ok(json!({
        "nodes": nodes.len(),
        "max_unavailable": opts.max_unavailable,
        "max_staging": opts.max_staging,
        "controller_replicas": REPLICAS,
        "strategy": strategy_figures(opts, &cycles, wall_s),
        "fleet_up_s": round2(up_s),
        "rollout_wall_s": round2(wall_s),
        "node_cycle_s": { "count": cycles.len(), "mean": round2(mean(&cycle_s)), "max": round2(max(&cycle_s)) },
        "ideal_rounds": rounds,
        "ideal_s": round2(rounds as f64 * mean(&cycle_s)),
        "first_unavailable_s": record["timeline"].as_array().into_iter().flatten()
            .find(|e| e["nodes"].as_array().is_some_and(|n| !n.is_empty()))
            .and_then(|e| e["at_ms"].as_u64())
            .map(|at| round2(at.saturating_sub(t0_ms) as f64 / 1000.0)),
        "max_unavailable_seen": record["max"],
        "staging": {
            "nodes_staging_max_sampled": watched.staging_max,
            "last_staging_seen_s": watched.last_staging_s.map(round2),
            "pulling_transactions_max": max_overlap(&pulls),
            "pulling_transaction_s": { "count": pulls.len(), "mean": round2(mean(&pulls.iter().map(|(a, b)| (b - a) as f64 / 1000.0).collect::<Vec<_>>())) },
        },
        "controller": {
            "user": SERVICE_ACCOUNT,
            "leader": leader,
            "requests_total": controller_total,
            "requests_per_node": round2(controller_total as f64 / n),
            "requests_by_verb": controller_verbs,
            "requests_by_resource": stats["by_resource"][SERVICE_ACCOUNT],
            "startup_requests_by_verb": startup["by_user"][SERVICE_ACCOUNT],
            "watches_open_max": stats["watches_max"][SERVICE_ACCOUNT],
            "replicas": replicas.iter().map(|r| {
                let (rss, cpu) = usage.of(r.identity());
                json!({ "identity": r.identity(), "rss_kib_max": rss, "cpu_s": round2(cpu) })
            }).collect::<Vec<_>>(),
        },
        "agents": {
            "requests_per_node_by_verb": per_node(&agent_verbs, n),
            "requests_per_node_by_resource": per_node(&agent_resources, n),
            "requests_per_node_total": counts(&per_node_totals),
            "watches_open_max": counts(&watches_max),
            "rss_kib_max": counts(&agent_rss),
            "cpu_s": { "mean": round2(mean(&agent_cpu)), "max": round2(max(&agent_cpu)) },
        },
        "other_users_requests": others,
        "testbed_process": {
            "rss_kib": status_kib(own, "VmRSS").ok(),
            "cpu_s": cpu_ticks(own).ok().map(|t| round2(t as f64 / TICKS_PER_S)),
        },
    }))
}

/// The bench plays the machine-config operator's order ([`strategy::drain_first`]); no
/// controller runs, so there are no controller figures.
async fn drain_first(
    opts: &FleetBenchOptions,
    fleet: &Fleet,
    started: Instant,
) -> anyhow::Result<Value> {
    let api = fleet.apiserver();
    all_idle(fleet).await?;
    let up_s = started.elapsed().as_secs_f64();
    api.control(ApiServerCmd::ResetStats).await?;
    api.control(ApiServerCmd::ResetUnavailable).await?;
    let t0 = Instant::now();
    let per_node = opts.simulated.pull + opts.simulated.drain + opts.simulated.reboot;
    let timeout =
        (per_node + Duration::from_secs(120)) * u32::try_from(opts.nodes).unwrap_or(u32::MAX);
    strategy::drain_first(fleet, opts.max_unavailable, &opts.simulated, timeout).await?;
    let wall_s = t0.elapsed().as_secs_f64();
    let record = api.control(ApiServerCmd::Unavailable).await?;
    let cycles = unavailable_spells(&record, unix_ms());
    let pulls = pulling_transactions(fleet).await?;
    Ok(json!({
        "nodes": opts.nodes,
        "max_unavailable": opts.max_unavailable,
        "strategy": strategy_figures(opts, &cycles, wall_s),
        "fleet_up_s": round2(up_s),
        "rollout_wall_s": round2(wall_s),
        "max_unavailable_seen": record["max"],
        "pulling_transactions_max": max_overlap(&pulls),
    }))
}

/// The strategy, the simulated durations, each node's unavailable windows (cordon or NotReady
/// → uncordoned and Ready, by the API server's record) and the figures against the model.
fn strategy_figures(opts: &FleetBenchOptions, cycles: &[(String, f64)], wall_s: f64) -> Value {
    let sim = &opts.simulated;
    let mut by_node: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (node, s) in cycles {
        by_node.entry(node).or_default().push(round2(*s));
    }
    let windows: Vec<f64> = cycles.iter().map(|(_, s)| *s).collect();
    let model = Model::new(opts.nodes, opts.max_unavailable, sim);
    json!({
        "name": match opts.strategy {
            Strategy::StageFirst => "stage-first",
            Strategy::DrainFirst => "drain-first",
        },
        "pull_s": sim.pull.as_secs_f64(),
        "drain_s": sim.drain.as_secs_f64(),
        "reboot_s": sim.reboot.as_secs_f64(),
        "unavailable_window_s": {
            "mean": round2(mean(&windows)),
            "max": round2(max(&windows)),
            "by_node": by_node,
        },
        "model": model.ratios(mean(&windows), wall_s),
    })
}

/// Waits until every agent reports Idle.
async fn all_idle(fleet: &Fleet) -> anyhow::Result<()> {
    let nodes = fleet.nodes();
    wait_for(
        "every agent to report Idle",
        Duration::from_secs(60 + nodes.len() as u64),
        || {
            nodes.iter().all(|n| {
                fleet
                    .annotations(n)
                    .is_ok_and(|a| state(&a) == Some("Idle"))
            })
        },
    )
    .await
}

/// A clear error before anything starts when a binary is missing.
fn require(bin: &Path, package: &str, flag: &str) -> anyhow::Result<()> {
    if !bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build -p {package}` in this testbed's profile \
             (the bench looks next to `testbed`; `--release` for figures) or give its path with \
             `{flag}`",
            bin.display()
        );
    }
    Ok(())
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Each count divided by `n`.
fn per_node(counts: &BTreeMap<String, u64>, n: f64) -> BTreeMap<String, f64> {
    counts
        .iter()
        .map(|(k, c)| (k.clone(), round2(*c as f64 / n)))
        .collect()
}

/// `{"mean", "max"}` of counts.
fn counts(xs: &[u64]) -> Value {
    let mean = if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<u64>() as f64 / xs.len() as f64
    };
    json!({ "mean": round2(mean), "max": xs.iter().max() })
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(0.0, f64::max)
}

fn state(a: &Value) -> Option<&str> {
    a.get(STATE).and_then(Value::as_str)
}

async fn wait_for(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Waits until the controller's open watches have not changed for a second: the leader has
/// started its watchers, so what follows is the migration's cost.
async fn wait_for_settled_watches(fleet: &Fleet) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (0, Instant::now());
    loop {
        let stats = fleet.apiserver().control(ApiServerCmd::STATS).await?;
        let open = stats["watches_open"][SERVICE_ACCOUNT].as_u64().unwrap_or(0);
        if open != last.0 {
            last = (open, Instant::now());
        } else if open > 0 && last.1.elapsed() >= Duration::from_secs(1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the controller opened no watches within 30 s (see DIR/controller-*.log)");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the bench saw while the pool moved.
struct Watched {
    usage: Sampler,
    staging_max: usize,
    last_staging_s: Option<f64>,
}

/// Polls the pool until it reports `Updated` (an error if it reports `Degraded`, a replica
/// exits, or it takes too long), sampling the nodes' states and every process.
async fn watch_rollout(
    fleet: &Fleet,
    replicas: &mut [Replica],
    t0: Instant,
) -> anyhow::Result<Watched> {
    let nodes = fleet.nodes();
    let deadline = t0 + Duration::from_secs(600 + 20 * nodes.len() as u64);
    let mut watched = Watched {
        usage: Sampler::default(),
        staging_max: 0,
        last_staging_s: None,
    };
    let mut next_sample = Instant::now();
    loop {
        let staging = nodes
            .iter()
            .filter(|n| {
                fleet
                    .annotations(n)
                    .is_ok_and(|a| state(&a) == Some("Staging"))
            })
            .count();
        watched.staging_max = watched.staging_max.max(staging);
        if staging > 0 {
            watched.last_staging_s = Some(t0.elapsed().as_secs_f64());
        }
        if Instant::now() >= next_sample {
            for r in replicas.iter_mut() {
                let pid = r.pid()?;
                watched.usage.sample(r.identity(), pid);
            }
            for node in &nodes {
                if let Some(pid) = fleet.streamd_pid(node).await? {
                    watched.usage.sample(node, pid);
                }
            }
            next_sample += SAMPLE;
        }
        let pool = fleet.apiserver().get(
            "osstream.openshift.io/v1alpha1",
            "StreamPool",
            None,
            "worker",
        )?;
        let condition = |type_: &str| {
            pool.pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_)
                .filter(|c| c["status"] == "True")
                .map(|c| c["message"].as_str().unwrap_or_default().to_string())
        };
        if let Some(message) = condition("Degraded") {
            bail!("the pool is Degraded: {message}");
        }
        let current =
            pool.pointer("/status/observedGeneration") == pool.pointer("/metadata/generation");
        if current
            && condition("Updated").is_some()
            && pool["status"]["updatedMachineCount"].as_u64() == Some(nodes.len() as u64)
        {
            return Ok(watched);
        }
        if Instant::now() > deadline {
            bail!(
                "the pool did not report Updated within {:?}: {:#}",
                deadline - t0,
                pool["status"]
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Each node's time unavailable, from the API server's record (`{"timeline": [{"at_ms",
/// "nodes"}]}`): `(node, seconds)` for every spell from entering the set to leaving it (or
/// `end_ms`).
fn unavailable_spells(record: &Value, end_ms: u64) -> Vec<(String, f64)> {
    let mut since: BTreeMap<String, u64> = BTreeMap::new();
    let mut spells = Vec::new();
    for entry in record["timeline"].as_array().into_iter().flatten() {
        let at = entry["at_ms"].as_u64().unwrap_or(0);
        let now: Vec<&str> = entry["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        since.retain(|node, start| {
            let stays = now.contains(&node.as_str());
            if !stays {
                spells.push((node.clone(), at.saturating_sub(*start) as f64 / 1000.0));
            }
            stays
        });
        for node in now {
            since.entry(node.to_string()).or_insert(at);
        }
    }
    for (node, start) in since {
        spells.push((node, end_ms.saturating_sub(start) as f64 / 1000.0));
    }
    spells
}

/// `(started_ms, finished_ms)` of every transaction that pulled an image, on every node (the
/// fake rpm-ostreeds' records).
async fn pulling_transactions(fleet: &Fleet) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for node in fleet.nodes() {
        let records = fleet.control(RpmOstreedCmd::Transactions.on(node)).await?;
        for r in records.as_array().into_iter().flatten() {
            if r["pulled"] == true
                && let (Some(a), Some(b)) = (r["started_ms"].as_u64(), r["finished_ms"].as_u64())
            {
                out.push((a, b));
            }
        }
    }
    Ok(out)
}

/// The most intervals open at once.
fn max_overlap(intervals: &[(u64, u64)]) -> usize {
    // An end sorts before a start at the same instant: touching intervals do not overlap.
    let mut edges: Vec<(u64, i32)> = intervals
        .iter()
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spells_follow_the_record() {
        let record = json!({"timeline": [
            {"at_ms": 1000, "nodes": []},
            {"at_ms": 2000, "nodes": ["a"]},
            {"at_ms": 2500, "nodes": ["a", "b"]},
            {"at_ms": 4000, "nodes": ["b"]},
            {"at_ms": 5000, "nodes": []},
            {"at_ms": 6000, "nodes": ["a"]},
        ]});
        let spells = unavailable_spells(&record, 6500);
        assert_eq!(
            spells,
            [("a".into(), 2.0), ("b".into(), 2.5), ("a".into(), 0.5)]
        );
    }

    #[test]
    fn overlap_counts_open_intervals() {
        assert_eq!(max_overlap(&[]), 0);
        assert_eq!(max_overlap(&[(0, 10), (5, 15), (10, 20)]), 2);
        assert_eq!(max_overlap(&[(0, 10), (1, 9), (2, 8)]), 3);
    }
}
