//! Reads, annotations, watches, patches and events on the fake API server.

use std::time::{Duration, Instant};

use serde_json::json;
use testbed::control::ApiServerCmd;

use super::{Env, NODE_USER, STREAM_KEY, parse};
use crate::common::{NODE, Watch};

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
