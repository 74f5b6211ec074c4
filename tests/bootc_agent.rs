//! End-to-end: streamd on a host without rpm-ostreed, driving bootc through systemd.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_host_stages_only_after_approval_then_reboots_into_rhel10() {
    let mut env = Env::with_backend("bootc-agent", "default", testbed::Backend::Bootc).await;
    env.start_streamd();
    let idle = env.wait_state("Idle").await;
    let host: serde_json::Value = serde_json::from_str(&idle[HOST]).expect("host JSON");
    assert_eq!(host["backend"], "bootc");
    env.request_rhel10();
    let waiting = env
        .wait_for(
            "a reboot request before staging",
            Duration::from_secs(90),
            |a| {
                a.get(STATE).map(String::as_str) == Some("Staged")
                    && a.contains_key(REBOOT_REQUESTED)
            },
        )
        .await;
    assert!(
        !waiting.contains_key(STAGED_OS_IMAGE),
        "nothing is staged before the approval: {waiting:?}"
    );
    assert!(
        waiting[REASON].contains("only after the reboot is approved"),
        "{waiting:?}"
    );
    // streamctl plan shows what this backend will run.
    let out = env.streamctl(&["plan"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "bootc switch --transport registry {}",
            env.rhel10()
        )),
        "{text}"
    );
    let units = env
        .tb
        .control(&json!({"target": "systemd", "cmd": "units"}))
        .await
        .expect("units");
    assert!(
        !units.to_string().contains("switch"),
        "no bootc switch before approval: {units}"
    );

    env.approve_reboot().await;
    env.wait_state("Rebooting").await;
    env.wait_for("logind reboots", Duration::from_secs(60), |_| {
        env.reboot_initiated()
    })
    .await;
    let units = env
        .tb
        .control(&json!({"target": "systemd", "cmd": "units"}))
        .await
        .expect("units");
    assert!(
        units.to_string().contains("switch"),
        "the switch ran in a unit once approved: {units}"
    );
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], json!(true), "{out}");
    env.start_streamd();
    let done = env.wait_state("Done").await;
    assert_eq!(done[CURRENT_OS_IMAGE], env.rhel10());
    assert_eq!(done[CURRENT_STREAM], "rhel-10");
    assert!(env.event_reasons().iter().any(|r| r == "Applied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_refuses_hosts_with_package_overrides() {
    for host in ["realtime", "layered"] {
        let mut env =
            Env::with_backend(&format!("bootc-{host}"), host, testbed::Backend::Bootc).await;
        env.start_streamd();
        env.wait_state("Idle").await;
        let ext = env.vars()["TESTBED_RHEL10_EXTENSIONS_IMAGE"].clone();
        env.request_rhel10();
        env.annotate(&[&format!("{DESIRED_EXTENSIONS_IMAGE}={ext}")]);
        let refused = env.wait_state("Refused").await;
        assert!(
            refused[REASON].contains("package overrides"),
            "{host}: {}",
            refused[REASON]
        );
        assert!(!refused.contains_key(REBOOT_REQUESTED), "{host}");
    }
}
