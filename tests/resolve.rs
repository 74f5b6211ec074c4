//! End-to-end: `resolve-streams = true`, a node naming only its stream.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

async fn resolving_env(name: &str) -> Env {
    let mut env = Env::new(name).await;
    env.config("60-resolve.toml", "resolve-streams = true\n");
    env.start_streamd();
    env.wait_state("Idle").await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_only_request_takes_the_clusters_images() {
    let env = resolving_env("resolve-happy").await;
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    let staged = env.wait_reboot_request().await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    assert!(
        !staged.contains_key(DESIRED_OS_IMAGE),
        "streamd never writes the input keys"
    );
    // The resolved request is what streamctl shows.
    let out = env.streamctl(&["status", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(doc["desiredOsImage"], json!(env.rhel10()));
    assert_eq!(
        doc["desiredExtensionsImage"],
        json!(env.rhel10_extensions())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_stream_is_refused_listing_the_available_ones() {
    let env = resolving_env("resolve-unknown").await;
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-11")]);
    let refused = env.wait_state("Refused").await;
    assert!(
        refused[REASON].contains("rhel-11") && refused[REASON].contains(r#""rhel-9", "rhel-10""#),
        "{}",
        refused[REASON]
    );
    assert!(env.transactions().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_digest_re_targets_the_node() {
    let env = resolving_env("resolve-retarget").await;
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    let first = env.wait_reboot_request().await;
    // The cluster points rhel-10 at another image (here: the one the node runs).
    let v = env.vars();
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
        {"name": "rhel-10", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL10_EXTENSIONS_IMAGE"]},
    ]}})
    .to_string();
    env.patch_streams_status(&patch);
    let done = env
        .wait_for("re-targeted", Duration::from_secs(60), |a| {
            a.get(STATE).map(String::as_str) == Some("Done") && !a.contains_key(STAGED_OS_IMAGE)
        })
        .await;
    assert_ne!(done[OBSERVED_DESIRED], first[OBSERVED_DESIRED]);
    assert!(!done.contains_key(REBOOT_REQUESTED));
    let txns = env.transactions().await;
    assert!(
        txns.iter().any(|t| t["method"] == "Cleanup"),
        "the stale stage is removed: {txns:#?}"
    );
}
