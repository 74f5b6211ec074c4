//! A registry that misbehaves on purpose, for streamd's limits and deadlines: raw HTTP/1.1
//! over TCP, one request per connection, the answer chosen by the test from the request path.
//! Oversized manifests, configs larger than their descriptors, huge error bodies and token
//! answers, and a server that accepts and then trickles a byte at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What the server does with one request.
pub enum Answer {
    /// Status, extra headers, body; `Content-Length` is sent unless `eof_delimited` (then the
    /// body ends with the connection).
    Full {
        /// HTTP status.
        status: u16,
        /// Headers besides `Connection` and `Content-Length`.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
        /// No `Content-Length`: the body ends when the connection does.
        eof_delimited: bool,
    },
    /// 200 with a large `Content-Length`, then one byte every 200 ms, forever.
    Trickle,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer").finish_non_exhaustive()
    }
}

/// 200 with `body`.
pub fn ok(body: Vec<u8>) -> Answer {
    Answer::Full {
        status: 200,
        headers: Vec::new(),
        body,
        eof_delimited: false,
    }
}

/// `status` with `body`.
pub fn status(status: u16, body: Vec<u8>) -> Answer {
    Answer::Full {
        status,
        headers: Vec::new(),
        body,
        eof_delimited: false,
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A running hostile registry.
pub struct Server {
    /// `127.0.0.1:port`.
    pub host: String,
    /// Requests answered so far.
    pub hits: Arc<AtomicUsize>,
    /// [`Answer::Trickle`]s that ended because the client closed the connection.
    pub abandoned: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// Requests answered so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Trickled answers whose client went away so far.
    pub fn abandoned(&self) -> usize {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// Starts a server answering every request with `route(path)`.
pub async fn start(
    route: impl Fn(&str) -> Answer + Send + Sync + 'static,
) -> anyhow::Result<Server> {
    start_with_head(move |path, _| route(path), None).await
}

/// Starts a server answering every request with `route(path, head)` (`head`: the request line
/// and headers as sent), over TLS when `tls` is given (a rustls server configuration, e.g.
/// [`crate::fakes::registry::tls::Pki::server`]).
pub async fn start_with_head(
    route: impl Fn(&str, &str) -> Answer + Send + Sync + 'static,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<Server> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let host = listener.local_addr()?.to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let abandoned = Arc::new(AtomicUsize::new(0));
    let counters = Arc::new(Counters {
        hits: hits.clone(),
        abandoned: abandoned.clone(),
    });
    let route = Arc::new(route);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (route, counters, acceptor) = (route.clone(), counters.clone(), acceptor.clone());
            tokio::spawn(async move {
                match acceptor {
                    // A failed handshake (the client refused the certificate) is no request.
                    Some(a) => {
                        if let Ok(tls) = a.accept(tcp).await {
                            answer(tls, &*route, &counters).await;
                        }
                    }
                    None => answer(tcp, &*route, &counters).await,
                }
            });
        }
    });
    Ok(Server {
        host,
        hits,
        abandoned,
        task,
    })
}

/// What the server counts.
struct Counters {
    hits: Arc<AtomicUsize>,
    abandoned: Arc<AtomicUsize>,
}

/// Reads one request head from `io` and writes what `route` says.
async fn answer<S>(
    mut io: S,
    route: &(dyn Fn(&str, &str) -> Answer + Send + Sync),
    counters: &Counters,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        // A TLS handshake record sent to plain HTTP: closed at once, as a Go server closes
        // a connection whose request does not parse.
        if head.first() == Some(&0x16) {
            return;
        }
    }
    counters.hits.fetch_add(1, Ordering::SeqCst);
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    match route(&path, &text) {
        Answer::Full {
            status,
            headers,
            body,
            eof_delimited,
        } => {
            let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            if !eof_delimited {
                out.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            out.push_str("\r\n");
            let _ = io.write_all(out.as_bytes()).await;
            let _ = io.write_all(&body).await;
            let _ = io.shutdown().await;
        }
        Answer::Trickle => {
            let _ = io
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                .await;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if io.write_all(b" ").await.is_err() {
                    counters.abandoned.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
}

/// A config blob with the labels of a bootable image, padded to at least `pad` bytes.
pub fn config(pad: usize) -> Vec<u8> {
    let mut c = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {"containers.bootc": "1", "io.openshift.os.streamclass": "rhel-10"}},
        "rootfs": {"type": "layers", "diff_ids": []},
    })
    .to_string()
    .into_bytes();
    if c.len() < pad {
        c.pop();
        c.extend(std::iter::repeat_n(b' ', pad - c.len()));
        c.push(b'}');
    }
    c
}

/// An image manifest over `config` and `layers` (descriptor JSON values).
pub fn manifest(config: &[u8], config_size: i64, layers: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha(config),
            "size": config_size,
        },
        "layers": layers,
    })
    .to_string()
    .into_bytes()
}
