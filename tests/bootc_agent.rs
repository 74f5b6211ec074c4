//! End-to-end: streamd on a host without rpm-ostreed, driving bootc through systemd.

mod common;

use std::time::Duration;

use common::*;
use testbed::control::BootcCmd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_host_stages_only_after_approval_then_reboots_into_rhel10() {
    let mut env = Env::with_backend("bootc-agent", "default", testbed::Backend::Bootc).await;
    // Before v1.12.0 bootc cannot hold a stage (no `upgrade --download-only`).
    bootc(
        &env,
        BootcCmd::Version {
            version: Some("1.11.0".into()),
        },
    )
    .await;
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

/// Approves the reboot request and waits until logind is asked to reboot.
async fn approve_and_reboot(env: &Env) {
    env.approve_reboot().await;
    rebooting(env).await;
}

/// Waits for `Rebooting` and logind's reboot.
async fn rebooting(env: &Env) {
    env.wait_state("Rebooting").await;
    env.wait_for("logind reboots", Duration::from_secs(60), |_| {
        env.reboot_initiated()
    })
    .await;
}

/// A control command to the fake bootc.
async fn bootc(env: &Env, cmd: BootcCmd) -> serde_json::Value {
    env.tb.control(cmd).await.expect("bootc control")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootc_from_before_format_and_stateroot_is_driven_all_the_way() {
    let mut env = Env::with_backend("bootc-old", "default", testbed::Backend::Bootc).await;
    // bootc v0.1.12: only `--json`, `org.containers.bootc/v1alpha1`, no `ostree.stateroot`.
    bootc(
        &env,
        BootcCmd::Version {
            version: Some("0.1.12".into()),
        },
    )
    .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_reboot_request().await;
    approve_and_reboot(&env).await;
    env.reboot_into_rhel10().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootc_switch_broken_by_the_network_is_retried_with_bootcs_words() {
    network_failure_is_retried("bootc-netfail", "1.11.0", "error: Switching").await;
}

/// bootc before v1.4.0 (RHEL 9.5's 1.1.2, RHEL 10.0's 1.1.6) printed its error chain through
/// tracing, `ERROR` in red and no `error:` prefix: the reason keeps bootc's words without the
/// colour codes, and the failure still reads as a network one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_bootcs_network_failure_is_read_without_its_colour_codes() {
    network_failure_is_retried("bootc-netfail-old", "1.1.6", "ERROR Switching").await;
}

/// A bootc `version` that cannot hold a stage fails its switch on the network once: streamd
/// retries with bootc's words (`printed`: how that version starts the chain), then the approved
/// reboot goes ahead.
async fn network_failure_is_retried(name: &str, version: &str, printed: &str) {
    let mut env = Env::with_backend(name, "default", testbed::Backend::Bootc).await;
    // A bootc that cannot hold a stage: the switch runs after the approval.
    bootc(
        &env,
        BootcCmd::Version {
            version: Some(version.into()),
        },
    )
    .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    bootc(
        &env,
        BootcCmd::FailNextSwitch { message: "Creating importer: failed to invoke method OpenImage: pinging container registry quay.io: Get \"https://quay.io/v2/\": dial tcp: lookup quay.io: no such host".into() },
    )
    .await;
    env.request_rhel10();
    env.wait_reboot_request().await;
    env.approve_reboot().await;
    let degraded = env
        .wait_for("a network retry", Duration::from_secs(60), |a| {
            a.get(REASON).is_some_and(|r| r.contains("retry 1 of 3"))
        })
        .await;
    assert_eq!(degraded[STATE], "Degraded");
    assert!(
        degraded[REASON].starts_with("staging failed on the network (retry 1 of 3): bootc failed in unit streamd-bootc-deploy.service")
            && degraded[REASON].contains(&format!("{printed}: Pulling: Creating importer"))
            && !degraded[REASON].contains("[31m")
            && degraded[REASON].contains("lookup quay.io: no such host"),
        "{}",
        degraded[REASON]
    );
    // The retry pulls again and the approved reboot goes ahead.
    rebooting(&env).await;
    env.reboot_into_rhel10().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_booted_from_a_signed_image_switches_under_the_signature_policy() {
    let mut env = Env::with_backend("bootc-signed", "default", testbed::Backend::Bootc).await;
    // A policy ostree-ext takes for the verifying origin: its default is not
    // insecureAcceptAnything (with that default the switch below, and streamd's, are refused).
    let repo = env
        .rhel10()
        .split('@')
        .next()
        .unwrap_or_default()
        .to_string();
    std::fs::write(
        env.dir.join("host/etc/containers/policy.json"),
        serde_json::json!({"default": [{"type": "reject"}],
            "transports": {"docker": {repo: [{"type": "insecureAcceptAnything"}]}}})
        .to_string(),
    )
    .expect("policy");
    // Install-time state of a signed host: its image deployed with the policy enforced.
    let out = std::process::Command::new(&env.vars()["TESTBED_BOOTC"])
        .args(["switch", "--enforce-container-sigpolicy", &env.rhel9()])
        .output()
        .expect("fake bootc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rebooted = env.reboot(false).await;
    assert_eq!(rebooted["applied"], serde_json::json!(true), "{rebooted}");
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_reboot_request().await;
    approve_and_reboot(&env).await;
    let switch = bootc_lines(&env)
        .await
        .into_iter()
        .find(|argv| argv[1] == "switch")
        .expect("a switch unit");
    assert_eq!(
        switch,
        serde_json::json!([
            env.vars()["TESTBED_BOOTC"],
            "switch",
            "--transport",
            "registry",
            "--enforce-container-sigpolicy",
            env.rhel10()
        ])
    );
}

/// The argv of every `bootc` command line the units ran, in order (a held switch's unit has
/// three: its lock step, the switch and the hold).
async fn bootc_lines(env: &Env) -> Vec<serde_json::Value> {
    let units = env.systemd_units().await;
    bootc_argvs(&units, &serde_json::json!(env.vars()["TESTBED_BOOTC"]))
}

/// The bootc commands that ran in units, without `bootc status`: the words after the program.
async fn bootc_commands(env: &Env) -> Vec<Vec<String>> {
    bootc_lines(env)
        .await
        .iter()
        .filter_map(|argv| {
            let words: Vec<String> = argv
                .as_array()?
                .iter()
                .skip(1)
                .filter_map(|w| w.as_str().map(String::from))
                .collect();
            (words.first().map(String::as_str) != Some("status")).then_some(words)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootc_that_can_lock_stages_before_the_approval_and_holds_it() {
    let mut env = Env::with_backend("bootc-lock", "default", testbed::Backend::Bootc).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let waiting = env.wait_reboot_request().await;
    let rhel10 = env.rhel10();
    assert_eq!(
        waiting.get(STAGED_OS_IMAGE),
        Some(&rhel10),
        "bootc >= 1.12 stages before the approval: {waiting:?}"
    );
    let held = [
        vec!["switch", "--transport", "registry", rhel10.as_str()],
        vec!["upgrade", "--download-only"],
    ];
    assert_eq!(bootc_commands(&env).await, held);
    // Held: an unplanned reboot does not apply it.
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], serde_json::json!(false), "{out}");
    // Staged and held again in the new boot (a new token); the approval unlocks it, then
    // logind reboots.
    env.start_streamd();
    let first = waiting[REBOOT_REQUESTED].clone();
    let again = env
        .wait_for("a new reboot request", Duration::from_secs(90), |a| {
            a.get(STATE).map(String::as_str) == Some("Staged")
                && a.get(REBOOT_REQUESTED).is_some_and(|t| *t != first)
        })
        .await;
    env.annotate(&[&format!("{REBOOT_APPROVED}={}", again[REBOOT_REQUESTED])]);
    rebooting(&env).await;
    let commands = bootc_commands(&env).await;
    assert_eq!(
        commands.last().map(Vec::as_slice),
        Some(["upgrade".to_string(), "--from-downloaded".to_string()].as_slice()),
        "{commands:?}"
    );
    assert_eq!(commands.len(), 5, "{commands:?}");
    env.reboot_into_rhel10().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_while_streamd_stages_early_leaves_the_node_on_its_os() {
    let mut env = Env::with_backend("bootc-window", "default", testbed::Backend::Bootc).await;
    // The switch stays running for 3 s once it staged: the window before the hold, stretched.
    bootc(&env, BootcCmd::PauseAfterNextSwitch { ms: 3000 }).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let record = env.dir.join("host/run/ostree/staged-deployment");
    env.wait_for("the switch staged", Duration::from_secs(60), |_| {
        record.exists()
    })
    .await;
    // The host goes down now (streamd is stopped as a shutdown stops it).
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], serde_json::json!(false), "{out}");
    assert_eq!(out["booted"], serde_json::json!(env.tb.images()[0].digest));
    // The testbed's reboot does not end the units that ran: let the cut-short one end.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Back on its OS, streamd stages and holds again, and waits for the approval.
    env.start_streamd();
    let waiting = env.wait_reboot_request().await;
    assert_eq!(waiting.get(STAGED_OS_IMAGE), Some(&env.rhel10()));
    approve_and_reboot(&env).await;
    env.reboot_into_rhel10().await;
}

/// The request changes while streamd holds a stage of the earlier image (the stream's image
/// was refreshed): bootc cannot hold a new stage over the held one, so the held stage gives way
/// to the booted image and the new image is staged only once the reboot is approved. No stage
/// of an image other than the booted one is ever unlocked before the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_request_over_a_held_stage_is_staged_after_the_approval() {
    let mut env = Env::with_backend("bootc-retarget", "default", testbed::Backend::Bootc).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let held = env.wait_reboot_request().await;
    let (rhel9, rhel10) = (env.rhel9(), env.rhel10());
    assert_eq!(held.get(STAGED_OS_IMAGE), Some(&rhel10), "{held:?}");

    let update = env.tb.registry().update_image().pullspec.clone();
    env.request("rhel-10", &update, None);
    let first = held[REBOOT_REQUESTED].clone();
    let waiting = env
        .wait_for(
            "the approval asked for the refreshed image",
            Duration::from_secs(120),
            |a| {
                a.get(STATE).map(String::as_str) == Some("Staged")
                    && a.get(REBOOT_REQUESTED).is_some_and(|t| *t != first)
            },
        )
        .await;
    assert!(
        waiting[REASON].contains("cannot hold a stage over the one in place")
            && waiting[REASON].contains("only after the reboot is approved"),
        "{waiting:?}"
    );
    // What the next boot would apply is what runs now.
    assert_eq!(waiting.get(STAGED_OS_IMAGE), Some(&rhel9), "{waiting:?}");
    let before = [
        vec!["switch", "--transport", "registry", rhel10.as_str()],
        vec!["upgrade", "--download-only"],
        vec!["switch", "--transport", "registry", rhel9.as_str()],
    ];
    assert_eq!(bootc_commands(&env).await, before);

    approve_and_reboot(&env).await;
    let commands = bootc_commands(&env).await;
    assert_eq!(
        commands[before.len()..],
        [vec!["switch", "--transport", "registry", update.as_str()]],
        "staged unheld once approved, then rebooted: {commands:?}"
    );
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], serde_json::json!(true), "{out}");
    env.start_streamd();
    let done = env.wait_state("Done").await;
    assert_eq!(done[CURRENT_OS_IMAGE], update);
    assert_eq!(done[CURRENT_STREAM], "rhel-10");
}

/// A hold that fails on the network leaves the booted image staged in place of the unheld
/// stage; the retry then stages only after the approval (it cannot hold over that stage) and
/// the node moves on, rather than staying refused until a reboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hold_is_retried_after_the_approval() {
    let mut env = Env::with_backend("bootc-holdfail", "default", testbed::Backend::Bootc).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    bootc(
        &env,
        BootcCmd::FailNextUpgrade { message: "Creating importer: failed to invoke method OpenImage: pinging container registry: dial tcp: lookup quay.io: no such host".into() },
    )
    .await;
    env.request_rhel10();
    let (rhel9, rhel10) = (env.rhel9(), env.rhel10());
    let waiting = env
        .wait_for(
            "the approval asked after the failed hold",
            Duration::from_secs(120),
            |a| {
                a.get(STATE).map(String::as_str) == Some("Staged")
                    && a.contains_key(REBOOT_REQUESTED)
            },
        )
        .await;
    assert!(
        waiting[REASON].contains("only after the reboot is approved"),
        "{waiting:?}"
    );
    assert_eq!(waiting.get(STAGED_OS_IMAGE), Some(&rhel9), "{waiting:?}");
    approve_and_reboot(&env).await;
    let commands = bootc_commands(&env).await;
    assert_eq!(
        commands.last().map(Vec::as_slice),
        Some(
            ["switch", "--transport", "registry", rhel10.as_str()]
                .map(String::from)
                .as_slice()
        ),
        "{commands:?}"
    );
    env.reboot_into_rhel10().await;
}
