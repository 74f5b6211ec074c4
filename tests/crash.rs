//! Crash consistency: migrations rhel-9 -> rhel-10 -> rhel-9 ... with streamd SIGKILLed at a
//! random moment of each and started again, while this driver plays the cluster (approves the
//! reboot token it is shown) and the host (reboots once rpm-ostreed initiated it).
//!
//! `CRASH_MIGRATIONS` (default 5) sets the number of migrations, `CRASH_SEED` replays the kill
//! plan of an earlier run (the seed is printed). The rules measured per migration are in
//! docs/reliability.md ("Crash consistency").

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use testbed::control::RpmOstreedCmd;

/// A migration that has not reached `Done` on its target by then has not converged.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the `Applied` Event may take after `Done` (Events go out from their own queue).
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Poll interval of the driver.
const POLL: Duration = Duration::from_millis(20);

/// xorshift64* (Vigna): a few lines, seedable, good enough to spread kill moments.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Zero is xorshift's only fixed point.
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where in the migration streamd is killed; the kill comes a random offset (up to `window`)
/// after the phase's trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Trigger: the request was just written (streamd has not run its checks yet).
    BeforePreflight,
    /// Trigger: `state=Staging` or an `UpdateDeployment` call seen.
    Staging,
    /// Trigger: `reboot-requested` appeared; the driver approves only after the kill.
    AwaitingApproval,
    /// Trigger: the driver approved; it reboots the host only after the kill.
    AfterApproval,
    /// Trigger: streamd started after the reboot; the kill may come before or after `Done`.
    AfterReboot,
}

impl Phase {
    const ALL: [Phase; 5] = [
        Phase::BeforePreflight,
        Phase::Staging,
        Phase::AwaitingApproval,
        Phase::AfterApproval,
        Phase::AfterReboot,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::BeforePreflight => "before-preflight",
            Phase::Staging => "staging",
            Phase::AwaitingApproval => "awaiting-approval",
            Phase::AfterApproval => "after-approval",
            Phase::AfterReboot => "after-reboot",
        }
    }

    /// Longest offset after the trigger, chosen so the kill lands in or just past the phase on
    /// the testbed (staging is stretched by the `slow`/`progress` knobs set in the test).
    fn window(self) -> Duration {
        Duration::from_millis(match self {
            // Preflight starts within ~10 ms of the request and takes ~90 ms.
            Phase::BeforePreflight => 200,
            // Pull, 2 s of progress, 1 s slow: about 3 s.
            Phase::Staging => 3000,
            Phase::AwaitingApproval => 1000,
            // FinalizeDeployment follows the approval within ~30 ms.
            Phase::AfterApproval => 300,
            // streamd reports Done ~30-60 ms after it is started: kills before and after it.
            Phase::AfterReboot => 200,
        })
    }
}

/// One migration's kill plan.
#[derive(Debug, Clone, Copy)]
struct Plan {
    phase: Phase,
    offset: Duration,
    /// How long streamd stays down before it is started again.
    down: Duration,
}

/// Phases in seeded round-robin blocks (every block of five covers each phase once), so even
/// the default five migrations hit every phase.
fn plans(rng: &mut Rng, n: usize) -> Vec<Plan> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut block = Phase::ALL;
        for i in (1..block.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            block.swap(i, j);
        }
        for phase in block {
            let window = phase.window().as_millis() as u64;
            out.push(Plan {
                phase,
                offset: Duration::from_millis(rng.below(window + 1)),
                down: Duration::from_millis(rng.below(301)),
            });
        }
    }
    out.truncate(n);
    out
}

/// What one migration did.
#[derive(Debug)]
struct Outcome {
    target: &'static str,
    plan: Plan,
    /// Time of the kill since the request was written, and the state annotation just before.
    kill: Option<(Duration, String)>,
    duration: Duration,
    converged: bool,
    /// `UpdateDeployment` transactions for the target that finished successfully.
    staged_ok: usize,
    /// Other `UpdateDeployment` records: joined calls, cancelled, interrupted, dropped, refused.
    staged_other: Vec<String>,
    finalizes: usize,
    reboots: usize,
    unapproved: Vec<String>,
    lost: Vec<String>,
}

impl Outcome {
    fn double_staged(&self) -> bool {
        self.staged_ok > 1
    }
}

/// Calls that created a transaction (refused calls are recorded with id 0).
impl Outcome {
    fn new(target: &'static str, plan: Plan) -> Self {
        Outcome {
            target,
            plan,
            kill: None,
            duration: Duration::ZERO,
            converged: false,
            staged_ok: 0,
            staged_other: Vec::new(),
            finalizes: 0,
            reboots: 0,
            unapproved: Vec::new(),
            lost: Vec::new(),
        }
    }
}

/// Whether the migration reached the phase a kill is planned in.
fn phase_reached(
    phase: Phase,
    a: &BTreeMap<String, String>,
    txns: &[Value],
    approved: bool,
) -> bool {
    match phase {
        Phase::BeforePreflight => true,
        Phase::Staging => {
            a.get(STATE).map(String::as_str) == Some("Staging")
                || calls(txns, "UpdateDeployment").next().is_some()
        }
        Phase::AwaitingApproval => a.contains_key(REBOOT_REQUESTED),
        Phase::AfterApproval => approved,
        Phase::AfterReboot => false, // set when streamd starts after the reboot
    }
}

fn calls<'a>(txns: &'a [Value], method: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    txns.iter()
        .filter(move |t| t["method"] == method && t["id"] != json!(0))
}

fn digest_of(image: &str) -> &str {
    image.rsplit_once('@').map_or(image, |(_, d)| d)
}

fn applied_events(env: &Env) -> usize {
    env.event_reasons()
        .iter()
        .filter(|r| *r == "Applied")
        .count()
}

/// Whether the fake's booted deployment carries `digest` (the host's truth, whatever streamd
/// reports).
async fn host_booted(env: &Env, digest: &str) -> bool {
    let deps = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    deps.as_array().is_some_and(|d| {
        d.iter()
            .any(|d| d["booted"] == json!(true) && d.to_string().contains(digest))
    })
}

fn kill_and_restart(env: &mut Env, down: Duration) {
    env.kill_streamd();
    std::thread::sleep(down);
    env.start_streamd();
}

/// Runs one migration to `target` under `plan`, playing the cluster and the host.
async fn migrate(env: &mut Env, target: &'static str, image: &str, plan: Plan) -> Outcome {
    env.rpmostreed(RpmOstreedCmd::ResetTransactions).await;
    let applied_before = applied_events(env);
    let digest = digest_of(image).to_string();
    let start = Instant::now();
    env.request(target, image, None);
    let mut out = Outcome::new(target, plan);
    let mut trigger: Option<Instant> = (plan.phase == Phase::BeforePreflight).then_some(start);
    // The token approved in this boot, and the FinalizeDeployment calls made before this boot.
    let mut approved: Option<String> = None;
    let mut finalizes_before_boot = 0;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    while start.elapsed() < MIGRATION_TIMEOUT {
        let a = env.annotations().await;
        let txns = env.transactions().await;
        let finalizes = calls(&txns, "FinalizeDeployment").count();
        if finalizes > finalizes_before_boot && approved.is_none() {
            out.unapproved.push(format!(
                "FinalizeDeployment #{finalizes} at {:?} without an approval in this boot",
                start.elapsed()
            ));
            finalizes_before_boot = finalizes;
        }
        let state = a.get(STATE).cloned().unwrap_or_default();

        // The kill.
        if out.kill.is_none() {
            if trigger.is_none() && phase_reached(plan.phase, &a, &txns, approved.is_some()) {
                trigger = Some(Instant::now());
            }
            if trigger.is_some_and(|t| t.elapsed() >= plan.offset) {
                // The state annotation may still be the previous migration's Done.
                let label = if state == "Done"
                    && a.get(CURRENT_OS_IMAGE).map(String::as_str) != Some(image)
                {
                    "Done(previous)".to_string()
                } else {
                    state.clone()
                };
                out.kill = Some((start.elapsed(), label));
                kill_and_restart(env, plan.down);
                continue;
            }
        }
        let kill_pending = out.kill.is_none();

        // The cluster approves the token it is shown (after a planned kill while waiting).
        if let Some(token) = a.get(REBOOT_REQUESTED)
            && approved.as_deref() != Some(token.as_str())
            && !(kill_pending && plan.phase == Phase::AwaitingApproval)
        {
            if env.reboot_initiated() {
                out.unapproved.push(format!(
                    "reboot initiated before {token} was approved ({:?})",
                    start.elapsed()
                ));
            }
            env.annotate(&[&format!("{REBOOT_APPROVED}={token}")]);
            approved = Some(token.clone());
            continue;
        }

        // The host reboots once rpm-ostreed initiated it (after a planned kill in between).
        if env.reboot_initiated() && !(kill_pending && plan.phase == Phase::AfterApproval) {
            if approved.is_none() {
                out.unapproved.push(format!(
                    "reboot initiated at {:?} without an approval in this boot",
                    start.elapsed()
                ));
            }
            let r = env.reboot(false).await;
            out.reboots += 1;
            if r["applied"] != json!(true) {
                out.lost
                    .push(format!("reboot {} did not apply: {r}", out.reboots));
            }
            approved = None;
            finalizes_before_boot = calls(&env.transactions().await, "FinalizeDeployment").count();
            env.start_streamd();
            if plan.phase == Phase::AfterReboot && trigger.is_none() {
                trigger = Some(Instant::now());
            }
            continue;
        }

        if !kill_pending
            && state == "Done"
            && a.get(CURRENT_OS_IMAGE).map(String::as_str) == Some(image)
        {
            out.converged = true;
            out.duration = start.elapsed();
            break;
        }
        last = a;
        tokio::time::sleep(POLL).await;
    }
    if !out.converged {
        out.duration = start.elapsed();
        println!(
            "migration to {target} did not converge; last annotations: {last:#?}\ntransactions: {:#}",
            json!(env.transactions().await)
        );
    }
    let txns = env.transactions().await;
    tally_stagings(&txns, &digest, &mut out);
    out.finalizes = calls(&txns, "FinalizeDeployment").count();

    lost_reports(env, &digest, applied_before, &mut out).await;
    out
}

/// Counts the stagings of `digest` that went through, and says what happened to the others.
fn tally_stagings(txns: &[Value], digest: &str, out: &mut Outcome) {
    for t in calls(txns, "UpdateDeployment") {
        if !t["modifiers"].to_string().contains(digest) {
            continue;
        }
        let ok = t["result"]["ok"] == json!(true);
        let interrupted = t["cancelled"] == json!(true)
            || t["crashed"] == json!(true)
            || t["dropped"] == json!(true);
        if ok && !interrupted {
            out.staged_ok += 1;
        } else {
            out.staged_other.push(format!(
                "#{} ok={} cancelled={} crashed={} dropped={} started={}",
                t["id"],
                t["result"]["ok"],
                t["cancelled"],
                t["crashed"],
                t["dropped"],
                t["started"]
            ));
        }
        let joined = t["joined"].as_u64().unwrap_or(0);
        if joined > 0 {
            out.staged_other
                .push(format!("#{} joined by {joined}", t["id"]));
        }
    }
    for t in txns
        .iter()
        .filter(|t| t["method"] == "UpdateDeployment" && t["id"] == json!(0))
    {
        out.staged_other.push(format!(
            "refused: {}",
            t["error"].as_str().unwrap_or_default()
        ));
    }
}

/// Lost reports: the host is on the target but the cluster was not told.
async fn lost_reports(env: &Env, digest: &str, applied_before: usize, out: &mut Outcome) {
    if host_booted(env, digest).await {
        if !out.converged {
            out.lost
                .push("the host booted the target but state=Done was never reported".into());
        }
        let deadline = Instant::now() + EVENT_TIMEOUT;
        while applied_events(env) <= applied_before {
            if Instant::now() > deadline {
                out.lost.push("no Applied Event".into());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn seed() -> u64 {
    match std::env::var("CRASH_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("CRASH_SEED={s}: {e}"))
        }
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

fn migrations() -> usize {
    std::env::var("CRASH_MIGRATIONS").map_or(5, |s| {
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("CRASH_MIGRATIONS={s}: {e}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_point_of_a_migration_converges() {
    let seed = seed();
    let n = migrations();
    println!("crash consistency: {n} migrations, seed {seed} (replay: CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let plans = plans(&mut rng, n);

    let mut env = Env::new("crash").await;
    env.config("60-crash.toml", "allow-downgrade = true\n");
    // Staging long enough to be hit: 20 progress signals over 2 s, then 1 s more.
    env.rpmostreed(RpmOstreedCmd::Progress {
        signals: 20,
        per_second: 10,
    })
    .await;
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 1000 }).await;
    env.start_streamd();
    env.wait_state("Idle").await;

    let wall = Instant::now();
    let mut outcomes = Vec::with_capacity(n);
    for (i, plan) in plans.into_iter().enumerate() {
        let (target, image) = if i % 2 == 0 {
            ("rhel-10", env.rhel10())
        } else {
            ("rhel-9", env.rhel9())
        };
        let o = migrate(&mut env, target, &image, plan).await;
        println!(
            "#{i:<3} -> {:<7} {:<17} +{:>4} ms  killed at {:>6} ms in {:<14} {:>5.1} s  {}",
            o.target,
            o.plan.phase.name(),
            o.plan.offset.as_millis(),
            o.kill.as_ref().map_or(0, |k| k.0.as_millis()),
            o.kill.as_ref().map_or("-", |k| k.1.as_str()),
            o.duration.as_secs_f64(),
            if o.converged {
                "converged"
            } else {
                "NOT CONVERGED"
            },
        );
        if !o.staged_other.is_empty() {
            println!(
                "     other UpdateDeployment records: {}",
                o.staged_other.join("; ")
            );
        }
        for p in o.unapproved.iter().chain(&o.lost) {
            println!("     !! {p}");
        }
        let stop = !o.converged;
        outcomes.push(o);
        if stop {
            // The node is not where the next migration expects it.
            break;
        }
    }
    let wall = wall.elapsed();

    let converged = outcomes.iter().filter(|o| o.converged).count();
    let double = outcomes.iter().filter(|o| o.double_staged()).count();
    let unapproved: usize = outcomes.iter().map(|o| o.unapproved.len()).sum();
    let lost: usize = outcomes.iter().map(|o| o.lost.len()).sum();
    let mut by_phase: BTreeMap<Phase, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
    for o in &outcomes {
        let e = by_phase.entry(o.plan.phase).or_default();
        e.0 += 1;
        let at = o.kill.as_ref().map_or("-".to_string(), |k| k.1.clone());
        *e.1.entry(at).or_default() += 1;
    }
    let mut durations: Vec<f64> = outcomes.iter().map(|o| o.duration.as_secs_f64()).collect();
    durations.sort_by(f64::total_cmp);
    println!(
        "\nseed {seed}, {} of {n} migrations run, wall time {:.1} s",
        outcomes.len(),
        wall.as_secs_f64()
    );
    println!(
        "converged {converged} / double-staged {double} / unapproved reboots {unapproved} / lost reports {lost}"
    );
    println!(
        "migration duration: min {:.1} s, median {:.1} s, max {:.1} s",
        durations.first().copied().unwrap_or_default(),
        durations
            .get(durations.len() / 2)
            .copied()
            .unwrap_or_default(),
        durations.last().copied().unwrap_or_default()
    );
    println!("kill phase: migrations (state annotation at the kill)");
    for (phase, (count, states)) in &by_phase {
        println!("  {:<17} {count:>3}  {states:?}", phase.name());
    }
    let staged_other: usize = outcomes.iter().map(|o| o.staged_other.len()).sum();
    println!(
        "UpdateDeployment records besides the one successful staging: {staged_other}; \
         FinalizeDeployment calls: {}; reboots: {}",
        outcomes.iter().map(|o| o.finalizes).sum::<usize>(),
        outcomes.iter().map(|o| o.reboots).sum::<usize>()
    );
    println!("streamd log: {}", env.dir.join("streamd.log").display());

    assert_eq!(outcomes.len(), n, "a migration did not converge; see above");
    assert_eq!(converged, n, "all converged");
    assert_eq!(double, 0, "no double staging");
    assert_eq!(unapproved, 0, "no unapproved reboot");
    assert_eq!(lost, 0, "no lost report");
}
