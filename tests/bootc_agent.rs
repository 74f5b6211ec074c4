//! End-to-end: streamd on a host without rpm-ostreed, driving bootc through systemd.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_host_stages_only_after_approval_then_reboots_into_rhel10() {
    let mut env = Env::with_backend("bootc-agent", "default", testbed::Backend::Bootc).await;
    env.start_streamd();
    let idle = env.wait_state("Idle").await;
    let host = host_facts(&idle);
    assert_eq!(host["backend"], "bootc");
    env.request_rhel10();
    let waiting = env.wait_reboot_request().await;
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
    let units = env.systemd_units().await;
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
    let units = env.systemd_units().await;
    assert!(
        units.to_string().contains("switch"),
        "the switch ran in a unit once approved: {units}"
    );
    env.reboot_into_rhel10().await;
    assert!(env.event_reasons().iter().any(|r| r == "Applied"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_refuses_hosts_with_package_overrides() {
    for host in ["realtime", "layered"] {
        let mut env =
            Env::with_backend(&format!("bootc-{host}"), host, testbed::Backend::Bootc).await;
        env.start_streamd();
        env.wait_state("Idle").await;
        env.request_rhel10();
        env.request_rhel10_extensions();
        let refused = env.wait_state("Refused").await;
        assert!(
            refused[REASON].contains("package overrides"),
            "{host}: {}",
            refused[REASON]
        );
        assert!(!refused.contains_key(REBOOT_REQUESTED), "{host}");
    }
}
