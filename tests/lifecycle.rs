//! End-to-end: the reboot handshake, after-boot verification, rollbacks and changes in flight.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use testbed::control::{InhibitMode, Inhibitor, LogindCmd, RpmOstreedCmd};

fn methods(txns: &[Value]) -> Vec<String> {
    started(txns)
        .into_iter()
        .map(|t| t["method"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn count(txns: &[Value], method: &str) -> usize {
    methods(txns).iter().filter(|m| *m == method).count()
}

/// The UpdateDeployment transactions that were started, in order.
fn started_updates(txns: &[Value]) -> Vec<&Value> {
    started(txns)
        .into_iter()
        .filter(|t| t["method"] == "UpdateDeployment")
        .collect()
}

fn attempt_record(env: &Env) -> Option<Value> {
    let text = std::fs::read_to_string(env.dir.join("state/attempt.json")).ok()?;
    serde_json::from_str(&text).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_migration_reboots_into_rhel10_and_reports_done() {
    let mut env = Env::new("approve").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let staged = env.wait_reboot_request().await;
    let token = staged[REBOOT_REQUESTED].clone();
    assert!(
        token.starts_with(&staged[OBSERVED_DESIRED]),
        "the token names the request: {token}"
    );

    // The admin on the host sees the same request.
    let out = env.streamctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("waiting for approval: reboot-approved={token}")),
        "{text}"
    );
    let out = env.streamctl(&["status", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(doc["rebootRequested"], json!(token));
    assert_eq!(doc["rebootApproved"], json!(false));

    // A stale or foreign token never reboots the node.
    for wrong in [
        "not-the-token",
        &format!("{}.000000000000", staged[OBSERVED_DESIRED]),
    ] {
        env.annotate(&[&format!("{REBOOT_APPROVED}={wrong}")]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let a = env.annotations().await;
        assert_eq!(a[STATE], "Staged", "{wrong}");
        assert!(!env.reboot_initiated(), "{wrong} must not reboot");
        assert_eq!(count(&env.transactions().await, "FinalizeDeployment"), 0);
    }

    env.annotate(&[&format!("{REBOOT_APPROVED}={token}")]);
    let rebooting = env.wait_state("Rebooting").await;
    assert!(
        rebooting[REASON].contains("attempt 1 of 2"),
        "{rebooting:?}"
    );
    env.wait_for(
        "rpm-ostreed initiates the reboot",
        Duration::from_secs(30),
        |_| env.reboot_initiated(),
    )
    .await;
    let txns = env.transactions().await;
    let fin: Vec<&Value> = txns
        .iter()
        .filter(|t| t["method"] == "FinalizeDeployment")
        .collect();
    assert_eq!(fin.len(), 1, "{txns:#?}");
    assert!(
        fin[0]["options"]["checksum"]
            .as_str()
            .is_some_and(|c| c.starts_with("sha256:")),
        "{fin:?}"
    );
    let record = attempt_record(&env).expect("attempt record written before the reboot");
    assert_eq!(record["attempt"]["attempts"], 1);

    let done = env.reboot_into_rhel10().await;
    assert!(!done.contains_key(REBOOT_REQUESTED), "{done:?}");
    assert!(!done.contains_key(STAGED_OS_IMAGE), "{done:?}");
    let reasons = env.event_reasons();
    for r in ["Staged", "RebootRequested", "Rebooting", "Applied"] {
        assert!(reasons.iter().any(|x| x == r), "{r} missing: {reasons:?}");
    }
    assert!(
        attempt_record(&env).is_none_or(|r| r["attempt"].is_null()),
        "the attempt record is cleared once done"
    );
    // Exactly one staging, one finalization.
    let txns = env.transactions().await;
    assert_eq!(count(&txns, "UpdateDeployment"), 1, "{txns:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplanned_reboot_keeps_the_old_os_and_asks_again() {
    let mut env = Env::new("unplanned").await;
    env.start_streamd();
    env.request_rhel10();
    let before = env
        .wait_for("a reboot request", Duration::from_secs(90), |a| {
            a.contains_key(REBOOT_REQUESTED)
        })
        .await;
    // Power loss: nobody approved, nothing finalized.
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], json!(false), "{out}");
    assert_eq!(
        out["discarded"],
        json!(true),
        "a locked staged deployment is never applied"
    );
    env.start_streamd();
    let after = env
        .wait_for("a new reboot request", Duration::from_secs(90), |a| {
            a.get(REBOOT_REQUESTED)
                .is_some_and(|t| *t != before[REBOOT_REQUESTED])
                && a.get(STATE).map(String::as_str) == Some("Staged")
        })
        .await;
    assert_eq!(after[CURRENT_OS_IMAGE], env.rhel9(), "still on the old OS");
    assert_eq!(after[CURRENT_STREAM], "rhel-9");
    assert!(
        attempt_record(&env).is_some_and(|r| r["attempt"].is_null()),
        "an unplanned reboot is not an attempt"
    );
    // The old token (previous boot) does not reboot the node now.
    env.annotate(&[&format!("{REBOOT_APPROVED}={}", before[REBOOT_REQUESTED])]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!env.reboot_initiated());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_finalization_rolls_back_retries_then_refuses() {
    let mut env = Env::new("rollback").await;
    env.start_streamd();
    env.request_rhel10();
    for attempt in 1..=2 {
        env.approve_reboot().await;
        env.wait_for("the reboot", Duration::from_secs(60), |_| {
            env.reboot_initiated()
        })
        .await;
        let out = env.reboot(true).await;
        assert_eq!(out["applied"], json!(false), "{out}");
        env.start_streamd();
        // Each reboot that came up on the old OS is reported once, as a RolledBack Event.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while env
            .event_reasons()
            .iter()
            .filter(|r| *r == "RolledBack")
            .count()
            < attempt
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no RolledBack report for attempt {attempt}\n{}",
                env.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let a = if attempt == 1 {
            env.wait_state("Staged").await
        } else {
            env.wait_state("Refused").await
        };
        assert_eq!(a[CURRENT_OS_IMAGE], env.rhel9(), "attempt {attempt}");
        let rec = attempt_record(&env).expect("record");
        assert_eq!(rec["attempt"]["attempts"], attempt, "{rec}");
    }
    let refused = env.annotations().await;
    assert!(
        refused[REASON].contains("attempt 2 of 2") && refused[REASON].contains("giving up"),
        "{refused:?}"
    );
    // The previous boot's ostree-finalize-staged error, read from the host's journal.
    assert!(
        refused[REASON]
            .contains("ostree-finalize-staged: error: Bootloader write config: grub2-mkconfig"),
        "{refused:?}"
    );
    let reasons = env.event_reasons();
    assert_eq!(
        reasons.iter().filter(|r| *r == "RolledBack").count(),
        2,
        "{reasons:?}"
    );
    // No reboot loop: nothing is staged again and the state holds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let txns = env.transactions().await;
    assert_eq!(count(&txns, "UpdateDeployment"), 2, "{txns:#?}");
    assert_eq!(count(&txns, "FinalizeDeployment"), 2, "{txns:#?}");
    assert_eq!(env.annotations().await[STATE], "Refused");
    // The same image again, from the first attempt, on `streamctl reconcile`, as the reason
    // says (issue 23 §2).
    assert!(
        refused[REASON].contains("run `streamctl reconcile` on the node"),
        "{refused:?}"
    );
    let out = env.streamctl(&["reconcile"]);
    assert!(out.status.success(), "{out:?}");
    env.wait_state("Staged").await;
    assert!(
        attempt_record(&env).is_some_and(|r| r["attempt"].is_null()),
        "the attempts start over"
    );
    assert_eq!(count(&env.transactions().await, "UpdateDeployment"), 3);
    // A new request (here: the same image with its extensions image) starts from zero.
    env.request_rhel10_extensions();
    env.wait_reboot_request().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_policy_never_stages_unlocked_and_verifies_after_boot() {
    let mut env = Env::new("never").await;
    env.config("60-reboot.toml", "reboot = \"never\"\n");
    env.start_streamd();
    env.request_rhel10();
    let staged = env.wait_state("Staged").await;
    assert!(!staged.contains_key(REBOOT_REQUESTED), "{staged:?}");
    let txns = env.transactions().await;
    let t = txns
        .iter()
        .find(|t| t["method"] == "UpdateDeployment")
        .expect("staging");
    assert_eq!(t["options"]["lock-finalization"], json!(false));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !env.reboot_initiated(),
        "streamd never reboots under reboot = never"
    );
    // Someone else reboots: the unlocked deployment is applied.
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], json!(true), "{out}");
    env.start_streamd();
    let done = env.wait_state("Done").await;
    assert_eq!(done[CURRENT_STREAM], "rhel-10");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_request_after_staging_cleans_up() {
    let mut env = Env::new("cleanup").await;
    env.start_streamd();
    env.request_rhel10();
    env.wait_for("a reboot request", Duration::from_secs(90), |a| {
        a.contains_key(REBOOT_REQUESTED)
    })
    .await;
    env.withdraw_request();
    let idle = env
        .wait_for("idle with nothing staged", Duration::from_secs(60), |a| {
            a.get(STATE).map(String::as_str) == Some("Idle") && !a.contains_key(STAGED_OS_IMAGE)
        })
        .await;
    assert!(!idle.contains_key(REBOOT_REQUESTED), "{idle:?}");
    let txns = env.transactions().await;
    assert_eq!(count(&txns, "Cleanup"), 1, "{txns:#?}");
    // And a reboot now boots the old OS.
    let out = env.reboot(false).await;
    assert_eq!(
        out["discarded"],
        json!(false),
        "nothing was left staged: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_request_mid_staging_cancels_and_stages_the_new_one() {
    let mut env = Env::new("change").await;
    // Long enough that the change always arrives mid-transaction, even on a loaded machine;
    // the cancellation ends the pause at once.
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 20000 }).await;
    env.start_streamd();
    env.request_rhel10();
    env.wait_state("Staging").await;
    env.request_rhel10_extensions();
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 0 }).await;
    let a = env.wait_reboot_request().await;
    let txns = env.transactions().await;
    let updates = started_updates(&txns);
    assert_eq!(updates.len(), 2, "{txns:#?}");
    assert_eq!(updates[0]["cancelled"], json!(true), "{txns:#?}");
    assert_eq!(updates[1]["result"]["ok"], json!(true), "{txns:#?}");
    assert!(a[REBOOT_REQUESTED].starts_with(&a[OBSERVED_DESIRED]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_ostreed_exiting_mid_transaction_is_recovered() {
    let mut env = Env::new("daemon-exit").await;
    env.rpmostreed(RpmOstreedCmd::ExitMidTransaction).await;
    env.start_streamd();
    env.request_rhel10();
    env.wait_for(
        "staged after the daemon came back",
        Duration::from_secs(120),
        |a| a.get(STATE).map(String::as_str) == Some("Staged"),
    )
    .await;
    let txns = env.transactions().await;
    let updates = started_updates(&txns);
    assert_eq!(updates.len(), 2, "{txns:#?}");
    assert_eq!(updates[0]["crashed"], json!(true), "{txns:#?}");
    assert!(
        env.log()
            .contains("closed the transaction without a result"),
        "the interruption is reported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inhibitor_lock_degrades_naming_it_and_retries() {
    let mut env = Env::new("inhibit").await;
    env.tb
        .control(LogindCmd::Inhibit(Inhibitor {
            what: "shutdown:sleep".into(),
            who: "etcd-backup".into(),
            why: "snapshot in progress".into(),
            mode: InhibitMode::Block,
            uid: 0,
            pid: 0,
        }))
        .await
        .expect("inhibit");
    env.start_streamd();
    env.request_rhel10();
    env.approve_reboot().await;
    let degraded = env
        .wait_for("the inhibitor reported", Duration::from_secs(60), |a| {
            a.get(STATE).map(String::as_str) == Some("Degraded")
        })
        .await;
    let reason = &degraded[REASON];
    assert!(
        reason.contains("etcd-backup") && reason.contains("snapshot in progress"),
        "{reason}"
    );
    assert!(!env.reboot_initiated());
    assert!(
        attempt_record(&env).is_some_and(|r| r["attempt"].is_null()),
        "a blocked reboot is not an attempt"
    );
    // Asked again after a minute, doubling (issue 20 §7: not every minute), or at once.
    assert!(
        reason.contains("asked again in 60s (streamctl reconcile asks at once)"),
        "{reason}"
    );
    env.tb
        .control(LogindCmd::Release {
            who: "etcd-backup".into(),
        })
        .await
        .expect("release");
    let out = env.streamctl(&["reconcile"]);
    assert!(out.status.success(), "{out:?}");
    env.wait_state("Rebooting").await;
    env.wait_for("the reboot", Duration::from_secs(60), |_| {
        env.reboot_initiated()
    })
    .await;
    let rec = attempt_record(&env).expect("record");
    assert_eq!(rec["attempt"]["attempts"], 1, "{rec}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_staged_deployment_is_refused_unless_replacing_is_allowed() {
    let mut env = Env::new("foreign").await;
    // Another tool stages the same target, without a finalization lock.
    let out = std::process::Command::new(&env.vars()["TESTBED_BOOTC"])
        .args(["switch", "--transport", "registry", &env.rhel10()])
        .envs(env.vars())
        .output()
        .expect("fake bootc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.start_streamd();
    env.request_rhel10();
    let refused = env.wait_state("Refused").await;
    let reason = &refused[REASON];
    assert!(
        reason.contains("pending-deployment") && reason.contains(&env.rhel10()),
        "{reason}"
    );
    assert_eq!(count(&env.transactions().await, "UpdateDeployment"), 0);

    env.stop_streamd();
    env.config("60-replace.toml", "replace-foreign-staged = true\n");
    env.start_streamd();
    let staged = env.wait_reboot_request().await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    let txns = env.transactions().await;
    let t = txns
        .iter()
        .find(|t| t["method"] == "UpdateDeployment")
        .expect("staging");
    assert_eq!(t["options"]["lock-finalization"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fips_realtime_node_keeps_both_across_the_reboot_and_is_checked_after_boot() {
    let mut env = Env::with_host("fips-rt", "fips-realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.request_rhel10_extensions();
    env.approve_reboot().await;
    env.wait_for("the reboot", Duration::from_secs(60), |_| {
        env.reboot_initiated()
    })
    .await;
    let rec = attempt_record(&env).expect("record");
    assert_eq!(rec["attempt"]["kernel"], "realtime", "{rec}");
    assert_eq!(rec["attempt"]["fips"], true, "{rec}");
    let out = env.reboot(false).await;
    assert!(
        out["kernel"]
            .as_str()
            .is_some_and(|k| k.contains("el10") && k.ends_with("+rt")),
        "{out}"
    );
    env.start_streamd();
    let done = env.wait_state("Done").await;
    let host = host_facts(&done);
    assert_eq!(host["kernel"], "realtime");
    assert_eq!(host["fips"], "enabled");

    // Had FIPS been lost on the way, the node would be reported, not rebooted again: rewind
    // the record to "just rebooted" and boot a host whose kernel says FIPS is off.
    env.stop_streamd();
    let mut rec = rec;
    rec["attempt"]["bootId"] = json!("00000000-0000-0000-0000-000000000000");
    std::fs::write(
        env.dir.join("state/attempt.json"),
        serde_json::to_vec(&rec).expect("json"),
    )
    .expect("write record");
    std::fs::write(env.dir.join("host/proc/sys/crypto/fips_enabled"), "0\n").expect("fips off");
    env.start_streamd();
    let degraded = env.wait_state("Degraded").await;
    assert!(
        degraded[REASON].contains("FIPS mode was on before the reboot"),
        "{}",
        degraded[REASON]
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!env.reboot_initiated(), "never a reboot after a bad boot");
    assert_eq!(env.annotations().await[STATE], "Degraded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_policy_immediate_finalizes_without_asking() {
    let mut env = Env::new("immediate").await;
    env.config("60-reboot.toml", "reboot = \"immediate\"\n");
    env.start_streamd();
    env.request_rhel10();
    env.wait_for("the reboot", Duration::from_secs(90), |_| {
        env.reboot_initiated()
    })
    .await;
    let a = env.annotations().await;
    assert_eq!(a[STATE], "Rebooting");
    assert!(!a.contains_key(REBOOT_REQUESTED), "nobody is asked: {a:?}");
    let txns = env.transactions().await;
    assert_eq!(count(&txns, "FinalizeDeployment"), 1, "{txns:#?}");
    env.reboot(false).await;
    env.start_streamd();
    let done = env.wait_state("Done").await;
    assert_eq!(done[CURRENT_STREAM], "rhel-10");
}

/// streamd dies while rpm-ostreed stages a broken tree (the real-time kernel is lost); the
/// transaction ends without it. After the restart the stage is its own and carries the desired
/// image, but was never checked on disk: it is checked (and removed) before any reboot is
/// requested, never taken as ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_never_checked_is_checked_after_a_restart_before_any_approval() {
    let mut env = Env::with_host("verify-restart", "realtime").await;
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 3000 }).await;
    env.rpmostreed(RpmOstreedCmd::DropVariantNext).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    // Killed once rpm-ostreed runs the transaction (a caller gone before `Start()` drops it).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while started(&env.transactions().await).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no transaction started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.kill_streamd();
    loop {
        let deps = env.rpmostreed(RpmOstreedCmd::Deployments).await;
        if deps
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["staged"] == json!(true)))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the orphaned transaction staged nothing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.start_streamd();
    let a = env
        .wait_for(
            "a verdict on the unchecked stage",
            Duration::from_secs(90),
            |a| {
                a.get(STATE).map(String::as_str) == Some("Degraded")
                    || a.contains_key(REBOOT_REQUESTED)
            },
        )
        .await;
    assert!(
        !a.contains_key(REBOOT_REQUESTED),
        "a reboot was requested for a stage never checked: {a:#?}"
    );
    assert!(a[REASON].contains("+rt"), "{}", a[REASON]);
    assert!(
        a[REASON].contains("pending deployment was removed"),
        "{}",
        a[REASON]
    );
}

/// A plain rebase whose new root fails rpm-ostree's sanity check (`/usr/bin/true`): rpm-ostree
/// v2025.5 stages it before the check and leaves it staged when the transaction fails (seen on
/// the real daemon). streamd reports the failure and removes that stage; it never checks it as
/// if it were a good one nor leaves it for a reboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_left_by_a_failed_sanity_check_is_removed_and_the_failure_reported() {
    let mut env = Env::new("sanity-left").await;
    env.rpmostreed(RpmOstreedCmd::BrokenRootNext).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let os = env.rhel10();
    env.request("rhel-10", &os, None);
    let degraded = env.wait_state("Degraded").await;
    assert!(
        degraded[REASON].contains("Sanity-checking final rootfs"),
        "{}",
        degraded[REASON]
    );
    assert!(!degraded.contains_key(REBOOT_REQUESTED), "{degraded:#?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let deps = env.rpmostreed(RpmOstreedCmd::Deployments).await;
        let staged = deps
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["staged"] == json!(true)));
        if !staged {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the failed transaction's stage was left: {deps:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One staging transaction, then a cleanup; no second pull of the failed request.
    let txns = env.transactions().await;
    let methods: Vec<&str> = started(&txns)
        .iter()
        .filter_map(|t| t["method"].as_str())
        .collect();
    assert_eq!(
        methods.iter().filter(|m| **m != "Cleanup").count(),
        1,
        "{methods:?}"
    );
    assert!(methods.contains(&"Cleanup"), "{methods:?}");
    let a = env.wait_state("Degraded").await;
    assert!(
        a[REASON].contains("Sanity-checking final rootfs"),
        "{}",
        a[REASON]
    );
}

/// A → B → A in one boot: the approval the cluster wrote for the first staging of A (late, or
/// left over) must not finalize the second staging of A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_not_replayed_onto_a_later_staging_of_the_same_request() {
    let mut env = Env::new("replay").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    let first = env.wait_reboot_request().await[REBOOT_REQUESTED].clone();
    // B: the same image without the extensions image.
    env.annotate(&[&format!("{DESIRED_EXTENSIONS_IMAGE}-")]);
    env.wait_for("B staged", Duration::from_secs(90), |a| {
        a.get(STATE).map(String::as_str) == Some("Staged")
            && a.get(REBOOT_REQUESTED).is_some_and(|t| *t != first)
    })
    .await;
    // Back to A, with the approval of A's first staging.
    env.annotate(&[
        &format!("{DESIRED_EXTENSIONS_IMAGE}={ext}"),
        &format!("{REBOOT_APPROVED}={first}"),
    ]);
    let a = env
        .wait_for("A staged again", Duration::from_secs(90), |a| {
            a.get(STATE).map(String::as_str) == Some("Rebooting")
                || (a.get(STATE).map(String::as_str) == Some("Staged")
                    && a.get(REBOOT_REQUESTED)
                        .is_some_and(|t| t.starts_with(&first[..16])))
        })
        .await;
    assert_eq!(a[STATE], "Staged", "{a:#?}");
    assert_ne!(a[REBOOT_REQUESTED], first, "the same token again");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!env.reboot_initiated(), "finalized on a replayed approval");
    let finalized = env
        .transactions()
        .await
        .iter()
        .filter(|t| t["method"] == "FinalizeDeployment")
        .count();
    assert_eq!(finalized, 0);
}
