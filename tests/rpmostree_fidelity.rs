//! The agent against rpm-ostree's real behaviours that differ from what a kind fake would do
//! (issue 9): each test runs the real streamd on a testbed whose fake rpm-ostreed behaves like
//! the real daemon of a given version.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use testbed::control::RpmOstreedCmd;

/// Stages rhel-10 and checks the agent stays `Staged` on its one locked stage: no
/// `Cleanup`, no second `UpdateDeployment` (each would be a full image download on a node).
async fn locked_stage_stays_staged(name: &str, legacy_lock_file: bool) {
    let mut env = Env::new(name).await;
    env.rpmostreed(RpmOstreedCmd::LegacyLockFile {
        on: legacy_lock_file,
    })
    .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let deployments = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    // What rpm-ostreed reports depends on its version; the lock is real either way.
    assert_eq!(
        deployments[0].get("finalization-locked").is_some(),
        legacy_lock_file,
        "{deployments:#?}"
    );
    assert_eq!(
        env.dir
            .join("host/run/ostree/staged-deployment-locked")
            .exists(),
        legacy_lock_file
    );
    assert!(env.dir.join("host/run/ostree/staged-deployment").exists());
    // A planner that misread the lock cleans up and stages again within a second or two.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let a = env.annotations().await;
    assert_eq!(a.get(STATE).map(String::as_str), Some("Staged"), "{a:#?}");
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(methods, ["UpdateDeployment"], "{txns:#?}\n{}", env.log());
    env.stop_streamd();
}

/// rpm-ostree >= v2024.6: the lock is only the `locked` key of `/run/ostree/staged-deployment`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_stage_is_kept_on_current_rpm_ostree() {
    locked_stage_stays_staged("lock-current", false).await;
}

/// rpm-ostree before v2024.6: the legacy lock file, and `finalization-locked` on D-Bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_stage_is_kept_on_legacy_rpm_ostree() {
    locked_stage_stays_staged("lock-legacy", true).await;
}

/// The booted rhel-9 image is a later build than the rhel-10 one (as often in the field):
/// rpm-ostree refuses the rebase as "chronologically older" when the client sends
/// `allow-downgrade: false`, so streamd leaves the option out (its own `direction` check is
/// what stops an older major).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebase_to_an_older_build_of_a_newer_major_is_staged() {
    let mut env = Env::new("older-build").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = env
        .wait_for("Staged or Degraded", Duration::from_secs(90), |a| {
            matches!(
                a.get(STATE).map(String::as_str),
                Some("Staged" | "Degraded")
            )
        })
        .await;
    assert_eq!(a.get(STATE).map(String::as_str), Some("Staged"), "{a:#?}");
    let txns = env.transactions().await;
    assert_eq!(txns[0]["method"], "UpdateDeployment");
    assert_eq!(txns[0]["options"].get("allow-downgrade"), None, "{txns:#?}");
    env.stop_streamd();
}

/// An error reply of rpm-ostreed's own (here polkit's `AccessDenied`) is its answer to this
/// request: streamd goes `Degraded` once and does not call again with a full preflight every
/// minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_degrades_once() {
    let mut env = Env::new("refused").await;
    env.rpmostreed(RpmOstreedCmd::DenyCalls { on: true }).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = env
        .wait_for("Degraded", Duration::from_secs(30), |a| {
            a.get(STATE).map(String::as_str) == Some("Degraded")
        })
        .await;
    assert!(a[REASON].contains("not allowed for user"), "{}", a[REASON]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let txns = env.transactions().await;
    assert_eq!(txns.len(), 1, "{txns:#?}");
    assert!(
        txns[0]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("org.freedesktop.DBus.Error.AccessDenied")),
        "{txns:#?}"
    );
    let a = env.annotations().await;
    assert_eq!(a.get(STATE).map(String::as_str), Some("Degraded"));
    env.stop_streamd();
}

/// A real container pull reports progress only as layer tasks "[n/N] Fetching ostree chunk …"
/// (no `PercentProgress`): streamd turns them into `progress`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_tasks_are_reported_as_progress() {
    let mut env = Env::new("layer-progress").await;
    env.rpmostreed(RpmOstreedCmd::Slow { ms: 4000 }).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = env
        .wait_for("progress from layer tasks", Duration::from_secs(30), |a| {
            a.get(STATE).map(String::as_str) == Some("Staging")
                && a.get(PROGRESS)
                    .and_then(|p| p.parse::<u8>().ok())
                    .is_some_and(|p| p > 0)
        })
        .await;
    assert!(a[REASON].contains("Fetching ostree chunk"), "{a:#?}");
    env.wait_state("Staged").await;
    env.stop_streamd();
}

/// rpm-ostreed unlocks, queues the reboot and then goes down before streamd reads `Finished`:
/// the reboot is committed, so streamd keeps the attempt (it stays `Rebooting`, touches
/// nothing) and the next boot is checked as that attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_finalization_is_possibly_applied() {
    let mut env = Env::new("finalize-dropped").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_reboot_request().await;
    env.rpmostreed(RpmOstreedCmd::DropAfterUnlock).await;
    env.approve_reboot().await;
    env.wait_for("a reboot initiated", Duration::from_secs(30), |_| {
        env.reboot_initiated()
    })
    .await;
    // Whatever streamd does now must not be Degraded, nor another transaction.
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < deadline {
        let a = env.annotations().await;
        assert_eq!(
            a.get(STATE).map(String::as_str),
            Some("Rebooting"),
            "{a:#?}\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(
        methods,
        ["UpdateDeployment", "FinalizeDeployment"],
        "{txns:#?}"
    );
    assert_eq!(txns[1]["crashed"], true);
    env.reboot_into_rhel10().await;
}

/// A restarted rpm-ostreed (crash, update, idle exit and D-Bus activation) knows no clients:
/// streamd registers again, or the new daemon could idle-exit under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_is_registered_with_again() {
    let mut env = Env::new("reregister").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    assert_eq!(
        env.rpmostreed(RpmOstreedCmd::Clients).await,
        json!(["streamd"])
    );
    env.rpmostreed(RpmOstreedCmd::ExitMidTransaction).await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    assert_eq!(
        env.rpmostreed(RpmOstreedCmd::Clients).await,
        json!(["streamd"]),
        "{}",
        env.log()
    );
    env.stop_streamd();
}

/// The transaction socket could not be reached: the unstarted transaction must not stay
/// (it would block every rpm-ostree client) nor be joined by the retry. streamd's
/// transaction connection leaves the bus, so the daemon drops it; the retry creates a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstarted_transaction_is_dropped_not_joined() {
    let mut env = Env::new("wedged").await;
    env.rpmostreed(RpmOstreedCmd::DropPeerNext).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    let deploys: Vec<&serde_json::Value> = txns
        .iter()
        .filter(|t| t["method"] == "UpdateDeployment")
        .collect();
    assert_eq!(deploys.len(), 2, "{txns:#?}");
    assert_eq!(deploys[0]["dropped"], true, "{txns:#?}");
    assert_eq!(deploys[0]["joined"], 0, "{txns:#?}");
    assert_eq!(deploys[1]["started"], true, "{txns:#?}");
    env.stop_streamd();
}

/// `ostree admin deploy` (no `--stage`) left a pending deployment: not staged, yet it boots
/// next, and rpm-ostree edits its origin (which lacks the booted one's layered usbguard), not
/// the booted one's (`rpmostree_syscore_get_origin_merge_deployment`). streamd refuses it like
/// a foreign staged deployment and, allowed to replace it, removes it before staging, so what
/// is staged is its own plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_deployment_from_ostree_admin_deploy_is_foreign() {
    let mut env = Env::with_host("admin-pending", "layered").await;
    env.rpmostreed(RpmOstreedCmd::AdminDeploy { image: env.rhel9() })
        .await;
    env.start_streamd();
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    let a = env
        .wait_for("Refused or Degraded", Duration::from_secs(90), |a| {
            matches!(
                a.get(STATE).map(String::as_str),
                Some("Refused" | "Degraded")
            )
        })
        .await;
    assert_eq!(a.get(STATE).map(String::as_str), Some("Refused"), "{a:#?}");
    assert!(a[REASON].contains("pending-deployment"), "{}", a[REASON]);
    assert!(a[REASON].contains("not staged"), "{}", a[REASON]);
    assert!(env.transactions().await.is_empty());
    env.stop_streamd();

    env.config("60-replace.toml", "replace-foreign-staged = true\n");
    env.start_streamd();
    env.wait_reboot_request().await;
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(methods, ["Cleanup", "UpdateDeployment"], "{txns:#?}");
    let deployments = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    assert_eq!(
        deployments.as_array().map(Vec::len),
        Some(2),
        "{deployments:#?}"
    );
    assert_eq!(deployments[0]["staged"], true);
    let local = deployments[0]["requested-local-packages"].to_string();
    assert!(
        local.contains("usbguard-") && local.contains("el10"),
        "{local}"
    );
    assert_eq!(deployments[0]["requested-packages"], json!([]));
    env.stop_streamd();
}

/// rpm-ostree leaves out `container-image-reference-digest` when it cannot read the image's
/// metadata back (coreos/rpm-ostree#4185): streamd takes the digest pinned in the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booted_deployment_without_a_digest_is_known_by_its_reference() {
    let mut env = Env::new("no-digest").await;
    env.rpmostreed(RpmOstreedCmd::LoseImageMetadata { index: 0 })
        .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    // The booted image, asked for: nothing to do.
    env.request("rhel-9", &env.rhel9(), None);
    env.wait_for("Done", Duration::from_secs(30), |a| {
        a.get(STATE).map(String::as_str) == Some("Done")
    })
    .await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(methods, ["UpdateDeployment"], "{txns:#?}");
    env.stop_streamd();
}
