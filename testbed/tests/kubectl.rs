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
use testbed::apiserver::ApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const NODE_USER: &str = "system:node:worker-0";
const STREAM_KEY: &str = "osstream.openshift.io/desired-stream";

struct Env {
    dir: PathBuf,
    server: ApiServer,
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

    async fn control(&self, cmd: Value) -> Value {
        self.server.control(&cmd).await.expect("control command")
    }

    async fn annotations(&self) -> Value {
        self.control(json!({"cmd": "node-annotations"})).await
    }

    async fn node(&self) -> Value {
        self.control(json!({"cmd": "get-node"})).await
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

    let stats = env.control(json!({"cmd": "stats"})).await;
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
    let stats = env.control(json!({"cmd": "stats"})).await;
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
            Some(("application/apply-patch+yaml", "metadata: {}")),
            415,
            "UnsupportedMediaType",
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
        ["nodes", "nodes/status", "events", "namespaces", "pods"]
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
    env.control(json!({"cmd": "fault", "kind": "gone", "count": 1}))
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

    env.control(json!({"cmd": "fault", "kind": "throttle", "count": 1, "retry_after": 3}))
        .await;
    let raw = env.raw("GET", &node_path, Identity::Admin, None).await;
    assert_eq!(raw.status, 429);
    assert!(
        raw.head.to_ascii_lowercase().contains("retry-after: 3"),
        "{}",
        raw.head
    );
    assert_eq!(raw.json()["reason"], "TooManyRequests");

    env.control(json!({"cmd": "fault", "kind": "error", "count": 1}))
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
    env.control(json!({"cmd": "reset-stats"})).await;
    env.control(json!({"cmd": "fault", "kind": "throttle", "count": 2, "retry_after": 1}))
        .await;
    let started = Instant::now();
    let out = env.kubectl(&["get", "--raw", &node_path]).await;
    assert_eq!(parse(&out)["metadata"]["name"], NODE);
    // At least one Retry-After wait; the gcloud kubectl dispatcher's own /version probe
    // may take one of the 429s, so the exact split between the two is not fixed.
    assert!(started.elapsed() >= Duration::from_secs(1));
    let stats = env.control(json!({"cmd": "stats"})).await;
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

    env.control(json!({"cmd": "fault", "kind": "delay", "ms": 400}))
        .await;
    let started = Instant::now();
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    env.control(json!({"cmd": "fault", "kind": "delay", "ms": 0}))
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
    env.control(json!({"cmd": "fault", "kind": "drop-watches"}))
        .await;
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
    env.control(json!({"cmd": "fault", "kind": "refuse", "on": true}))
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
    env.control(json!({"cmd": "fault", "kind": "refuse", "on": false}))
        .await;
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );

    env.control(json!({"cmd": "fault", "kind": "error", "count": 5}))
        .await;
    env.control(json!({"cmd": "fault", "kind": "clear"})).await;
    assert_eq!(
        env.raw("GET", &node_path, Identity::Admin, None)
            .await
            .status,
        200
    );
    assert!(
        env.server
            .control(&json!({"cmd": "fault", "kind": "nope"}))
            .await
            .is_err()
    );
    assert!(env.server.control(&json!({"cmd": "nope"})).await.is_err());
}

#[tokio::test]
async fn stats_count_kubectl_requests_by_user_and_verb() {
    let env = Env::start("stats").await;
    env.kubectl(&["get", "node", NODE, "-o", "json"]).await;
    env.kubectl_as_node(&["annotate", "node", NODE, "a=b"])
        .await;
    env.kubectl_as_node(&["label", "node", NODE, "c=d"]).await;
    let stats = env.control(json!({"cmd": "stats"})).await;
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
    env.control(json!({"cmd": "reset-stats"})).await;
    assert_eq!(
        env.control(json!({"cmd": "stats"})).await,
        json!({"total": 0, "by_user": {}})
    );
}
