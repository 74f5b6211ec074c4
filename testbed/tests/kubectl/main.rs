//! The fake API server driven by the real `kubectl` (and by raw HTTPS where status codes
//! and headers matter). Every test starts its own server in a fresh directory.

#[path = "../common/mod.rs"]
mod common;

mod auth_errors;
mod coordination;
mod crd;
mod drain;
mod objects;
mod rbac;
mod watch_faults;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use testbed::control::ApiServerCmd;
use testbed::fakes::apiserver::ApiServer;
use testbed::scratch::ScratchDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use common::{Out, run_kubectl, start_apiserver};

const NODE_USER: &str = "system:node:worker-0";
const STREAM_KEY: &str = "osstream.openshift.io/desired-stream";

struct Env {
    server: ApiServer,
    /// After the server: dropped once it stopped.
    dir: ScratchDir,
}

/// A raw HTTP response.
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// The JSON lines of a watch response.
    fn events(&self) -> Vec<Value> {
        self.body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            .collect()
    }
}

enum Identity {
    Admin,
    Node,
    Anonymous,
}

impl Env {
    async fn start(test: &str) -> Env {
        let (dir, server) = start_apiserver("kubectl", test).await;
        Env { dir, server }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    async fn run(&self, kubeconfig: &Path, args: &[&str]) -> Out {
        run_kubectl(&self.dir, kubeconfig, args).await
    }

    /// `kubectl` as `admin` (bearer token), asserting success.
    async fn kubectl(&self, args: &[&str]) -> String {
        let out = self.run(&self.path("kubeconfig-admin"), args).await;
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr);
        out.stdout
    }

    /// `kubectl` as `admin`, asserting failure; returns stderr.
    async fn kubectl_fails(&self, args: &[&str]) -> String {
        let out = self.run(&self.path("kubeconfig-admin"), args).await;
        assert!(
            !out.ok,
            "kubectl {args:?} unexpectedly succeeded: {}",
            out.stdout
        );
        out.stderr
    }

    /// `kubectl --kubeconfig dir/kubeconfig` (the node's client certificate), asserting success.
    async fn kubectl_as_node(&self, args: &[&str]) -> String {
        let kubeconfig = self.path("kubeconfig");
        let mut full = vec!["--kubeconfig", kubeconfig.to_str().expect("utf-8 path")];
        full.extend_from_slice(args);
        // KUBECONFIG still names the admin config: the flag must win.
        let out = self.run(&self.path("kubeconfig-admin"), &full).await;
        assert!(out.ok, "kubectl {full:?} failed: {}", out.stderr);
        out.stdout
    }

    async fn control(&self, cmd: ApiServerCmd) -> Value {
        self.server.control(cmd).await.expect("control command")
    }

    async fn annotations(&self) -> Value {
        self.control(ApiServerCmd::NodeAnnotations).await
    }

    async fn node(&self) -> Value {
        self.control(ApiServerCmd::GetNode).await
    }

    fn node_rv(node: &Value) -> u64 {
        node["metadata"]["resourceVersion"]
            .as_str()
            .expect("resourceVersion string")
            .parse()
            .expect("numeric resourceVersion")
    }

    /// One HTTP/1.0 request (so the body, even a watch, ends when the server closes).
    async fn raw(
        &self,
        method: &str,
        path: &str,
        who: Identity,
        body: Option<(&str, &str)>,
    ) -> Raw {
        let stream = self.raw_connect(who).await.expect("connect");
        raw_exchange(stream, method, path, &self.token(), body).await
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.path("pki/admin-token")).expect("token file")
    }

    async fn raw_connect(&self, who: Identity) -> std::io::Result<Conn> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_file(self.path("pki/ca.crt")).expect("ca pem");
        roots.add(ca).expect("add ca");
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("tls versions")
            .with_root_certificates(roots);
        let config = match who {
            Identity::Node => {
                let cert = CertificateDer::from_pem_file(self.path("pki/node.crt")).expect("cert");
                let key = PrivateKeyDer::from_pem_file(self.path("pki/node.key")).expect("key");
                builder
                    .with_client_auth_cert(vec![cert], key)
                    .expect("client auth")
            }
            Identity::Admin | Identity::Anonymous => builder.with_no_client_auth(),
        };
        let url = self
            .server
            .url()
            .strip_prefix("https://")
            .expect("https url");
        let tcp = TcpStream::connect(url).await?;
        let name = ServerName::try_from("127.0.0.1").expect("server name");
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        Ok(Conn {
            tls,
            bearer: matches!(who, Identity::Admin),
        })
    }
}

/// A TLS connection to the server; `bearer` requests send the admin token.
struct Conn {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    bearer: bool,
}

async fn raw_exchange(
    Conn { mut tls, bearer }: Conn,
    method: &str,
    path: &str,
    token: &str,
    body: Option<(&str, &str)>,
) -> Raw {
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    if bearer {
        req.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some((content_type, body)) = body {
        req.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.map(|(_, b)| b).unwrap_or_default());
    tls.write_all(req.as_bytes()).await.expect("write request");
    let mut buf = Vec::new();
    // The server closes without close_notify on some paths; what was read is what counts.
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut buf))
        .await
        .expect("response within 30s");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Raw {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn parse(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Writes `text` to `DIR/name` and returns the path as a string.
fn write(env: &Env, name: &str, text: &str) -> String {
    let path = env.path(name);
    std::fs::write(&path, text).expect("write manifest");
    path.to_str().expect("utf-8 path").to_string()
}
