//! End-to-end: the machine-config daemon manages the node, so streamd runs in readiness mode
//! (never stages or reboots, reports per stream whether a move would pass preflight); the
//! `check-*` keys in manage mode; `mode` in the config (docs/protocol.md "Modes").

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use testbed::control::RpmOstreedCmd;

const MODE: &str = "osstream.openshift.io/mode";
const READINESS: &str = "osstream.openshift.io/readiness";
const CHECK_STREAM: &str = "osstream.openshift.io/check-stream";
const CHECK_OS_IMAGE: &str = "osstream.openshift.io/check-os-image";
/// The annotation the machine-config daemon sets once it applied a MachineConfig.
const MCD_CURRENT_CONFIG: &str = "machineconfiguration.openshift.io/currentConfig";

/// The `readiness` annotation, parsed.
fn readiness(a: &BTreeMap<String, String>) -> Value {
    serde_json::from_str(&a[READINESS]).expect("readiness is JSON")
}

/// Waits until the `readiness` annotation has an entry for `stream`; returns the annotations.
async fn wait_readiness(env: &Env, stream: &str) -> BTreeMap<String, String> {
    env.wait_for(
        &format!("readiness of {stream}"),
        Duration::from_secs(90),
        |a| {
            a.get(READINESS)
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .is_some_and(|r| r.get(stream).is_some())
        },
    )
    .await
}

/// A node the MCD annotated (rendered config applied), streamd started on host `host`.
async fn mcd_annotated(name: &str, host: &str) -> Env {
    let mut env = Env::with_host(name, host).await;
    env.annotate(&[&format!(
        "{MCD_CURRENT_CONFIG}=rendered-worker-0123456789abcdef0123456789abcdef"
    )]);
    env.start_streamd();
    env
}

/// Asserts that no rpm-ostreed transaction method (staging, cleanup, finalizing) was called.
async fn assert_no_transaction(env: &Env) {
    let txns = env.transactions().await;
    assert!(txns.is_empty(), "no mutating call expected: {txns:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcd_annotated_node_refuses_requests_naming_the_mcd_and_the_config_key() {
    let env = mcd_annotated("readiness-annotation", "default").await;
    env.request_rhel10();
    let refused = env.wait_state("Refused").await;
    assert_eq!(refused[MODE], "readiness");
    let reason = &refused[REASON];
    assert!(
        reason.contains("machine-config daemon")
            && reason.contains(MCD_CURRENT_CONFIG)
            && reason.contains("set its MachineConfigPool's spec.osImageStream.name")
            && !reason.contains(r#"mode = "manage""#),
        "{reason}"
    );
    // Long enough for a staging to have started, were streamd to stage.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.annotations().await[STATE], "Refused");
    assert!(!env.annotations().await.contains_key(STAGED_OS_IMAGE));
    assert_no_transaction(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcd_host_file_alone_puts_the_node_in_readiness_mode() {
    let mut env = Env::with_host("readiness-hostfile", "mcd").await;
    env.start_streamd();
    env.request_rhel10();
    let refused = env.wait_state("Refused").await;
    assert_eq!(refused[MODE], "readiness");
    assert!(
        refused[REASON].contains("/etc/machine-config-daemon/currentconfig"),
        "{}",
        refused[REASON]
    );
    assert_no_transaction(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_lists_each_other_available_stream_with_the_failed_check_ids() {
    let env = mcd_annotated("readiness-oldcpu", "old-cpu").await;
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "readiness");
    assert_eq!(a[STATE], "Idle");
    let r = readiness(&a);
    assert!(
        r.get("rhel-9").is_none(),
        "the booted stream is not checked: {r}"
    );
    let e = &r["rhel-10"];
    assert_eq!(e["ready"], json!(false), "{e}");
    assert_eq!(e["failed"], json!(["cpu-level"]), "{e}");
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|s| s.starts_with("preflight check cpu-level failed:")),
        "{e}"
    );
    assert_eq!(e["osImage"], json!(env.rhel10()));
    assert_eq!(e["checked"].as_str().map(str::len), Some(16), "{e}");
    assert!(a[READINESS].len() <= 4096);
    assert_no_transaction(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reports_a_ready_stream() {
    let env = mcd_annotated("readiness-ready", "default").await;
    let r = readiness(&wait_readiness(&env, "rhel-10").await);
    assert_eq!(
        r["rhel-10"],
        json!({"ready": true, "failed": [], "reason": "", "osImage": env.rhel10(), "checked": r["rhel-10"]["checked"]}),
    );
    assert_no_transaction(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_stream_in_manage_mode_checks_without_staging() {
    let mut env = Env::new("readiness-manage-check").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.annotate(&[&format!("{CHECK_STREAM}=rhel-10")]);
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "manage");
    assert_eq!(a[STATE], "Idle");
    let r = readiness(&a);
    assert_eq!(r["rhel-10"]["ready"], json!(true), "{r}");
    assert_eq!(r["rhel-10"]["osImage"], json!(env.rhel10()), "{r}");
    assert_no_transaction(&env).await;
    // A request is still served in manage mode.
    env.request_rhel10();
    env.wait_reboot_request().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_manage_in_the_config_overrides_the_mcd() {
    let mut env = Env::new("readiness-override").await;
    env.annotate(&[&format!(
        "{MCD_CURRENT_CONFIG}=rendered-worker-0123456789abcdef0123456789abcdef"
    )]);
    env.config("60-mode.toml", "mode = \"manage\"\n");
    env.start_streamd();
    env.request_rhel10();
    let staged = env.wait_reboot_request().await;
    assert_eq!(staged[MODE], "manage");
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_check_values_are_refused_in_readiness_mode_changing_nothing() {
    let env = mcd_annotated("readiness-badcheck", "default").await;
    // A valid check first, so there is a readiness value a bad one must leave alone.
    env.annotate(&[&format!("{CHECK_STREAM}=rhel-10")]);
    let before = wait_readiness(&env, "rhel-10").await;
    env.annotate(&[&format!("{CHECK_OS_IMAGE}=quay.io/openshift/rhcos:latest")]);
    let refused = env.wait_state("Refused").await;
    assert!(
        refused[REASON].contains(CHECK_OS_IMAGE),
        "{}",
        refused[REASON]
    );
    assert_eq!(refused[READINESS], before[READINESS]);
    env.annotate(&[
        &format!("{CHECK_OS_IMAGE}-"),
        &format!("{CHECK_STREAM}=RHEL 10"),
    ]);
    let refused = env
        .wait_for("check-stream refused", Duration::from_secs(30), |a| {
            a.get(REASON).is_some_and(|r| r.contains(CHECK_STREAM))
        })
        .await;
    assert_eq!(refused[STATE], "Refused");
    assert_eq!(refused[READINESS], before[READINESS]);
    assert_no_transaction(&env).await;
}

/// A node on an on-cluster-layered rhel-9 image that the MCD manages: setting the pool's stream
/// makes the machine-config operator rebuild the layered image from the rhel-10 base image
/// (openshift/machine-config-operator:pkg/controller/build/buildrequest/assets/
/// Containerfile.on-cluster-build-template), so the base image the OSImageStream gives is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layered_image_node_is_ready_for_the_base_image_the_mco_rebuilds_from() {
    let env = mcd_annotated("readiness-ocl", "layered-image").await;
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "readiness");
    let r = readiness(&a);
    assert_eq!(
        r["rhel-10"],
        json!({"ready": true, "failed": [], "reason": "", "osImage": env.rhel10(), "checked": r["rhel-10"]["checked"]}),
    );
    assert!(a[READINESS].len() <= 4096);
    assert_no_transaction(&env).await;
}

/// The same node in manage mode (`check-stream` checks streamd's own move): the base image
/// would drop what was layered, and is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_stream_in_manage_mode_still_refuses_a_base_image_to_a_layered_node() {
    let mut env = Env::with_host("readiness-ocl-manage", "layered-image").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.annotate(&[&format!("{CHECK_STREAM}=rhel-10")]);
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "manage");
    let e = &readiness(&a)["rhel-10"];
    assert_eq!(e["ready"], json!(false), "{e}");
    assert_eq!(e["failed"], json!(["os-image"]), "{e}");
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|s| s.contains("on-cluster-layered image")),
        "{e}"
    );
    assert_no_transaction(&env).await;
}

/// `mode = "readiness"` in the config without any MCD signal: no machine-config operator will
/// rebuild the layered image, so the checks judge streamd's own move and refuse the base image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_by_config_alone_still_refuses_a_base_image_to_a_layered_node() {
    let mut env = Env::with_host("readiness-ocl-config", "layered-image").await;
    env.config("60-mode.toml", "mode = \"readiness\"\n");
    env.start_streamd();
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "readiness");
    let e = &readiness(&a)["rhel-10"];
    assert_eq!(e["failed"], json!(["os-image"]), "{e}");
    assert_no_transaction(&env).await;
}

/// OpenShift 4.21 and 4.22 on the Default feature set (every production cluster) serve no
/// OSImageStream API: the cluster offers no streams, which is nothing wrong with the node. It
/// stays `Idle` with no Warning Event, says why and how to check a stream anyway, and a
/// `check-stream` with `check-os-image` is still checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_offers_no_streams_leaves_a_readiness_node_idle() {
    let mut env = Env::with_host("readiness-nostreams", "mcd").await;
    env.apiserver(testbed::control::ApiServerCmd::ServeOsimagestreams { version: None })
        .await;
    env.start_streamd();
    let reason = wait_status_reason(&env, "offers no OS image streams").await;
    assert!(
        reason.contains("check-stream and check-os-image")
            && reason.contains("TechPreviewNoUpgrade, DevPreviewNoUpgrade or CustomNoUpgrade")
            && !reason.contains("set desired-os-image"),
        "{reason}"
    );
    // Long enough for the old code to have gone Degraded and posted its Warning.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a = env.annotations().await;
    assert_eq!(a[STATE], "Idle", "{a:?}");
    assert_eq!(a[MODE], "readiness");
    assert_eq!(
        a.get(REASON).map(String::as_str),
        Some(""),
        "Idle has no reason"
    );
    assert!(!a.contains_key(READINESS), "nothing was checked: {a:?}");
    assert_eq!(warning_events(&env), Vec::<String>::new());

    env.annotate(&[
        &format!("{CHECK_STREAM}=rhel-10"),
        &format!("{CHECK_OS_IMAGE}={}", env.rhel10()),
    ]);
    let e = &readiness(&wait_readiness(&env, "rhel-10").await)["rhel-10"];
    assert_eq!(e["ready"], json!(true), "{e}");
    assert_eq!(env.annotations().await[STATE], "Idle");
    assert_no_transaction(&env).await;
}

/// The rhel-10 readiness entry of an MCD-annotated node on host `host` of a cluster playing
/// OpenShift `release`.
async fn rhel10_readiness_on(name: &str, host: &str, release: testbed::OpenShift) -> Value {
    let mut env = Env::with_openshift(name, host, release).await;
    env.annotate(&[&format!(
        "{MCD_CURRENT_CONFIG}=rendered-worker-0123456789abcdef0123456789abcdef"
    )]);
    env.start_streamd();
    let r = readiness(&wait_readiness(&env, "rhel-10").await);
    assert_no_transaction(&env).await;
    // Readiness extracts no RPM and keeps no record in the runtime directory (memory).
    let kept: Vec<_> = walk(&env.dir.join("run/extensions"));
    assert!(kept.is_empty(), "readiness wrote {kept:?}");
    r["rhel-10"].clone()
}

/// Every file below `dir` (none when it is missing).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}

/// 4.21's machine-config daemon adds kernel-rt-kvm for a real-time MachineConfig while the
/// node runs EL9, and the rhel-10 extensions image has none: the move would fail. 4.22's
/// never asks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_21_realtime_node_is_not_ready_for_rhel_10_without_kernel_rt_kvm() {
    let e = rhel10_readiness_on(
        "readiness-421-rt",
        "mcd-realtime",
        testbed::OpenShift::V4_21,
    )
    .await;
    assert_eq!(e["ready"], json!(false), "{e}");
    assert_eq!(e["failed"], json!(["kernel-variant"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        // The reason is bounded: the release is named before the cut.
        reason.contains("lacks kernel-rt-kvm for the realtime kernel")
            && reason.contains("by release 4.21's"),
        "{reason}"
    );
    let e = rhel10_readiness_on(
        "readiness-422-rt",
        "mcd-realtime",
        testbed::OpenShift::V4_22,
    )
    .await;
    assert_eq!(e["ready"], json!(true), "{e}");
}

/// `wasm` is an extension of 4.21's operator (crun-wasm, which the testbed's rhel-10 extensions
/// image, like RHCOS's, does not have); 4.22's rejects the MachineConfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_21_wasm_node_needs_crun_wasm_where_4_22_rejects_it() {
    let e = rhel10_readiness_on("readiness-421-wasm", "mcd-wasm", testbed::OpenShift::V4_21).await;
    assert_eq!(e["failed"], json!(["layered-packages"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("spec.extensions (wasm) needs packages")
            && reason.ends_with(": crun-wasm")
            && !reason.contains("does not support"),
        "{reason}"
    );
    let e = rhel10_readiness_on("readiness-422-wasm", "mcd-wasm", testbed::OpenShift::V4_22).await;
    assert_eq!(e["failed"], json!(["layered-packages"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(r#"does not support: "wasm""#)
            && reason.contains("by release 4.22's machine-config operator"),
        "{reason}"
    );
}

/// The installer script the DaemonSet's init container runs.
const INSTALL_SH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/docs/deploy/openshift/install.sh"
);

/// What the installer image carries in /opt/streamd (docs/deploy/openshift/Containerfile: the
/// el9 RPMs' files), from this build, below `env`'s directory.
fn installer_files(env: &Env) -> PathBuf {
    let src = env.dir.join("installer");
    std::fs::create_dir_all(&src).expect("installer dir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, from) in [
        ("streamd", PathBuf::from(env!("CARGO_BIN_EXE_streamd"))),
        (
            "streamd-verify",
            PathBuf::from(env!("CARGO_BIN_EXE_streamd-verify")),
        ),
        ("streamctl", PathBuf::from(env!("CARGO_BIN_EXE_streamctl"))),
        ("streamd.service", repo.join("systemd/streamd.service")),
        (
            "streamd-bootloader-update.target",
            repo.join("systemd/streamd-bootloader-update.target"),
        ),
        (
            "io.openshift.OSStream1.conf",
            repo.join("systemd/io.openshift.OSStream1.conf"),
        ),
    ] {
        // A hard link where the file system allows: the debug binaries are large.
        let to = src.join(name);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).expect("copying an installer file");
        }
    }
    // The module's bytes only matter to the host's semodule, which the stub plays.
    std::fs::write(src.join("streamd.pp.bz2"), "streamd policy module\n").expect("module");
    src
}

/// The host's commands for the installer (`STREAMD_HOST_RUN`): each is logged to
/// `host-commands.log`; `semodule` keeps its module store where the host's is, in the host
/// root's /etc/selinux.
fn host_run_stub(env: &Env) -> PathBuf {
    let stub = env.dir.join("host-run");
    let store = env
        .dir
        .join("host/etc/selinux/targeted/active/modules/400/streamd");
    let log = env.dir.join("host-commands.log");
    let script = format!(
        "#!/bin/sh\necho \"$*\" >>'{log}'\ncase \"$1 $2\" in\n\
         'semodule -l') [ -e '{store}' ] && echo streamd ;;\n\
         'semodule -i') mkdir -p '{store}' ;;\nesac\nexit 0\n",
        log = log.display(),
        store = store.display()
    );
    std::fs::write(&stub, script).expect("writing the stub");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    stub
}

/// Runs the installer on `env`'s host root; returns its output and the host commands it ran.
fn run_installer(env: &Env, src: &Path, stub: &Path) -> (String, String) {
    let log = env.dir.join("host-commands.log");
    let _ = std::fs::remove_file(&log);
    let out = std::process::Command::new("sh")
        .arg(INSTALL_SH)
        .env("STREAMD_HOST", env.dir.join("host"))
        .env("STREAMD_SRC", src)
        .env("STREAMD_HOST_RUN", stub)
        .output()
        .expect("running install.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "install.sh failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, std::fs::read_to_string(&log).unwrap_or_default())
}

/// streamd installed the OpenShift way (docs/deploy/openshift/: binaries in /usr/local, units
/// in /etc, the policy module in the store, nothing layered) on a node the MCD manages reads
/// ready for rhel-10. After the node booted rhel-10 (a new deployment: its /usr replaces the
/// old one, /etc and /var stay) the installed streamd is still there, the installer's second
/// run finds nothing to do, and streamd starts and reports again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamd_installed_by_the_openshift_daemonset_is_ready_and_survives_the_rebase() {
    let mut env = Env::with_host("ocp-install", "mcd").await;
    let (src, stub) = (installer_files(&env), host_run_stub(&env));
    let (out, commands) = run_installer(&env, &src, &stub);
    assert!(
        out.contains("installed /usr/local/libexec/streamd\n"),
        "{out}"
    );
    assert!(
        commands.contains("semodule -i /usr/local/share/streamd/streamd.pp.bz2\n")
            && commands.contains("systemctl restart streamd.service\n"),
        "{commands}"
    );
    let host = env.dir.join("host");
    let unit = std::fs::read_to_string(host.join("etc/systemd/system/streamd.service"))
        .expect("the unit in /etc");
    assert!(
        unit.lines()
            .any(|l| l == "ExecStart=/usr/local/libexec/streamd"),
        "{unit}"
    );
    let program = host.join("usr/local/libexec/streamd");
    env.start_streamd_at(&program);
    let a = wait_readiness(&env, "rhel-10").await;
    assert_eq!(a[MODE], "readiness");
    assert_eq!(a[CURRENT_STREAM], "rhel-9");
    let r = readiness(&a);
    assert_eq!(r["rhel-10"]["ready"], json!(true), "{r}");

    // The machine-config daemon's rebase to rhel-10 and the reboot into it.
    std::fs::write(host.join("usr/libexec-marker"), "the old /usr").expect("marker");
    let rhel10 = env.rhel10();
    env.rpmostreed(RpmOstreedCmd::AdminDeploy { image: rhel10 })
        .await;
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], json!(true), "{out}");
    let os = std::fs::read_to_string(host.join("usr/lib/os-release")).expect("os-release");
    assert!(os.contains("RHEL_VERSION=10"), "{os}");
    assert!(!host.join("usr/libexec-marker").exists(), "a new /usr");
    // The pod starts again after the boot: everything is where it was.
    let (out, commands) = run_installer(&env, &src, &stub);
    assert!(!out.contains("installed "), "{out}");
    assert!(
        commands.contains("systemctl enable --now streamd.service\n")
            && !commands.contains("semodule -i"),
        "{commands}"
    );
    env.start_streamd_at(&program);
    // Only a streamd running on rhel-10 checks rhel-9 (the booted stream is not checked).
    let a = wait_readiness(&env, "rhel-9").await;
    assert_eq!(a[MODE], "readiness");
    assert_eq!(a[STATE], "Idle");
    assert_eq!(
        (a[CURRENT_STREAM].as_str(), &a[CURRENT_OS_IMAGE]),
        ("rhel-10", &env.rhel10())
    );
    let r = readiness(&a);
    assert!(
        !r["rhel-9"]["failed"]
            .as_array()
            .is_some_and(|f| f.contains(&json!("layered-packages"))),
        "{r}"
    );
    assert_no_transaction(&env).await;
}

/// The route the OpenShift install replaces: streamd's el9 RPMs layered on the node. The
/// machine-config daemon's rebase keeps local RPMs in the origin as built, so streamd's own
/// check finds el9 packages for an el10 target and the node reads not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamd_layered_as_its_el9_rpms_fails_its_own_layered_packages_check() {
    let e = rhel10_readiness_on(
        "ocp-install-rpm",
        "mcd-streamd-rpm",
        testbed::OpenShift::V4_23,
    )
    .await;
    assert_eq!(e["ready"], json!(false), "{e}");
    assert_eq!(e["failed"], json!(["layered-packages"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    // The reason is bounded: the first RPM is named before the cut.
    assert!(
        reason.contains("not built for the target (el10)")
            && reason.contains(testbed::fixtures::STREAMD_EL9_RPMS[0]),
        "{reason}"
    );
}

/// Waits until `streamctl status --json` has a reason containing `part`; returns it.
async fn wait_status_reason(env: &Env, part: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = env.streamctl(&["status", "--json"]);
        let reason = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v["reason"].as_str().map(String::from))
            .unwrap_or_default();
        if reason.contains(part) {
            return reason;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no status reason with {part:?} within 60s; last: {reason:?}\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The reasons of the Warning Events posted so far.
fn warning_events(env: &Env) -> Vec<String> {
    let out = env.kubectl(&["get", "events", "-o", "json"]);
    let events: Value = serde_json::from_slice(&out.stdout).expect("events JSON");
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "Warning")
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect()
}

/// A user MachineConfig that sets `osImageURL` pins the pool (the rendered MachineConfig is
/// `os-image-url-overridden`): 4.21's operator keeps that image over any stream's, 4.22's will
/// not render a pool that sets both. No stream applies, and nothing is checked for it (on the
/// old code the stream was checked and read ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_overrides_os_image_url_takes_no_stream() {
    for (name, release, says) in [
        (
            "readiness-421-pinned",
            testbed::OpenShift::V4_21,
            "keeps that image over any stream's",
        ),
        (
            "readiness-422-pinned",
            testbed::OpenShift::V4_22,
            "RenderDegraded",
        ),
        (
            "readiness-423-pinned",
            testbed::OpenShift::V4_23,
            "RenderDegraded",
        ),
    ] {
        let e = rhel10_readiness_on(name, "mcd-osimageurl-override", release).await;
        assert_eq!(e["ready"], json!(false), "{e}");
        assert_eq!(e["failed"], json!([]), "{e}");
        assert_eq!(e["osImage"], json!(""), "nothing was checked: {e}");
        let reason = e["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("stream not applicable: the pool overrides osImageURL")
                && reason.contains(says),
            "{reason}"
        );
    }
}

/// The OSImageStream's `release-image-version` names the operator build that wrote it; from
/// 4.22 the render controller ignores one another build wrote (an upgrade under way), so
/// readiness does too; 4.21's reads it (on the old code 4.22 and 4.23 read ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osimagestream_of_another_operator_build_is_ignored_from_4_22() {
    for (name, release, ignored) in [
        ("readiness-422-guard", testbed::OpenShift::V4_22, true),
        ("readiness-423-guard", testbed::OpenShift::V4_23, true),
        ("readiness-421-guard", testbed::OpenShift::V4_21, false),
    ] {
        let mut env = Env::with_openshift(name, "mcd", release).await;
        env.kubectl_ok(&[
            "annotate",
            "--overwrite",
            "osimagestream",
            "cluster",
            "machineconfiguration.openshift.io/release-image-version=0123abcd",
        ]);
        env.start_streamd();
        let e = readiness(&wait_readiness(&env, "rhel-10").await)["rhel-10"].clone();
        let reason = e["reason"].as_str().unwrap_or_default();
        if ignored {
            assert_eq!(e["failed"], json!([]), "{e}");
            assert!(
                reason.starts_with(&format!(
                    r#"the machine-config operator ignores OSImageStream "cluster": operator build "0123abcd" wrote it, build "{}" rendered"#,
                    release.controller_version()
                )),
                "{reason}"
            );
        } else {
            assert_eq!(e["ready"], json!(true), "{e}");
        }
        assert_no_transaction(&env).await;
    }
}

/// A PinnedImageSet put the OS image in the node's CRI-O storage (the machine-config daemon's
/// `/etc/crio/crio.conf.d/50-pinned-images`): the daemon rebases from that copy, so a registry
/// that does not serve the image leaves readiness unknown, not "not ready" (on the old code
/// `os-image` failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_os_image_the_registry_does_not_serve_is_unknown() {
    let mut env = Env::with_host("readiness-pinned-image", "mcd").await;
    let rhel10 = env.rhel10();
    let repository = rhel10.split('@').next().unwrap_or_default();
    let pinned = format!("{repository}@sha256:{}", "f".repeat(64));
    let dropin = env.dir.join("host/etc/crio/crio.conf.d");
    std::fs::create_dir_all(&dropin).expect("mkdir");
    std::fs::write(
        dropin.join("50-pinned-images"),
        format!("[crio]\n  [crio.image]\n    pinned_images = [\"{pinned}\"]\n"),
    )
    .expect("pinned images");
    env.start_streamd();
    env.annotate(&[
        &format!("{CHECK_STREAM}=rhel-10"),
        &format!("{CHECK_OS_IMAGE}={pinned}"),
    ]);
    let e = readiness(&wait_readiness(&env, "rhel-10").await)["rhel-10"].clone();
    assert_eq!(e["ready"], json!(false), "{e}");
    assert_eq!(e["failed"], json!([]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("readiness unknown: the OS image is pinned in this node's CRI-O storage by a PinnedImageSet"),
        "{reason}"
    );
    assert_no_transaction(&env).await;
}

/// The machine-config daemon stages its update's image, then records the new MachineConfig in
/// `currentconfig`, then reboots: a stage of the image that MachineConfig names is the
/// daemon's own, which does not block the operator's move (on the old code
/// `pending-deployment` failed); another stage still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcds_own_stage_in_flight_is_not_a_foreign_pending_deployment() {
    let mut env = Env::with_host("readiness-mcd-stage", "mcd").await;
    let rhel10 = env.rhel10();
    let currentconfig = env.dir.join("host/etc/machine-config-daemon/currentconfig");
    let recorded = format!(
        r#"{{"kind":"MachineConfig","apiVersion":"machineconfiguration.openshift.io/v1","metadata":{{"name":"rendered-worker-00112233445566778899aabbccddeeff","annotations":{{"machineconfiguration.openshift.io/release-image-version":"4.23.0","machineconfiguration.openshift.io/generated-by-controller-version":"d20efd9b9"}}}},"spec":{{"osImageURL":"{rhel10}"}}}}"#
    );
    std::fs::write(&currentconfig, recorded).expect("currentconfig");
    // Another client stages the image (the fake bootc's switch, as for a foreign stage).
    let out = std::process::Command::new(&env.vars()["TESTBED_BOOTC"])
        .args(["switch", "--transport", "registry", &rhel10])
        .envs(env.vars())
        .output()
        .expect("fake bootc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.start_streamd();
    let e = readiness(&wait_readiness(&env, "rhel-10").await)["rhel-10"].clone();
    assert_eq!(e["ready"], json!(true), "{e}");
    assert_eq!(e["failed"], json!([]), "{e}");
    // A stage of another image than the recorded MachineConfig's is not the daemon's.
    env.stop_streamd();
    let out = std::process::Command::new(&env.vars()["TESTBED_BOOTC"])
        .args(["switch", "--transport", "registry", &env.rhel9()])
        .envs(env.vars())
        .output()
        .expect("fake bootc runs");
    assert!(out.status.success());
    env.start_streamd();
    let a = env
        .wait_for("pending-deployment fails", Duration::from_secs(90), |a| {
            a.get(READINESS)
                .is_some_and(|r| r.contains(r#""failed":["pending-deployment"]"#))
        })
        .await;
    let reason = readiness(&a)["rhel-10"]["reason"].clone();
    assert!(
        reason
            .as_str()
            .is_some_and(|r| r.contains("is staged by someone else")),
        "{reason}"
    );
    assert_no_transaction(&env).await;
}

/// 4.21's machine-config daemon does no bootloader update before the rebase: with Secure Boot
/// on, the move to rhel-10 is not ready until bootupd's `bootloader-update.service` has run
/// this boot (as systemd says), which leaves the bootloader where 4.22's daemon would put it.
/// On the old code the node read ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4_21_secure_boot_node_is_ready_once_the_bootloader_update_ran_this_boot() {
    let mut env = Env::with_openshift(
        "readiness-421-sb",
        "mcd-secureboot",
        testbed::OpenShift::V4_21,
    )
    .await;
    env.start_streamd();
    let e = readiness(&wait_readiness(&env, "rhel-10").await)["rhel-10"].clone();
    assert_eq!(e["failed"], json!(["secure-boot"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("Secure Boot is on and bootloader-update.service has not run this boot")
            && reason.contains("by release 4.21's"),
        "{reason}"
    );
    let host = host_facts(&env.annotations().await);
    assert_eq!(
        (&host["secureBoot"], &host["bootloaderUpdated"]),
        (&json!(true), &json!(false)),
        "{host}"
    );
    env.stop_streamd();

    // The unit runs (as at boot, or as an admin starts it).
    let conn = bus_connection(&env.tb).await;
    conn.call_method(
        Some("org.freedesktop.systemd1"),
        "/org/freedesktop/systemd1",
        Some("org.freedesktop.systemd1.Manager"),
        "StartUnit",
        &("bootloader-update.service", "replace"),
    )
    .await
    .expect("StartUnit");
    wait_unit_active(&conn, "bootloader-update.service").await;
    env.start_streamd();
    let a = env
        .wait_for("rhel-10 ready", Duration::from_secs(90), |a| {
            a.get(READINESS)
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .is_some_and(|r| r["rhel-10"]["ready"] == json!(true))
        })
        .await;
    assert_eq!(readiness(&a)["rhel-10"]["failed"], json!([]));
    assert_eq!(host_facts(&a)["bootloaderUpdated"], json!(true), "{a:?}");
    assert_no_transaction(&env).await;
}

/// Waits until systemd (the fake) has `unit` `active`.
async fn wait_unit_active(conn: &zbus::Connection, unit: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let path: Option<zbus::zvariant::OwnedObjectPath> = conn
            .call_method(
                Some("org.freedesktop.systemd1"),
                "/org/freedesktop/systemd1",
                Some("org.freedesktop.systemd1.Manager"),
                "GetUnit",
                &(unit,),
            )
            .await
            .ok()
            .and_then(|m| m.body().deserialize().ok());
        let mut state = String::new();
        if let Some(path) = path {
            let props = zbus::fdo::PropertiesProxy::builder(conn)
                .destination("org.freedesktop.systemd1")
                .and_then(|b| b.path(path))
                .expect("properties proxy")
                .build()
                .await
                .expect("properties proxy");
            let iface = zbus::names::InterfaceName::from_static_str_unchecked(
                "org.freedesktop.systemd1.Unit",
            );
            if let Ok(v) = props.get(iface, "ActiveState").await {
                state = String::try_from(v).unwrap_or_default();
            }
        }
        if state == "active" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{unit} not active within 60 s: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
