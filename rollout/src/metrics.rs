//! What the controller exposes on its metrics port (`--metrics-bind-address`): Prometheus
//! metrics at `/metrics` (text format 0.0.4), `/healthz` (the process serves) and `/readyz` (it
//! joined the leader election, or runs without one). A minimal HTTP/1.1 server: one request
//! per connection, GET only, bounded reads.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::planner::Summary;

/// One pool's gauges, from its last reconcile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pool {
    /// `Updated`, `Updating`, `Degraded`, `Paused` or a stall reason.
    phase: String,
    /// Nodes by step (`Updated`, and the progress steps).
    steps: BTreeMap<String, usize>,
    draining: usize,
    drain_timeouts: usize,
    evictions_blocked: usize,
    reconcile_errors: u64,
}

/// The controller's metrics (shared by the reconciles and the server).
#[derive(Debug, Default)]
pub struct Metrics {
    pools: Mutex<BTreeMap<String, Pool>>,
    leader: AtomicBool,
    ready: AtomicBool,
}

impl Metrics {
    /// Records a pool's reconcile: its `phase` (the `Updating` condition's reason, or
    /// `Degraded`/`Paused`/`Updated`), the planner's summary and the drains blocked.
    pub fn pool(&self, name: &str, phase: &str, summary: &Summary, blocked: usize) {
        let mut steps: BTreeMap<String, usize> = BTreeMap::new();
        for p in &summary.progress {
            *steps.entry(p.step.to_string()).or_default() += 1;
        }
        steps.insert("Updated".into(), summary.updated);
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let entry = pools.entry(name.to_string()).or_default();
        *entry = Pool {
            phase: phase.to_string(),
            steps,
            draining: summary.draining.len(),
            drain_timeouts: summary.timed_out.len(),
            evictions_blocked: blocked,
            reconcile_errors: entry.reconcile_errors,
        };
    }

    /// Counts a failed reconcile of `pool`.
    pub fn reconcile_failed(&self, pool: &str) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.entry(pool.to_string()).or_default().reconcile_errors += 1;
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &str) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.remove(pool);
    }

    /// Whether this replica leads (a leader is ready too).
    pub fn set_leader(&self, leading: bool) {
        self.leader.store(leading, Ordering::Relaxed);
        if leading {
            self.set_ready();
        }
    }

    /// `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in rows {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let per_pool = |f: &dyn Fn(&Pool) -> String| -> Vec<(String, String)> {
            pools
                .iter()
                .map(|(n, p)| (format!("{{pool=\"{}\"}}", label(n)), f(p)))
                .collect()
        };
        family(
            "streamd_rollout_pool_phase",
            "gauge",
            "1 for the pool's phase (the Updating condition's reason, or Updated, Degraded, Paused).",
            pools
                .iter()
                .map(|(n, p)| {
                    let labels = format!("{{pool=\"{}\",phase=\"{}\"}}", label(n), label(&p.phase));
                    (labels, "1".to_string())
                })
                .collect(),
        );
        family(
            "streamd_rollout_pool_nodes",
            "gauge",
            "The pool's nodes by step.",
            pools
                .iter()
                .flat_map(|(n, p)| {
                    p.steps.iter().map(move |(s, c)| {
                        let labels = format!("{{pool=\"{}\",step=\"{}\"}}", label(n), label(s));
                        (labels, c.to_string())
                    })
                })
                .collect(),
        );
        family(
            "streamd_rollout_drains",
            "gauge",
            "Nodes being drained within their timeout.",
            per_pool(&|p| p.draining.to_string()),
        );
        family(
            "streamd_rollout_drain_timeouts",
            "gauge",
            "Nodes whose drain ran past drain.timeoutSeconds.",
            per_pool(&|p| p.drain_timeouts.to_string()),
        );
        family(
            "streamd_rollout_evictions_blocked",
            "gauge",
            "Drains held by pods not yet evicted (a PodDisruptionBudget, a pod still terminating).",
            per_pool(&|p| p.evictions_blocked.to_string()),
        );
        family(
            "streamd_rollout_reconcile_errors_total",
            "counter",
            "Failed reconciles.",
            per_pool(&|p| p.reconcile_errors.to_string()),
        );
        let leader = u8::from(self.leader.load(Ordering::Relaxed));
        family(
            "streamd_rollout_leader",
            "gauge",
            "1 while this replica holds the leader lease.",
            vec![(String::new(), leader.to_string())],
        );
        out
    }

    /// The status line and body for a request line (`GET /metrics HTTP/1.1`).
    fn answer(&self, request_line: &str) -> (&'static str, String) {
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next(), parts.next());
        if method != Some("GET") {
            return ("405 Method Not Allowed", "GET only\n".into());
        }
        match path.map(|p| p.split('?').next().unwrap_or(p)) {
            Some("/metrics") => ("200 OK", self.render()),
            Some("/healthz") => ("200 OK", "ok\n".into()),
            Some("/readyz") if self.ready.load(Ordering::Relaxed) => ("200 OK", "ok\n".into()),
            Some("/readyz") => ("503 Service Unavailable", "not ready\n".into()),
            _ => ("404 Not Found", "not found\n".into()),
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
    pub async fn serve(self: std::sync::Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                    let mut len = 0;
                    while len < buf.len() {
                        match stream.read(&mut buf[len..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => len += n,
                        }
                        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    len
                })
                .await
                .unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..read]);
                let (status, body) = me.answer(text.lines().next().unwrap_or_default());
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    }
}

/// A label value as the text format wants it (backslash, quote and newline escaped).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::Progress;

    fn summary() -> Summary {
        Summary {
            updated: 2,
            draining: vec!["w3".into()],
            timed_out: vec!["w4".into()],
            progress: vec![
                Progress {
                    name: "w3".into(),
                    step: "Draining",
                    since: None,
                    reason: String::new(),
                },
                Progress {
                    name: "w4".into(),
                    step: "Draining",
                    since: None,
                    reason: String::new(),
                },
            ],
            ..Summary::default()
        }
    }

    #[test]
    fn metrics_render_the_pools_in_the_text_format() {
        let m = Metrics::default();
        m.pool("worker", "DrainTimeout", &summary(), 1);
        m.reconcile_failed("worker");
        m.reconcile_failed("wei\"rd");
        m.set_leader(true);
        let text = m.render();
        for line in [
            "streamd_rollout_pool_phase{pool=\"worker\",phase=\"DrainTimeout\"} 1",
            "streamd_rollout_pool_nodes{pool=\"worker\",step=\"Draining\"} 2",
            "streamd_rollout_pool_nodes{pool=\"worker\",step=\"Updated\"} 2",
            "streamd_rollout_drains{pool=\"worker\"} 1",
            "streamd_rollout_drain_timeouts{pool=\"worker\"} 1",
            "streamd_rollout_evictions_blocked{pool=\"worker\"} 1",
            "streamd_rollout_reconcile_errors_total{pool=\"worker\"} 1",
            "streamd_rollout_reconcile_errors_total{pool=\"wei\\\"rd\"} 1",
            "# TYPE streamd_rollout_reconcile_errors_total counter",
            "streamd_rollout_leader 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        // A reconcile keeps the error count; forgetting the pool drops it.
        m.pool("worker", "Updated", &Summary::default(), 0);
        assert!(
            m.render()
                .contains("streamd_rollout_reconcile_errors_total{pool=\"worker\"} 1")
        );
        m.forget("worker");
        assert!(!m.render().contains("pool=\"worker\""));
    }

    #[tokio::test]
    async fn the_endpoints_answer_over_http() {
        let m = std::sync::Arc::new(Metrics::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(m.clone().serve(listener));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200 OK"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        m.set_ready();
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200 OK"));
        let metrics = get("/metrics").await;
        assert!(metrics.contains("streamd_rollout_leader 0"), "{metrics}");
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
