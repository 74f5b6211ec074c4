//! End-to-end: the real streamd, streamctl and kubectl against a testbed.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::json;
use testbed::control::{ApiServerCmd, Fault, RpmOstreedCmd};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_stages_rhel10_with_progress() {
    let mut env = Env::new("happy").await;
    env.rpmostreed(RpmOstreedCmd::Progress {
        signals: 40,
        per_second: 8,
    })
    .await;
    env.start_streamd();
    let idle = env.wait_state("Idle").await;
    assert_eq!(idle.get(CURRENT_STREAM).map(String::as_str), Some("rhel-9"));
    assert_eq!(idle.get(CURRENT_OS_IMAGE), Some(&env.rhel9()));
    let host = host_facts(&idle);
    assert_eq!(host["backend"], "rpm-ostree");
    assert_eq!(host["arch"], "x86_64");

    env.request_rhel10();
    let staging = env
        .wait_for("progress while staging", Duration::from_secs(30), |a| {
            a.get(STATE).map(String::as_str) == Some("Staging")
                && a.get(PROGRESS)
                    .and_then(|p| p.parse::<u8>().ok())
                    .is_some_and(|p| p > 0)
        })
        .await;
    assert!(staging.contains_key(OBSERVED_DESIRED));

    // streamctl during staging.
    let out = env.streamctl(&["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("State:") && text.contains("Staging"),
        "{text}"
    );

    let staged = env.wait_state("Staged").await;
    assert_eq!(staged.get(STAGED_OS_IMAGE), Some(&env.rhel10()));
    // The handlers' lines carry the request they act on (issue 22 §5): the step that ended,
    // the decision, preflight's end and the transaction's end.
    let log = plain(&env.log());
    for span in ["work_done", "decide", "on_prepared", "on_staged"] {
        assert!(
            span_carries(&log, span, &staged[OBSERVED_DESIRED]),
            "no {span} span with request={}:\n{log}",
            staged[OBSERVED_DESIRED]
        );
    }
    assert_eq!(
        staged.get(CURRENT_STREAM).map(String::as_str),
        Some("rhel-9")
    );
    assert!(
        !staged.contains_key(PROGRESS),
        "progress is removed once staged"
    );

    let txns = env.transactions().await;
    assert_eq!(started(&txns).len(), 1, "{txns:#?}");
    let t = &txns[0];
    assert_eq!(t["method"], "UpdateDeployment");
    assert_eq!(
        t["modifiers"]["set-refspec"],
        json!(format!("ostree-unverified-registry:{}", env.rhel10()))
    );
    assert_eq!(t["options"]["lock-finalization"], json!(true));
    assert_eq!(t["options"]["reboot"], json!(false));
    assert!(
        t["options"]["initiating-command-line"]
            .as_str()
            .unwrap_or_default()
            .contains("rhel-10")
    );

    // streamctl after staging, JSON form.
    let out = env.streamctl(&["status", "--json"]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(doc["schemaVersion"], 1);
    assert_eq!(doc["state"], "Staged");
    assert_eq!(doc["node"], testbed::NODE_NAME);
    assert_eq!(doc["stagedOsImage"], json!(env.rhel10()));
    assert_eq!(doc["desiredStream"], "rhel-10");
    assert_eq!(doc["currentStream"], "rhel-9");
    assert_eq!(doc["host"]["backend"], "rpm-ostree");
    assert_documented(
        &doc,
        &documented_fields("`streamctl status --json` prints one JSON object"),
        "status --json",
    );
    json_of_preflight_and_plan_is_as_documented(&env);

    // Events were posted for the node.
    let out = env.kubectl(&["get", "events", "-o", "json"]);
    let events: serde_json::Value = serde_json::from_slice(&out.stdout).expect("events JSON");
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["reason"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        reasons.contains(&"StagingStarted") && reasons.contains(&"Staged"),
        "{reasons:?}"
    );
    // Events name the node by uid too, so `kubectl describe node` lists them.
    let out = env.kubectl(&["describe", "node", testbed::NODE_NAME]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("StagingStarted"), "{text}");
}

/// `log` without the fmt layer's colours (ANSI escape sequences).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: up to and including the final letter.
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a line of `log` sits in span `span` with the field `request` = `hash`
/// (`span{step="verify" request=abc}:`).
fn span_carries(log: &str, span: &str, hash: &str) -> bool {
    let open = format!("{span}{{");
    let wanted = format!("request={hash}");
    log.lines().any(|l| {
        l.match_indices(&open).any(|(i, _)| {
            let fields = l[i + open.len()..].split('}').next().unwrap_or_default();
            fields.split(' ').any(|f| f == wanted)
        })
    })
}

#[test]
fn a_span_is_found_by_name_and_request() {
    let log = "\x1b[2mT\x1b[0m DEBUG \x1b[1mwork_done\x1b[0m{\x1b[3mstep\x1b[0m\x1b[2m=\x1b[0m\"verify\" \x1b[3mrequest\x1b[0m\x1b[2m=\x1b[0mabc}\x1b[2m:\x1b[0m x: m\n\
               T DEBUG decide{request=abd}: x: m\n\
               T DEBUG on_staged{request=\"abc\"}: x: m";
    let log = plain(log);
    assert!(
        log.starts_with("T DEBUG work_done{step=\"verify\" request=abc}: x: m"),
        "{log}"
    );
    assert!(span_carries(&log, "work_done", "abc"));
    assert!(span_carries(&log, "decide", "abd"));
    assert!(!span_carries(&log, "decide", "abc"));
    assert!(
        !span_carries(&log, "on_staged", "abc"),
        "one format: no quotes"
    );
    assert!(!span_carries(&log, "reconcile", "abc"));
}

/// `streamctl preflight --json` and `plan --json` for the node's request print exactly the fields
/// docs/protocol.md lists, and the plan only the modifiers and options it names.
fn json_of_preflight_and_plan_is_as_documented(env: &Env) {
    let out = env.streamctl(&["preflight", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("preflight JSON");
    assert_documented(
        &answer,
        &documented_fields("`streamctl preflight --json` prints"),
        "preflight --json",
    );
    for check in answer["checks"].as_array().expect("checks") {
        let keys: Vec<&String> = check.as_object().expect("a check").keys().collect();
        assert_eq!(keys, ["id", "message", "result"], "{check}");
        assert!(["pass", "warn", "fail"].contains(&check["result"].as_str().unwrap_or_default()));
    }
    let out = env.streamctl(&["plan", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    assert_eq!(plan, answer["plan"], "plan --json is preflight's plan");
    let fields = documented_fields("`streamctl plan --json` prints");
    assert_documented(&plan, &fields, "plan --json");
    for (name, description) in &fields {
        let allowed = backticked(description);
        for key in plan[name.as_str()].as_object().expect("a map").keys() {
            assert!(
                allowed.contains(key),
                "plan --json {name}: `{key}` is not in docs/protocol.md"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_request_is_not_staged_twice() {
    let mut env = Env::new("idempotent").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    // Same request again (no change of input keys), then a restart of the daemon: the staged
    // deployment already carries the image each time.
    env.request_rhel10();
    env.stop_streamd();
    env.start_streamd();
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    assert_eq!(started(&txns).len(), 1, "{txns:#?}");
    // Removing the request removes the stage (nothing stale is left for a reboot); asking
    // again stages again.
    env.withdraw_request();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    let methods: Vec<&str> = started(&txns)
        .into_iter()
        .filter_map(|t| t["method"].as_str())
        .collect();
    assert_eq!(
        methods,
        ["UpdateDeployment", "Cleanup", "UpdateDeployment"],
        "{txns:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_annotations_are_refused_without_transactions() {
    let mut env = Env::new("invalid").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let good = env.rhel10();
    let hex = good.rsplit(':').next().unwrap_or_default().to_string();
    let repo = good.split('@').next().unwrap_or_default().to_string();
    let cases: Vec<(String, String, &str)> = vec![
        ("RHEL-10".into(), good.clone(), "desired-stream"),
        ("rhel_10".into(), good.clone(), "desired-stream"),
        ("-rhel-10".into(), good.clone(), "desired-stream"),
        ("rhel-10-".into(), good.clone(), "desired-stream"),
        (" rhel-10".into(), good.clone(), "desired-stream"),
        ("a".repeat(254), good.clone(), "desired-stream"),
        ("rhel..10".into(), good.clone(), "desired-stream"),
        (
            "rhel-10".into(),
            format!("{repo}:latest"),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("{repo}@sha256:{}", hex.to_uppercase()),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("{repo}@sha256:{}", &hex[..60]),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("{repo}:4.20@sha256:{hex}"),
            "desired-os-image",
        ),
        ("rhel-10".into(), format!(" {good}"), "desired-os-image"),
        ("rhel-10".into(), format!("-{good}"), "desired-os-image"),
        (
            "rhel-10".into(),
            format!("rhcos@sha256:{hex}"),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("{repo}@md5:{hex}"),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("{}/{repo}@sha256:{hex}", "x".repeat(440)),
            "desired-os-image",
        ),
        (
            "rhel-10".into(),
            format!("docker://{good}"),
            "desired-os-image",
        ),
        ("rhel-10".into(), "".into(), "desired-os-image"),
    ];
    assert!(cases.len() >= 15);
    for (stream, image, key) in &cases {
        env.request(stream, image, None);
        let a = env
            .wait_for(
                &format!("refusal of {stream:?} / {image:?}"),
                Duration::from_secs(15),
                |a| {
                    a.get(STATE).map(String::as_str) == Some("Refused")
                        && a.get(REASON).is_some_and(|r| r.contains(key))
                        && a.get(REASON)
                            .is_some_and(|r| r.contains("osstream.openshift.io/"))
                },
            )
            .await;
        assert!(a[REASON].chars().count() <= 1024);
        // Back to Idle between cases, so each refusal is a fresh one.
        env.withdraw_request();
        env.wait_state("Idle").await;
    }
    // An extensions image that is not pinned is refused too.
    env.request("rhel-10", &good, Some(&format!("{repo}:ext")));
    env.wait_for("extensions refusal", Duration::from_secs(15), |a| {
        a.get(REASON)
            .is_some_and(|r| r.contains("desired-extensions-image"))
    })
    .await;
    let txns = env.transactions().await;
    assert!(
        txns.is_empty(),
        "no transaction may reach rpm-ostree: {txns:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_rpm_ostreed_is_waited_for() {
    let mut env = Env::new("busy").await;
    env.rpmostreed(RpmOstreedCmd::HoldForeign { on: true })
        .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_for("waiting reason", Duration::from_secs(20), |a| {
        a.get(STATE).map(String::as_str) == Some("Staging")
            && a.get(REASON)
                .is_some_and(|r| r.contains("Transaction in progress"))
    })
    .await;
    env.rpmostreed(RpmOstreedCmd::HoldForeign { on: false })
        .await;
    env.wait_state("Staged").await;
    assert_eq!(started(&env.transactions().await).len(), 1);
}

/// Starts streamd with the fake's next transaction failing with `message`, asks for rhel-10 and
/// returns the annotations once the node is `Degraded`.
async fn first_staging_fails(env: &mut Env, message: &str) -> BTreeMap<String, String> {
    env.rpmostreed(RpmOstreedCmd::FailNext {
        message: message.to_string(),
    })
    .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Degraded").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_transaction_degrades_with_the_daemon_message() {
    let mut env = Env::new("fail").await;
    let msg =
        "error: Could not depsolve transaction; 1 problem detected: nothing provides libfoo.so.2";
    let a = first_staging_fails(&mut env, msg).await;
    assert!(
        a[REASON].contains("nothing provides libfoo.so.2"),
        "{}",
        a[REASON]
    );
    assert!(!a.contains_key(STAGED_OS_IMAGE));
    // No flapping: a broken request stays Degraded, with no second transaction, past the
    // first delay any retry would have used.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let later = env.annotations().await;
    assert_eq!(later.get(STATE).map(String::as_str), Some("Degraded"));
    assert_eq!(later[REASON], a[REASON]);
    assert_eq!(started(&env.transactions().await).len(), 1);
}

/// Field failure: the registry drops the connection while rpm-ostree pulls. The same request is
/// staged again after a pause instead of waiting for someone to notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_failure_while_pulling_is_staged_again() {
    let mut env = Env::new("pull-retry").await;
    let msg = "Importing: reading blob sha256:ab: read tcp 10.0.0.2:4711->10.0.0.1:443: read: connection reset by peer";
    let a = first_staging_fails(&mut env, msg).await;
    assert!(
        a[REASON].contains("retry 1 of 3") && a[REASON].contains("connection reset by peer"),
        "{}",
        a[REASON]
    );
    let staged = env.wait_state("Staged").await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    assert_eq!(started(&env.transactions().await).len(), 2);
}

/// With `pull-retries = 0` a network failure is left like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_retries_zero_leaves_a_network_failure_degraded() {
    let mut env = Env::new("pull-retry-0").await;
    env.config("60-retries.toml", "pull-retries = 0\n");
    let a = first_staging_fails(
        &mut env,
        "fetching blob: received unexpected HTTP status: 503 Service Unavailable",
    )
    .await;
    assert!(a[REASON].contains("no retries left"), "{}", a[REASON]);
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        env.annotations().await.get(STATE).map(String::as_str),
        Some("Degraded")
    );
    assert_eq!(started(&env.transactions().await).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_image_is_refused_before_rpm_ostree() {
    let mut env = Env::new("unknown").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let repo = env
        .rhel10()
        .split('@')
        .next()
        .unwrap_or_default()
        .to_string();
    let img = format!("{repo}@sha256:{}", "e".repeat(64));
    env.request("rhel-10", &img, None);
    let a = env.wait_state("Refused").await;
    assert!(
        a[REASON].contains("preflight check os-image failed"),
        "{}",
        a[REASON]
    );
    assert!(a[REASON].contains("manifest unknown"), "{}", a[REASON]);
    assert!(env.transactions().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_drop_and_410_are_survived() {
    let mut env = Env::new("watchfaults").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.apiserver(ApiServerCmd::Fault(Fault::Gone { count: 2 }))
        .await;
    env.apiserver(ApiServerCmd::Fault(Fault::DropWatches)).await;
    // Let the watcher fail and relist before the request arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let stats = env.apiserver(ApiServerCmd::STATS).await;
    let watches = stats["by_user"]["system:node:worker-0"]["watch"]
        .as_u64()
        .unwrap_or(0);
    assert!(watches >= 2, "streamd re-opened its watch: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_request_returns_to_idle() {
    let mut env = Env::new("remove").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    env.withdraw_request();
    let a = env.wait_state("Idle").await;
    assert_eq!(a.get(REASON).map(String::as_str), Some(""));
    assert!(!a.contains_key(OBSERVED_DESIRED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamctl_without_daemon_says_so() {
    let env = Env::new("nodaemon").await;
    let out = env.streamctl(&["status"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("streamd is not running"), "{err}");
    assert!(
        !err.contains("org.freedesktop.DBus.Error"),
        "no raw D-Bus error names: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly() {
    let mut env = Env::new("sigterm").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let st = env.stop_streamd();
    assert!(st.success(), "exit status {st}\n{}", env.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_request_mid_staging_cancels_it() {
    let mut env = Env::new("cancel").await;
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 5000 }).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staging").await;
    // Let the transaction start before the request goes away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.withdraw_request();
    let a = env.wait_state("Idle").await;
    assert!(!a.contains_key(STAGED_OS_IMAGE), "nothing staged: {a:#?}");
    let txns = env.transactions().await;
    assert_eq!(txns.len(), 1, "{txns:#?}");
    assert_eq!(txns[0]["cancelled"], json!(true), "{txns:#?}");
    let deps = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    assert!(
        deps.as_array()
            .is_some_and(|d| d.iter().all(|d| d["staged"] != json!(true))),
        "{deps:#}"
    );
}

/// A request whose staging failed for good is remembered across a restart: the restarted
/// streamd reports the same failure and pulls nothing again, until `streamctl reconcile`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_not_staged_again_after_a_restart() {
    let mut env = Env::new("fail-restart").await;
    let msg =
        "error: Could not depsolve transaction; 1 problem detected: nothing provides libfoo.so.2";
    let a = first_staging_fails(&mut env, msg).await;
    env.kill_streamd();
    env.start_streamd();
    // Past the restarted streamd's first decision (a new staging would have started by now).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let later = env.annotations().await;
    assert_eq!(later.get(STATE).map(String::as_str), Some("Degraded"));
    assert_eq!(later[REASON], a[REASON]);
    assert_eq!(
        started(&env.transactions().await).len(),
        1,
        "staged again after the restart\n{}",
        env.log()
    );
    // Asked for explicitly, it is tried again.
    let out = env.streamctl(&["reconcile"]);
    assert!(out.status.success(), "{out:?}");
    env.wait_state("Staged").await;
    assert_eq!(started(&env.transactions().await).len(), 2);
}

/// The count of network failures of a request survives a restart: the retry after a restart
/// is the next one, not the first again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pull_retry_count_survives_a_restart() {
    let mut env = Env::new("pull-retry-restart").await;
    let msg = "Importing: reading blob sha256:ab: read tcp 10.0.0.2:4711->10.0.0.1:443: read: connection reset by peer";
    let a = first_staging_fails(&mut env, msg).await;
    assert!(a[REASON].contains("retry 1 of 3"), "{}", a[REASON]);
    env.kill_streamd();
    env.rpmostreed(RpmOstreedCmd::FailNext {
        message: msg.to_string(),
    })
    .await;
    env.start_streamd();
    // The restarted streamd stages again (the retry's wait does not survive a restart) and the
    // transaction fails on the network once more.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let txns = env.transactions().await;
        let done = started(&txns)
            .iter()
            .filter(|t| !t["result"].is_null())
            .count();
        if done >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second transaction\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = env
        .wait_for(
            "the second failure reported",
            Duration::from_secs(10),
            |b| b.get(REASON).is_some_and(|r| r.contains("retry 2 of 3")),
        )
        .await;
    assert_eq!(b[STATE], "Degraded");
}
