//! Shared harness for the testbed's tests that drive the fake API server with the real
//! `kubectl`: a fresh directory and server per test, and `kubectl` runs against it.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::fakes::apiserver::{ApiServer, ApiServerConfig};
use testbed::scratch::ScratchDir;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdout, Command};

/// The node the API server serves.
pub const NODE: &str = "worker-0";

/// What one `kubectl` run printed, and whether it succeeded.
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// A fresh scratch directory `<prefix>-<test>` with an API server for `NODE` started in it.
pub async fn start_apiserver(prefix: &str, test: &str) -> (ScratchDir, ApiServer) {
    let dir = ScratchDir::new(&format!("{prefix}-{test}")).expect("scratch dir");
    let server = ApiServer::start(ApiServerConfig {
        dir: dir.to_path_buf(),
        node_name: NODE.into(),
    })
    .await
    .expect("start apiserver");
    (dir, server)
}

/// The real `kubectl` with `args` and `KUBECONFIG=kubeconfig`, its cache and home in `dir`,
/// stdin closed and killed on drop.
pub fn kubectl_command(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", dir.join("kube-cache"))
        .env("HOME", dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `kubectl_command(dir, kubeconfig, args)` to its end, within 60 s.
pub async fn run_kubectl(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Out {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        kubectl_command(dir, kubeconfig, args).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
    .expect("run kubectl");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A running `kubectl -w` and what it printed so far.
pub struct Watch {
    pub child: Child,
    stdout: ChildStdout,
    buf: Vec<u8>,
    pub seen: String,
}

impl Watch {
    /// Spawns `kubectl_command(dir, kubeconfig, args)` with stdout and stderr piped.
    pub fn spawn(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Watch {
        let mut child = kubectl_command(dir, kubeconfig, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl -w");
        let stdout = child.stdout.take().expect("stdout");
        Watch {
            child,
            stdout,
            buf: vec![0u8; 64 * 1024],
            seen: String::new(),
        }
    }

    /// The JSON values printed so far, up to the first incomplete one.
    pub fn events(&self) -> Vec<Value> {
        serde_json::Deserializer::from_str(&self.seen)
            .into_iter::<Value>()
            .map_while(Result::ok)
            .collect()
    }

    /// Waits until `deadline` for more output; panics if kubectl exits, the read fails or the
    /// time runs out.
    pub async fn read_more(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = &mut self.seen;
        match tokio::time::timeout(left, self.stdout.read(&mut self.buf)).await {
            Ok(Ok(0)) => panic!("kubectl -w exited; output: {seen}"),
            Ok(Ok(n)) => seen.push_str(&String::from_utf8_lossy(&self.buf[..n])),
            Ok(Err(e)) => panic!("reading kubectl output: {e}"),
            Err(_) => panic!("no change within 30s; output: {seen}"),
        }
    }
}
