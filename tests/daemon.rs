//! The daemon's host-side contracts: sd_notify, the D-Bus API and its signals, config errors.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_notify_ready_status_and_stopping() {
    let mut env = Env::new("notify").await;
    let sock_path = env.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ]);
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    env.stop_streamd();
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match sock.recv(&mut buf) {
            Ok(n) => messages.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) if messages.iter().any(|m| m.contains("STOPPING=1")) => break,
            Err(_) => {}
        }
    }
    let ready = messages.iter().position(|m| m.contains("READY=1"));
    let staged = messages.iter().position(|m| m.contains("STATUS=Staged"));
    let stopping = messages.iter().position(|m| m.contains("STOPPING=1"));
    assert!(ready.is_some(), "{messages:?}");
    assert!(
        messages.iter().any(|m| m.contains("STATUS=Staging")),
        "{messages:?}"
    );
    assert!(ready < staged && staged < stopping, "order: {messages:?}");
    // Pinged from the main loop at half the 0.4 s timeout.
    let pings = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(pings >= 2, "watchdog pings: {messages:?}");
}

#[zbus::proxy(
    interface = "io.openshift.OSStream1",
    default_service = "io.openshift.OSStream1",
    default_path = "/io/openshift/OSStream1"
)]
trait OSStream1 {
    fn reconcile(&self) -> zbus::Result<()>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn node(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn progress(&self) -> zbus::Result<u32>;
    #[zbus(property)]
    fn staged_os_image(&self) -> zbus::Result<String>;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbus_properties_and_changed_signals() {
    let mut env = Env::new("dbusapi").await;
    env.rpmostreed(serde_json::json!({"cmd": "progress", "signals": 10, "per-second": 10}))
        .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let conn = zbus::connection::Builder::address(env.vars()["DBUS_SYSTEM_BUS_ADDRESS"].as_str())
        .expect("address")
        .build()
        .await
        .expect("bus");
    let proxy = OSStream1Proxy::new(&conn).await.expect("proxy");
    assert_eq!(proxy.node().await.expect("Node"), testbed::NODE_NAME);
    assert_eq!(proxy.state().await.expect("State"), "Idle");
    let mut changes = proxy.receive_state_changed().await;
    env.request_rhel10();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !seen.iter().any(|s| s == "Staged") {
        let next = tokio::time::timeout_at(deadline, changes.next())
            .await
            .expect("PropertiesChanged within 30 s")
            .expect("stream open");
        seen.push(next.get().await.expect("value"));
    }
    assert!(seen.contains(&"Staging".to_string()), "{seen:?}");
    assert_eq!(proxy.staged_os_image().await.expect("staged"), env.rhel10());
    proxy.reconcile().await.expect("Reconcile");
    // Reconciling a staged node changes nothing and stages nothing again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(proxy.state().await.expect("State"), "Staged");
    assert_eq!(started(&env.transactions().await).len(), 1);
}

#[test]
fn invalid_config_is_one_clear_line_and_exit_2() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("badconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("10-bad.toml"),
        "node-name = \"a\"\nreboot-policy = \"never\"\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_streamd"))
        .env("STREAMD_CONFIG_DIR", &dir)
        .output()
        .expect("streamd runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("streamd: "))
        .expect("a streamd: line");
    assert!(line.contains("10-bad.toml:2:1"), "{line}");
    assert!(line.contains("reboot-policy"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_logs_annotations_or_events() {
    let mut env = Env::new("secrets").await;
    // Run with the bearer-token kubeconfig and everything logged at trace level.
    let token_kubeconfig = env.dir.join("kubeconfig-admin");
    env.start_streamd_with(&[
        (
            "STREAMD_KUBECONFIG",
            token_kubeconfig.to_str().expect("utf-8"),
        ),
        ("STREAMD_LOG", "trace"),
    ]);
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let token = std::fs::read_to_string(env.dir.join("pki/admin-token")).expect("token");
    let secret: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&env.vars()["TESTBED_PULL_SECRET"]).expect("pull secret"),
    )
    .expect("json");
    let auth = secret["auths"]
        .as_object()
        .and_then(|m| m.values().next())
        .and_then(|e| e["auth"].as_str())
        .expect("auth")
        .to_string();
    let password = env.tb.registry().password().to_string();
    let log = env.log();
    assert!(log.len() > 1000, "a trace-level log was written");
    let annotations = format!("{:?}", env.annotations().await);
    let events =
        String::from_utf8_lossy(&env.kubectl(&["get", "events", "-o", "json"]).stdout).to_string();
    for (what, text) in [
        ("log", &log),
        ("annotations", &annotations),
        ("events", &events),
    ] {
        for (name, secret) in [
            ("token", token.trim()),
            ("pull-secret auth", auth.as_str()),
            ("registry password", password.as_str()),
        ] {
            assert!(!text.contains(secret), "the {name} appears in the {what}");
        }
    }
}

/// Runs `cmd` as `nobody` (uid/gid 65534) with the testbed's environment.
fn as_nobody(env: &Env, program: &str, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(program)
        .args(args)
        .envs(env.vars())
        .output()
        .expect("setpriv runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbus_policy_lets_others_read_but_not_call() {
    let mut env = Env::new("policy").await;
    // The shipped policy file, loaded into the testbed's real dbus-daemon.
    let policy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/io.openshift.OSStream1.conf"
    );
    std::fs::copy(
        policy,
        env.tb
            .bus()
            .policy_dir()
            .join("io.openshift.OSStream1.conf"),
    )
    .expect("install policy");
    env.tb.bus().reload().expect("reload");
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let addr = env.vars()["DBUS_SYSTEM_BUS_ADDRESS"].clone();
    let target = [
        "io.openshift.OSStream1",
        "/io/openshift/OSStream1",
        "io.openshift.OSStream1",
    ];
    let mut get = vec!["--address", addr.as_str(), "get-property"];
    get.extend(target);
    get.push("State");
    let out = as_nobody(&env, "busctl", &get);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "s \"Idle\"");
    let mut call = vec!["--address", addr.as_str(), "call"];
    call.extend(target);
    call.push("Reconcile");
    let out = as_nobody(&env, "busctl", &call);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Access denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // streamctl as a non-root admin: status works, reconcile is refused with advice.
    let out = as_nobody(&env, env!("CARGO_BIN_EXE_streamctl"), &["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("State:        Idle"));
    let out = as_nobody(&env, env!("CARGO_BIN_EXE_streamctl"), &["reconcile"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied") && err.contains("run streamctl as root"),
        "{err}"
    );
    // Root may call.
    let out = env.streamctl(&["reconcile"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// libostree and glib stay out of the resident daemon: only the short-lived `streamd-verify`
/// helper links them.
#[test]
fn the_daemon_does_not_link_libostree() {
    let ldd = |bin: &str| {
        let out = std::process::Command::new("ldd")
            .arg(bin)
            .output()
            .expect("ldd runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let daemon = ldd(env!("CARGO_BIN_EXE_streamd"));
    assert!(
        !daemon.contains("libostree") && !daemon.contains("libglib"),
        "{daemon}"
    );
    assert!(
        ldd(env!("CARGO_BIN_EXE_streamd-verify")).contains("libostree"),
        "the helper is where libostree is"
    );
}
