//! The daemon's host-side contracts: sd_notify, the D-Bus API and its signals, config errors.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use testbed::control::{ApiServerCmd, Fault, RpmOstreedCmd};
use testbed::scratch::ScratchDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_notify_ready_status_and_stopping() {
    let mut env = Env::new("notify").await;
    let sock_path = env.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    // Read as systemd does, all along: a queue left full drops messages (see the test below).
    let reader = std::thread::spawn(move || read_notify(&sock, Duration::from_secs(120)));
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ]);
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    assert!(env.stop_streamd().success());
    let messages = reader.join().expect("reader");
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

/// A notify socket whose queue is full (a reader that is busy or wedged) must not stall streamd:
/// a blocking send there held its one runtime thread, so it stayed `Staging` (or never got
/// `Idle`) and did not see SIGTERM. The socket is not read until `Staged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_notify_to_a_full_socket_never_blocks() {
    let mut env = Env::new("notifyfull").await;
    let sock_path = env.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    // Fill its queue (net.unix.max_dgram_qlen datagrams) before streamd sends anything.
    let filler = UnixDatagram::unbound().expect("socket");
    filler.set_nonblocking(true).expect("non-blocking");
    let full = loop {
        if let Err(e) = filler.send_to(b"FILLER=1\n", &sock_path) {
            break e;
        }
    };
    assert_eq!(full.kind(), std::io::ErrorKind::WouldBlock, "{full}");
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ]);
    env.wait_for(
        "state Idle with a full notify socket",
        Duration::from_secs(30),
        |a| a.get(STATE).map(String::as_str) == Some("Idle"),
    )
    .await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    // Drained, the socket takes streamd's messages again: pings, then STOPPING=1 on SIGTERM.
    sock.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 4096];
    while sock.recv(&mut buf).is_ok() {}
    sock.set_nonblocking(false).expect("blocking");
    // What comes first is not fixed (a `STATUS=`, the `READY=1` sent again, a ping): read for up
    // to 5 s until both a ping and `READY=1` are seen.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut seen: Vec<String> = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    let has = |seen: &[String], what: &str| seen.iter().any(|m| m.contains(what));
    while !(has(&seen, "WATCHDOG=1") && has(&seen, "READY=1")) && Instant::now() < until {
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    assert!(
        has(&seen, "WATCHDOG=1"),
        "no WATCHDOG=1 within 5 s of draining: {seen:?}"
    );
    // READY=1 did not fit at the start; it is sent again until it does (systemd would
    // otherwise fail the start at its timeout).
    assert!(
        has(&seen, "READY=1"),
        "READY=1 never sent once the queue drained: {seen:?}"
    );
    assert!(env.stop_streamd().success());
    let messages = read_notify(&sock, Duration::from_secs(5));
    assert!(
        messages.iter().any(|m| m.contains("STOPPING=1")),
        "{messages:?}"
    );
}

/// The datagrams on `sock` until `STOPPING=1` or `within` has passed.
fn read_notify(sock: &UnixDatagram, within: Duration) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !messages.iter().any(|m: &String| m.contains("STOPPING=1")) {
        if let Ok(n) = sock.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    messages
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
    env.rpmostreed(RpmOstreedCmd::Progress {
        signals: 10,
        per_second: 10,
    })
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

/// A scratch directory other users can traverse (mode 0711, not listable): the build tree may
/// sit below a directory only its owner enters (a clone in root's home or in a `mktemp -d`),
/// the scratch directory does not (`testbed::scratch`).
struct Reachable(ScratchDir);

impl Reachable {
    fn new(name: &str) -> Reachable {
        use std::os::unix::fs::PermissionsExt;
        let dir = ScratchDir::new(&format!("reachable-{name}")).expect("scratch dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        Reachable(dir)
    }

    /// Lets others traverse every directory from the scratch root down to `path`'s parent
    /// (whatever the umask made them), and nothing else.
    fn open_path_to(&self, path: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(&*self.0)) {
            // Traverse only: nobody lists or reads the testbed's credentials on the way.
            let mode = std::fs::metadata(d).expect("stat").permissions().mode() & 0o700;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011))
                .expect("chmod");
            dir = d.parent();
        }
    }

    /// A copy of `binary` others may run.
    fn copy_of(&self, binary: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let src = std::path::Path::new(binary);
        let dst = self.0.join(src.file_name().expect("a file name"));
        std::fs::copy(src, &dst).expect("copy binary");
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        dst
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dbus_policy_lets_others_read_but_not_call() {
    // `nobody` must reach the bus socket and run streamctl: both live in a directory it can
    // enter, not under the build tree (declared first: removed after the testbed stops).
    let scratch = Reachable::new("policy");
    let mut env = Env::in_dir(scratch.0.join("testbed")).await;
    let socket = env.vars()["DBUS_SYSTEM_BUS_ADDRESS"]
        .strip_prefix("unix:path=")
        .expect("a unix socket address")
        .to_string();
    scratch.open_path_to(std::path::Path::new(&socket));
    let streamctl = scratch.copy_of(env!("CARGO_BIN_EXE_streamctl"));
    let streamctl = streamctl.to_str().expect("utf-8 path");
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
    let out = as_nobody(&env, streamctl, &["status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("State:        Idle"));
    let out = as_nobody(&env, streamctl, &["reconcile"]);
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

/// Collects sd_notify datagrams on `path` in a thread until the returned handle is dropped.
struct Notifications {
    messages: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Notifications {
    fn listen(path: &std::path::Path) -> Notifications {
        let sock = UnixDatagram::bind(path).expect("notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, s) = (messages.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    m.lock().expect("lock").push((Instant::now(), text));
                }
            }
        });
        Notifications { messages, stop }
    }

    fn all(&self) -> Vec<(Instant, String)> {
        self.messages.lock().expect("lock").clone()
    }

    /// Waits until a message contains `text`; returns when it came.
    async fn wait_for(&self, env: &Env, text: &str, timeout: Duration) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((at, _)) = self.all().into_iter().find(|(_, m)| m.contains(text)) {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "no notification with {text:?} within {timeout:?}: {:?}\n{}",
                self.all(),
                env.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `streamctl status`'s `Reason:` line.
fn status_reason(env: &Env) -> String {
    let out = env.streamctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("Reason:"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|| panic!("no Reason line: {text}"))
}

/// How long the API server stays unreachable after the start: longer than systemd's default
/// start-limit window (`DefaultStartLimitIntervalSec=10s`) and than a few of the unit's
/// `RestartSec=10s` cycles would take to use up its burst at test scale.
const START_OUTAGE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_at_start_is_a_reported_wait_then_converges() {
    let mut env = Env::new("outage-start").await;
    let sock_path = env.dir.join("notify.sock");
    let notes = Notifications::listen(&sock_path);
    // A new node: the kubelet's kubeconfig does not exist yet, and the API server is down.
    let kubeconfig = env.dir.join("kubelet").join("kubeconfig");
    env.apiserver(ApiServerCmd::Fault(Fault::Refuse { on: true }))
        .await;
    let started = Instant::now();
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "2000000"),
        ("STREAMD_KUBECONFIG", kubeconfig.to_str().expect("utf-8")),
    ]);
    let ready = notes
        .wait_for(&env, "READY=1", Duration::from_secs(10))
        .await;
    println!("READY=1 {:?} after the start", ready - started);
    notes
        .wait_for(&env, "waiting for the kubeconfig", Duration::from_secs(10))
        .await;
    assert!(
        status_reason(&env).contains("waiting for the kubeconfig"),
        "{}",
        status_reason(&env)
    );
    // The kubelet writes its kubeconfig (its CSR was approved); the API server is still down.
    std::fs::create_dir_all(kubeconfig.parent().expect("parent")).expect("mkdir");
    std::fs::copy(env.dir.join("kubeconfig"), &kubeconfig).expect("kubeconfig");
    notes
        .wait_for(
            &env,
            "waiting for the Kubernetes API server",
            Duration::from_secs(30),
        )
        .await;
    assert!(
        status_reason(&env).contains("waiting for the Kubernetes API server"),
        "{}",
        status_reason(&env)
    );
    tokio::time::sleep(START_OUTAGE.saturating_sub(started.elapsed())).await;
    assert!(
        env.streamd_running(),
        "streamd exited during the outage\n{}",
        env.log()
    );
    env.apiserver(ApiServerCmd::Fault(Fault::Clear)).await;
    let up = Instant::now();
    env.wait_state("Idle").await;
    let idle = up.elapsed();
    env.request_rhel10();
    env.wait_state("Staged").await;
    println!(
        "outage at start {:?}: Idle {idle:?} after the API server came back, Staged {:?} after",
        up - started,
        up.elapsed()
    );
    // Not killed by its own watchdog while waiting: pings all along.
    let pings = notes
        .all()
        .iter()
        .filter(|(_, m)| m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 10, "watchdog pings: {pings}");
    assert_eq!(started_txns(&env).await, 1);
}

/// rpm-ostreed is not on the bus when streamd starts (broken, or not yet up), for longer than
/// systemd's start-limit window: streamd says READY, reports the wait (`STATUS=`, journal),
/// keeps the watchdog fed and tries again with backoff; once the daemon is there it converges
/// without a restart. Before, it exited 1 before READY at every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_ostreed_missing_at_start_is_a_reported_wait_then_converges() {
    let mut env = Env::new("no-rpmostreed").await;
    // On this host nothing is activatable, so `auto` would take bootc; an RHCOS node's
    // rpm-ostreed is activatable, and `auto` takes rpm-ostree there whatever its state.
    env.config("60-backend.toml", "backend = \"rpm-ostree\"\n");
    env.rpmostreed(RpmOstreedCmd::Bus { on: false }).await;
    let sock_path = env.dir.join("notify.sock");
    let notes = Notifications::listen(&sock_path);
    let started = Instant::now();
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "2000000"),
    ]);
    notes
        .wait_for(&env, "READY=1", Duration::from_secs(10))
        .await;
    notes
        .wait_for(
            &env,
            "STATUS=Waiting: connecting to rpm-ostreed",
            Duration::from_secs(10),
        )
        .await;
    tokio::time::sleep(START_OUTAGE.saturating_sub(started.elapsed())).await;
    assert!(
        env.streamd_running(),
        "streamd exited while rpm-ostreed was missing\n{}",
        env.log()
    );
    env.rpmostreed(RpmOstreedCmd::Bus { on: true }).await;
    let up = Instant::now();
    env.wait_state("Idle").await;
    println!(
        "rpm-ostreed missing for {:?}: Idle {:?} after it came",
        up - started,
        up.elapsed()
    );
    env.request_rhel10();
    env.wait_state("Staged").await;
    let pings = notes
        .all()
        .iter()
        .filter(|(at, m)| *at < up && m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 10, "watchdog pings while waiting: {pings}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_without_a_node_is_reported() {
    let mut env = Env::new("no-node").await;
    let sock_path = env.dir.join("notify.sock");
    let notes = Notifications::listen(&sock_path);
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("STREAMD_NODE_NAME", "worker-9"),
    ]);
    notes
        .wait_for(&env, "READY=1", Duration::from_secs(10))
        .await;
    notes
        .wait_for(
            &env,
            "waiting for the Node worker-9",
            Duration::from_secs(30),
        )
        .await;
    let reason = status_reason(&env);
    assert!(reason.contains("no Node of that name"), "{reason}");
    assert!(env.streamd_running(), "{}", env.log());
}

async fn started_txns(env: &Env) -> usize {
    started(&env.transactions().await).len()
}

/// The kubelet rotates its client certificate onto a new client CA; the old one is refused with
/// 401. streamd reloads the credentials (on the 401, or when the files change) and keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_client_certificate_is_reloaded() {
    let mut env = Env::new("rotate").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let rotated = env.apiserver(ApiServerCmd::RotateClientCa).await;
    assert_eq!(rotated["generation"], 1);
    let at = Instant::now();
    env.request_rhel10();
    env.wait_state("Staged").await;
    println!("Staged {:?} after the rotation", at.elapsed());
    assert_eq!(started_txns(&env).await, 1);
    assert!(
        env.log().contains("cluster credentials loaded"),
        "{}",
        env.log()
    );
}

/// A registry that accepts connections and never answers: holds every connection until dropped.
struct StalledRegistry {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl StalledRegistry {
    fn start() -> StalledRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(conn);
            }
        });
        StalledRegistry { addr, accepted }
    }

    fn image(&self) -> String {
        format!("{}/openshift/rhcos@sha256:{}", self.addr, "5".repeat(64))
    }
}

/// Starts streamd with a 2 s watchdog (pings every second) reporting to a notify listener,
/// beside a stalled registry it may read; returns once the node is `Idle`.
async fn start_watched_beside_a_stall(env: &mut Env) -> (StalledRegistry, Notifications) {
    let registry = StalledRegistry::start();
    env.allow_registries(&[&registry.addr.to_string()]);
    let notes = start_watched(env).await;
    (registry, notes)
}

/// Starts streamd with a 2 s watchdog (pings every second) reporting to a notify listener;
/// returns once the node is `Idle`.
async fn start_watched(env: &mut Env) -> Notifications {
    let sock_path = env.dir.join("notify.sock");
    let notes = Notifications::listen(&sock_path);
    env.start_streamd_with(&[
        ("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "2000000"),
    ]);
    env.wait_state("Idle").await;
    notes
}

/// The `WATCHDOG=1` messages received within `window`.
fn watchdog_pings(notes: &Notifications, window: (Instant, Instant)) -> usize {
    notes
        .all()
        .iter()
        .filter(|(at, m)| m.contains("WATCHDOG=1") && *at >= window.0 && *at <= window.1)
        .count()
}

/// How long the registry stalls under observation: several watchdog intervals.
const STALL: Duration = Duration::from_secs(12);

/// Preflight reads a registry that accepts and never answers, for longer than the watchdog
/// interval: the loop still pings the watchdog, reports `Preflight`, answers `streamctl
/// status`, takes a new request at once and stops at once on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_registry_does_not_stall_the_loop() {
    let mut env = Env::new("stall").await;
    let (registry, notes) = start_watched_beside_a_stall(&mut env).await;
    env.request("rhel-10", &registry.image(), None);
    let requested = Instant::now();
    env.wait_for("Preflight reported", Duration::from_secs(5), |a| {
        a.get(STATE).map(String::as_str) == Some("Preflight")
    })
    .await;
    println!(
        "Preflight reported {:?} after the request",
        requested.elapsed()
    );
    // Observe the stall: the registry has the connection and answers nothing.
    let mut status_times = Vec::new();
    while requested.elapsed() < STALL {
        let t = Instant::now();
        let out = env.streamctl(&["status"]);
        assert!(out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("State:        Preflight"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        status_times.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let accepted = registry.accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        accepted >= 1,
        "preflight never reached the stalled registry"
    );
    let window = (requested + Duration::from_secs(2), Instant::now());
    let pings = watchdog_pings(&notes, window);
    let span = window.1 - window.0;
    println!(
        "during a {span:?} stall: {pings} WATCHDOG=1, {} streamctl status answered (slowest {:?}), {accepted} registry connection(s)",
        status_times.len(),
        status_times.iter().max()
    );
    assert!(
        pings as u64 >= span.as_secs() - 2,
        "{pings} pings in {span:?}\n{}",
        env.log()
    );
    // A new request is taken at once: the stalled preflight is dropped.
    let changed = Instant::now();
    env.request_rhel10();
    env.wait_state("Staged").await;
    println!("Staged {:?} after the request changed", changed.elapsed());
    assert_eq!(started_txns(&env).await, 1);
    // Stalled again, SIGTERM stops it at once.
    env.request("rhel-10", &registry.image(), None);
    env.wait_state("Preflight").await;
    let term = Instant::now();
    env.stop_streamd();
    println!("stopped {:?} after SIGTERM mid-preflight", term.elapsed());
}

/// `streamctl preflight` against a registry that accepts and never answers, then a new request
/// on the node: the D-Bus method waits for its answer, and meanwhile the loop still publishes,
/// takes the request and pings the watchdog. A guard: the stall issue 20 §4 saw (no
/// `WATCHDOG=1` for 58 s) did not reproduce on the code before the status got its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_preflight_call_does_not_stall_the_loop() {
    let mut env = Env::new("stall-call").await;
    let (registry, notes) = start_watched_beside_a_stall(&mut env).await;
    let mut call = env
        .streamctl_command(&[
            "preflight",
            "--stream",
            "rhel-10",
            "--os-image",
            &registry.image(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("streamctl preflight starts");
    let called = Instant::now();
    while registry.accepted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            called.elapsed() < Duration::from_secs(20),
            "the preflight never reached the stalled registry\n{}",
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A new request on the node while the call waits: the loop takes it and publishes.
    env.request_rhel10();
    env.wait_for("the request taken", Duration::from_secs(10), |a| {
        a.get(STATE).map(String::as_str) == Some("Preflight")
    })
    .await;
    // Until the registry read's own deadline ends the call.
    let mut ended = None;
    while ended.is_none() && called.elapsed() < Duration::from_secs(60) {
        if call.try_wait().expect("wait").is_some() {
            ended = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let window = (
        called + Duration::from_secs(2),
        ended.unwrap_or_else(Instant::now),
    );
    let span = window.1.saturating_duration_since(window.0);
    assert!(
        span >= Duration::from_secs(4),
        "the call waited long enough to matter: {span:?}"
    );
    let pings = watchdog_pings(&notes, window);
    println!("while a preflight call waited {span:?}: {pings} WATCHDOG=1");
    assert!(
        pings as u64 >= span.as_secs() - 2,
        "{pings} pings in {span:?}\n{}",
        env.log()
    );
    env.wait_state("Staged").await;
    let _ = call.kill();
    let _ = call.wait();
}

/// `streamctl preflight` while a staging transaction runs (issue 20 §4): the call is answered
/// from a task of its own, with the checks, and meanwhile the loop follows the transaction to
/// `Staged` and pings the watchdog throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_call_during_staging_does_not_stall_the_loop() {
    let mut env = Env::new("stage-call").await;
    // A staging of about 10 s: 80 progress signals, 8 a second.
    env.rpmostreed(RpmOstreedCmd::Progress {
        signals: 80,
        per_second: 8,
    })
    .await;
    let notes = start_watched(&mut env).await;
    env.request_rhel10();
    env.wait_for("Staging", Duration::from_secs(30), |a| {
        a.get(STATE).map(String::as_str) == Some("Staging")
    })
    .await;
    let called = Instant::now();
    let rhel10 = env.rhel10();
    let out = env.streamctl(&[
        "preflight",
        "--json",
        "--stream",
        "rhel-10",
        "--os-image",
        &rhel10,
    ]);
    let answered = called.elapsed();
    // The checks ran (0: pass, 1: a check fails), not "could not run" (4).
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{out:?}\n{}",
        env.log()
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        doc["checks"].as_array().is_some_and(|c| !c.is_empty()),
        "{doc}"
    );
    env.wait_state("Staged").await;
    let window = (called, Instant::now());
    let span = window.1 - window.0;
    let pings = watchdog_pings(&notes, window);
    println!("preflight answered in {answered:?} during staging; {pings} WATCHDOG=1 in {span:?}");
    assert!(
        pings as u64 >= span.as_secs().saturating_sub(2),
        "{pings} pings in {span:?}\n{}",
        env.log()
    );
    assert_eq!(started_txns(&env).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_lease_names_the_node() {
    let mut env = Env::new("heartbeat").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let get = [
        "get",
        "lease",
        "-n",
        "streamd-node-lease",
        testbed::NODE_NAME,
        "-o",
        "json",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let lease: serde_json::Value = loop {
        let out = env.kubectl(&get);
        if out.status.success() {
            break serde_json::from_slice(&out.stdout).expect("lease JSON");
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat Lease: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(lease["spec"]["holderIdentity"], testbed::NODE_NAME);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 360);
    let renewed = lease["spec"]["renewTime"].as_str().expect("renewTime");
    assert!(
        renewed.len() == "2026-12-04T10:00:00.000000Z".len() && renewed.ends_with('Z'),
        "MicroTime with microseconds: {renewed}"
    );
    env.stop_streamd();
}
