//! The fake API server driven by the real `kubectl` (and by raw HTTPS where status codes
//! and headers matter). Every test starts its own server in a fresh directory.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{NODE, Out, Watch, run_kubectl, start_apiserver};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use testbed::control::{ApiServerCmd, Fault};
use testbed::fakes::apiserver::ApiServer;
use testbed::scratch::ScratchDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

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

#[tokio::test]
async fn get_node_json_and_tables() {
    let env = Env::start("get").await;
    let node = parse(&env.kubectl(&["get", "node", NODE, "-o", "json"]).await);
    assert_eq!(node["kind"], "Node");
    assert_eq!(node["metadata"]["name"], NODE);
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["node-role.kubernetes.io/worker"], "");
    assert_eq!(
        node["status"]["nodeInfo"]["osImage"],
        "Red Hat Enterprise Linux CoreOS 9.6"
    );
    assert!(
        node["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );

    let table = env.kubectl(&["get", "nodes"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(row[..3], [NODE, "Ready", "worker"]);
    assert_eq!(row[4], "v1.32.4");

    let wide = env.kubectl(&["get", "no", "-o", "wide"]).await;
    assert!(
        wide.contains("Red Hat Enterprise Linux CoreOS 9.6"),
        "{wide}"
    );
    assert!(wide.contains("10.0.0.10"), "{wide}");

    let list = parse(
        &env.kubectl(&[
            "get",
            "nodes",
            "-o",
            "json",
            "--field-selector",
            "metadata.name=nope",
        ])
        .await,
    );
    assert_eq!(list["items"], json!([]));
    let list = parse(
        &env.kubectl(&["get", "nodes", "-o", "json", "-l", "kubernetes.io/os=linux"])
            .await,
    );
    assert_eq!(list["items"][0]["metadata"]["name"], NODE);

    let ns = parse(
        &env.kubectl(&["get", "namespace", "default", "-o", "json"])
            .await,
    );
    assert_eq!(ns["status"]["phase"], "Active");
    let err = env.kubectl_fails(&["get", "node", "nope"]).await;
    assert!(
        err.contains("NotFound") && err.contains("nodes \"nope\" not found"),
        "{err}"
    );
    let described = env.kubectl(&["describe", "node", NODE]).await;
    assert!(
        described.contains("Red Hat Enterprise Linux CoreOS 9.6"),
        "{described}"
    );
    assert!(described.contains("(0 in total)"), "{described}");
    let version = env.kubectl(&["version", "-o", "json"]).await;
    assert_eq!(parse(&version)["serverVersion"]["gitVersion"], "v1.32.4");
}

#[tokio::test]
async fn annotate_overwrite_and_remove() {
    let env = Env::start("annotate").await;
    let before = env.node().await;
    let set = format!("{STREAM_KEY}=rhel-10");
    env.kubectl(&["annotate", "node", NODE, &set]).await;
    assert_eq!(env.annotations().await[STREAM_KEY], "rhel-10");
    let read_back = parse(&env.kubectl(&["get", "node", NODE, "-o", "json"]).await);
    assert_eq!(read_back["metadata"]["annotations"][STREAM_KEY], "rhel-10");
    assert_eq!(
        Env::node_rv(&read_back),
        Env::node_rv(&before) + 1,
        "one write, one resourceVersion"
    );
    assert_eq!(read_back["metadata"]["uid"], before["metadata"]["uid"]);

    let again = format!("{STREAM_KEY}=rhel-9");
    let err = env.kubectl_fails(&["annotate", "node", NODE, &again]).await;
    assert!(err.contains("already has a value"), "{err}");
    env.kubectl(&["annotate", "--overwrite", "node", NODE, &again])
        .await;
    assert_eq!(env.annotations().await[STREAM_KEY], "rhel-9");

    let remove = format!("{STREAM_KEY}-");
    env.kubectl(&["annotate", "node", NODE, &remove]).await;
    let annotations = env.annotations().await;
    assert!(annotations.get(STREAM_KEY).is_none(), "{annotations}");
    assert_eq!(
        annotations["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );

    let err = env
        .kubectl_fails(&["annotate", "node", NODE, "Not A Key=1"])
        .await;
    assert!(!err.is_empty());
    // kubectl checks label syntax itself; a patch reaches the server's validation.
    let err = env
        .kubectl_fails(&[
            "patch",
            "node",
            NODE,
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"bad":"has space"}}}"#,
        ])
        .await;
    assert!(
        err.contains("Invalid value") && err.contains("has space"),
        "{err}"
    );
}

#[tokio::test]
async fn watch_sees_annotation_from_node_identity() {
    let env = Env::start("watch").await;
    let mut watch = Watch::spawn(
        &env.dir,
        &env.path("kubeconfig-admin"),
        &[
            "get",
            "node",
            NODE,
            "-w",
            "-o",
            "json",
            "--output-watch-events",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut annotated = false;
    let found = loop {
        let events = watch.events();
        if !annotated && !events.is_empty() {
            assert_eq!(events[0]["type"], "ADDED", "{}", watch.seen);
            let set = format!("{STREAM_KEY}=rhel-10");
            env.kubectl_as_node(&["annotate", "node", NODE, &set]).await;
            annotated = true;
        }
        if let Some(ev) = events
            .iter()
            .find(|e| e["object"]["metadata"]["annotations"][STREAM_KEY] == "rhel-10")
        {
            break ev.clone();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no change seen; output so far: {}",
            watch.seen
        );
        watch.read_more(deadline).await;
    };
    assert_eq!(found["type"], "MODIFIED");
    let _ = watch.child.kill().await;

    let stats = env.control(ApiServerCmd::STATS).await;
    assert_eq!(stats["by_user"]["admin"]["watch"], 1, "{stats}");
    assert_eq!(stats["by_user"][NODE_USER]["patch"], 1, "{stats}");
}

#[tokio::test]
async fn patch_types_conflicts_and_status() {
    let env = Env::start("patch").await;
    env.kubectl(&[
        "patch",
        "node",
        NODE,
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"merge":"yes"}}}"#,
    ])
    .await;
    env.kubectl(&[
        "patch",
        "node",
        NODE,
        "--type=strategic",
        "-p",
        r#"{"metadata":{"annotations":{"strategic":"yes"}}}"#,
    ])
    .await;
    let json_patch = format!(
        r#"[{{"op":"add","path":"/metadata/annotations/{}","value":"rhel-10"}}]"#,
        STREAM_KEY.replace('/', "~1")
    );
    env.kubectl(&["patch", "node", NODE, "--type=json", "-p", &json_patch])
        .await;
    let node = env.node().await;
    assert_eq!(node["metadata"]["labels"]["merge"], "yes");
    assert_eq!(node["metadata"]["annotations"]["strategic"], "yes");
    assert_eq!(node["metadata"]["annotations"][STREAM_KEY], "rhel-10");

    // A failed `test` is a 422 and changes nothing.
    let guarded = format!(
        r#"[{{"op":"test","path":"/metadata/annotations/{k}","value":"rhel-9"}},{{"op":"replace","path":"/metadata/annotations/{k}","value":"rhel-11"}}]"#,
        k = STREAM_KEY.replace('/', "~1")
    );
    let err = env
        .kubectl_fails(&["patch", "node", NODE, "--type=json", "-p", &guarded])
        .await;
    assert!(err.contains("test failed"), "{err}");
    assert!(err.contains("Invalid") || err.contains("invalid"), "{err}");
    assert_eq!(env.annotations().await[STREAM_KEY], "rhel-10");
    assert_eq!(Env::node_rv(&env.node().await), Env::node_rv(&node));

    // A resourceVersion precondition that is out of date is a 409.
    let stale = json!({"metadata": {"resourceVersion": (Env::node_rv(&node) - 1).to_string(), "labels": {"x": "y"}}});
    let err = env
        .kubectl_fails(&[
            "patch",
            "node",
            NODE,
            "--type=merge",
            "-p",
            &stale.to_string(),
        ])
        .await;
    assert!(err.contains("the object has been modified"), "{err}");
    assert!(env.node().await["metadata"]["labels"].get("x").is_none());
    let fresh = json!({"metadata": {"resourceVersion": Env::node_rv(&node).to_string(), "labels": {"x": "y"}}});
    env.kubectl(&[
        "patch",
        "node",
        NODE,
        "--type=merge",
        "-p",
        &fresh.to_string(),
    ])
    .await;
    assert_eq!(env.node().await["metadata"]["labels"]["x"], "y");

    // Identity fields are not patchable; status only changes through /status.
    let node = env.node().await;
    env.kubectl(&[
        "patch",
        "node",
        NODE,
        "--type=merge",
        "-p",
        r#"{"metadata":{"uid":"forged"},"status":{"capacity":{"pods":"1"}}}"#,
    ])
    .await;
    let after = env.node().await;
    assert_eq!(after["metadata"]["uid"], node["metadata"]["uid"]);
    assert_eq!(after["status"]["capacity"]["pods"], "250");
    env.kubectl(&[
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Testing"}]}}"#,
    ])
    .await;
    let table = env.kubectl(&["get", "node", NODE]).await;
    assert!(table.contains("NotReady"), "{table}");
    let conditions = env.node().await["status"]["conditions"].clone();
    assert_eq!(conditions.as_array().map(Vec::len), Some(4), "{conditions}");

    // Replace with PUT: a stale resourceVersion conflicts, the current one succeeds.
    let mut put = env.node().await;
    put["metadata"]["labels"]["replaced"] = json!("yes");
    std::fs::write(env.path("node.json"), put.to_string()).expect("write node.json");
    let node_json = env.path("node.json");
    let node_json = node_json.to_str().expect("utf-8 path");
    env.kubectl(&["replace", "-f", node_json]).await;
    let err = env.kubectl_fails(&["replace", "-f", node_json]).await;
    assert!(err.contains("the object has been modified"), "{err}");
    assert_eq!(env.node().await["metadata"]["labels"]["replaced"], "yes");
}

#[tokio::test]
async fn events_create_list_and_patch() {
    let env = Env::start("events").await;
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "worker-0.stream-switch", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": NODE, "apiVersion": "v1"},
        "reason": "StreamSwitchStarted",
        "message": "switching to rhel-10",
        "type": "Normal",
        "count": 1,
        "source": {"component": "streamd", "host": NODE},
        "firstTimestamp": "2026-11-29T14:00:00Z",
        "lastTimestamp": "2026-11-29T14:00:00Z",
    });
    std::fs::write(env.path("event.json"), event.to_string()).expect("write event");
    let file = env.path("event.json");
    let file = file.to_str().expect("utf-8 path");
    let created = env.kubectl(&["create", "-f", file]).await;
    assert!(
        created.contains("worker-0.stream-switch created"),
        "{created}"
    );
    let err = env.kubectl_fails(&["create", "-f", file]).await;
    assert!(err.contains("AlreadyExists"), "{err}");

    let mut generated = event.clone();
    generated["metadata"] = json!({"generateName": "worker-0."});
    std::fs::write(env.path("event2.json"), generated.to_string()).expect("write event");
    let file2 = env.path("event2.json");
    let out = env
        .kubectl(&[
            "create",
            "-f",
            file2.to_str().expect("utf-8 path"),
            "-o",
            "json",
        ])
        .await;
    let name = parse(&out)["metadata"]["name"]
        .as_str()
        .expect("generated name")
        .to_string();
    assert!(
        name.starts_with("worker-0.") && name.len() == "worker-0.".len() + 5,
        "{name}"
    );

    let list = parse(&env.kubectl(&["get", "events", "-o", "json"]).await);
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{list}");
    let first = &items[0];
    assert_eq!(first["reason"], "StreamSwitchStarted");
    assert!(first["metadata"]["uid"].is_string());
    assert!(first["metadata"]["resourceVersion"].is_string());
    assert!(first["metadata"]["creationTimestamp"].is_string());

    let all = env.kubectl(&["get", "events", "-A"]).await;
    let header: Vec<&str> = all
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(header[0], "NAMESPACE", "{all}");
    assert!(
        header.contains(&"REASON") && header.contains(&"OBJECT"),
        "{all}"
    );
    assert!(
        all.contains("StreamSwitchStarted") && all.contains("node/worker-0"),
        "{all}"
    );

    env.kubectl(&[
        "patch",
        "event",
        "worker-0.stream-switch",
        "--type=merge",
        "-p",
        r#"{"count":2,"lastTimestamp":"2026-11-29T14:05:00Z"}"#,
    ])
    .await;
    let ev = parse(
        &env.kubectl(&["get", "event", "worker-0.stream-switch", "-o", "json"])
            .await,
    );
    assert_eq!(ev["count"], 2);

    let selected = parse(
        &env.kubectl(&[
            "get",
            "events",
            "-A",
            "-o",
            "json",
            "--field-selector",
            "involvedObject.kind=Node,involvedObject.name=worker-0,metadata.name=worker-0.stream-switch",
        ])
        .await,
    );
    assert_eq!(
        selected["items"].as_array().map(Vec::len),
        Some(1),
        "{selected}"
    );
    env.kubectl(&["delete", "event", &name]).await;
    let list = parse(&env.kubectl(&["get", "events", "-o", "json"]).await);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    let err = env
        .kubectl_fails(&["get", "events", "-n", "kube-system", &name])
        .await;
    assert!(err.contains("not found"), "{err}");
}

#[tokio::test]
async fn anonymous_and_wrong_token_are_unauthorized() {
    let env = Env::start("anon").await;
    let admin = std::fs::read_to_string(env.path("kubeconfig-admin")).expect("kubeconfig");
    let with_user = |user: &str| -> String {
        admin
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("token:") {
                    format!("    {user}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // No credentials at all: kubectl wants to prompt for them (stdin is closed), so it
    // fails before its first resource request; the raw request below shows the 401.
    std::fs::write(env.path("kubeconfig-anon"), with_user("{}")).expect("write");
    let out = env
        .run(&env.path("kubeconfig-anon"), &["get", "nodes"])
        .await;
    assert!(!out.ok, "anonymous kubectl succeeded: {}", out.stdout);
    // Credentials the server does not accept: basic auth, a wrong token.
    std::fs::write(
        env.path("kubeconfig-basic"),
        with_user("{username: nobody, password: secret}"),
    )
    .expect("write");
    let wrong = admin.replace(&env.token(), "not-the-token");
    std::fs::write(env.path("kubeconfig-wrong"), wrong).expect("write");
    for config in ["kubeconfig-basic", "kubeconfig-wrong"] {
        let out = env.run(&env.path(config), &["get", "nodes"]).await;
        assert!(!out.ok, "{config}: {}", out.stdout);
        // kubectl's wording for a 401 (the message comes from client-go's discovery).
        assert!(
            out.stderr.contains("You must be logged in to the server"),
            "{config}: {}",
            out.stderr
        );
    }

    let raw = env
        .raw("GET", "/api/v1/nodes", Identity::Anonymous, None)
        .await;
    assert_eq!(raw.status, 401);
    let status = raw.json();
    assert_eq!(
        (
            status["kind"].as_str(),
            status["apiVersion"].as_str(),
            status["status"].as_str(),
            status["reason"].as_str(),
            status["code"].as_u64()
        ),
        (
            Some("Status"),
            Some("v1"),
            Some("Failure"),
            Some("Unauthorized"),
            Some(401)
        )
    );
    let raw = env
        .raw(
            "GET",
            &format!("/api/v1/nodes/{NODE}"),
            Identity::Node,
            None,
        )
        .await;
    assert_eq!(raw.status, 200, "{}", raw.body);
    let stats = env.control(ApiServerCmd::STATS).await;
    assert_eq!(stats["by_user"][NODE_USER]["get"], 1, "{stats}");
    assert!(
        stats["by_user"]["system:anonymous"]["list"].as_u64() >= Some(1),
        "{stats}"
    );
}

#[tokio::test]
async fn raw_errors_are_status_objects() {
    let env = Env::start("errors").await;
    let cases = [
        ("GET", "/api/v1/secrets".to_string(), None, 404, "NotFound"),
        (
            "GET",
            "/api/v1/nodes/nope".to_string(),
            None,
            404,
            "NotFound",
        ),
        (
            "DELETE",
            format!("/api/v1/nodes/{NODE}"),
            None,
            405,
            "MethodNotAllowed",
        ),
        (
            "POST",
            "/api/v1/nodes".to_string(),
            Some(("application/json", "{}")),
            405,
            "MethodNotAllowed",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/merge-patch+json", "{not json")),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/json-patch+json", r#"{"op":"add"}"#)),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/yaml", "metadata: {}")),
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some(("application/apply-patch+yaml", "metadata: {}")),
            422,
            "Invalid",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some((
                "application/merge-patch+json",
                r#"{"metadata":{"annotations":{"a":1}}}"#,
            )),
            400,
            "BadRequest",
        ),
        (
            "PATCH",
            format!("/api/v1/nodes/{NODE}"),
            Some((
                "application/merge-patch+json",
                r#"{"metadata":{"name":"other"}}"#,
            )),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/events".to_string(),
            Some(("application/json", r#"{"metadata":{}}"#)),
            422,
            "Invalid",
        ),
        (
            "GET",
            "/api/v1/nodes?watch=maybe".to_string(),
            None,
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?watch=1&resourceVersion=abc".to_string(),
            None,
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?labelSelector=a+b".to_string(),
            None,
            400,
            "BadRequest",
        ),
    ];
    for (method, path, body, code, reason) in cases {
        let raw = env.raw(method, &path, Identity::Admin, body).await;
        assert_eq!(raw.status, code, "{method} {path}: {}", raw.body);
        let status = raw.json();
        assert_eq!(status["kind"], "Status", "{method} {path}");
        assert_eq!(status["reason"], reason, "{method} {path}: {status}");
        assert_eq!(status["code"], code);
    }
    let discovery = env.raw("GET", "/apis", Identity::Admin, None).await;
    assert_eq!(discovery.json()["kind"], "APIGroupList");
    let resources = env
        .raw("GET", "/api/v1", Identity::Admin, None)
        .await
        .json();
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "nodes",
            "nodes/status",
            "events",
            "namespaces",
            "pods",
            "pods/status",
            "pods/eviction"
        ]
    );
}

#[tokio::test]
async fn watch_resume_expiry_and_gone_fault() {
    let env = Env::start("gone").await;
    let rv = Env::node_rv(&env.node().await);
    env.kubectl(&["label", "node", NODE, "step=1"]).await;

    // Resuming from a known resourceVersion replays what happened since.
    let path = format!(
        "/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds=1&fieldSelector=metadata.name%3D{NODE}"
    );
    let events = env.raw("GET", &path, Identity::Admin, None).await.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "MODIFIED");
    assert_eq!(events[0]["object"]["metadata"]["labels"]["step"], "1");

    // Unset resourceVersion: the current state as ADDED.
    let events = env
        .raw(
            "GET",
            "/api/v1/nodes?watch=1&timeoutSeconds=1",
            Identity::Admin,
            None,
        )
        .await
        .events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ADDED");

    // `gone` compacts the history: the old resourceVersion is now too old.
    env.control(ApiServerCmd::Fault(Fault::Gone { count: 1 }))
        .await;
    let current = Env::node_rv(&env.node().await);
    let forced = env
        .raw(
            "GET",
            &format!("/api/v1/nodes?watch=1&resourceVersion={current}"),
            Identity::Admin,
            None,
        )
        .await;
    assert_eq!(forced.status, 200);
    let events = forced.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
    let old = env.raw("GET", &path, Identity::Admin, None).await.events();
    assert_eq!(old[0]["type"], "ERROR", "{old:?}");
    assert!(
        old[0]["object"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("too old resource version"))
    );
    let resumed = env
        .raw(
            "GET",
            &format!("/api/v1/nodes?watch=1&resourceVersion={current}&timeoutSeconds=1"),
            Identity::Admin,
            None,
        )
        .await;
    assert_eq!(
        resumed.events(),
        Vec::<Value>::new(),
        "the fault was used up"
    );

    let list = env
        .raw("GET", "/api/v1/nodes", Identity::Admin, None)
        .await
        .json();
    assert_eq!(list["kind"], "NodeList");
    assert_eq!(list["metadata"]["resourceVersion"], current.to_string());
}

#[tokio::test]
async fn bookmarks_arrive_when_idle() {
    let env = Env::start("bookmarks").await;
    let started = Instant::now();
    let raw = env
        .raw(
            "GET",
            "/api/v1/nodes?watch=1&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=11",
            Identity::Node,
            None,
        )
        .await;
    let events = raw.events();
    assert!(started.elapsed() >= Duration::from_secs(10));
    let bookmark = events.last().expect("events");
    assert_eq!(bookmark["type"], "BOOKMARK", "{events:?}");
    assert_eq!(bookmark["object"]["kind"], "Node");
    assert_eq!(
        bookmark["object"]["metadata"]["resourceVersion"],
        env.node().await["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn throttle_error_delay_refuse_and_drop_faults() {
    let env = Env::start("faults").await;
    let node_path = format!("/api/v1/nodes/{NODE}");

    env.control(ApiServerCmd::Fault(Fault::Throttle {
        count: 1,
        retry_after: 3,
        user: None,
        verb: None,
    }))
    .await;
    let raw = env.raw("GET", &node_path, Identity::Admin, None).await;
    assert_eq!(raw.status, 429);
    assert!(
        raw.head.to_ascii_lowercase().contains("retry-after: 3"),
        "{}",
        raw.head
    );
    assert_eq!(raw.json()["reason"], "TooManyRequests");

    env.control(ApiServerCmd::Fault(Fault::Error {
        count: 1,
        code: 500,
        user: None,
        verb: None,
    }))
    .await;
    let raw = env.raw("GET", &node_path, Identity::Admin, None).await;
    assert_eq!(raw.status, 500);
    assert_eq!(raw.json()["reason"], "InternalError");
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );

    // kubectl honours Retry-After and succeeds after the throttled attempts.
    env.kubectl(&["get", "node", NODE]).await; // warm the discovery cache
    env.control(ApiServerCmd::ResetStats).await;
    env.control(ApiServerCmd::Fault(Fault::Throttle {
        count: 2,
        retry_after: 1,
        user: None,
        verb: None,
    }))
    .await;
    let started = Instant::now();
    let out = env.kubectl(&["get", "--raw", &node_path]).await;
    assert_eq!(parse(&out)["metadata"]["name"], NODE);
    // At least one Retry-After wait; the gcloud kubectl dispatcher's own /version probe
    // may take one of the 429s, so the exact split between the two is not fixed.
    assert!(started.elapsed() >= Duration::from_secs(1));
    let stats = env.control(ApiServerCmd::STATS).await;
    assert!(
        stats["by_user"]["admin"]["get"].as_u64() >= Some(3),
        "{stats}"
    );
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200,
        "throttle used up"
    );

    env.control(ApiServerCmd::Fault(Fault::Delay {
        ms: 400,
        user: None,
        verb: None,
    }))
    .await;
    let started = Instant::now();
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    env.control(ApiServerCmd::Fault(Fault::Delay {
        ms: 0,
        user: None,
        verb: None,
    }))
    .await;

    // An open watch ends when watches are dropped.
    let connection = env.raw_connect(Identity::Admin).await.expect("connect");
    let token = env.token();
    let watch = tokio::spawn(async move {
        // No timeout in practice: an overflowing timeoutSeconds must not hurt the server.
        let path = "/api/v1/nodes?watch=1&timeoutSeconds=18446744073709551615";
        raw_exchange(connection, "GET", path, &token, None).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watch.is_finished());
    env.control(ApiServerCmd::Fault(Fault::DropWatches)).await;
    let dropped = tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("watch ends after drop-watches")
        .expect("watch task");
    assert_eq!(dropped.events()[0]["type"], "ADDED");

    // An outage closes the port and cuts established connections.
    let connection = env.raw_connect(Identity::Admin).await.expect("connect");
    let token = env.token();
    let watch = tokio::spawn(async move {
        raw_exchange(connection, "GET", "/api/v1/nodes?watch=1", &token, None).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.control(ApiServerCmd::Fault(Fault::Refuse { on: true }))
        .await;
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("open watch cut by the outage")
        .expect("watch task");
    let refused = env.raw_connect(Identity::Admin).await.err();
    assert_eq!(
        refused.map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionRefused)
    );
    let err = env.kubectl_fails(&["get", "node", NODE]).await;
    assert!(err.contains("refused"), "{err}");
    env.control(ApiServerCmd::Fault(Fault::Refuse { on: false }))
        .await;
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );

    env.control(ApiServerCmd::Fault(Fault::Error {
        count: 5,
        code: 500,
        user: None,
        verb: None,
    }))
    .await;
    env.control(ApiServerCmd::Fault(Fault::Clear)).await;
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );
    // Unknown commands do not get past the control socket's parser.
    for unknown in [
        json!({"cmd": "fault", "kind": "nope"}),
        json!({"cmd": "nope"}),
    ] {
        assert!(
            serde_json::from_value::<ApiServerCmd>(unknown.clone()).is_err(),
            "{unknown}"
        );
    }
}

#[tokio::test]
async fn stats_count_kubectl_requests_by_user_and_verb() {
    let env = Env::start("stats").await;
    env.kubectl(&["get", "node", NODE, "-o", "json"]).await;
    env.kubectl_as_node(&["annotate", "node", NODE, "a=b"])
        .await;
    env.kubectl_as_node(&["label", "node", NODE, "c=d"]).await;
    let stats = env.control(ApiServerCmd::STATS).await;
    let admin = &stats["by_user"]["admin"];
    let node = &stats["by_user"][NODE_USER];
    assert!(admin["get"].as_u64() >= Some(1), "{stats}");
    assert!(admin.get("patch").is_none(), "{stats}");
    assert_eq!(node["patch"], 2, "{stats}");
    assert!(node["get"].as_u64() >= Some(2), "{stats}");
    let sum: u64 = stats["by_user"]
        .as_object()
        .expect("by_user")
        .values()
        .flat_map(|verbs| verbs.as_object().expect("verbs").values())
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(stats["total"], sum);
    env.control(ApiServerCmd::ResetStats).await;
    let reset = env.control(ApiServerCmd::STATS).await;
    assert_eq!(
        (&reset["total"], &reset["by_user"]),
        (&json!(0), &json!({}))
    );
}

/// Writes `text` to `DIR/name` and returns the path as a string.
fn write(env: &Env, name: &str, text: &str) -> String {
    let path = env.path(name);
    std::fs::write(&path, text).expect("write manifest");
    path.to_str().expect("utf-8 path").to_string()
}

const STREAMPOOL_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: streampools.osstream.openshift.io
spec:
  group: osstream.openshift.io
  scope: Cluster
  names:
    plural: streampools
    kind: StreamPool
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

#[tokio::test]
async fn posted_crd_is_served_with_generation_status_and_watch() {
    let env = Env::start("crd").await;
    let crd = write(&env, "crd.yaml", STREAMPOOL_CRD);
    env.kubectl(&["create", "-f", &crd]).await;
    env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=10s",
        "crd/streampools.osstream.openshift.io",
    ])
    .await;
    let stored = parse(
        &env.kubectl(&[
            "get",
            "crd",
            "streampools.osstream.openshift.io",
            "-o",
            "json",
        ])
        .await,
    );
    assert_eq!(stored["spec"]["names"]["singular"], "streampool");
    assert_eq!(stored["spec"]["names"]["listKind"], "StreamPoolList");
    assert_eq!(stored["status"]["storedVersions"], json!(["v1alpha1"]));
    let resources = env
        .kubectl(&[
            "api-resources",
            "--api-group=osstream.openshift.io",
            "-o",
            "wide",
        ])
        .await;
    assert!(
        resources.contains("streampools")
            && resources.contains("StreamPool")
            && resources.contains("false"),
        "cluster-scoped StreamPool in discovery: {resources}"
    );

    let mut watch = Watch::spawn(
        &env.dir,
        &env.path("kubeconfig-admin"),
        &[
            "get",
            "streampools",
            "-w",
            "-o",
            "json",
            "--output-watch-events",
        ],
    );
    let pool = write(
        &env,
        "pool.yaml",
        "apiVersion: osstream.openshift.io/v1alpha1\nkind: StreamPool\nmetadata:\n  name: workers\nspec:\n  stream: rhel-10\nstatus:\n  updated: 3\n",
    );
    env.kubectl(&["create", "-f", &pool]).await;
    let created = parse(
        &env.kubectl(&["get", "streampool", "workers", "-o", "json"])
            .await,
    );
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(
        created.get("status").is_none(),
        "create drops status: {created}"
    );
    env.kubectl(&[
        "patch",
        "streampool",
        "workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"stream":"rhel-9"}}"#,
    ])
    .await;
    env.kubectl(&[
        "patch",
        "streampool",
        "workers",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"observedGeneration":2},"spec":{"stream":"ignored"}}"#,
    ])
    .await;
    let pool = parse(
        &env.kubectl(&["get", "streampool", "workers", "-o", "json"])
            .await,
    );
    assert_eq!(pool["metadata"]["generation"], 2, "{pool}");
    assert_eq!(
        pool["spec"]["stream"], "rhel-9",
        "status writes keep spec: {pool}"
    );
    assert_eq!(pool["status"]["observedGeneration"], 2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while watch.events().len() < 3 {
        watch.read_more(deadline).await;
    }
    let kinds: Vec<Value> = watch.events().iter().map(|e| e["type"].clone()).collect();
    assert_eq!(
        kinds[..3],
        [json!("ADDED"), json!("MODIFIED"), json!("MODIFIED")]
    );

    let err = env
        .kubectl_fails(&[
            "get",
            "streampools",
            "--field-selector",
            "spec.stream=rhel-9",
        ])
        .await;
    assert!(err.contains("is not a known field selector"), "{err}");

    env.kubectl(&["delete", "crd", "streampools.osstream.openshift.io"])
        .await;
    let raw = env
        .raw(
            "GET",
            "/apis/osstream.openshift.io/v1alpha1/streampools",
            Identity::Admin,
            None,
        )
        .await;
    assert_eq!(raw.status, 404, "no longer served: {}", raw.body);
    let bad = write(
        &env,
        "bad.yaml",
        &STREAMPOOL_CRD.replace("name: streampools.osstream", "name: pools.osstream"),
    );
    let err = env.kubectl_fails(&["create", "-f", &bad]).await;
    assert!(
        err.contains(r#"metadata.name: Invalid value: "pools.osstream.openshift.io": must be spec.names.plural+"."+spec.group"#),
        "{err}"
    );
}

#[tokio::test]
async fn kubectl_cordon_and_uncordon_are_recorded_as_unavailability() {
    let env = Env::start("cordon").await;
    env.control(ApiServerCmd::ResetUnavailable).await;
    let out = env.kubectl(&["cordon", NODE]).await;
    assert!(out.contains("cordoned"), "{out}");
    assert_eq!(env.node().await["spec"]["unschedulable"], true);
    let table = env.kubectl(&["get", "node", NODE]).await;
    assert!(table.contains("Ready,SchedulingDisabled"), "{table}");
    env.kubectl(&["uncordon", NODE]).await;
    assert!(env.node().await["spec"].get("unschedulable").is_none());
    let record = env.control(ApiServerCmd::Unavailable).await;
    assert_eq!(record["max"], 1, "{record}");
    assert_eq!(record["now"], json!([]), "{record}");
    let sets: Vec<Value> = record["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .map(|e| e["nodes"].clone())
        .collect();
    assert_eq!(sets, [json!([]), json!([NODE]), json!([])], "{record}");
}

/// A pod of ReplicaSet `web-rs` bound to `node`, created by the admin and made Running and
/// Ready as its kubelet would.
fn web_pod(env: &Env, name: &str, node: &str) {
    env.server
        .create(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": { "app": "web" },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs",
                    "uid": "5f0c3a63-6a4e-4e52-9a0c-2a8c4fbb7d11", "controller": true,
                }],
            },
            "spec": { "nodeName": node, "containers": [{ "name": "web", "image": "quay.io/x/web:1" }] },
        }))
        .expect("create pod");
    env.server
        .update_status("v1", "Pod", Some("default"), name, |pod| {
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True" }],
            });
        })
        .expect("pod status");
}

#[tokio::test]
async fn kubectl_drain_evicts_through_the_disruption_budget() {
    let env = Env::start("drain").await;
    env.server
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}))
        .expect("second node");
    web_pod(&env, "web-a", NODE);
    web_pod(&env, "web-b", NODE);
    let pdb = write(
        &env,
        "pdb.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\n  namespace: default\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      app: web\n",
    );
    env.kubectl(&["create", "-f", &pdb]).await;
    let status = parse(&env.kubectl(&["get", "pdb", "web", "-o", "json"]).await)["status"].clone();
    assert_eq!(
        (
            &status["currentHealthy"],
            &status["desiredHealthy"],
            &status["disruptionsAllowed"],
            &status["expectedPods"]
        ),
        (&json!(2), &json!(1), &json!(1), &json!(2)),
        "{status}"
    );
    env.control(ApiServerCmd::PodRemoval { delay_ms: 300 })
        .await;
    let pods = parse(
        &env.kubectl(&[
            "get",
            "pods",
            "-A",
            "-o",
            "json",
            "--field-selector",
            &format!("spec.nodeName={NODE}"),
        ])
        .await,
    );
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(2));
    // One eviction is allowed, the second is refused until a replacement is Ready elsewhere.
    let out = env
        .run(
            &env.path("kubeconfig-admin"),
            &["drain", NODE, "--ignore-daemonsets", "--timeout=8s"],
        )
        .await;
    assert!(!out.ok, "drain cannot finish: {}", out.stdout);
    assert!(
        out.stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{}",
        out.stderr
    );
    assert_eq!(
        env.node().await["spec"]["unschedulable"],
        true,
        "drain cordons first"
    );
    let left = parse(&env.kubectl(&["get", "pods", "-o", "json"]).await);
    assert_eq!(left["items"].as_array().map(Vec::len), Some(1), "{left}");
    web_pod(&env, "web-c", "worker-1");
    let out = env
        .kubectl(&["drain", NODE, "--ignore-daemonsets", "--timeout=30s"])
        .await;
    assert!(out.contains("drained"), "{out}");
    let left = parse(
        &env.kubectl(&[
            "get",
            "pods",
            "-o",
            "json",
            "--field-selector",
            &format!("spec.nodeName={NODE}"),
        ])
        .await,
    );
    assert_eq!(left["items"], json!([]));
    let err = env
        .kubectl_fails(&["get", "pods", "--field-selector", "spec.host=x"])
        .await;
    assert!(
        err.contains("field label not supported: spec.host"),
        "{err}"
    );
}

/// `POST` an Eviction of `name` to the eviction path of `path_name`, with `extra` fields (such as
/// `deleteOptions`), as the admin.
async fn evict(env: &Env, path_name: &str, name: &str, extra: Value) -> Raw {
    let mut body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let path = format!("/api/v1/namespaces/default/pods/{path_name}/eviction");
    env.raw(
        "POST",
        &path,
        Identity::Admin,
        Some(("application/json", &body.to_string())),
    )
    .await
}

#[tokio::test]
async fn eviction_statuses_and_graceful_deletion_are_the_real_ones() {
    let env = Env::start("evict").await;
    for name in ["web-a", "web-b"] {
        web_pod(&env, name, NODE);
    }
    env.server
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("pdb");
    let raw = evict(&env, "web-a", "web-a", json!({})).await;
    assert_eq!(raw.status, 429, "{}", raw.body);
    assert_eq!(
        raw.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "reason": "TooManyRequests", "code": 429,
            "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}})
    );
    let raw = evict(&env, "web-a", "web-b", json!({})).await;
    assert_eq!(
        (raw.status, raw.json()["message"].clone()),
        (
            400,
            json!("name in URL does not match name in Eviction object")
        )
    );
    // A second budget over the same pods: the eviction subresource cannot decide.
    env.server
        .create(
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-2", "namespace": "default"},
            "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("second pdb");
    let raw = evict(&env, "web-a", "web-a", json!({})).await;
    assert_eq!(raw.status, 500, "{}", raw.body);
    assert_eq!(
        raw.json()["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    env.kubectl(&["delete", "pdb", "web"]).await;

    // Allowed: 201 Success, the pod terminates gracefully (deletionTimestamp, then gone).
    env.control(ApiServerCmd::PodRemoval { delay_ms: 1500 })
        .await;
    let raw = evict(
        &env,
        "web-a",
        "web-a",
        json!({"deleteOptions": {"gracePeriodSeconds": 20}}),
    )
    .await;
    assert_eq!(raw.status, 201, "{}", raw.body);
    assert_eq!(raw.json()["status"], "Success");
    let pod = parse(&env.kubectl(&["get", "pod", "web-a", "-o", "json"]).await);
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 20, "{pod}");
    assert!(pod["metadata"]["deletionTimestamp"].is_string(), "{pod}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while env
        .run(&env.path("kubeconfig-admin"), &["get", "pod", "web-a"])
        .await
        .ok
    {
        assert!(Instant::now() < deadline, "web-a never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Dry run and preconditions are honoured (a failed precondition still took the disruption,
    // as on a real server: the delete comes after the budget update).
    let raw = evict(
        &env,
        "web-b",
        "web-b",
        json!({"deleteOptions": {"dryRun": ["All"]}}),
    )
    .await;
    assert_eq!(raw.status, 201, "{}", raw.body);
    env.kubectl(&["get", "pod", "web-b"]).await;
    let raw = evict(
        &env,
        "web-b",
        "web-b",
        json!({"deleteOptions": {"preconditions": {"uid": "nope"}}}),
    )
    .await;
    assert_eq!(raw.status, 409, "{}", raw.body);
    let pdb = parse(&env.kubectl(&["get", "pdb", "web-2", "-o", "json"]).await);
    assert!(pdb["status"]["disruptedPods"]["web-b"].is_string(), "{pdb}");
    let raw = evict(&env, "nope", "nope", json!({})).await;
    assert_eq!(raw.status, 404, "{}", raw.body);
    // An unscheduled pod is deleted at once whatever the grace period.
    env.server
        .create(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending"},
            "spec": {"containers": [{"name": "c", "image": "quay.io/x/c:1"}]}}),
        )
        .expect("pending pod");
    let pending = parse(&env.kubectl(&["get", "pod", "pending", "-o", "json"]).await);
    assert_eq!(pending["status"], json!({"phase": "Pending"}));
    assert_eq!(pending["spec"]["terminationGracePeriodSeconds"], 30);
    env.kubectl(&["delete", "pod", "pending", "--wait=false"])
        .await;
    env.kubectl_fails(&["get", "pod", "pending"]).await;
}

#[tokio::test]
async fn leases_conflict_on_a_stale_resource_version() {
    let env = Env::start("lease").await;
    let lease = write(
        &env,
        "lease.yaml",
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: streamd-rollout\n  namespace: default\nspec:\n  holderIdentity: a\n  leaseDurationSeconds: 15\n",
    );
    env.kubectl(&["create", "-f", &lease]).await;
    let first = parse(
        &env.kubectl(&["get", "lease", "streamd-rollout", "-o", "json"])
            .await,
    );
    let mut taken = first.clone();
    taken["spec"]["holderIdentity"] = json!("b");
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/streamd-rollout";
    let raw = env
        .raw(
            "PUT",
            path,
            Identity::Admin,
            Some(("application/json", &taken.to_string())),
        )
        .await;
    assert_eq!(raw.status, 200, "{}", raw.body);
    // The other candidate still holds the old resourceVersion: it loses.
    let mut stale = first.clone();
    stale["spec"]["holderIdentity"] = json!("c");
    let raw = env
        .raw(
            "PUT",
            path,
            Identity::Admin,
            Some(("application/json", &stale.to_string())),
        )
        .await;
    assert_eq!(raw.status, 409, "{}", raw.body);
    assert_eq!(raw.json()["reason"], "Conflict");
    let now = parse(
        &env.kubectl(&["get", "lease", "streamd-rollout", "-o", "json"])
            .await,
    );
    assert_eq!(now["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn a_service_account_gets_exactly_what_rbac_binds() {
    let env = Env::start("rbac").await;
    let sa = "system:serviceaccount:streamd:streamd-rollout";
    let reply = env
        .control(ApiServerCmd::AddUser {
            user: sa.to_string(),
        })
        .await;
    let kubeconfig = PathBuf::from(reply["kubeconfig"].as_str().expect("kubeconfig path"));
    let as_sa = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        let env = &env;
        async move { env.run(&kubeconfig, args).await }
    };
    let out = as_sa(&["get", "pods", "-A"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(r#"pods is forbidden: User "system:serviceaccount:streamd:streamd-rollout" cannot list resource "pods" in API group "" at the cluster scope"#),
        "{}",
        out.stderr
    );
    // (`kubectl create namespace` would send protobuf, which the fake does not read.)
    let rbac = write(
        &env,
        "rbac.yaml",
        r#"apiVersion: v1
kind: Namespace
metadata: {name: streamd}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: rollout}
rules:
- {apiGroups: [""], resources: [pods], verbs: [list, watch]}
- {apiGroups: [""], resources: [pods/eviction], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rollout}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: rollout}
subjects: [{kind: ServiceAccount, name: streamd-rollout, namespace: streamd}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: rollout-lease, namespace: streamd}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rollout-lease, namespace: streamd}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: rollout-lease}
subjects: [{kind: ServiceAccount, name: streamd-rollout}]
"#,
    );
    env.kubectl(&["create", "-f", &rbac]).await;
    assert!(as_sa(&["get", "pods", "-A"]).await.ok);
    assert!(
        as_sa(&["get", "lease", "-n", "streamd", "x"])
            .await
            .stderr
            .contains("NotFound")
    );
    let out = as_sa(&["get", "lease", "-n", "default", "x"]).await;
    assert!(
        out.stderr.contains("Forbidden"),
        "a Role grants only its namespace: {}",
        out.stderr
    );
    let out = as_sa(&["delete", "pod", "-n", "default", "x"]).await;
    assert!(out.stderr.contains("Forbidden"), "{}", out.stderr);
    let stats = env.control(ApiServerCmd::STATS).await;
    assert!(
        stats["by_resource"][sa]["pods"]["list"].as_u64() >= Some(2),
        "{stats}"
    );
    assert!(
        stats["by_resource"][sa]["leases"]["get"].as_u64() >= Some(2),
        "{stats}"
    );

    let mut watch = Watch::spawn(
        &env.dir,
        &kubeconfig,
        &["get", "pods", "-A", "-w", "-o", "json"],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = env.control(ApiServerCmd::STATS).await;
        if stats["watches_open"][sa] == 1 {
            assert_eq!(stats["watches_max"][sa], 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the watch is never counted open: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.child.kill().await.expect("kill kubectl -w");
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.control(ApiServerCmd::STATS).await["watches_open"][sa] != 0 {
        assert!(Instant::now() < deadline, "the closed watch stays counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn server_side_apply_conflicts_on_another_managers_field() {
    let env = Env::start("apply").await;
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: l\n  namespace: default\nspec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 15\n"
        )
    };
    let a = write(&env, "a.yaml", &lease("a"));
    let b = write(&env, "b.yaml", &lease("b"));
    // An apply creates the object.
    env.kubectl(&["apply", "--server-side", "--field-manager=a", "-f", &a])
        .await;
    let err = env
        .kubectl_fails(&["apply", "--server-side", "--field-manager=b", "-f", &b])
        .await;
    assert!(
        err.contains(r#"Apply failed with 1 conflict: conflict with "a" using coordination.k8s.io/v1: .spec.holderIdentity"#),
        "{err}"
    );
    // Re-applying the same values is shared ownership, not a conflict.
    env.kubectl(&["apply", "--server-side", "--field-manager=b", "-f", &a])
        .await;
    // Once an ordinary patch removed the holder, nobody owns it: b's apply goes through.
    env.kubectl(&[
        "patch",
        "lease",
        "l",
        "--type=strategic",
        "--field-manager=b",
        "-p",
        r#"{"spec":{"holderIdentity":null}}"#,
    ])
    .await;
    env.kubectl(&["apply", "--server-side", "--field-manager=b", "-f", &b])
        .await;
    let now = parse(&env.kubectl(&["get", "lease", "l", "-o", "json"]).await);
    assert_eq!(now["spec"]["holderIdentity"], "b");
    let err = env
        .kubectl_fails(&["apply", "--server-side", "--field-manager=a", "-f", &a])
        .await;
    assert!(err.contains(r#"conflict with "b""#), "{err}");
    env.kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=a",
        "--force-conflicts",
        "-f",
        &a,
    ])
    .await;
    let now = parse(&env.kubectl(&["get", "lease", "l", "-o", "json"]).await);
    assert_eq!(now["spec"]["holderIdentity"], "a");
    let raw = env
        .raw(
            "PATCH",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
            Identity::Admin,
            Some(("application/apply-patch+yaml", &lease("c"))),
        )
        .await;
    assert_eq!(raw.status, 422, "fieldManager is required: {}", raw.body);
}
