//! End-to-end: on a Secure Boot x86_64/aarch64 node a move to another RHEL major updates the
//! bootloader through systemd (streamd's `streamd-bootloader-update.target`, which pulls in
//! bootupd's `bootloader-update.service`) before finalizing, so the old shim trusts the target's
//! signing keys; when the update fails nothing is finalized.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const UNIT: &str = "bootloader-update.service";
const TARGET: &str = "streamd-bootloader-update.target";

/// The fake systemd's records of `bootloader-update.service` starts.
async fn bootloader_runs(env: &Env) -> Vec<Value> {
    let units = env.systemd_units().await;
    units
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|u| u["unit"] == json!(UNIT))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to 30 s for `pred`.
async fn eventually(what: &str, env: &Env, pred: impl Fn(&Env) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pred(env) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a `FinalizeDeployment` transaction was asked for.
async fn finalize_called(env: &Env) -> bool {
    env.transactions()
        .await
        .iter()
        .any(|t| t["method"] == json!("FinalizeDeployment"))
}

/// A host moving rhel-9 → rhel-10, up to the approval; `prepare` changes the host root first.
async fn approved_move(name: &str, host: &str, prepare: impl FnOnce(&Path)) -> Env {
    let mut env = Env::with_host(name, host).await;
    prepare(&env.dir.join("host"));
    env.start_streamd();
    env.request_rhel10();
    env.approve_reboot().await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_major_move_updates_the_bootloader_before_finalizing() {
    let env = approved_move("secureboot-update", "secureboot", |_| {}).await;
    eventually("the reboot", &env, Env::reboot_initiated).await;
    let runs = bootloader_runs(&env).await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["job_result"], json!("done"), "{runs:#?}");
    // streamd starts only its own target (the one packaged unit SELinux lets it start);
    // systemd pulls bootupd's unit in.
    assert_eq!(runs[0]["pulled_in_by"], json!(TARGET), "{runs:#?}");
    let units = env.systemd_units().await;
    let targets: Vec<&Value> = units
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| u["unit"] == json!(TARGET))
        .collect();
    assert_eq!(targets.len(), 1, "{units:#?}");
    assert_eq!(targets[0]["mode"], json!("replace"), "{targets:#?}");
    assert_eq!(targets[0]["job_result"], json!("done"), "{targets:#?}");
    let updated = std::fs::read_to_string(env.dir.join("host/run/testbed/bootloader-updated"))
        .expect("the fake bootupctl ran");
    assert_eq!(updated.lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_bootloader_update_degrades_without_finalizing() {
    let env = approved_move("secureboot-fails", "secureboot", |host| {
        std::fs::create_dir_all(host.join("run/testbed")).expect("mkdir");
        std::fs::write(
            host.join("run/testbed/bootloader-update-fails"),
            "error: updating EFI: No space left on device\n",
        )
        .expect("fault");
    })
    .await;
    let degraded = env.wait_state("Degraded").await;
    let reason = &degraded[REASON];
    assert!(
        reason.contains(UNIT) && reason.contains("Secure Boot") && reason.contains("exit-code"),
        "{reason}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!finalize_called(&env).await, "nothing may be finalized");
    assert!(!env.reboot_initiated());
    assert_eq!(env.annotations().await[STATE], "Degraded");
    // Not retried behind the admin's back: one run until asked again.
    assert_eq!(bootloader_runs(&env).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_unit_the_move_is_not_finalized_and_the_reason_says_why() {
    let env = approved_move("secureboot-nounit", "secureboot", |host| {
        std::fs::remove_file(host.join("usr/lib/systemd/system").join(UNIT))
            .expect("remove the unit");
    })
    .await;
    let degraded = env.wait_state("Degraded").await;
    let reason = &degraded[REASON];
    assert!(
        reason.contains(UNIT) && reason.contains("not found") && reason.contains("bootupctl"),
        "{reason}"
    );
    assert!(!finalize_called(&env).await);
    assert!(!env.reboot_initiated());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_streamds_target_the_reason_says_to_reinstall() {
    let env = approved_move("secureboot-notarget", "secureboot", |host| {
        std::fs::remove_file(host.join("usr/lib/systemd/system").join(TARGET))
            .expect("remove the target");
    })
    .await;
    let degraded = env.wait_state("Degraded").await;
    let reason = &degraded[REASON];
    assert!(
        reason.contains(TARGET) && reason.contains("reinstall streamd"),
        "{reason}"
    );
    assert!(bootloader_runs(&env).await.is_empty());
    assert!(!finalize_called(&env).await);
    assert!(!env.reboot_initiated());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_secure_boot_the_bootloader_is_left_alone() {
    let env = approved_move("secureboot-off", "default", |_| {}).await;
    eventually("the reboot", &env, Env::reboot_initiated).await;
    assert!(bootloader_runs(&env).await.is_empty());
}
