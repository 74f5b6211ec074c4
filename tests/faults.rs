//! The Kubernetes API under faults: the real streamd against the fake API server's fault knobs.
//!
//! Each test puts streamd in a known state, switches a fault on, changes the request (or lets a
//! pending state change happen), switches the fault off and checks that the final state is
//! reported with exactly one staging transaction. Timings are printed, not asserted; the 60 s
//! outage asserts only a generous request-rate bound that a broken backoff would exceed.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::{Value, json};
use testbed::control::{ApiServerCmd, Fault, RpmOstreedCmd};

/// The user streamd authenticates as (the node's client certificate).
fn node_user() -> String {
    format!("system:node:{}", testbed::NODE_NAME)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

async fn fault(env: &Env, fault: Fault) -> Value {
    env.apiserver(ApiServerCmd::Fault(fault)).await
}

/// `at_ms` of each entry of streamd's with `verb` in a list control command's answer:
/// `requests` (when received) or `injected-faults` (when answered).
async fn times(env: &Env, list: ApiServerCmd, verb: &str) -> Vec<u64> {
    let all = env.apiserver(list).await;
    all.as_array()
        .expect("array")
        .iter()
        .filter(|r| r["user"] == node_user().as_str() && r["verb"] == verb)
        .map(|r| r["at_ms"].as_u64().expect("at_ms"))
        .collect()
}

/// Waits until the server has answered `n` injected faults to streamd's `verb` requests.
async fn wait_injected(env: &Env, verb: &str, n: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let hits = times(env, ApiServerCmd::InjectedFaults, verb).await;
        if hits.len() >= n {
            return hits;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} injected {verb} faults reached streamd\n{}",
            hits.len(),
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// streamd's request counts by verb in `[since, until)`.
async fn counts(env: &Env, since: u64, until: u64) -> BTreeMap<String, u64> {
    let stats = env
        .apiserver(ApiServerCmd::Stats {
            since_ms: Some(since),
            until_ms: Some(until),
        })
        .await;
    serde_json::from_value(stats["by_user"][node_user()].clone()).unwrap_or_default()
}

/// A testbed with streamd running and `Idle`.
async fn idle(name: &str) -> Env {
    let mut env = Env::new(name).await;
    // These tests time the Node patches against the faults they inject per user and verb; the
    // heartbeat Lease's patches (same user, same verb, their own schedule) would take faults
    // meant for them.
    env.config("50-no-heartbeat.toml", "heartbeat-namespace = \"\"\n");
    env.start_streamd();
    env.wait_state("Idle").await;
    env
}

/// Waits for `Staged`, checks that exactly one transaction staged it, and prints how long it took
/// from `since` (usually when the fault ended).
async fn converged(env: &Env, what: &str, since: Instant) {
    let a = env.wait_state("Staged").await;
    let took = since.elapsed();
    assert_eq!(a.get(STAGED_OS_IMAGE), Some(&env.rhel10()), "{a:#?}");
    let txns = env.transactions().await;
    assert_eq!(
        started(&txns).len(),
        1,
        "one staging transaction: {txns:#?}"
    );
    println!("{what}: Staged reported {took:.1?} later");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_dropped_converges() {
    let env = idle("fault-drop").await;
    env.apiserver(ApiServerCmd::ResetStats).await;
    for _ in 0..3 {
        fault(&env, Fault::DropWatches).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fault(&env, Fault::DropWatches).await;
    env.request_rhel10();
    let off = Instant::now();
    converged(&env, "watch dropped, then the request", off).await;
    let watches = times(&env, ApiServerCmd::Requests, "watch").await.len();
    assert!(
        watches >= 4,
        "streamd re-opened its watch after each drop: {watches}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_410_relists_and_converges() {
    let env = idle("fault-gone").await;
    env.apiserver(ApiServerCmd::ResetStats).await;
    fault(&env, Fault::Gone { count: 2 }).await;
    fault(&env, Fault::DropWatches).await;
    env.request_rhel10();
    let off = Instant::now();
    converged(&env, "410 Gone, then the request", off).await;
    // The request may arrive with the first relist; the second 410 still has to end in one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lists = times(&env, ApiServerCmd::Requests, "list").await.len();
        if lists >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "streamd relisted after each 410: {lists} lists\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_patches_honour_retry_after() {
    const RETRY_AFTER_S: u64 = 2;
    let env = idle("fault-429").await;
    fault(
        &env,
        Fault::Throttle {
            count: 3,
            retry_after: RETRY_AFTER_S,
            user: Some(node_user()),
            verb: Some("patch".into()),
        },
    )
    .await;
    env.request_rhel10();
    let throttled = wait_injected(&env, "patch", 3).await;
    fault(&env, Fault::Clear).await;
    let off = Instant::now();
    converged(&env, "429 on patch ended", off).await;
    let patches = times(&env, ApiServerCmd::Requests, "patch").await;
    for t in &throttled {
        let next = patches
            .iter()
            .find(|p| **p > *t)
            .unwrap_or_else(|| panic!("no patch after the 429 at {t}: {patches:?}"));
        println!(
            "429 at {t}: next patch {} ms later (Retry-After {RETRY_AFTER_S} s)",
            next - t
        );
        assert!(
            *next >= t + RETRY_AFTER_S * 1000,
            "patched {} ms after a 429 with Retry-After: {RETRY_AFTER_S}",
            next - t
        );
    }
}

/// `count` of streamd's `verb` requests get `code`, while the request changes; then converged.
async fn server_errors_are_retried(name: &str, verb: &str, code: u16, count: usize) {
    let env = idle(name).await;
    fault(
        &env,
        Fault::Error {
            count: count as u64,
            code,
            user: Some(node_user()),
            verb: Some(verb.to_string()),
        },
    )
    .await;
    // An open watch is not affected by a new fault; end it so streamd has to re-open.
    fault(&env, Fault::DropWatches).await;
    env.request_rhel10();
    let failed = wait_injected(&env, verb, count).await;
    fault(&env, Fault::Clear).await;
    let off = Instant::now();
    converged(&env, &format!("{code} on {verb} ended"), off).await;
    let gaps: Vec<u64> = failed.windows(2).map(|w| w[1] - w[0]).collect();
    println!("{code} on {verb}: ms between the failed attempts {gaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_on_patch_are_retried() {
    server_errors_are_retried("fault-5xx-patch", "patch", 500, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_on_watch_are_retried() {
    server_errors_are_retried("fault-5xx-watch", "watch", 503, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_responses_converge() {
    let env = idle("fault-slow").await;
    fault(
        &env,
        Fault::Delay {
            ms: 2000,
            user: Some(node_user()),
            verb: None,
        },
    )
    .await;
    // The watch is re-opened under the delay too.
    fault(&env, Fault::DropWatches).await;
    let on = Instant::now();
    env.request_rhel10();
    // Converges while every answer still takes 2 s (below the patch timeout).
    converged(&env, "request under 2 s responses", on).await;
    fault(&env, Fault::Clear).await;
}

/// Waits until the (slowed) staging transaction has finished in rpm-ostreed.
async fn wait_transaction_finished(env: &Env) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !env
        .transactions()
        .await
        .iter()
        .any(|t| t["started"] == json!(true) && !t["result"].is_null())
    {
        assert!(Instant::now() < deadline, "the transaction did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// streamd running and `Staging` a slowed transaction, so `Staged` becomes due during a fault.
async fn staging(name: &str, slow_ms: u64) -> Env {
    let env = idle(name).await;
    env.rpmostreed(RpmOstreedCmd::Slow { ms: slow_ms }).await;
    env.request_rhel10();
    env.wait_state("Staging").await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_converges() {
    let env = staging("fault-refused", 2000).await;
    fault(&env, Fault::Refuse { on: true }).await;
    wait_transaction_finished(&env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    fault(&env, Fault::Refuse { on: false }).await;
    let off = Instant::now();
    converged(&env, "connection refused ended", off).await;
}

/// How a 60 s outage looked from one side.
struct Outage {
    what: &'static str,
    /// Requests (or connection attempts) by verb during the outage.
    by_verb: BTreeMap<String, u64>,
    secs: f64,
}

impl Outage {
    fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }

    fn per_minute(&self) -> f64 {
        self.total() as f64 * 60.0 / self.secs
    }

    fn print(&self) {
        let verbs: Vec<String> = self
            .by_verb
            .iter()
            .map(|(v, n)| format!("{v} {n} ({:.1}/min)", *n as f64 * 60.0 / self.secs))
            .collect();
        println!(
            "{}: {} requests in {:.1} s = {:.1}/min; {}",
            self.what,
            self.total(),
            self.secs,
            self.per_minute(),
            verbs.join(", ")
        );
    }
}

const OUTAGE: Duration = Duration::from_secs(60);
/// All requests a minute: far above the ~15/min a working backoff makes, far below a retry loop.
const MAX_PER_MINUTE: f64 = 120.0;
/// Requests of one verb a minute: a retry at a fixed 1 s would make 60.
const MAX_PER_MINUTE_PER_VERB: f64 = 30.0;

/// 503 to every request of streamd for 60 s, counted by the API server.
async fn outage_503() -> Outage {
    let env = staging("fault-outage-503", 4000).await;
    fault(
        &env,
        Fault::Error {
            count: 1_000_000,
            code: 503,
            user: Some(node_user()),
            verb: None,
        },
    )
    .await;
    let since = now_ms();
    fault(&env, Fault::DropWatches).await;
    tokio::time::sleep(OUTAGE).await;
    let until = now_ms();
    fault(&env, Fault::Clear).await;
    let off = Instant::now();
    let by_verb = counts(&env, since, until).await;
    converged(&env, "60 s of 503 ended", off).await;
    Outage {
        what: "60 s of 503 (server count)",
        by_verb,
        secs: (until - since) as f64 / 1000.0,
    }
}

/// The port closed for 60 s. Nothing reaches the server, so the attempts are counted from
/// streamd's log: each failed request logs one line.
async fn outage_refused() -> Outage {
    let env = staging("fault-outage-refused", 4000).await;
    let start = Instant::now();
    fault(&env, Fault::Refuse { on: true }).await;
    let log_from = env.log().len();
    tokio::time::sleep(OUTAGE).await;
    let log = env.log();
    let secs = start.elapsed().as_secs_f64();
    fault(&env, Fault::Refuse { on: false }).await;
    let off = Instant::now();
    let during = &log[log_from..];
    let mut by_verb = BTreeMap::new();
    for (verb, line) in [
        ("patch", "patching node annotations failed"),
        ("list/watch", "node watch failed"),
        ("create (event)", "posting event failed"),
    ] {
        by_verb.insert(verb.to_string(), during.matches(line).count() as u64);
    }
    converged(&env, "60 s of connection refused ended", off).await;
    Outage {
        what: "60 s of connection refused (streamd's failed attempts)",
        by_verb,
        secs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_of_60_s_keeps_the_request_rate_bounded() {
    // Two independent testbeds at once, so the file's wall time grows by one outage only.
    let (a, b) = tokio::join!(outage_503(), outage_refused());
    for o in [&a, &b] {
        o.print();
        assert!(
            o.by_verb.get("patch").copied().unwrap_or(0) >= 2,
            "{}: streamd kept trying to report: {:?}",
            o.what,
            o.by_verb
        );
        assert!(
            o.per_minute() < MAX_PER_MINUTE,
            "{}: {:.1} requests/min",
            o.what,
            o.per_minute()
        );
        for (verb, n) in &o.by_verb {
            let rate = *n as f64 * 60.0 / o.secs;
            assert!(
                rate < MAX_PER_MINUTE_PER_VERB,
                "{}: {verb} at {rate:.1}/min",
                o.what
            );
        }
    }
}
