//! The bootc backend (`streamd::backend::bootc`) against the testbed on a bootc host: bootc runs in
//! transient units of the fake systemd, the fake bootc stages on the real ostree sysroot, and
//! reboots go through the fake logind.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{bus_connection, scratch_dir, start_testbed};
use serde_json::json;
use streamd::backend::Deployment;
use streamd::backend::KernelVariant;
use streamd::backend::bootc::{BootcError, Client, parse_status, refusal, rpm_ostreed_available};
use testbed::control::{
    BootcCmd, InhibitMode, Inhibitor, LogindCmd, Request, SystemdCmd, TestbedCmd,
};
use testbed::scratch::ScratchDir;
use testbed::{Backend, Testbed};

/// A bootc testbed on `host`, a bus connection and a client; the directory goes last.
struct Env {
    tb: Testbed,
    client: Client,
    conn: zbus::Connection,
    dir: ScratchDir,
}

impl Env {
    async fn new(name: &str, host: &str) -> Env {
        let dir = scratch_dir("bootc", name);
        let tb = start_testbed(&dir, host, Backend::Bootc).await;
        let conn = bus_connection(&tb).await;
        let client = Client::new(
            conn.clone(),
            &tb.env()["TESTBED_BOOTC"],
            dir.join("run"),
            &dir.join("host"),
        );
        Env {
            tb,
            client,
            conn,
            dir,
        }
    }

    async fn ctl(&self, cmd: impl Into<Request>) -> serde_json::Value {
        self.tb.control(cmd).await.expect("control command")
    }

    /// A policy.json whose default is not insecureAcceptAnything (the testbed's repository
    /// accepted), so ostree-ext takes a switch with `--enforce-container-sigpolicy`.
    fn policy_for_signed_switches(&self) {
        let pullspec = &self.tb.images()[0].pullspec;
        let repo = pullspec.split('@').next().unwrap_or_default();
        std::fs::write(
            self.dir.join("host/etc/containers/policy.json"),
            json!({"default": [{"type": "reject"}],
                "transports": {"docker": {repo: [{"type": "insecureAcceptAnything"}]}}})
            .to_string(),
        )
        .expect("policy");
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

// one scenario, step by step, as bootc and systemd see it
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn switch_stages_and_reboot_is_recorded() {
    let env = Env::new("happy", "default").await;
    assert!(
        !rpm_ostreed_available(&env.conn).await.expect("detect"),
        "a bootc host has no rpm-ostreed"
    );
    let rhel9 = &env.tb.images()[0];
    let rhel10 = &env.tb.images()[1];

    let t = Instant::now();
    let before = env.client.deployments().await.expect("status");
    println!(
        "bootc status through a transient unit: {} ms",
        ms(t.elapsed())
    );
    assert_eq!(before.len(), 1);
    let booted = &before[0];
    assert!(booted.booted && !booted.staged && !booted.incompatible);
    assert_eq!(booted.pullspec(), Some(rhel9.pullspec.as_str()));
    assert_eq!(
        booted.container_image_reference.as_deref(),
        Some(format!("ostree-unverified-registry:{}", rhel9.pullspec).as_str())
    );
    assert!(booted.carries_digest(&rhel9.digest));
    assert_eq!(booted.id, format!("rhcos-{}.0", booted.checksum));
    assert_eq!(refusal(KernelVariant::Default, booted), None);
    // The status file was only a channel.
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.join("run"))
        .expect("run dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("bootc-status"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let t = Instant::now();
    env.client
        .switch(&rhel10.pullspec, false)
        .await
        .expect("switch");
    println!(
        "bootc switch through a transient unit: {} ms",
        ms(t.elapsed())
    );
    let after = env.client.deployments().await.expect("status after switch");
    assert_eq!(after.len(), 2, "{after:#?}");
    let staged = &after[0];
    assert!(staged.staged && !staged.booted);
    assert!(
        !staged.finalization_locked,
        "bootc has no finalization lock"
    );
    assert!(staged.carries_digest(&rhel10.digest));
    // bootc reports what ostree-ext stored: the platform manifest's digest of the pinned index.
    let platform = env.tb.registry().os_images()[1].platforms[0].digest.clone();
    assert_ne!(platform, rhel10.digest);
    assert_eq!(
        staged.container_image_reference_digest.as_deref(),
        Some(platform.as_str())
    );
    assert_eq!(staged.pullspec(), Some(rhel10.pullspec.as_str()));
    assert_ne!(staged.checksum, after[1].checksum);
    assert!(after[1].booted);

    // The unit ran the configured bootc with the documented arguments, in a oneshot unit.
    let units = env.ctl(SystemdCmd::Units).await;
    let switch = units
        .as_array()
        .expect("units")
        .iter()
        .find(|u| u["spec"]["exec_start"][0][1][1] == "switch")
        .expect("a switch unit");
    assert_eq!(switch["spec"]["service_type"], "oneshot");
    assert_eq!(
        switch["spec"]["exec_start"][0][1],
        json!([
            env.tb.env()["TESTBED_BOOTC"],
            "switch",
            "--transport",
            "registry",
            rhel10.pullspec
        ])
    );
    assert_eq!(switch["job_result"], "done");
    assert!(
        switch["journal"]
            .as_str()
            .is_some_and(|j| j.contains(&format!("Digest: {platform}"))),
        "{switch}"
    );
    // Collected after the result was read: nothing stays loaded.
    assert_eq!(env.ctl(SystemdCmd::Loaded).await, json!([]));

    // An inhibitor blocks the reboot with who and why; releasing it lets the reboot through.
    env.ctl(LogindCmd::Inhibit(Inhibitor {
        what: "sleep:shutdown".into(),
        who: "etcd-backup".into(),
        why: "backup running".into(),
        mode: InhibitMode::Block,
        uid: 0,
        pid: 0,
    }))
    .await;
    match env.client.reboot().await {
        Err(BootcError::Inhibited { who, why }) => {
            assert_eq!(
                (who.as_str(), why.as_str()),
                ("etcd-backup", "backup running")
            );
        }
        other => panic!("expected Inhibited, got {other:?}"),
    }
    assert_eq!(env.ctl(LogindCmd::Reboots).await, 0);
    env.ctl(LogindCmd::Release {
        who: "etcd-backup".into(),
    })
    .await;
    // A delay inhibitor does not block.
    env.ctl(LogindCmd::Inhibit(Inhibitor {
        what: "shutdown".into(),
        who: "kubelet".into(),
        why: "drain".into(),
        mode: InhibitMode::Delay,
        uid: 0,
        pid: 0,
    }))
    .await;
    env.client.reboot().await.expect("reboot");
    assert_eq!(env.ctl(LogindCmd::Reboots).await, 1);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.dir.join("rpmostreed/state.json")).expect("state.json"),
    )
    .expect("json");
    assert_eq!(state["reboot_requested"], true);
}

#[tokio::test]
async fn failing_units_name_the_unit() {
    let env = Env::new("fail", "default").await;
    let missing = format!(
        "{}/openshift/rhcos@sha256:{}",
        env.tb.registry().host(),
        "0".repeat(64)
    );
    match env.client.switch(&missing, false).await {
        Err(e @ BootcError::UnitFailed { .. }) => {
            let BootcError::UnitFailed {
                unit,
                result,
                status,
                stderr,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(unit, streamd::backend::bootc::WRITE_UNIT);
            assert_eq!((result.as_str(), *status), ("exit-code", 1));
            // bootc's own error chain, read from the unit's stderr file.
            assert!(
                stderr.starts_with("error: Switching: Pulling: ")
                    && stderr.contains("manifest unknown"),
                "{stderr}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("): {stderr}; see `journalctl -u {unit}`")),
                "{e}"
            );
            assert!(!e.is_transient());
            assert!(
                !e.is_network_failure(),
                "a missing manifest is not the network"
            );
        }
        other => panic!("expected UnitFailed, got {other:?}"),
    }
    let units = env.ctl(SystemdCmd::Units).await;
    assert!(
        units[0]["spec"]["stderr"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/bootc-deploy.stderr")),
        "{units}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.join("run"))
        .expect("run dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".stderr"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the stderr file was only a channel: {leftovers:?}"
    );

    // A pull that broke on the network reads as one, in bootc's words.
    env.ctl(BootcCmd::FailNextSwitch { message: "Creating importer: failed to invoke method OpenImage: pinging container registry quay.io: Get \"https://quay.io/v2/\": dial tcp: lookup quay.io: no such host".into() })
        .await;
    let rhel10 = &env.tb.images()[1];
    match env.client.switch(&rhel10.pullspec, false).await {
        Err(e @ BootcError::UnitFailed { .. }) => {
            assert!(e.is_network_failure(), "{e}");
            assert!(
                e.to_string().contains("lookup quay.io: no such host"),
                "{e}"
            );
        }
        other => panic!("expected UnitFailed, got {other:?}"),
    }
    // Nothing was staged.
    assert_eq!(env.client.deployments().await.expect("status").len(), 1);

    // A bootc that does not exist: systemd's exec failure (203/EXEC), and no output to parse.
    let absent = Client::new(
        env.conn.clone(),
        env.dir.join("no-such-bootc"),
        env.dir.join("run"),
        &env.dir.join("host"),
    );
    match absent.deployments().await {
        Err(BootcError::UnitFailed { result, status, .. }) => {
            assert_eq!((result.as_str(), status), ("exit-code", 203));
        }
        other => panic!("expected UnitFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn layered_host_is_incompatible_and_refused() {
    let env = Env::new("layered", "layered").await;
    let deps = env.client.deployments().await.expect("status");
    let booted = deps.iter().find(|d| d.booted).expect("booted");
    assert!(booted.incompatible, "{booted:#?}");
    assert_eq!(
        booted.container_image_reference, None,
        "bootc hides the image"
    );
    let reason = refusal(KernelVariant::Default, booted).expect("refused");
    assert!(
        reason.contains("bootc cannot carry package overrides"),
        "{reason}"
    );
    assert!(reason.contains("variant image"), "{reason}");
}

fn host_json(booted: serde_json::Value) -> String {
    json!({
        "apiVersion": "org.containers.bootc/v1", "kind": "BootcHost",
        "metadata": {"name": "host"},
        "spec": {"image": null, "bootOrder": "default"},
        "status": {"staged": null, "booted": booted, "rollback": null, "rollbackQueued": false,
                   "type": null, "usrOverlay": null, "readOnly": false}
    })
    .to_string()
}

fn entry() -> serde_json::Value {
    json!({
        "image": {"image": {"image": "q.io/x/os@sha256:aa", "transport": "registry",
                            "signature": "containerPolicy"},
                  "version": "10.1", "timestamp": null, "architecture": "amd64",
                  "imageDigest": "sha256:bb"},
        "cachedUpdate": null, "incompatible": false, "pinned": true, "softRebootCapable": false,
        "downloadOnly": false, "store": "ostreeContainer",
        "ostree": {"stateroot": "rhcos", "checksum": "c0ffee", "deploySerial": 2},
        "composefs": null
    })
}

#[test]
fn status_documents_parse_and_malformed_ones_are_errors() {
    let deps = parse_status(&host_json(entry())).expect("parse");
    assert_eq!(deps.len(), 1);
    let d = &deps[0];
    assert_eq!(d.id, "rhcos-c0ffee.2");
    assert!(d.booted && d.pinned && !d.staged);
    assert_eq!(
        d.container_image_reference.as_deref(),
        Some("ostree-image-signed:docker://q.io/x/os@sha256:aa")
    );
    assert_eq!(d.pullspec(), Some("q.io/x/os@sha256:aa"));
    assert_eq!(d.image_digest(), Some("sha256:bb"));
    assert_eq!(d.version.as_deref(), Some("10.1"));

    let mut remote = entry();
    remote["image"]["image"]["signature"] = json!({"ostreeRemote": "rhel"});
    let d = &parse_status(&host_json(remote)).expect("remote")[0];
    assert_eq!(
        d.container_image_reference.as_deref(),
        Some("ostree-remote-registry:rhel:q.io/x/os@sha256:aa")
    );

    // bootc before v1.3.0 (and v1alpha1 before v0.1.15): no stateroot; known by checksum.serial.
    let mut old = entry();
    old["ostree"]
        .as_object_mut()
        .expect("object")
        .remove("stateroot");
    let d =
        &parse_status(&host_json(old).replace("bootc/v1", "bootc/v1alpha1")).expect("old shape")[0];
    assert_eq!((d.id.as_str(), d.osname.as_str()), ("c0ffee.2", ""));

    let mut serial = entry();
    serial["ostree"]["deploySerial"] = json!(u64::from(u32::MAX));
    let mut composefs = entry();
    composefs["ostree"] = json!(null);
    let mut wrong_type = entry();
    wrong_type["incompatible"] = json!("no");
    let cases = [
        ("{not json".to_string(), "not a bootc host document"),
        (String::new(), "not a bootc host document"),
        (
            r#"{"apiVersion":"v1","kind":"Pod","status":{}}"#.to_string(),
            "expected BootcHost",
        ),
        (
            host_json(entry()).replace("BootcHost", "Pod"),
            "expected BootcHost",
        ),
        (host_json(json!(null)), "not booted through ostree"),
        (host_json(serial), "out of range"),
        (host_json(composefs), "composefs"),
        (host_json(wrong_type), "not a bootc host document"),
    ];
    for (text, want) in cases {
        match parse_status(&text) {
            Err(e @ BootcError::Status(_)) => {
                assert!(e.to_string().contains(want), "{text}: {e}");
            }
            other => panic!("{text}: expected a status error, got {other:?}"),
        }
    }
}

#[test]
fn refusal_table() {
    let plain = Deployment::default();
    let incompatible = Deployment {
        incompatible: true,
        ..Deployment::default()
    };
    let layered = Deployment {
        requested_packages: vec!["usbguard".into()],
        ..Deployment::default()
    };
    let overridden = Deployment {
        requested_base_removals: vec!["kernel".into()],
        ..Deployment::default()
    };
    let cases = [
        (KernelVariant::Default, &plain, None),
        (KernelVariant::Realtime, &plain, Some("realtime kernel")),
        (KernelVariant::SixtyFourK, &plain, Some("64k-pages kernel")),
        (
            KernelVariant::Default,
            &incompatible,
            Some("local rpm-ostree package changes"),
        ),
        (KernelVariant::Default, &layered, Some("(usbguard)")),
        (KernelVariant::Default, &overridden, Some("(kernel)")),
    ];
    for (kernel, dep, want) in cases {
        let got = refusal(kernel, dep);
        match (want, &got) {
            (None, None) => {}
            (Some(w), Some(reason)) => {
                assert!(reason.contains(w), "{reason}");
                assert!(
                    reason.contains("bootc cannot carry package overrides"),
                    "{reason}"
                );
                assert!(
                    reason.contains("the target must be a variant image"),
                    "{reason}"
                );
            }
            _ => panic!("{kernel:?} {dep:?}: got {got:?}, want {want:?}"),
        }
    }
}

/// `bootc status --json` as each bootc release printed it, from the fake at that version.
#[tokio::test]
async fn every_status_shape_since_json_output_parses() {
    let env = Env::new("shapes", "default").await;
    let rhel9 = &env.tb.images()[0];
    for (version, id_has_stateroot) in [
        ("0.1.12", false),
        ("0.1.13", false),
        ("1.1.0", false),
        ("1.2.0", false),
        ("1.3.0", true),
        ("1.11.0", true),
        ("1.12.0", true),
        ("1.16.9", true),
    ] {
        env.ctl(BootcCmd::Version {
            version: Some(version.to_string()),
        })
        .await;
        let deps = env
            .client
            .deployments()
            .await
            .unwrap_or_else(|e| panic!("bootc {version}: {e}"));
        let booted = &deps[0];
        assert!(booted.booted, "{version}");
        assert_eq!(
            booted.pullspec(),
            Some(rhel9.pullspec.as_str()),
            "{version}"
        );
        assert_eq!(
            booted.id,
            if id_has_stateroot {
                format!("rhcos-{}.0", booted.checksum)
            } else {
                format!("{}.0", booted.checksum)
            },
            "{version}"
        );
    }
    // The legacy flag is what streamd runs: it works on every release.
    let units = env.ctl(SystemdCmd::Units).await;
    assert!(
        units
            .as_array()
            .expect("units")
            .iter()
            .all(|u| u["spec"]["exec_start"][0][1][2] == "--json"),
        "{units}"
    );
}

#[tokio::test]
async fn signed_hosts_keep_enforcing_the_signature_policy() {
    use streamd::backend::{Backend, StagePlan};
    let env = Env::new("signed", "default").await;
    env.policy_for_signed_switches();
    let rhel9 = env.tb.images()[0].clone();
    let rhel10 = env.tb.images()[1].clone();
    // Boot the host from its image with signature enforcement, as a signed install is.
    env.client
        .switch(&rhel9.pullspec, true)
        .await
        .expect("signed switch");
    env.ctl(TestbedCmd::Reboot {
        fail_finalize: false,
    })
    .await;
    let deps = env.client.deployments().await.expect("status");
    let booted = deps.iter().find(|d| d.booted).expect("booted");
    assert_eq!(
        booted.container_image_reference.as_deref(),
        Some(format!("ostree-image-signed:docker://{}", rhel9.pullspec).as_str())
    );

    let backend = Backend::Bootc(env.client.clone());
    let target: streamd::image::reference::ImageRef = rhel10.pullspec.parse().expect("pinned");
    let plan = StagePlan::rebase("rhel-10", &target, false);
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    backend.stage(&plan, &tx, cancelled).await.expect("stage");
    let staged_ref = |deps: &[Deployment]| {
        deps.iter()
            .find(|d| d.staged)
            .and_then(|d| d.container_image_reference.clone())
    };
    let deps = env.client.deployments().await.expect("status");
    assert_eq!(
        staged_ref(&deps),
        Some(format!("ostree-image-signed:docker://{}", rhel10.pullspec)),
        "the target stays under the signature policy"
    );
    // Clearing the stale stage (bootc: staging the booted image again) keeps it too.
    backend
        .cleanup_pending(&rhel9.pullspec)
        .await
        .expect("cleanup");
    let deps = env.client.deployments().await.expect("status");
    assert_eq!(
        staged_ref(&deps),
        Some(format!("ostree-image-signed:docker://{}", rhel9.pullspec))
    );
    let units = env.ctl(SystemdCmd::Units).await;
    // Every `bootc switch` command line, also the held one's (after its lock step).
    let switches: Vec<&serde_json::Value> = units
        .as_array()
        .expect("units")
        .iter()
        .flat_map(|u| u["spec"]["exec_start"].as_array().into_iter().flatten())
        .map(|line| &line[1])
        .filter(|argv| argv[1] == "switch")
        .collect();
    assert_eq!(switches.len(), 3, "{units}");
    assert!(
        switches.iter().all(|argv| argv
            .as_array()
            .is_some_and(|a| a.iter().any(|w| w == "--enforce-container-sigpolicy"))),
        "{units}"
    );
}

/// The `bootc` units the fake systemd started whose command is `bootc <verb>`.
fn units_running(units: &serde_json::Value, verb: &str) -> Vec<serde_json::Value> {
    units
        .as_array()
        .expect("units")
        .iter()
        .filter(|u| u["spec"]["exec_start"][0][1][1] == verb)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_timed_out_switch_is_joined_never_started_twice() {
    let env = Env::new("timeout", "default").await;
    env.policy_for_signed_switches();
    let rhel10 = &env.tb.images()[1];
    // A pull slower than the caller's limit: the unit outlives the first call.
    env.ctl(BootcCmd::DelayNextSwitch { ms: 4000 }).await;
    let hasty = env
        .client
        .clone()
        .with_timeouts(Duration::from_secs(60), Duration::from_millis(800));
    let unit = match hasty.switch(&rhel10.pullspec, false).await {
        Err(e @ BootcError::Timeout { .. }) => {
            assert!(e.is_transient(), "{e}");
            let BootcError::Timeout { unit, .. } = e else {
                unreachable!()
            };
            unit
        }
        other => panic!("expected Timeout, got {other:?}"),
    };
    assert_eq!(
        env.ctl(SystemdCmd::Loaded).await,
        json!([unit]),
        "the unit is left running"
    );
    // The retry (the agent's, after its backoff) waits for that unit instead of starting
    // a second `bootc switch` beside it, and takes its result.
    let t = Instant::now();
    env.client
        .switch(&rhel10.pullspec, false)
        .await
        .expect("the retry joins the running switch");
    println!("retry joined the running unit for {} ms", ms(t.elapsed()));
    let units = env.ctl(SystemdCmd::Units).await;
    let switches = units_running(&units, "switch");
    assert_eq!(switches.len(), 1, "one bootc switch only: {units:#}");
    let staged = env.client.deployments().await.expect("status");
    assert!(staged[0].staged && staged[0].carries_digest(&rhel10.digest));
    assert_eq!(
        env.ctl(SystemdCmd::Loaded).await,
        json!([]),
        "collected once its result was read"
    );

    // Another command while one runs (the request changed meanwhile) waits for it to end,
    // then runs: never two beside each other.
    let rhel9 = &env.tb.images()[0];
    env.ctl(BootcCmd::DelayNextSwitch { ms: 3000 }).await;
    let slow = {
        let c = env.client.clone();
        let image = rhel10.pullspec.clone();
        // Staged already: "Image specification is unchanged" — only its unit matters here.
        tokio::spawn(async move { c.switch(&image, true).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = {
        let c = env.client.clone();
        let image = rhel9.pullspec.clone();
        tokio::spawn(async move { c.switch(&image, false).await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let loaded = env.ctl(SystemdCmd::Loaded).await;
    assert_eq!(
        loaded.as_array().map(Vec::len),
        Some(1),
        "the second waits: {loaded}"
    );
    slow.await.expect("join").expect("the first switch");
    second
        .await
        .expect("join")
        .expect("the second command runs after the first");
    let units = env.ctl(SystemdCmd::Units).await;
    let switches = units_running(&units, "switch");
    assert_eq!(switches.len(), 3, "{units:#}");
    assert!(
        switches.iter().all(|u| u["job_result"] == "done"),
        "{units:#}"
    );
}

/// Commands only bootc >= 1.12 has: `upgrade --download-only` holds the stage of the spec's
/// digest, `--from-downloaded` lets it go; an older bootc refuses the flags and is known not
/// to hold from its status.
#[tokio::test]
async fn a_stage_is_held_and_released_only_where_bootc_can() {
    let env = Env::new("hold", "default").await;
    let rhel10 = &env.tb.images()[1];
    env.client.deployments().await.expect("status");
    assert!(env.client.can_hold(), "bootc 1.16.9 prints downloadOnly");
    env.client
        .switch(&rhel10.pullspec, false)
        .await
        .expect("switch");
    let t = Instant::now();
    env.client.hold().await.expect("hold");
    // The stage is unlocked from the end of the switch until the hold's unit ends.
    println!(
        "upgrade --download-only through a unit: {} ms",
        ms(t.elapsed())
    );
    let held = env.client.deployments().await.expect("status");
    assert!(
        held[0].staged && held[0].finalization_locked,
        "downloadOnly: {held:#?}"
    );
    env.client.release().await.expect("release");
    let released = env.client.deployments().await.expect("status");
    assert!(released[0].staged && !released[0].finalization_locked);

    // bootc 1.11: no downloadOnly in the status, and clap refuses the flag.
    env.ctl(BootcCmd::Version {
        version: Some("1.11.0".into()),
    })
    .await;
    env.client.deployments().await.expect("status");
    assert!(!env.client.can_hold());
    match env.client.hold().await {
        Err(BootcError::UnitFailed { status, stderr, .. }) => {
            assert_eq!(status, 2);
            assert!(
                stderr.contains("unexpected argument '--download-only' found"),
                "{stderr}"
            );
        }
        other => panic!("expected UnitFailed, got {other:?}"),
    }
}

/// A switch whose hold fails (the pull of `upgrade --download-only` broke) does not leave the
/// target staged unlocked: the booted image is staged in its place and the error is bootc's.
#[tokio::test]
async fn a_stage_that_cannot_be_held_does_not_stay() {
    let env = Env::new("hold-fails", "default").await;
    let (rhel9, rhel10) = (&env.tb.images()[0], &env.tb.images()[1]);
    let backend = streamd::backend::Backend::Bootc(env.client.clone());
    env.client.deployments().await.expect("status");
    assert!(backend.locks());
    env.ctl(BootcCmd::FailNextUpgrade { message: "Creating importer: failed to invoke method OpenImage: pinging container registry: dial tcp: lookup quay.io: no such host".into() })
        .await;
    let image: streamd::image::reference::ImageRef = rhel10.pullspec.parse().expect("image");
    let plan = streamd::backend::StagePlan::rebase("rhel-10", &image, false);
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    let e = backend
        .stage(&plan, &tx, cancelled)
        .await
        .expect_err("the hold failed");
    assert!(e.is_network_failure(), "{e}");
    assert!(e.to_string().contains("error: Upgrading: Pulling:"), "{e}");
    let after = env.client.deployments().await.expect("status");
    let staged = after.iter().find(|d| d.staged);
    assert!(
        staged.is_none_or(|s| s.carries_digest(&rhel9.digest)),
        "no unheld rhel-10 stage: {after:#?}"
    );
}

/// The host's `/run/ostree` below the testbed's host root.
fn run_ostree(env: &Env) -> PathBuf {
    env.dir.join("host/run/ostree")
}

/// A shutdown between `bootc switch` staging and the hold does not apply the stage: the legacy
/// lock file is in place before the switch stages (ostree finalizes nothing while it exists).
#[tokio::test]
async fn a_reboot_between_the_switch_and_the_hold_does_not_apply_the_stage() {
    let env = Env::new("hold-window", "default").await;
    let (rhel9, rhel10) = (&env.tb.images()[0], &env.tb.images()[1]);
    let backend = streamd::backend::Backend::Bootc(env.client.clone());
    env.client.deployments().await.expect("status");
    assert!(backend.locks());
    // The switch stays running for 20 s once it staged: the window, stretched.
    env.ctl(BootcCmd::PauseAfterNextSwitch { ms: 20_000 }).await;
    let image: streamd::image::reference::ImageRef = rhel10.pullspec.parse().expect("image");
    let plan = streamd::backend::StagePlan::rebase("rhel-10", &image, false);
    let staging = tokio::spawn(async move {
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let (_cancel, cancelled) = tokio::sync::watch::channel(false);
        backend.stage(&plan, &tx, cancelled).await
    });
    let record = run_ostree(&env).join("staged-deployment");
    let t = Instant::now();
    while !record.exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "nothing was staged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The host goes down now, while the switch's unit still runs.
    let out = env
        .ctl(TestbedCmd::Reboot {
            fail_finalize: false,
        })
        .await;
    assert_eq!(out["applied"], json!(false), "{out}");
    assert_eq!(out["booted"], json!(rhel9.digest), "{out}");
    assert!(
        !run_ostree(&env).join("staged-deployment-locked").exists(),
        "/run is emptied by the reboot"
    );
    staging.abort();
}

/// A switch that fails leaves no lock behind: the legacy file would silently hold the next stage
/// anyone makes.
#[tokio::test]
async fn a_failed_held_switch_leaves_no_lock_file() {
    let env = Env::new("hold-switch-fails", "default").await;
    let rhel10 = &env.tb.images()[1];
    let backend = streamd::backend::Backend::Bootc(env.client.clone());
    env.client.deployments().await.expect("status");
    env.ctl(BootcCmd::FailNextSwitch { message: "Creating importer: failed to invoke method OpenImage: reading manifest: manifest unknown".into() })
        .await;
    let image: streamd::image::reference::ImageRef = rhel10.pullspec.parse().expect("image");
    let plan = streamd::backend::StagePlan::rebase("rhel-10", &image, false);
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    let e = backend
        .stage(&plan, &tx, cancelled)
        .await
        .expect_err("the switch failed");
    assert!(e.to_string().contains("manifest unknown"), "{e}");
    assert!(
        !run_ostree(&env).join("staged-deployment-locked").exists(),
        "no lock file is left behind"
    );
    let after = env.client.deployments().await.expect("status");
    assert!(after.iter().all(|d| !d.staged), "{after:#?}");
}

/// The target already staged but not held (an earlier run was cut short before its hold): only
/// the hold runs; another image staged is refused, not staged over.
#[tokio::test]
async fn an_unheld_stage_of_the_target_is_held_and_another_stage_is_not_replaced() {
    let env = Env::new("hold-existing", "default").await;
    let (rhel9, rhel10) = (&env.tb.images()[0], &env.tb.images()[1]);
    let backend = streamd::backend::Backend::Bootc(env.client.clone());
    env.client
        .switch(&rhel10.pullspec, false)
        .await
        .expect("switch");
    let stage = |pullspec: &str| {
        let image: streamd::image::reference::ImageRef = pullspec.parse().expect("image");
        streamd::backend::StagePlan::rebase("rhel-10", &image, false)
    };
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (_cancel, cancelled) = tokio::sync::watch::channel(false);
    backend
        .stage(&stage(&rhel10.pullspec), &tx, cancelled.clone())
        .await
        .expect("held");
    let deps = env.client.deployments().await.expect("status");
    assert!(
        deps[0].staged && deps[0].finalization_locked && deps[0].carries_digest(&rhel10.digest),
        "{deps:#?}"
    );
    let units = env.ctl(SystemdCmd::Units).await;
    let switches = units
        .as_array()
        .expect("units")
        .iter()
        .flat_map(|u| u["spec"]["exec_start"].as_array().into_iter().flatten())
        .filter(|line| line[1][1] == "switch")
        .count();
    assert_eq!(switches, 1, "no second switch: {units}");

    // The booted image staged in its place (what a cleanup leaves): not staged over.
    env.client
        .switch(&rhel9.pullspec, false)
        .await
        .expect("switch back");
    let e = backend
        .stage(&stage(&rhel10.pullspec), &tx, cancelled)
        .await
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains(&format!("{} is staged already", rhel9.pullspec)),
        "{e}"
    );
    // The unit checks again itself (another tool may stage between the status and the unit).
    match env.client.switch_held(&rhel10.pullspec, false).await {
        Err(BootcError::UnitFailed { stderr, .. }) => {
            assert!(
                stderr.contains("a deployment is staged already"),
                "{stderr}"
            );
        }
        other => panic!("expected UnitFailed, got {other:?}"),
    }
    let deps = env.client.deployments().await.expect("status");
    assert!(
        deps[0].staged && deps[0].carries_digest(&rhel9.digest),
        "{deps:#?}"
    );
    assert!(!run_ostree(&env).join("staged-deployment-locked").exists());
}

/// bootc prints no image labels: the client reads them from the booted and staged
/// deployments' commits (`ostree.container.image-config`, as ostree-ext stored it) through the
/// real libostree in the `streamd-verify` helper; a read that fails leaves them unknown
/// (`image_labels_error`) and the status usable.
#[tokio::test]
async fn image_labels_are_read_from_the_deployment_commits() {
    let env = Env::new("labels", "layered-image").await;
    let (rhel9, rhel10) = (env.tb.images()[0].clone(), env.tb.images()[1].clone());
    let client = env
        .client
        .clone()
        .with_helper(env!("CARGO_BIN_EXE_streamd-verify"));
    let t = Instant::now();
    let before = client.deployments().await.expect("status");
    let first = t.elapsed();
    let t = Instant::now();
    assert_eq!(client.deployments().await.expect("status again"), before);
    println!(
        "bootc status with the labels read by the helper: {} ms; with them cached: {} ms",
        ms(first),
        ms(t.elapsed())
    );
    let booted = before.iter().find(|d| d.booted).expect("booted");
    assert_eq!(booted.image_labels_error, None);
    assert_eq!(
        booted.image_labels.get("baseOSContainerImage"),
        Some(&rhel9.pullspec),
        "the layered image's own label: {booted:#?}"
    );
    assert_eq!(
        booted
            .image_labels
            .get("io.openshift.os.streamclass")
            .map(String::as_str),
        Some("rhel-9")
    );
    client
        .switch(&rhel10.pullspec, false)
        .await
        .expect("switch");
    let after = client.deployments().await.expect("status after switch");
    let staged = after.iter().find(|d| d.staged).expect("staged");
    assert_eq!(
        staged
            .image_labels
            .get("io.openshift.os.streamclass")
            .map(String::as_str),
        Some("rhel-10"),
        "{staged:#?}"
    );
    assert!(!staged.image_labels.contains_key("baseOSContainerImage"));

    // A helper that cannot run: the labels are unknown, not empty, and the status still works.
    let missing = env.dir.join("no-such-helper");
    let broken = Client::new(
        env.conn.clone(),
        &env.tb.env()["TESTBED_BOOTC"],
        env.dir.join("run"),
        &env.dir.join("host"),
    )
    .with_helper(&missing);
    let deps = broken.deployments().await.expect("status without labels");
    for d in deps.iter().filter(|d| d.booted || d.staged) {
        assert!(d.image_labels.is_empty(), "{d:#?}");
        let why = d.image_labels_error.as_deref().expect("unknown labels");
        assert!(why.contains("no-such-helper"), "{why}");
    }
}

/// The helper answers only what it understands: other arguments or an unreadable request end
/// with exit status 2 and the reason on stderr, never an answer.
#[test]
fn the_label_helper_refuses_bad_requests() {
    use std::io::Write as _;
    let helper = env!("CARGO_BIN_EXE_streamd-verify");
    let cases: [(&[&str], &str, &str); 3] = [
        (&["bogus"], "{}", "unknown arguments"),
        (&["image-configs"], "{", "not an image-configs request"),
        (
            &["image-configs"],
            r#"{"repo":"/r"}"#,
            "missing field `commits`",
        ),
    ];
    for (args, input, want) in cases {
        let mut child = std::process::Command::new(helper)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the helper");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write the request");
        let out = child.wait_with_output().expect("helper output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: no answer");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
