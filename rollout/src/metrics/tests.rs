use std::collections::BTreeSet;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

fn render(m: &Metrics) -> String {
    m.render().expect("render")
}

#[test]
fn metrics_render_the_pools_in_the_openmetrics_text_format() {
    let m = Metrics::default();
    m.pool("worker", "DrainTimeout", &summary(), 1);
    m.reconcile_failed("worker");
    m.reconcile_failed("wei\"rd");
    m.set_leader(true);
    let text = render(&m);
    for line in [
        "streamd_rollout_pool_phase{pool=\"worker\",phase=\"DrainTimeout\"} 1",
        "streamd_rollout_pool_nodes{pool=\"worker\",step=\"Draining\"} 2",
        "streamd_rollout_pool_nodes{pool=\"worker\",step=\"Updated\"} 2",
        "streamd_rollout_drains{pool=\"worker\"} 1",
        "streamd_rollout_drain_timeouts{pool=\"worker\"} 1",
        "streamd_rollout_evictions_blocked{pool=\"worker\"} 1",
        "streamd_rollout_reconcile_errors_total{pool=\"worker\"} 1",
        "streamd_rollout_reconcile_errors_total{pool=\"wei\\\"rd\"} 1",
        // OpenMetrics names a counter's family without the `_total` its samples carry.
        "# TYPE streamd_rollout_reconcile_errors counter",
        "# TYPE streamd_rollout_pool_phase gauge",
        "streamd_rollout_leader 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    // A new phase replaces the old, a step no node is at goes, the error count stays.
    m.pool("worker", "Updated", &Summary::default(), 0);
    let text = render(&m);
    assert!(text.contains("streamd_rollout_reconcile_errors_total{pool=\"worker\"} 1"));
    assert!(text.contains("streamd_rollout_pool_phase{pool=\"worker\",phase=\"Updated\"} 1"));
    assert!(!text.contains("DrainTimeout"), "{text}");
    assert!(!text.contains("step=\"Draining\""), "{text}");
    m.forget("worker");
    assert!(!render(&m).contains("pool=\"worker\""));
}

#[test]
fn finished_drains_are_a_histogram_of_seconds_per_pool() {
    let m = Metrics::default();
    m.drained("worker", 3);
    m.drained("worker", 42);
    m.drained("worker", u64::MAX);
    let text = render(&m);
    for line in [
        "# TYPE streamd_rollout_drain_duration_seconds histogram",
        "# UNIT streamd_rollout_drain_duration_seconds seconds",
        "streamd_rollout_drain_duration_seconds_count{pool=\"worker\"} 3",
        "streamd_rollout_drain_duration_seconds_bucket{le=\"5.0\",pool=\"worker\"} 1",
        "streamd_rollout_drain_duration_seconds_bucket{le=\"80.0\",pool=\"worker\"} 2",
        "streamd_rollout_drain_duration_seconds_bucket{le=\"2560.0\",pool=\"worker\"} 2",
        "streamd_rollout_drain_duration_seconds_bucket{le=\"+Inf\",pool=\"worker\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
    m.forget("worker");
    assert!(!render(&m).contains("pool=\"worker\""));
}

#[test]
fn a_replica_that_stops_leading_drops_the_pools_gauges_and_keeps_the_counts() {
    let m = Metrics::default();
    m.set_leader(true);
    m.pool("worker", "DrainTimeout", &summary(), 1);
    m.reconcile_failed("worker");
    m.set_leader(false);
    let text = render(&m);
    assert!(text.contains("streamd_rollout_leader 0"), "{text}");
    assert!(text.contains("streamd_rollout_reconcile_errors_total{pool=\"worker\"} 1"));
    for gone in [
        "pool_phase{",
        "pool_nodes{",
        "drains{",
        "drain_timeouts{",
        "evictions_blocked{",
    ] {
        assert!(!text.contains(gone), "{gone}\n{text}");
    }
    // Leading again, the next reconcile shows the pool afresh.
    m.set_leader(true);
    m.pool("worker", "Updated", &Summary::default(), 0);
    let text = render(&m);
    assert!(text.contains("streamd_rollout_pool_phase{pool=\"worker\",phase=\"Updated\"} 1"));
    assert!(!text.contains("DrainTimeout"), "{text}");
}

/// Checks `text` line by line against the OpenMetrics text format: metadata then samples per
/// family, each family once, sample names of their family (a counter's with `_total`), label
/// values escaped, numeric values, `# EOF` last.
fn check_openmetrics(text: &str) -> Result<usize, String> {
    let name = "[a-zA-Z_:][a-zA-Z0-9_:]*";
    let unit = regex::Regex::new(&format!(r"^# UNIT ({name}) [a-z]+$")).expect("regex");
    let value = r#""(?:[^"\\\n]|\\[\\"n])*""#;
    let help = regex::Regex::new(&format!(r"^# HELP ({name}) [^\n]*$")).expect("regex");
    let kind = regex::Regex::new(&format!(
        r"^# TYPE ({name}) (counter|gauge|histogram|gaugehistogram|stateset|info|summary|unknown)$"
    ))
    .expect("regex");
    let sample = regex::Regex::new(&format!(
        r"^({name})(?:\{{[a-zA-Z_][a-zA-Z0-9_]*={value}(?:,[a-zA-Z_][a-zA-Z0-9_]*={value})*\}})? (-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|NaN|[+-]Inf)$"
    ))
    .expect("regex");
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("no `# EOF` at the end")?;
    let mut families = BTreeSet::new();
    let (mut family, mut samples) = (String::new(), 0);
    let mut suffixes: &[&str] = &[""];
    for line in body.lines() {
        if let Some(c) = help.captures(line) {
            if c[1] != family && !families.insert(c[1].to_string()) {
                return Err(format!("family repeated: {line}"));
            }
            family = c[1].to_string();
        } else if let Some(c) = unit.captures(line) {
            if c[1] != family {
                return Err(format!("unit outside its family: {line}"));
            }
        } else if let Some(c) = kind.captures(line) {
            if c[1] != family && !families.insert(c[1].to_string()) {
                return Err(format!("family repeated: {line}"));
            }
            family = c[1].to_string();
            suffixes = match &c[2] {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
        } else if let Some(c) = sample.captures(line) {
            if !suffixes.iter().any(|s| c[1] == format!("{family}{s}")) {
                return Err(format!("sample outside its family {family}: {line}"));
            }
            samples += 1;
        } else {
            return Err(format!("not OpenMetrics text: {line:?}"));
        }
    }
    Ok(samples)
}

#[test]
fn a_scrape_is_valid_openmetrics_text() {
    let m = Metrics::default();
    assert_eq!(
        check_openmetrics(&render(&m)),
        Ok(1),
        "only the leader gauge"
    );
    m.pool("worker", "DrainTimeout", &summary(), 1);
    m.pool("odd\\pool\nname\"", "Updating", &Summary::default(), 0);
    m.reconcile_failed("worker");
    m.drained("worker", 42);
    let text = render(&m);
    let samples = check_openmetrics(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // 13, and the histogram's 11 buckets, sum and count.
    assert_eq!(samples, 26, "{text}");
    // The checker is strict: a raw newline in a label value, a sample outside its family and a
    // missing `# EOF` are refused.
    for bad in [
        text.replace("odd\\\\pool\\nname", "odd\npool"),
        text.replace("streamd_rollout_leader 0", "streamd_rollout_leaders 0"),
        text.replace("# EOF\n", ""),
    ] {
        assert!(check_openmetrics(&bad).is_err(), "{bad}");
    }
}

/// Sends `request` raw and reads the answer until the server closes the connection.
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before reading all of a huge request: a failed write is
    // part of what is tested, the answer is what counts.
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes(),
    )
    .await
}

async fn start(
    limits: Limits,
) -> (
    Arc<Metrics>,
    std::net::SocketAddr,
    tokio::task::JoinHandle<()>,
) {
    let m = Arc::new(Metrics::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(m.clone().serve_within(listener, limits));
    (m, addr, server)
}

#[tokio::test]
async fn the_endpoints_answer_over_http() {
    let (m, addr, server) = start(Limits::default()).await;
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
    m.set_ready();
    assert!(
        get(addr, "/readyz?verbose")
            .await
            .starts_with("HTTP/1.1 200 OK")
    );
    let metrics = get(addr, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(metrics.contains(OPENMETRICS), "{metrics}");
    assert!(metrics.contains("\r\n\r\n# HELP "), "{metrics}");
    assert!(metrics.contains("streamd_rollout_leader 0"), "{metrics}");
    assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    let post = exchange(
        addr,
        b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
    );
    assert!(post.await.starts_with("HTTP/1.1 405"));
    server.abort();
}

#[tokio::test]
async fn malformed_and_huge_requests_are_refused_and_the_server_goes_on() {
    let (_m, addr, server) = start(Limits::default()).await;
    let garbage = exchange(addr, b"\x00\x01\x02 nonsense\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage:?}");
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let answer = exchange(addr, huge.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    let many: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    let answer = exchange(
        addr,
        format!("GET /healthz HTTP/1.1\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
    server.abort();
}

#[tokio::test]
async fn clients_that_never_finish_their_request_do_not_pin_the_server() {
    let limits = Limits {
        connections: 2,
        header_read: Duration::from_secs(1),
        connection: Duration::from_secs(2),
    };
    let (_m, addr, server) = start(limits).await;
    // Take every slot with a request that never ends.
    let mut stalled = Vec::new();
    for _ in 0..limits.connections {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        stalled.push(s);
    }
    // The server closes them unanswered (the header read timeout) and serves the next client.
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
    for mut s in stalled {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let out = String::from_utf8_lossy(&out);
        assert!(!out.contains(" 200 "), "{out}");
    }
    server.abort();
}

#[tokio::test]
async fn a_scrape_larger_than_the_connection_buffer_is_served_whole() {
    let (m, addr, server) = start(Limits::default()).await;
    for i in 0..300 {
        m.pool(&format!("pool-{i:03}"), "Updating", &summary(), 1);
    }
    let want = render(&m);
    assert!(want.len() > 8 * MAX_BUF_BYTES, "{}", want.len());
    let answer = get(addr, "/metrics").await;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b);
    assert_eq!(body, Some(want.as_str()));
    server.abort();
}
