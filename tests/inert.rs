//! What a registry says reaches sd_notify, the node's annotations and Events only as one inert
//! line: a 4xx body cannot add `WATCHDOG=trigger` to a notify message or drive a terminal.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::*;
use testbed::fakes::registry::hostile;

const BODY: &[u8] = b"\nWATCHDOG=trigger\n\x1b[31mdenied\x1b[0m\r\nREADY=1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_error_body_reaches_status_annotations_and_events_inert() {
    let mut env = Env::new("inert").await;
    let registry = hostile::start(|_| hostile::status(400, BODY.to_vec()))
        .await
        .expect("hostile registry");
    let testbed_registry = env
        .rhel10()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    env.config(
        "90-hostile.toml",
        &format!(
            "insecure-registries = [{testbed_registry:?}, {:?}]\n",
            registry.host
        ),
    );
    env.allow_registries(&[&registry.host]);
    let sock_path = env.dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    env.start_streamd_with(&[("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8"))]);
    env.wait_state("Idle").await;
    let os = format!(
        "{}/openshift/rhcos@sha256:{}",
        registry.host,
        "a".repeat(64)
    );
    env.request("rhel-10", &os, None);
    let a = env.wait_state("Refused").await;
    let reason = &a[REASON];
    assert!(registry.hits() > 0, "the registry was asked");
    assert!(reason.contains("WATCHDOG=trigger"), "{reason}");
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
    // The Event about it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let messages = loop {
        let out = env.kubectl(&["get", "events", "-o", "json"]);
        let events: serde_json::Value = serde_json::from_slice(&out.stdout).expect("events");
        let m: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str().map(String::from))
            .collect();
        if m.iter().any(|m| m.contains("WATCHDOG")) || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        messages.iter().any(|m| m.contains("WATCHDOG=trigger")),
        "{messages:?}"
    );
    for m in &messages {
        assert!(!m.chars().any(char::is_control), "{m:?}");
    }
    env.stop_streamd();
    let mut notify = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = sock.recv(&mut buf) {
        notify.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let refused = notify
        .iter()
        .find(|m| m.contains("STATUS=Refused"))
        .unwrap_or_else(|| panic!("no STATUS=Refused in {notify:?}"));
    // sd_notify reads one assignment per line: nothing but STATUS= may be in that message.
    assert_eq!(refused.lines().count(), 1, "{refused:?}");
    for m in &notify {
        for line in m.lines() {
            assert!(
                !line.starts_with("WATCHDOG=trigger") && !line.starts_with("READY=1\u{1b}"),
                "{m:?}"
            );
        }
        assert!(!m.contains('\u{1b}'), "{m:?}");
    }
}
