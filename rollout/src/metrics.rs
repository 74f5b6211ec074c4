//! What the controller exposes on its metrics port (`--metrics-bind-address`): metrics at
//! `/metrics` in the OpenMetrics text format (prometheus-client's encoder; Prometheus scrapes it
//! as it is), `/healthz` (the process serves) and `/readyz` (it joined the leader election, or
//! runs without one). The server is hyper's HTTP/1.1, bounded so that a slow or hostile client
//! cannot pin it: one request per connection, a header size and a header read timeout, a
//! deadline per connection and a cap on connections open at once.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::planner::Summary;

/// The `Content-Type` of `/metrics` (what prometheus-client's text encoder writes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the per-pool families.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

/// Labels of `streamd_rollout_pool_phase`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    pool: String,
    phase: String,
}

/// Labels of `streamd_rollout_pool_nodes`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    pool: String,
    step: String,
}

/// The label values a pool's last reconcile set, so that the next drops those that no longer
/// hold (a phase left, a step no node is at any more).
#[derive(Debug, Default)]
struct Shown {
    phase: Option<String>,
    steps: BTreeSet<String>,
}

/// The controller's metrics (shared by the reconciles and the server).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    phase: Family<PhaseLabels, Gauge>,
    nodes: Family<StepLabels, Gauge>,
    drains: Family<PoolLabel, Gauge>,
    drain_timeouts: Family<PoolLabel, Gauge>,
    evictions_blocked: Family<PoolLabel, Gauge>,
    reconcile_errors: Family<PoolLabel, Counter>,
    drain_seconds: Family<PoolLabel, Histogram, fn() -> Histogram>,
    leader: Gauge,
    ready: AtomicBool,
    shown: Mutex<BTreeMap<String, Shown>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("streamd_rollout");
        let m = Self {
            registry: Registry::default(),
            phase: Family::default(),
            nodes: Family::default(),
            drains: Family::default(),
            drain_timeouts: Family::default(),
            evictions_blocked: Family::default(),
            reconcile_errors: Family::default(),
            drain_seconds: Family::new_with_constructor(drain_histogram),
            leader: Gauge::default(),
            ready: AtomicBool::new(false),
            shown: Mutex::default(),
        };
        registry.register(
            "pool_phase",
            "1 for the pool's phase (the Updating condition's reason, or Updated, Degraded, Paused)",
            m.phase.clone(),
        );
        registry.register("pool_nodes", "The pool's nodes by step", m.nodes.clone());
        registry.register(
            "drains",
            "Nodes being drained within their timeout",
            m.drains.clone(),
        );
        registry.register(
            "drain_timeouts",
            "Nodes whose drain ran past drain.timeoutSeconds",
            m.drain_timeouts.clone(),
        );
        registry.register(
            "evictions_blocked",
            "Drains held by pods not yet evicted (a PodDisruptionBudget, a pod still terminating)",
            m.evictions_blocked.clone(),
        );
        // A counter's samples get the `_total` suffix: `streamd_rollout_reconcile_errors_total`.
        registry.register(
            "reconcile_errors",
            "Failed reconciles",
            m.reconcile_errors.clone(),
        );
        registry.register_with_unit(
            "drain_duration",
            "Drains that finished, from the cordon to the reboot's approval",
            prometheus_client::registry::Unit::Seconds,
            m.drain_seconds.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Records a pool's reconcile: its `phase` (the `Updating` condition's reason, or
    /// `Degraded`/`Paused`/`Updated`), the planner's summary and the drains blocked.
    pub fn pool(&self, name: &str, phase: &str, summary: &Summary, blocked: usize) {
        let mut steps: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &summary.progress {
            *steps.entry(p.step).or_default() += 1;
        }
        steps.insert("Updated", summary.updated);
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let old = shown.remove(name).unwrap_or_default();
        if let Some(left) = old.phase.filter(|p| p != phase) {
            self.phase.remove(&phase_labels(name, &left));
        }
        self.phase.get_or_create(&phase_labels(name, phase)).set(1);
        for gone in old.steps.iter().filter(|s| !steps.contains_key(s.as_str())) {
            self.nodes.remove(&step_labels(name, gone));
        }
        for (step, count) in &steps {
            self.nodes
                .get_or_create(&step_labels(name, step))
                .set(gauge(*count));
        }
        let pool = pool_label(name);
        self.drains
            .get_or_create(&pool)
            .set(gauge(summary.draining.len()));
        self.drain_timeouts
            .get_or_create(&pool)
            .set(gauge(summary.timed_out.len()));
        self.evictions_blocked
            .get_or_create(&pool)
            .set(gauge(blocked));
        shown.insert(
            name.to_string(),
            Shown {
                phase: Some(phase.to_string()),
                steps: steps.keys().map(|s| (*s).to_string()).collect(),
            },
        );
    }

    /// Records a drain of `pool` that finished after `seconds` (its reboot approved).
    pub fn drained(&self, pool: &str, seconds: u64) {
        // A drain past u32::MAX seconds (136 years) is a clock jump: the last bucket anyway.
        let seconds = f64::from(u32::try_from(seconds).unwrap_or(u32::MAX));
        self.drain_seconds
            .get_or_create(&pool_label(pool))
            .observe(seconds);
    }

    /// Counts a failed reconcile of `pool`.
    pub fn reconcile_failed(&self, pool: &str) {
        self.reconcile_errors.get_or_create(&pool_label(pool)).inc();
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &str) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = shown.remove(pool) {
            if let Some(phase) = old.phase {
                self.phase.remove(&phase_labels(pool, &phase));
            }
            for step in &old.steps {
                self.nodes.remove(&step_labels(pool, step));
            }
        }
        let label = pool_label(pool);
        for family in [&self.drains, &self.drain_timeouts, &self.evictions_blocked] {
            family.remove(&label);
        }
        self.reconcile_errors.remove(&label);
        self.drain_seconds.remove(&label);
    }

    /// Whether this replica leads (a leader is ready too). A replica that stops leading drops
    /// the pools' gauges: they would go stale while another replica reconciles, and two replicas
    /// would report a pool's phase at once. The error counts stay (a counter only rises).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if leading {
            self.set_ready();
            return;
        }
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        shown.clear();
        self.phase.clear();
        self.nodes.clear();
        for family in [&self.drains, &self.drain_timeouts, &self.evictions_blocked] {
            family.clear();
        }
    }

    /// `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The answer to one request.
    fn answer<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        match request.uri().path() {
            "/metrics" => match self.render() {
                Ok(body) => {
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    response.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static(OPENMETRICS),
                    );
                    response
                }
                Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
            },
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.ready.load(Ordering::Relaxed) => text(StatusCode::OK, "ok\n"),
            "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        self.serve_within(listener, Limits::default()).await;
    }

    /// [`Metrics::serve`] within `limits`.
    async fn serve_within(self: Arc<Self>, listener: TcpListener, limits: Limits) {
        let slots = Arc::new(Semaphore::new(limits.connections));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .max_header_size(MAX_HEADER_BYTES)
            .max_headers(MAX_HEADERS)
            .max_buf_size(MAX_BUF_BYTES)
            .keep_alive(false);
        loop {
            // Accept no more than `connections` at once: the rest wait in the kernel's backlog.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, "accepting a metrics connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let me = self.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = me.answer(&request);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::spawn(async move {
                match tokio::time::timeout(limits.connection, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "metrics connection failed"),
                    Err(_) => tracing::debug!("metrics connection ran past its deadline; closed"),
                }
                drop(slot);
            });
        }
    }
}

/// Request header bytes (start line included) served; more is answered 431.
const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Request headers served; more is an error.
const MAX_HEADERS: usize = 32;
/// A connection's read buffer (hyper's minimum).
const MAX_BUF_BYTES: usize = 8 * 1024;

/// How long and how many connections the metrics server keeps.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Connections served at once.
    connections: usize,
    /// Time for a client to send its request headers.
    header_read: Duration,
    /// Time for a whole connection: request, answer and the client reading it.
    connection: Duration,
}

impl Default for Limits {
    /// Generous for Prometheus and the kubelet's probes (each a request of a few hundred bytes
    /// and an answer of a few KiB), small enough that slow clients free their slots soon.
    fn default() -> Self {
        Self {
            connections: 32,
            header_read: Duration::from_secs(5),
            connection: Duration::from_secs(30),
        }
    }
}

/// The drain durations' buckets: 5 s doubling to 2560 s (43 min; the default drain timeout is
/// 600 s), then `+Inf`.
fn drain_histogram() -> Histogram {
    Histogram::new(exponential_buckets(5.0, 2.0, 10))
}

fn pool_label(pool: &str) -> PoolLabel {
    PoolLabel {
        pool: pool.to_string(),
    }
}

fn phase_labels(pool: &str, phase: &str) -> PhaseLabels {
    PhaseLabels {
        pool: pool.to_string(),
        phase: phase.to_string(),
    }
}

fn step_labels(pool: &str, step: &str) -> StepLabels {
    StepLabels {
        pool: pool.to_string(),
        step: step.to_string(),
    }
}

/// A count as a gauge's value (saturating; counts of nodes never come near).
fn gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// A plain-text answer.
fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests;
