//! The fake API server's OSImageStreams and authorization, driven by the real `kubectl`; the
//! RBAC manifests in `docs/deploy/` applied with it and shown to grant the node exactly what
//! streamd needs; the OpenShift installer's manifest (`docs/deploy/openshift/`) parsed and checked.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{NODE, Out, Watch, run_kubectl, start_apiserver};
use serde_json::{Value, json};
use testbed::fakes::apiserver::{ApiServer, StreamImages};
use testbed::scratch::ScratchDir;

fn digest(fill: char) -> String {
    format!("sha256:{}", fill.to_string().repeat(64))
}

fn image(fill: char) -> String {
    format!("quay.io/openshift-release-dev/rhcos@{}", digest(fill))
}

/// `kubectl` arguments that merge-patch the OSImageStream's status subresource (as the
/// machine-config operator writes it).
fn status_patch(patch: &str) -> [&str; 7] {
    [
        "patch",
        "osimagestream",
        "cluster",
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    ]
}

struct Env {
    /// Kept alive for the test; dropping it stops the server.
    _server: ApiServer,
    /// After the server: dropped once it stopped.
    dir: ScratchDir,
}

impl Env {
    /// A bare API server (no RBAC objects); with `streams` the OSImageStream `cluster` too.
    async fn start(test: &str, streams: bool) -> Env {
        let (dir, server) = start_apiserver("osis", test).await;
        if streams {
            server
                .create_os_image_stream(
                    "rhel-9",
                    &[
                        StreamImages {
                            name: "rhel-9".into(),
                            os_image: image('9'),
                            extensions_image: image('e'),
                        },
                        StreamImages {
                            name: "rhel-10".into(),
                            os_image: image('a'),
                            extensions_image: image('f'),
                        },
                    ],
                )
                .expect("seed the OSImageStream");
        }
        Env {
            dir,
            _server: server,
        }
    }

    fn kubeconfig(&self, node: bool) -> PathBuf {
        self.dir.join(if node {
            "kubeconfig"
        } else {
            "kubeconfig-admin"
        })
    }

    /// `kubectl` as the admin (`node: false`) or the node's certificate, with a timeout.
    async fn run(&self, node: bool, args: &[&str]) -> Out {
        run_kubectl(&self.dir, &self.kubeconfig(node), args).await
    }

    async fn ok(&self, node: bool, args: &[&str]) -> String {
        let out = self.run(node, args).await;
        assert!(out.ok, "kubectl {args:?} failed: {}", out.stderr);
        out.stdout
    }

    async fn fails(&self, node: bool, args: &[&str]) -> String {
        let out = self.run(node, args).await;
        assert!(!out.ok, "kubectl {args:?} succeeded: {}", out.stdout);
        out.stderr
    }

    async fn object(&self) -> Value {
        let out = self
            .ok(false, &["get", "osimagestream", "cluster", "-o", "json"])
            .await;
        serde_json::from_str(&out).expect("kubectl -o json prints JSON")
    }
}

fn os_image_of(obj: &Value, stream: &str) -> Option<String> {
    obj["status"]["availableStreams"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == stream)?["osImage"]
        .as_str()
        .map(String::from)
}

#[tokio::test]
async fn kubectl_gets_watches_and_patches_os_image_streams() {
    let env = Env::start("kubectl", true).await;

    // Discovery: kubectl maps the plural, the singular and the kind.
    let resources = env
        .ok(
            false,
            &[
                "api-resources",
                "--api-group=machineconfiguration.openshift.io",
            ],
        )
        .await;
    assert!(
        resources.contains("osimagestreams") && resources.contains("OSImageStream"),
        "{resources}"
    );
    let table = env.ok(false, &["get", "osimagestreams"]).await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "AGE"], "{table}");
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("cluster ")),
        "{table}"
    );

    let obj = env.object().await;
    assert_eq!(obj["apiVersion"], "machineconfiguration.openshift.io/v1");
    assert_eq!(obj["kind"], "OSImageStream");
    assert_eq!(obj["spec"]["defaultStream"], "rhel-9");
    assert_eq!(obj["status"]["defaultStream"], "rhel-9");
    assert_eq!(os_image_of(&obj, "rhel-10"), Some(image('a')));
    let jsonpath = env
        .ok(
            false,
            &[
                "get",
                "osimagestream",
                "cluster",
                "-o",
                "jsonpath={.status.availableStreams[?(@.name==\"rhel-9\")].osExtensionsImage}",
            ],
        )
        .await;
    assert_eq!(jsonpath, image('e'));

    // A watch (field selector, as streamd's) sees a digest changed through the status subresource.
    let mut watch = Watch::spawn(
        &env.dir,
        &env.kubeconfig(false),
        &[
            "get",
            "osimagestreams",
            "--field-selector=metadata.name=cluster",
            "-w",
            "-o",
            "json",
            "--output-watch-events",
        ],
    );
    let new_image = image('b');
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": image('9'), "osExtensionsImage": image('e')},
        {"name": "rhel-10", "osImage": new_image, "osExtensionsImage": image('f')},
    ]}})
    .to_string();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    let mut patched = false;
    let modified = loop {
        let events = watch.events();
        if !patched && !events.is_empty() {
            assert_eq!(events[0]["type"], "ADDED", "{}", watch.seen);
            env.ok(false, &status_patch(&patch)).await;
            patched = true;
        }
        if let Some(ev) = events
            .iter()
            .find(|e| os_image_of(&e["object"], "rhel-10").as_deref() == Some(new_image.as_str()))
        {
            break ev.clone();
        }
        watch.read_more(deadline).await;
    };
    println!(
        "watch: ADDED, status patch, MODIFIED seen in {:?}",
        started.elapsed()
    );
    assert_eq!(modified["type"], "MODIFIED");
    let _ = watch.child.kill().await;
    assert_eq!(
        os_image_of(&env.object().await, "rhel-10"),
        Some(new_image.clone())
    );

    // Status belongs to the subresource: a patch of the main resource leaves it alone.
    let main_patch =
        json!({"status": {"defaultStream": "rhel-10"}, "metadata": {"labels": {"x": "y"}}})
            .to_string();
    env.ok(
        false,
        &[
            "patch",
            "osimagestream",
            "cluster",
            "--type=merge",
            "-p",
            &main_patch,
        ],
    )
    .await;
    let obj = env.object().await;
    assert_eq!(obj["metadata"]["labels"]["x"], "y");
    assert_eq!(obj["status"]["defaultStream"], "rhel-9");

    // The CRD's validation: a tag is not a digest, and nothing changes.
    let before = env.object().await;
    let bad = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": "quay.io/openshift/rhcos:latest", "osExtensionsImage": image('e')},
    ]}})
    .to_string();
    let err = env.fails(false, &status_patch(&bad)).await;
    assert!(
        err.contains("status.availableStreams[0].osImage")
            && err.contains("must end with a valid '@sha256:<digest>' suffix"),
        "{err}"
    );
    assert_eq!(env.object().await, before);

    // A singleton: another name is refused; deleting `cluster` works.
    let other = env.dir.join("other.json");
    std::fs::write(
        &other,
        json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "OSImageStream",
               "metadata": {"name": "other"}, "spec": {"defaultStream": "rhel-9"}})
        .to_string(),
    )
    .expect("write manifest");
    let err = env
        .fails(false, &["create", "-f", other.to_str().expect("utf-8")])
        .await;
    assert!(err.contains("must be 'cluster'"), "{err}");
    env.ok(false, &["delete", "osimagestream", "cluster"]).await;
    let err = env.fails(false, &["get", "osimagestream", "cluster"]).await;
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
}

#[tokio::test]
async fn deploy_rbac_grants_the_node_what_streamd_needs_and_no_more() {
    let env = Env::start("rbac", true).await;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy/rbac.yaml");
    let manifest = manifest.to_str().expect("utf-8 path");

    // Without the manifests the Node authorizer gives a node no custom resources.
    let err = env.fails(true, &["get", "osimagestreams"]).await;
    assert!(
        err.contains("forbidden")
            && err
                .contains("User \"system:node:worker-0\" cannot list resource \"osimagestreams\""),
        "{err}"
    );

    // The real kubectl parses, validates and applies them (client dry run first).
    let dry = env
        .ok(
            false,
            &["apply", "--dry-run=client", "-o", "name", "-f", manifest],
        )
        .await;
    assert_eq!(
        dry.lines().collect::<Vec<_>>(),
        [
            "clusterrole.rbac.authorization.k8s.io/streamd-node",
            "clusterrolebinding.rbac.authorization.k8s.io/streamd-node",
            "namespace/streamd-node-lease",
            "role.rbac.authorization.k8s.io/streamd-heartbeat",
            "rolebinding.rbac.authorization.k8s.io/streamd-heartbeat",
        ]
    );
    let err = env.fails(true, &["get", "osimagestreams"]).await;
    assert!(
        err.contains("forbidden"),
        "a dry run must change nothing: {err}"
    );
    env.ok(false, &["apply", "-f", manifest]).await;

    // Now the node reads and watches the stream catalog…
    let out = env
        .ok(true, &["get", "osimagestream", "cluster", "-o", "json"])
        .await;
    let obj: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(os_image_of(&obj, "rhel-9"), Some(image('9')));
    let watched = env
        .ok(
            true,
            &[
                "get",
                "osimagestreams",
                "-w",
                "--request-timeout=2s",
                "-o",
                "name",
            ],
        )
        .await;
    assert!(
        watched.contains("osimagestream.machineconfiguration.openshift.io/cluster"),
        "{watched}"
    );
    // …but cannot change it, nor anything RBAC would grant beyond its own Node.
    let err = env
        .fails(
            true,
            &[
                "patch",
                "osimagestream",
                "cluster",
                "--type=merge",
                "-p",
                r#"{"metadata":{"labels":{"a":"b"}}}"#,
            ],
        )
        .await;
    assert!(
        err.contains("cannot patch resource \"osimagestreams\""),
        "{err}"
    );
    env.ok(
        true,
        &["annotate", "node", NODE, "osstream.openshift.io/state=Idle"],
    )
    .await;
    let err = env
        .fails(true, &["delete", "clusterrolebinding", "streamd-node"])
        .await;
    assert!(err.contains("forbidden"), "{err}");
}

/// The object of `kind` in a parsed manifest.
fn object<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let one = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "one {kind}");
    one
}

/// docs/deploy/openshift/daemonset.yaml parses and has the shape its README describes: the
/// installer image pinned by digest, only the init container privileged, the host's `/` where
/// install.sh looks for it, the host's PID namespace, and no grant beyond the privileged SCC.
fn openshift_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy/openshift")
}

/// docs/deploy/openshift/daemonset.yaml, parsed.
fn openshift_manifest() -> Vec<Value> {
    let text =
        std::fs::read_to_string(openshift_dir().join("daemonset.yaml")).expect("daemonset.yaml");
    serde_saphyr::from_multiple(&text).expect("daemonset.yaml is YAML")
}

#[test]
fn openshift_daemonset_manifest_is_what_the_readme_says() {
    let dir = openshift_dir();
    let docs = openshift_manifest();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "DaemonSet"
        ]
    );
    let ns = object(&docs, "Namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    let name = ns["metadata"]["name"].clone();
    for d in &docs[1..] {
        assert_eq!(d["metadata"]["namespace"], name, "{d}");
    }
    let sa = object(&docs, "ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"], json!(false));
    assert_eq!(
        object(&docs, "Role")["rules"],
        json!([{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                "resourceNames": ["privileged"], "verbs": ["use"]}])
    );
    let binding = object(&docs, "RoleBinding");
    assert_eq!(
        binding["roleRef"]["name"],
        object(&docs, "Role")["metadata"]["name"]
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": name}])
    );

    let pod = &object(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["automountServiceAccountToken"], json!(false));
    assert_eq!(pod["hostPID"], json!(true));
    let [init] = pod["initContainers"]
        .as_array()
        .expect("init containers")
        .as_slice()
    else {
        panic!("one init container: {pod}");
    };
    let [idle] = pod["containers"].as_array().expect("containers").as_slice() else {
        panic!("one container: {pod}");
    };
    let image = init["image"].as_str().expect("image");
    let (_, digest) = image.split_once("@sha256:").expect("pinned by digest");
    assert!(digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(idle["image"], init["image"], "one image to pull");
    assert_eq!(init["securityContext"]["privileged"], json!(true));
    assert_eq!(idle["securityContext"]["privileged"], Value::Null);
    assert_eq!(
        idle["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    // The script the Containerfile puts in the image, told where the host is.
    let containerfile = std::fs::read_to_string(dir.join("Containerfile")).expect("Containerfile");
    let command = init["command"][0].as_str().expect("command");
    assert!(
        containerfile.contains(&format!("COPY docs/deploy/openshift/install.sh {command}")),
        "{command}"
    );
    let host = init["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "STREAMD_HOST"))
        .and_then(|v| v["value"].as_str())
        .expect("STREAMD_HOST");
    let mount = init["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == host))
        .expect("the host mounted at STREAMD_HOST");
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .expect("the host volume");
    assert_eq!(volume["hostPath"]["path"], "/");
    assert!(
        idle["volumeMounts"].is_null(),
        "the idle container sees no host"
    );
}

/// The manifest's Namespace, Role and RoleBinding are accepted by the testbed's API server
/// (which serves no ServiceAccounts or DaemonSets: the account is a token user the binding
/// names), and the installer's account gets nothing from them but what it says: it may not
/// read or write Nodes, Pods or the binding itself.
#[tokio::test]
async fn openshift_manifest_rbac_applies_and_grants_the_installer_no_api_access() {
    let (dir, server) = start_apiserver("osis", "installer").await;
    let docs = openshift_manifest();
    for doc in docs.iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("Namespace" | "Role" | "RoleBinding")
        )
    }) {
        server
            .create(doc.clone())
            .expect("the API server accepts it");
    }
    let sa = object(&docs, "ServiceAccount");
    let user = format!(
        "system:serviceaccount:{}:{}",
        sa["metadata"]["namespace"].as_str().expect("namespace"),
        sa["metadata"]["name"].as_str().expect("name")
    );
    let kubeconfig = server.add_user(&user).expect("token user");
    let ns = sa["metadata"]["namespace"].as_str().expect("namespace");
    for args in [
        &["get", "nodes"][..],
        &["get", "pods", "-n", ns],
        &["get", "rolebindings", "-n", ns],
        &["annotate", "node", NODE, "x=y"],
    ] {
        let out = run_kubectl(&dir, &kubeconfig, args).await;
        assert!(
            !out.ok && out.stderr.contains("forbidden"),
            "kubectl {args:?} as {user}: {}{}",
            out.stdout,
            out.stderr
        );
    }
    let admin = run_kubectl(
        &dir,
        &dir.join("kubeconfig-admin"),
        &["get", "role", "-n", ns, "-o", "name"],
    )
    .await;
    assert_eq!(
        admin.stdout.trim(),
        "role.rbac.authorization.k8s.io/streamd-installer"
    );
}
