//! End-to-end: `resolve-streams = true`, a node naming only its stream.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use testbed::control::ApiServerCmd;

async fn resolving_env(name: &str) -> Env {
    resolving_env_spread(name, 0).await
}

/// A resolving streamd whose staging after a catalog change waits up to `spread` seconds.
async fn resolving_env_spread(name: &str, spread: u64) -> Env {
    let mut env = Env::new(name).await;
    env.config(
        "60-resolve.toml",
        &format!("resolve-streams = true\nresolve-spread-seconds = {spread}\n"),
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serving_no_stream_api_is_reported_then_v1alpha1_is_used() {
    // A cluster before 4.21 (or 4.21/4.22 without a no-upgrade feature set).
    let mut env = Env::new("resolve-unserved").await;
    env.apiserver(ApiServerCmd::ServeOsimagestreams { version: None })
        .await;
    env.config(
        "60-resolve.toml",
        "resolve-streams = true\nresolve-spread-seconds = 0\n",
    );
    env.start_streamd();
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    let degraded = env
        .wait_for("degraded: no api", Duration::from_secs(60), |a| {
            a.get(STATE).map(String::as_str) == Some("Degraded")
                && a.get(REASON)
                    .is_some_and(|r| r.contains("serves no OSImageStream API"))
        })
        .await;
    assert!(
        degraded[REASON].starts_with("resolving stream through the cluster's OSImageStream: the cluster serves no OSImageStream API"),
        "{}",
        degraded[REASON]
    );
    assert!(env.transactions().await.is_empty());
    // The TechPreview API of 4.21/4.22 appears: streamd finds it and resolves through it.
    env.apiserver(ApiServerCmd::ServeOsimagestreams {
        version: Some("v1alpha1".into()),
    })
    .await;
    let staged = env.wait_reboot_request().await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_stream_api_is_reported_on_the_node() {
    let mut env = Env::new("resolve-forbidden").await;
    env.kubectl_ok(&["delete", "clusterrolebinding", "streamd-node"]);
    env.config(
        "60-resolve.toml",
        "resolve-streams = true\nresolve-spread-seconds = 0\n",
    );
    env.start_streamd();
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    let degraded = env.wait_state("Degraded").await;
    assert!(
        degraded[REASON].contains(
            "reading OSImageStream \"cluster\" (machineconfiguration.openshift.io/v1) is forbidden"
        ) && degraded[REASON].contains("cannot list resource"),
        "{}",
        degraded[REASON]
    );
    assert!(env.transactions().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_with_immediate_reboots_is_a_config_error() {
    let mut env = Env::new("resolve-immediate").await;
    env.config("50-reboot.toml", "reboot = \"immediate\"\n");
    env.config("60-resolve.toml", "# fleet\nresolve-streams = true\n");
    env.start_streamd();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while env.streamd_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "streamd keeps running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = env.log();
    assert!(
        log.contains("60-resolve.toml:2:19: resolve-streams = true cannot be combined with reboot = \"immediate\""),
        "{log}"
    );
    assert!(log.contains("50-reboot.toml:1:10"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_refresh_is_staged_after_this_nodes_share_of_the_spread() {
    let env = resolving_env_spread("resolve-spread", 3600).await;
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    // The admin's own request is acted on at once.
    let first = env.wait_reboot_request().await;
    let before = env.transactions().await.len();
    // The operator publishes a new rhel-10 digest: every node of the stream sees it at once.
    let v = env.vars();
    let rhel10 = env.rhel10();
    let (repo, _) = rhel10.split_once('@').expect("pinned");
    let refreshed = format!("{repo}@sha256:{}", "c".repeat(64));
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
        {"name": "rhel-10", "osImage": refreshed, "osExtensionsImage": v["TESTBED_RHEL10_EXTENSIONS_IMAGE"]},
    ]}})
    .to_string();
    env.patch_streams_status(&patch);
    let held = env
        .wait_for("spread", Duration::from_secs(30), |a| {
            a.get(STATE).map(String::as_str) == Some("Preflight")
                && a.get(REASON)
                    .is_some_and(|r| r.contains("resolve-spread-seconds"))
        })
        .await;
    assert!(
        held[REASON].starts_with(
            "the cluster's OSImageStream changed the images of stream \"rhel-10\"; staging in "
        ),
        "{}",
        held[REASON]
    );
    assert_ne!(held[OBSERVED_DESIRED], first[OBSERVED_DESIRED]);
    assert!(
        !held.contains_key(REBOOT_REQUESTED),
        "the old request's approval token is withdrawn"
    );
    let secs: u64 = held[REASON]
        .split("staging in ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the delay in the reason");
    assert!(secs < 3600, "{secs}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Nothing was pulled for the new digest yet (the old stage is cancelled or kept, not re-pulled).
    let after = env.transactions().await;
    assert!(
        !after[before..]
            .iter()
            .any(|t| t.to_string().contains(&"c".repeat(64))),
        "{after:#?}"
    );
}
