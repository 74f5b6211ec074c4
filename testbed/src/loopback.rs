//! A plain HTTP/1.1 server on loopback that answers fixed paths: the peer of tests that need a
//! web server and nothing more (dnf repositories, mirror lists, a proxy's answers). One request
//! per connection (`connection: close`); the request's path picks the answer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server answers for a path.
#[derive(Clone, Debug)]
pub enum Answer {
    /// 200 with this body.
    Ok(String),
    /// This status, no body.
    Status(u16),
    /// Accepts the request and never answers (a stalled server).
    Stall,
}

/// Serves `routes` (exact paths) on a new loopback port, `otherwise` for any other path, until
/// the runtime ends; returns the base URL (`http://127.0.0.1:PORT`).
pub async fn serve(routes: Vec<(String, Answer)>, otherwise: Answer) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a loopback port")?;
    let addr = listener.local_addr().context("the loopback address")?;
    let routes = Arc::new((routes, otherwise));
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or("/");
                let (table, otherwise) = &*routes;
                let answer = table
                    .iter()
                    .find(|(p, _)| p == path)
                    .map_or(otherwise, |(_, a)| a);
                let (status, body) = match answer {
                    Answer::Ok(body) => (200, body.as_str()),
                    Answer::Status(s) => (*s, ""),
                    Answer::Stall => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        return;
                    }
                };
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

/// The base URL of a loopback port nothing listens on (bound, then let go): a refused
/// connection.
pub async fn closed_port() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a loopback port")?;
    let addr = listener.local_addr().context("the loopback address")?;
    drop(listener);
    Ok(format!("http://{addr}"))
}
