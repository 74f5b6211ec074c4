//! A minimal registry HTTP API v2 client (plain HTTP, basic auth): what pushing the testbed's
//! images needs, and raw requests for checks.

use std::time::Duration;

use anyhow::{Context as _, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::oci::Blob;

/// How long one request (connect, send, read the whole body) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A response with its body read.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Response {
    /// A header's value as text, if present and valid.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Client for one registry `host` (`127.0.0.1:PORT`), optionally with basic-auth credentials.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    authorization: Option<String>,
}

/// Standard base64 with padding (RFC 4648), as basic auth and docker config files use it.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Client {
    /// A client for `host`; `credentials` are sent as basic auth on every request.
    pub fn new(host: &str, credentials: Option<(&str, &str)>) -> Client {
        Client {
            host: host.to_string(),
            authorization: credentials
                .map(|(u, p)| format!("Basic {}", base64(format!("{u}:{p}").as_bytes()))),
        }
    }

    /// Sends one request on a fresh connection and reads the whole response.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<Response> {
        let what = format!("{method} http://{}{path}", self.host);
        tokio::time::timeout(REQUEST_TIMEOUT, self.send(method, path, headers, body))
            .await
            .with_context(|| format!("{what}: no response within {REQUEST_TIMEOUT:?}"))?
            .with_context(|| what)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<Response> {
        let tcp = TcpStream::connect(&self.host).await.context("connecting")?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .context("http handshake")?;
        let conn = tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.host)
            .header(CONTENT_LENGTH, body.len());
        if let Some(auth) = &self.authorization {
            req = req.header(AUTHORIZATION, auth);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .context("building the request")?;
        let result = async {
            let resp = sender.send_request(req).await.context("sending")?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.context("reading the body")?.to_bytes();
            anyhow::Ok(Response {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        }
        .await;
        conn.abort();
        result
    }

    /// `GET path` with an optional `Accept` header.
    pub async fn get(&self, path: &str, accept: Option<&str>) -> anyhow::Result<Response> {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        self.request(Method::GET, path, &headers, Vec::new()).await
    }

    /// Whether the registry already has `digest` in `repo`.
    pub async fn blob_exists(&self, repo: &str, digest: &str) -> anyhow::Result<bool> {
        let r = self
            .request(
                Method::HEAD,
                &format!("/v2/{repo}/blobs/{digest}"),
                &[],
                Vec::new(),
            )
            .await?;
        match r.status {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => bail!("HEAD blob {digest} in {repo}: unexpected {s}"),
        }
    }

    /// Uploads `blob` to `repo` (monolithic: POST an upload session, PUT the bytes with their
    /// digest), unless the registry has it already; returns whether it uploaded.
    pub async fn push_blob(&self, repo: &str, blob: &Blob) -> anyhow::Result<bool> {
        if self.blob_exists(repo, &blob.digest).await? {
            return Ok(false);
        }
        let start = self
            .request(
                Method::POST,
                &format!("/v2/{repo}/blobs/uploads/"),
                &[],
                Vec::new(),
            )
            .await?;
        if start.status != StatusCode::ACCEPTED {
            bail!(
                "starting a blob upload to {repo}: {} {}",
                start.status,
                text(&start.body)
            );
        }
        let location = start
            .header(LOCATION.as_str())
            .context("upload without a Location")?;
        let path = upload_path(location)?;
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = format!("{path}{sep}digest={}", blob.digest.replace(':', "%3A"));
        let put = self
            .request(
                Method::PUT,
                &url,
                &[(CONTENT_TYPE.as_str(), "application/octet-stream")],
                blob.data.clone(),
            )
            .await?;
        if put.status != StatusCode::CREATED {
            bail!(
                "uploading blob {} to {repo}: {} {}",
                blob.digest,
                put.status,
                text(&put.body)
            );
        }
        check_digest(&put, &blob.digest)?;
        Ok(true)
    }

    /// Puts the manifest or index `doc` at `repo:reference` (a tag or its digest).
    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        doc: &Blob,
    ) -> anyhow::Result<()> {
        let r = self
            .request(
                Method::PUT,
                &format!("/v2/{repo}/manifests/{reference}"),
                &[(CONTENT_TYPE.as_str(), doc.media_type)],
                doc.data.clone(),
            )
            .await?;
        if r.status != StatusCode::CREATED {
            bail!(
                "putting manifest {repo}:{reference}: {} {}",
                r.status,
                text(&r.body)
            );
        }
        check_digest(&r, &doc.digest)
    }
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(500)
        .collect()
}

fn check_digest(r: &Response, want: &str) -> anyhow::Result<()> {
    match r.header("docker-content-digest") {
        Some(got) if got == want => Ok(()),
        got => bail!("registry answered digest {got:?}, expected {want}"),
    }
}

/// The path-and-query of an upload `Location`, which distribution sends as an absolute URL.
fn upload_path(location: &str) -> anyhow::Result<String> {
    if location.starts_with('/') {
        return Ok(location.to_string());
    }
    let rest = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))
        .with_context(|| format!("unexpected upload location {location:?}"))?;
    let slash = rest
        .find('/')
        .with_context(|| format!("upload location without a path: {location:?}"))?;
    Ok(rest[slash..].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn upload_locations_become_paths() {
        assert_eq!(
            upload_path("http://127.0.0.1:5000/v2/a/blobs/uploads/x?_state=y").unwrap(),
            "/v2/a/blobs/uploads/x?_state=y"
        );
        assert_eq!(
            upload_path("/v2/a/blobs/uploads/x").unwrap(),
            "/v2/a/blobs/uploads/x"
        );
        assert!(upload_path("ftp://x/y").is_err());
    }
}
