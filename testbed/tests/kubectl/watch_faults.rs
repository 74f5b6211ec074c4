//! Watch resumption and bookmarks, injected faults and request statistics.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testbed::control::{ApiServerCmd, Fault};

use super::{Env, Identity, NODE_USER, parse, raw_exchange};
use crate::common::NODE;

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
