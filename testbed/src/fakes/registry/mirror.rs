//! A registry mirror for tests: another `host:port` serving what the testbed registry serves
//! (every request forwarded, credentials included), which records who asked for what, so a
//! test can see that a pull went to the mirror and not to the source.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

use super::client::Client;

/// One request the mirror served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `GET`, `HEAD`.
    pub method: String,
    /// The request path (`/v2/…`).
    pub path: String,
    /// The `User-Agent` (streamd's or the container stack's).
    pub user_agent: String,
}

/// A running mirror; it stops when dropped.
pub struct Mirror {
    host: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").finish_non_exhaustive()
    }
}

impl Mirror {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<Mirror> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let host = listener.local_addr()?.to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.to_string();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (upstream, log) = (upstream.clone(), log.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        forward(upstream.clone(), log.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Mirror { host, seen, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The requests served so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    upstream: String,
    log: Arc<Mutex<Vec<Seen>>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // Every value of a header, joined as one list: containers/image sends one `Accept` header
    // per media type, and the registry must see them all (an index is refused otherwise).
    let header = |k: &str| {
        let values: Vec<&str> = req
            .headers()
            .get_all(k)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    };
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
    log.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
        method: req.method().to_string(),
        path: path.clone(),
        user_agent: header("user-agent").unwrap_or_default(),
    });
    let mut headers: Vec<(&str, String)> = Vec::new();
    for k in ["authorization", "accept", "user-agent", "range"] {
        if let Some(v) = header(k) {
            headers.push((k, v));
        }
    }
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = match Client::new(&upstream, None)
        .request(method, &path, &refs, body)
        .await
    {
        Ok(r) => {
            let mut out = Response::new(Full::new(r.body));
            *out.status_mut() = r.status;
            for (k, v) in r.headers.iter() {
                if k != "content-length" && k != "transfer-encoding" && k != "connection" {
                    out.headers_mut().append(k.clone(), v.clone());
                }
            }
            out
        }
        Err(_) => {
            let mut out = Response::new(Full::new(Bytes::new()));
            *out.status_mut() = StatusCode::BAD_GATEWAY;
            out
        }
    };
    Ok(out)
}
