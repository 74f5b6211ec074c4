//! Shared harness for the end-to-end tests: one testbed per test, the real `streamd`,
//! `streamctl` and `kubectl` binaries against it.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::control::{ApiServerCmd, RpmOstreedCmd, SystemdCmd};
use testbed::scratch::ScratchDir;
use testbed::{Options, Testbed};

pub const STATE: &str = "osstream.openshift.io/state";
pub const REASON: &str = "osstream.openshift.io/reason";
pub const PROGRESS: &str = "osstream.openshift.io/progress";
pub const DESIRED_STREAM: &str = "osstream.openshift.io/desired-stream";
pub const DESIRED_OS_IMAGE: &str = "osstream.openshift.io/desired-os-image";
pub const DESIRED_EXTENSIONS_IMAGE: &str = "osstream.openshift.io/desired-extensions-image";
pub const STAGED_OS_IMAGE: &str = "osstream.openshift.io/staged-os-image";
pub const CURRENT_OS_IMAGE: &str = "osstream.openshift.io/current-os-image";
pub const CURRENT_STREAM: &str = "osstream.openshift.io/current-stream";
pub const OBSERVED_DESIRED: &str = "osstream.openshift.io/observed-desired";
pub const HOST: &str = "osstream.openshift.io/host";
pub const REBOOT_REQUESTED: &str = "osstream.openshift.io/reboot-requested";
pub const REBOOT_APPROVED: &str = "osstream.openshift.io/reboot-approved";
pub const FAILED_CHECKS: &str = streamd::cluster::protocol::FAILED_CHECKS;

/// A fresh scratch directory for test `name` (see `testbed::scratch`: short, outside the
/// clone, removed unless the test failed).
pub fn scratch_dir(prefix: &str, name: &str) -> ScratchDir {
    ScratchDir::new(&format!("{prefix}-{name}")).expect("scratch dir")
}

/// Starts a testbed in `dir` on host fixture `host` whose update tool is `backend`.
pub async fn start_testbed(dir: &Path, host: &str, backend: testbed::Backend) -> Testbed {
    let mut opts = Options::new(dir.to_path_buf());
    opts.host = host.to_string();
    opts.backend = backend;
    Testbed::start(opts).await.expect("testbed starts")
}

/// A client connection to the testbed's system bus.
pub async fn bus_connection(tb: &Testbed) -> zbus::Connection {
    zbus::connection::Builder::address(tb.bus().address())
        .expect("bus address")
        .build()
        .await
        .expect("connect to the bus")
}

/// The transactions the fake rpm-ostreed recorded as started (`Start()` was called).
pub fn started(txns: &[Value]) -> Vec<&Value> {
    txns.iter()
        .filter(|t| t["started"] == json!(true))
        .collect()
}

/// Whether test `test` can stage through real libostree: the trixie root is there and this
/// process is root (it unshares namespaces). Outside CI it says why not and the test runs on
/// the fake's own writer; on CI (`CI=true`) either missing fails the test, so no CI run
/// passes without real libostree.
pub fn real_libostree(test: &str) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let trixie = testbed::fakes::rpmostreed::libostree::Trixie::for_test(test)
        .expect("the trixie root scripts/setup.sh makes (CI=true)");
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    match (trixie, root) {
        (Some(_), true) => true,
        (_, false) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: real libostree needs root, which CI runs as")
        }
        (Some(_), false) => {
            eprintln!("{test}: not root, so the fake writes libostree's record itself");
            false
        }
        (None, _) => false,
    }
}

/// The `host` annotation (the facts streamd reports about the node) parsed as JSON.
pub fn host_facts(annotations: &BTreeMap<String, String>) -> Value {
    serde_json::from_str(&annotations[HOST]).expect("the host annotation is JSON")
}

/// One testbed plus (optionally) a running streamd.
pub struct Env {
    pub tb: Testbed,
    pub dir: PathBuf,
    streamd: Option<Child>,
    /// The directory when the harness chose it; goes after the testbed.
    _scratch: Option<ScratchDir>,
}

impl Env {
    /// A fresh testbed in a scratch directory `e2e-<name>` on the default host.
    pub async fn new(name: &str) -> Env {
        Env::with_host(name, "default").await
    }

    /// A fresh testbed on host fixture `host`.
    pub async fn with_host(name: &str, host: &str) -> Env {
        Env::with_backend(name, host, testbed::Backend::RpmOstree).await
    }

    /// A fresh testbed on host fixture `host` whose update tool is `backend`.
    pub async fn with_backend(name: &str, host: &str, backend: testbed::Backend) -> Env {
        let scratch = scratch_dir("e2e", name);
        let tb = start_testbed(&scratch, host, backend).await;
        Env {
            tb,
            dir: scratch.to_path_buf(),
            streamd: None,
            _scratch: Some(scratch),
        }
    }

    /// A fresh testbed on host fixture `host` whose fake rpm-ostreed plays `version`.
    pub async fn with_rpm_ostree(
        name: &str,
        host: &str,
        version: testbed::RpmOstreeVersion,
    ) -> Env {
        Env::with_options(name, host, |o| o.rpm_ostree = version).await
    }

    /// A fresh testbed on host fixture `host` whose fake rpm-ostreed plays `version` and
    /// stages through real libostree 2025.x when [`real_libostree`] says it can.
    pub async fn with_rpm_ostree_over_libostree(
        name: &str,
        host: &str,
        version: testbed::RpmOstreeVersion,
    ) -> Env {
        let real = real_libostree(name);
        Env::with_options(name, host, |o| {
            o.rpm_ostree = version;
            o.real_libostree = real;
        })
        .await
    }

    /// A fresh testbed on host fixture `host` playing OpenShift `release`.
    pub async fn with_openshift(name: &str, host: &str, release: testbed::OpenShift) -> Env {
        Env::with_options(name, host, |o| o.openshift = release).await
    }

    /// A fresh testbed on host fixture `host` with the options `edit` sets.
    async fn with_options(name: &str, host: &str, edit: impl FnOnce(&mut Options)) -> Env {
        let scratch = scratch_dir("e2e", name);
        let mut opts = Options::new(scratch.to_path_buf());
        opts.host = host.to_string();
        edit(&mut opts);
        let tb = Testbed::start(opts).await.expect("testbed starts");
        Env {
            tb,
            dir: scratch.to_path_buf(),
            streamd: None,
            _scratch: Some(scratch),
        }
    }

    /// A fresh testbed on the default host in `dir`, a directory the caller chose (one other
    /// users can reach, for tests that run clients as them).
    pub async fn in_dir(dir: PathBuf) -> Env {
        let tb = start_testbed(&dir, "default", testbed::Backend::RpmOstree).await;
        Env {
            tb,
            dir,
            streamd: None,
            _scratch: None,
        }
    }

    /// `DIR/env` as a map.
    pub fn vars(&self) -> &BTreeMap<String, String> {
        self.tb.env()
    }

    pub fn rhel9(&self) -> String {
        self.vars()["TESTBED_RHEL9_IMAGE"].clone()
    }

    pub fn rhel10(&self) -> String {
        self.vars()["TESTBED_RHEL10_IMAGE"].clone()
    }

    /// The rhel-10 extensions image (`TESTBED_RHEL10_EXTENSIONS_IMAGE`).
    pub fn rhel10_extensions(&self) -> String {
        self.vars()["TESTBED_RHEL10_EXTENSIONS_IMAGE"].clone()
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.envs(self.vars()).env(
            "STREAMD_LOG",
            "debug,kube=info,hyper=info,zbus=info,tower=info",
        );
        c
    }

    /// Starts the real streamd binary against the testbed.
    pub fn start_streamd(&mut self) {
        self.start_streamd_with(&[]);
    }

    /// Starts streamd with extra environment variables.
    pub fn start_streamd_with(&mut self, extra_env: &[(&str, &str)]) {
        self.spawn_streamd(Path::new(env!("CARGO_BIN_EXE_streamd")), extra_env);
    }

    /// Starts the streamd binary at `program` (a copy installed on the host root) against the
    /// testbed.
    pub fn start_streamd_at(&mut self, program: &Path) {
        self.spawn_streamd(program, &[]);
    }

    fn spawn_streamd(&mut self, program: &Path, extra_env: &[(&str, &str)]) {
        assert!(self.streamd.is_none(), "streamd already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("streamd.log"))
            .expect("log file");
        // Through `sh -c exec` so WATCHDOG_PID can name streamd's own pid, as systemd sets it.
        let child = self
            .command("sh")
            .args(["-c", r#"WATCHDOG_PID=$$ exec "$0""#])
            .arg(program)
            .envs(extra_env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("streamd starts");
        self.streamd = Some(child);
    }

    /// Stops streamd with SIGTERM and returns its exit status.
    pub fn stop_streamd(&mut self) -> std::process::ExitStatus {
        let mut child = self.streamd.take().expect("streamd running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "streamd did not stop within 10 s of SIGTERM\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// streamd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("streamd.log")).unwrap_or_default()
    }

    /// Runs the real kubectl as the admin user.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.command("kubectl")
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// `kubectl annotate --overwrite node worker-0 k=v ... k-`.
    pub fn annotate(&self, pairs: &[&str]) {
        let mut args = vec!["annotate", "--overwrite", "node", testbed::NODE_NAME];
        args.extend_from_slice(pairs);
        let out = self.kubectl(&args);
        assert!(
            out.status.success(),
            "kubectl annotate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs streamctl.
    pub fn streamctl(&self, args: &[&str]) -> Output {
        self.streamctl_command(args)
            .output()
            .expect("streamctl runs")
    }

    /// `streamctl ARGS` against the testbed, not started yet.
    pub fn streamctl_command(&self, args: &[&str]) -> Command {
        let mut c = self.command(env!("CARGO_BIN_EXE_streamctl"));
        c.args(args);
        c
    }

    /// The node's annotations, read through the fake's control API.
    pub async fn annotations(&self) -> BTreeMap<String, String> {
        let v = self
            .tb
            .control(ApiServerCmd::NodeAnnotations)
            .await
            .expect("node-annotations");
        serde_json::from_value(v).expect("annotation map")
    }

    /// Polls until `pred` holds for the annotations; returns them. Panics with the log on timeout.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let a = self.annotations().await;
            if pred(&a) {
                return a;
            }
            // A streamd that died says so at once, not as a timeout.
            if self.streamd_exited() {
                panic!(
                    "streamd exited while waiting for {what}; annotations: {a:#?}\nstreamd log:\n{}",
                    self.log()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; annotations: {a:#?}\nstreamd log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// streamd was started and has exited since (a zombie until `stop_streamd` reaps it).
    fn streamd_exited(&self) -> bool {
        let Some(child) = &self.streamd else {
            return false;
        };
        match std::fs::read_to_string(format!("/proc/{}/stat", child.id())) {
            // The state follows the parenthesised command name.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => true,
        }
    }

    /// Waits for `state`.
    pub async fn wait_state(&self, state: &str) -> BTreeMap<String, String> {
        self.wait_for(&format!("state {state}"), Duration::from_secs(90), |a| {
            a.get(STATE).map(String::as_str) == Some(state)
        })
        .await
    }

    /// Control command to the fake rpm-ostreed.
    pub async fn rpmostreed(&self, cmd: RpmOstreedCmd) -> Value {
        self.tb.control(cmd).await.expect("rpmostreed control")
    }

    /// Control command to the fake API server.
    pub async fn apiserver(&self, cmd: ApiServerCmd) -> Value {
        self.tb.control(cmd).await.expect("apiserver control")
    }

    /// Transactions the fake rpm-ostreed recorded.
    pub async fn transactions(&self) -> Vec<Value> {
        let v = self.rpmostreed(RpmOstreedCmd::Transactions).await;
        v.as_array().cloned().expect("transactions is a list")
    }

    /// Requests `stream` with OS image `os` and, if given, extensions image `ext`, in one
    /// annotate.
    pub fn request(&self, stream: &str, os: &str, ext: Option<&str>) {
        let mut pairs = vec![
            format!("{DESIRED_STREAM}={stream}"),
            format!("{DESIRED_OS_IMAGE}={os}"),
        ];
        if let Some(e) = ext {
            pairs.push(format!("{DESIRED_EXTENSIONS_IMAGE}={e}"));
        }
        let refs: Vec<&str> = pairs.iter().map(String::as_str).collect();
        self.annotate(&refs);
    }

    /// Requests the rhel-10 image.
    pub fn request_rhel10(&self) {
        self.request("rhel-10", &self.rhel10(), None);
    }

    /// Adds the rhel-10 extensions image to the request (an annotate of its own).
    pub fn request_rhel10_extensions(&self) {
        let ext = self.rhel10_extensions();
        self.annotate(&[&format!("{DESIRED_EXTENSIONS_IMAGE}={ext}")]);
    }

    /// Withdraws the request: removes the desired stream and OS image annotations.
    pub fn withdraw_request(&self) {
        self.annotate(&[
            &format!("{DESIRED_STREAM}-"),
            &format!("{DESIRED_OS_IMAGE}-"),
        ]);
    }

    /// The fake systemd's units (what ran in transient units so far).
    pub async fn systemd_units(&self) -> Value {
        self.tb.control(SystemdCmd::Units).await.expect("units")
    }
}

/// The reboot handshake and restarts.
impl Env {
    /// Adds a streamd config drop-in (applied at the next start).
    pub fn config(&self, name: &str, text: &str) {
        std::fs::write(self.dir.join("config.d").join(name), text).expect("config drop-in");
    }

    /// Allows images from the registries `hosts` besides the testbed's (`allowed-repositories`,
    /// applied at the next start): for a test that asks for an image elsewhere to see what
    /// streamd makes of that registry, which the default image policy would refuse unread.
    pub fn allow_registries(&self, hosts: &[&str]) {
        let mut all = vec![self.tb.registry().host().to_string()];
        all.extend(hosts.iter().map(|h| h.to_string()));
        self.config(
            "60-allowed-repositories.toml",
            &format!("allowed-repositories = {all:?}\n"),
        );
    }

    /// Whether streamd is running (started by this harness and not exited).
    pub fn streamd_running(&mut self) -> bool {
        self.streamd
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills streamd with SIGKILL (a crash) and reaps it. A streamd that already exited on its
    /// own is a failure of the test, not something to reap quietly.
    pub fn kill_streamd(&mut self) {
        if let Some(mut c) = self.streamd.take() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("streamd exited on its own ({status})\n{}", self.log());
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A reboot of the host: streamd is stopped as a shutdown stops it (SIGTERM), the testbed
    /// applies an unlocked staged deployment (or discards it), and the boot id changes. streamd
    /// is not started again; call `start_streamd`.
    pub async fn reboot(&mut self, fail_finalize: bool) -> Value {
        if self.streamd.is_some() {
            assert!(
                self.streamd_running(),
                "streamd exited on its own before the reboot\n{}",
                self.log()
            );
            self.stop_streamd();
        }
        self.tb
            .reboot(fail_finalize)
            .await
            .expect("simulated reboot")
    }

    /// Reboots applying the staged deployment, starts streamd again and waits for `Done` on
    /// rhel-10 (current image and stream checked); returns the annotations.
    pub async fn reboot_into_rhel10(&mut self) -> BTreeMap<String, String> {
        let out = self.reboot(false).await;
        assert_eq!(out["applied"], json!(true), "{out}");
        self.start_streamd();
        let done = self.wait_state("Done").await;
        assert_eq!(done[CURRENT_OS_IMAGE], self.rhel10());
        assert_eq!(done[CURRENT_STREAM], "rhel-10");
        done
    }

    /// Whether the fake rpm-ostreed was asked to reboot (`FinalizeDeployment` succeeded).
    pub fn reboot_initiated(&self) -> bool {
        // Written atomically by the fake (temporary file, rename): never seen half-written.
        let text = std::fs::read_to_string(self.dir.join("rpmostreed/state.json"))
            .expect("the fake's state.json");
        let state: Value = serde_json::from_str(&text).expect("state.json is JSON");
        state["reboot_requested"] == json!(true)
    }

    /// Reasons of the Events posted so far, oldest first.
    pub fn event_reasons(&self) -> Vec<String> {
        let out = self.kubectl(&["get", "events", "-o", "json"]);
        let events: Value = serde_json::from_slice(&out.stdout).expect("events JSON");
        events["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["reason"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Runs kubectl as the admin and fails the test, with kubectl's stderr, unless it succeeds.
    pub fn kubectl_ok(&self, args: &[&str]) {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Merge-patches the OSImageStream's status subresource, as the machine-config operator
    /// writes it.
    pub fn patch_streams_status(&self, patch: &str) {
        self.kubectl_ok(&[
            "patch",
            "osimagestream",
            "cluster",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ]);
    }

    /// Waits for `Staged` with a reboot request; returns the annotations.
    pub async fn wait_reboot_request(&self) -> BTreeMap<String, String> {
        self.wait_for(
            "staged with a reboot request",
            Duration::from_secs(90),
            |a| {
                a.get(STATE).map(String::as_str) == Some("Staged")
                    && a.contains_key(REBOOT_REQUESTED)
            },
        )
        .await
    }

    /// Waits for a reboot request and approves it; returns the token.
    pub async fn approve_reboot(&self) -> String {
        let a = self
            .wait_for("a reboot request", Duration::from_secs(90), |a| {
                a.contains_key(REBOOT_REQUESTED)
            })
            .await;
        let token = a[REBOOT_REQUESTED].clone();
        self.annotate(&[&format!("{REBOOT_APPROVED}={token}")]);
        token
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.streamd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Pushes a one-layer image (an os-release only) with `labels` to the testbed registry; returns
/// its pullspec.
pub async fn push_os(env: &Env, tag: &str, labels: &[(&str, &str)]) -> String {
    let labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let files = vec![("usr/lib/os-release".into(), b"ID=rhcos\n".to_vec())];
    let (pullspec, _) = env
        .tb
        .registry()
        .push_custom(tag, labels, files)
        .await
        .expect("push");
    pullspec
}

/// `streamctl preflight --json` for stream rhel-10 on `os`, with `extensions` if given.
pub fn preflight_rhel10(env: &Env, os: &str, extensions: Option<&str>) -> Output {
    let mut args = vec![
        "preflight",
        "--json",
        "--stream",
        "rhel-10",
        "--os-image",
        os,
    ];
    if let Some(ext) = extensions {
        args.extend(["--extensions-image", ext]);
    }
    env.streamctl(&args)
}

/// The rows (field names, description) of the first table after the line of docs/protocol.md that
/// contains `after`; a row naming several fields (`` `a`, `b` ``) gives each.
pub fn documented_fields(after: &str) -> Vec<(String, String)> {
    let doc = include_str!("../../docs/protocol.md");
    let Some(start) = doc.find(after) else {
        panic!("docs/protocol.md has no {after:?}");
    };
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .flat_map(|row| {
            let mut cells = row.split('|').skip(1);
            let names = cells.next().unwrap_or_default().to_string();
            let what = cells.next().unwrap_or_default().trim().to_string();
            backticked(&names)
                .into_iter()
                .map(move |n| (n, what.clone()))
        })
        .collect()
}

/// The `` `quoted` `` words of `text`.
pub fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// Checks that the keys of `object` are the documented fields: none undocumented, and every
/// documented one present unless its description says it may be absent.
pub fn assert_documented(object: &Value, fields: &[(String, String)], what: &str) {
    let keys: Vec<&String> = object
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {object}"))
        .keys()
        .collect();
    for k in &keys {
        assert!(
            fields.iter().any(|(n, _)| n == *k),
            "{what}: `{k}` is not in docs/protocol.md"
        );
    }
    for (name, description) in fields {
        assert!(
            keys.contains(&name) || description.contains("absent when"),
            "{what}: docs/protocol.md lists `{name}`, the output has no such key: {object}"
        );
    }
}

/// The argv of every `bootc` command line in `units` (the testbed's systemd units), in order:
/// `bootc` is the program path the testbed gave (`TESTBED_BOOTC`).
pub fn bootc_argvs(units: &Value, bootc: &Value) -> Vec<Value> {
    units
        .as_array()
        .expect("units")
        .iter()
        .flat_map(|u| {
            u["spec"]["exec_start"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|line| line[1].clone())
        .filter(|argv| argv[0] == *bootc)
        .collect()
}
