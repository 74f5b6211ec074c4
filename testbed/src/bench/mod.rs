//! `testbed bench`: figures for docs/performance.md, printed and written as JSON.
//!
//! Measured, never asserted: reaction time from a node patch to `UpdateDeployment` reaching
//! rpm-ostreed (seen by a bus monitor) next to the delivery of the same patch to a bare
//! `kubectl get node -w`; streamd's RSS, CPU and API requests after an idle minute; node patches
//! per minute while the fake emits 1000 progress signals per second; what one migration to
//! rhel-10 (request, staging, approval, reboot, `Done`) costs in registry GETs and bytes, image
//! imports and transactions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use streamd::cluster::protocol::{
    DESIRED_OS_IMAGE, DESIRED_STREAM, REASON, REBOOT_APPROVED, REBOOT_REQUESTED, STATE,
};

use crate::control::{ApiServerCmd, RpmOstreedCmd};
use crate::harness::testbed::{NODE_NAME, Options, Testbed};

pub mod fleet;
pub mod strategy;

/// How long a staged migration is watched before the approval: a re-pull loop (cleanup and
/// stage again) shows up as more transactions, imports and registry GETs.
const STAGED_WATCH: Duration = Duration::from_secs(10);
const STREAMD_USER: &str = "system:node:worker-0";

/// Bench parameters.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Testbed directory.
    pub dir: PathBuf,
    /// The streamd binary.
    pub streamd: PathBuf,
    /// Number of patches for the reaction-time figure.
    pub patches: usize,
    /// Idle period for RSS, CPU and request counts.
    pub idle: Duration,
    /// Length of the progress storm.
    pub storm: Duration,
}

/// Runs the benchmark and returns the figures.
pub async fn run(opts: &BenchOptions) -> anyhow::Result<Value> {
    let tb = Testbed::start(Options::new(opts.dir.clone())).await?;
    let mut streamd = spawn_streamd(&tb, &opts.streamd)?;
    let result = measure(&tb, &mut streamd, opts).await;
    let _ = streamd.kill().await;
    result
}

async fn measure(tb: &Testbed, streamd: &mut Child, opts: &BenchOptions) -> anyhow::Result<Value> {
    wait_state(tb, "Idle", Duration::from_secs(30)).await?;
    let pid = streamd.id().context("streamd exited")?;
    let api = ApiClient::new(tb).await?;

    // Reaction time.
    let monitor = UpdateMonitor::start(tb.env()["DBUS_SYSTEM_BUS_ADDRESS"].as_str()).await?;
    let watch = KubectlWatch::start(tb).await?;
    // Distinct bootable rhel-10 images that pass preflight; the fake rpm-ostreed does not know
    // them, so each transaction fails fast after UpdateDeployment arrived.
    let mut images = Vec::new();
    for i in 0..opts.patches {
        let labels = std::collections::BTreeMap::from([
            ("containers.bootc".to_string(), "1".to_string()),
            (
                "io.openshift.os.streamclass".to_string(),
                "rhel-10".to_string(),
            ),
            ("ostree.linux".to_string(), tb.images()[1].kernel.clone()),
        ]);
        let files = vec![("etc/bench".to_string(), format!("{i}").into_bytes())];
        let (pullspec, _) = tb
            .registry()
            .push_custom(&format!("bench-{i}"), labels, files)
            .await?;
        images.push(pullspec);
    }
    let mut react = Vec::new();
    let mut deliver = Vec::new();
    for image in images {
        let t0 = api
            .patch_annotations(&json!({ DESIRED_STREAM: "rhel-10", DESIRED_OS_IMAGE: image }))
            .await?;
        let seen_update = monitor.wait_for(&image, Duration::from_secs(10)).await?;
        let seen_watch = watch.wait_for(&image, Duration::from_secs(10)).await?;
        react.push(seen_update.duration_since(t0));
        deliver.push(seen_watch.duration_since(t0));
        // The unknown image fails fast; wait for its verdict so the next patch is a new request.
        let digest = image.rsplit(':').next().unwrap_or_default();
        wait_annotations(tb, Duration::from_secs(10), |a| {
            a.get(STATE).and_then(Value::as_str) == Some("Degraded")
                && a.get(REASON)
                    .and_then(Value::as_str)
                    .is_some_and(|r| r.contains(digest))
        })
        .await?;
    }
    drop(watch);

    // Idle: no request, one minute.
    api.patch_annotations(&json!({ DESIRED_STREAM: null, DESIRED_OS_IMAGE: null }))
        .await?;
    wait_state(tb, "Idle", Duration::from_secs(10)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = requests_by(tb, STREAMD_USER).await?;
    let cpu0 = cpu_ticks(pid)?;
    tokio::time::sleep(opts.idle).await;
    let cpu1 = cpu_ticks(pid)?;
    let after = requests_by(tb, STREAMD_USER).await?;
    let rss_kib = status_kib(pid, "VmRSS")?;
    let rss_anon_kib = status_kib(pid, "RssAnon")?;
    let rss_file_kib = status_kib(pid, "RssFile")?;
    let idle_requests: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let idle_cpu_pct = (cpu1 - cpu0) as f64 / ticks_per_s / opts.idle.as_secs_f64() * 100.0;

    // Progress storm: 1000 signals per second for `storm`.
    let signals =
        u32::try_from((opts.storm.as_secs() * 1000).max(1000)).context("the storm is too long")?;
    tb.control(RpmOstreedCmd::Progress {
        signals,
        per_second: 1000,
    })
    .await?;
    let patches0 = requests_by(tb, STREAMD_USER)
        .await?
        .get("patch")
        .copied()
        .unwrap_or(0);
    let served0 = registry_served(tb)?;
    let txns0 = transactions(tb).await?.len();
    let t0 = Instant::now();
    let rhel10 = tb.images()[1].pullspec.clone();
    api.patch_annotations(&json!({ DESIRED_STREAM: "rhel-10", DESIRED_OS_IMAGE: rhel10 }))
        .await?;
    wait_state(tb, "Staged", opts.storm + Duration::from_secs(60)).await?;
    let storm_s = t0.elapsed().as_secs_f64();
    let patches1 = requests_by(tb, STREAMD_USER)
        .await?
        .get("patch")
        .copied()
        .unwrap_or(0);
    let storm_patches = patches1 - patches0;

    // The rest of that migration: watched while staged, approved, rebooted, `Done`.
    tokio::time::sleep(STAGED_WATCH).await;
    let a = tb.control(ApiServerCmd::NodeAnnotations).await?;
    let token = a
        .get(REBOOT_REQUESTED)
        .and_then(Value::as_str)
        .context("no reboot-requested token while staged")?
        .to_string();
    api.patch_annotations(&json!({ REBOOT_APPROVED: token }))
        .await?;
    // The fake marks the reboot once `FinalizeDeployment` unlocked the deployment.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !transactions(tb)
        .await?
        .iter()
        .any(|t| t["method"] == "FinalizeDeployment" && t["reboot_requested"] == true)
    {
        if Instant::now() > deadline {
            bail!("no FinalizeDeployment asked for a reboot within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = streamd.kill().await;
    let _ = streamd.wait().await;
    tb.reboot(false).await?;
    *streamd = spawn_streamd(tb, &opts.streamd)?;
    wait_state(tb, "Done", Duration::from_secs(60)).await?;
    let migration_s = t0.elapsed().as_secs_f64();
    let served = registry_served(tb)?.since(&served0);
    let txns = transactions(tb).await?;
    let new_txns = txns.get(txns0..).unwrap_or_default();
    let count = |method: &str| {
        new_txns
            .iter()
            .filter(|t| t["method"] == method && t["started"] == true)
            .count()
    };
    let imports = new_txns.iter().filter(|t| t["pulled"] == true).count();

    let (r50, r99) = (percentile(&react, 50.0), percentile(&react, 99.0));
    let (d50, d99) = (percentile(&deliver, 50.0), percentile(&deliver, 99.0));
    Ok(json!({
        "reaction": {
            "patches": opts.patches,
            "streamd_update_deployment_ms": { "p50": r50, "p99": r99 },
            "kubectl_watch_delivery_ms": { "p50": d50, "p99": d99 },
            "p99_ratio": if d99 > 0.0 { r99 / d99 } else { 0.0 },
        },
        "idle": {
            "seconds": opts.idle.as_secs(),
            "rss_kib": rss_kib,
            "rss_anon_kib": rss_anon_kib,
            "rss_file_kib": rss_file_kib,
            "cpu_percent": idle_cpu_pct,
            "api_requests": idle_requests,
            "api_requests_by_verb": diff(&before, &after),
        },
        "migration": {
            "seconds": migration_s,
            "staged_watch_seconds": STAGED_WATCH.as_secs(),
            "registry_manifest_gets": served.manifest_gets,
            "registry_blob_gets": served.blob_gets,
            "registry_bytes": served.bytes,
            "image_imports": imports,
            "update_deployments": count("UpdateDeployment"),
            "cleanups": count("Cleanup"),
            "finalize_deployments": count("FinalizeDeployment"),
        },
        "progress_storm": {
            "signals_per_second": 1000,
            "seconds": storm_s,
            "node_patches": storm_patches,
            "node_patches_per_minute": storm_patches as f64 / storm_s * 60.0,
        },
    }))
}

/// What the testbed registry served: GETs of manifests and blobs and their bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Served {
    manifest_gets: u64,
    blob_gets: u64,
    bytes: u64,
}

impl Served {
    fn since(&self, before: &Served) -> Served {
        Served {
            manifest_gets: self.manifest_gets - before.manifest_gets,
            blob_gets: self.blob_gets - before.blob_gets,
            bytes: self.bytes - before.bytes,
        }
    }
}

/// Counted from the registry's log: distribution logs every response ("response completed")
/// with its method, URI and `http.response.written` bytes.
fn registry_served(tb: &Testbed) -> anyhow::Result<Served> {
    let path = tb.registry().dir().join("registry").join("registry.log");
    let log =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut s = Served::default();
    for line in log.lines().filter(|l| {
        l.contains("msg=\"response completed\"") && l.contains("http.request.method=GET")
    }) {
        let uri = log_field(line, "http.request.uri=");
        if uri.contains("/manifests/") {
            s.manifest_gets += 1;
        } else if uri.contains("/blobs/") {
            s.blob_gets += 1;
        } else {
            continue;
        }
        s.bytes += log_field(line, "http.response.written=")
            .parse::<u64>()
            .unwrap_or(0);
    }
    Ok(s)
}

/// The value of `key` (which ends in `=`) in a logfmt line, unquoted.
fn log_field<'a>(line: &'a str, key: &str) -> &'a str {
    let Some((_, rest)) = line.split_once(key) else {
        return "";
    };
    match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next().unwrap_or_default(),
        None => rest.split(' ').next().unwrap_or_default(),
    }
}

async fn transactions(tb: &Testbed) -> anyhow::Result<Vec<Value>> {
    let t = tb.control(RpmOstreedCmd::Transactions).await?;
    Ok(t.as_array().cloned().unwrap_or_default())
}

fn diff(a: &HashMap<String, u64>, b: &HashMap<String, u64>) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in b {
        let d = v - a.get(k).copied().unwrap_or(0);
        if d > 0 {
            m.insert(k.clone(), json!(d));
        }
    }
    Value::Object(m)
}

fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    let idx = ((p / 100.0) * (ms.len() - 1) as f64).round() as usize;
    (ms[idx.min(ms.len() - 1)] * 100.0).round() / 100.0
}

fn spawn_streamd(tb: &Testbed, bin: &Path) -> anyhow::Result<Child> {
    let log = std::fs::File::create(tb.dir().join("streamd.log"))?;
    Command::new(bin)
        .envs(tb.env())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

async fn wait_state(tb: &Testbed, state: &str, timeout: Duration) -> anyhow::Result<()> {
    wait_annotations(tb, timeout, |a| {
        a.get(STATE).and_then(Value::as_str) == Some(state)
    })
    .await
    .with_context(|| format!("waiting for state {state}"))
}

async fn wait_annotations(
    tb: &Testbed,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let a = tb.control(ApiServerCmd::NodeAnnotations).await?;
        if pred(&a) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not reached within {timeout:?}: {a}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn requests_by(tb: &Testbed, user: &str) -> anyhow::Result<HashMap<String, u64>> {
    let s = tb.control(ApiServerCmd::STATS).await?;
    Ok(serde_json::from_value(s["by_user"][user].clone()).unwrap_or_default())
}

fn proc_status(pid: u32) -> anyhow::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc/PID/status")
}

/// `x` rounded to hundredths (the benches' figures).
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A `/proc/PID/status` figure in KiB (pub(crate) for the fleet bench, testbed/src/bench/fleet.rs).
pub(crate) fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    proc_status(pid)?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no {field} in /proc/PID/status"))
}

/// utime + stime of `pid` in clock ticks (pub(crate) for the fleet bench).
pub(crate) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(n(11) + n(12))
}

/// A bus monitor that timestamps every `UpdateDeployment` call by the image it asks for.
struct UpdateMonitor {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl UpdateMonitor {
    async fn start(address: &str) -> anyhow::Result<Self> {
        let conn = zbus::connection::Builder::address(address)?.build().await?;
        let rule = "type='method_call',interface='org.projectatomic.rpmostree1.OS',member='UpdateDeployment'";
        conn.call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus.Monitoring"),
            "BecomeMonitor",
            &(vec![rule], 0u32),
        )
        .await
        .context("BecomeMonitor")?;
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            let mut stream = zbus::MessageStream::from(&conn);
            while let Some(Ok(msg)) = stream.next().await {
                let at = Instant::now();
                let body = msg.body();
                type Dict = HashMap<String, zbus::zvariant::OwnedValue>;
                if let Ok((modifiers, _)) = body.deserialize::<(Dict, Dict)>()
                    && let Some(v) = modifiers.get("set-refspec")
                    && let Ok(r) = String::try_from(v.clone())
                {
                    let image = r
                        .rsplit_once("registry:")
                        .map(|(_, i)| i.to_string())
                        .unwrap_or(r);
                    s.lock().await.entry(image).or_insert(at);
                }
            }
        });
        Ok(UpdateMonitor { seen })
    }

    async fn wait_for(&self, image: &str, timeout: Duration) -> anyhow::Result<Instant> {
        wait_seen(&self.seen, image, timeout, "UpdateDeployment").await
    }
}

async fn wait_seen(
    seen: &Mutex<HashMap<String, Instant>>,
    key: &str,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = seen.lock().await.get(key) {
            return Ok(*t);
        }
        if Instant::now() > deadline {
            bail!("no {what} for {key} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// A bare `kubectl get node -w`, timestamping each desired-os-image value it prints.
struct KubectlWatch {
    _child: Child,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl KubectlWatch {
    async fn start(tb: &Testbed) -> anyhow::Result<Self> {
        let mut child = Command::new("kubectl")
            .envs(tb.env())
            .args([
                "get",
                "node",
                NODE_NAME,
                "-w",
                "-o",
                r"jsonpath={.metadata.annotations.osstream\.openshift\.io/desired-os-image}{'\n'}",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting kubectl get node -w")?;
        let out = child.stdout.take().context("kubectl stdout")?;
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let at = Instant::now();
                s.lock().await.entry(line.trim().to_string()).or_insert(at);
            }
        });
        // The first line is the current state; give kubectl time to open its watch.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(KubectlWatch {
            _child: child,
            seen,
        })
    }

    async fn wait_for(&self, image: &str, timeout: Duration) -> anyhow::Result<Instant> {
        wait_seen(&self.seen, image, timeout, "kubectl watch line").await
    }
}

/// A minimal admin client for the fake API server (bearer token, HTTP/1.1, reconnects when the
/// server closed the connection).
struct ApiClient {
    sender: Mutex<Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>,
    tls: tokio_rustls::TlsConnector,
    token: String,
    authority: String,
}

impl ApiClient {
    async fn new(tb: &Testbed) -> anyhow::Result<Self> {
        let url = tb.env()["TESTBED_API_URL"].clone();
        let authority = url
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let ca = std::fs::read(tb.dir().join("pki/ca.crt"))?;
        let token = std::fs::read_to_string(tb.dir().join("pki/admin-token"))?
            .trim()
            .to_string();
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&ca) {
            roots.add(cert?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(ApiClient {
            sender: Mutex::new(None),
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            token,
            authority,
        })
    }

    async fn connect(
        &self,
    ) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
        let tcp = tokio::net::TcpStream::connect(&self.authority).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
        let tls = self.tls.connect(name, tcp).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }

    /// Patches the node's annotations; returns when the request was sent (after the connection
    /// was ready, so connection handling is not part of the measured time).
    async fn patch_annotations(&self, annotations: &Value) -> anyhow::Result<Instant> {
        let body = json!({"metadata": {"annotations": annotations}}).to_string();
        let req = hyper::Request::patch(format!("/api/v1/nodes/{NODE_NAME}"))
            .header("host", &self.authority)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/merge-patch+json")
            .body(Full::new(Bytes::from(body)))?;
        let mut slot = self.sender.lock().await;
        let ready = match slot.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !ready {
            *slot = Some(self.connect().await?);
        }
        let sender = slot.as_mut().context("no API connection")?;
        sender.ready().await.context("API connection")?;
        let sent = Instant::now();
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let _ = resp.into_body().collect().await?;
        if !status.is_success() {
            bail!("patch failed: {status}");
        }
        Ok(sent)
    }
}
