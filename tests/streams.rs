//! The OSImageStream watcher (`streamd::cluster::streams::watch`) against the testbed's fake API server,
//! as the node identity (so the testbed's copy of docs/deploy/rbac.yaml is what lets it read),
//! with the real `kubectl` changing the object the way an operator or admin would.

mod common;

use std::time::{Duration, Instant};

use common::Env;
use futures::{Stream, StreamExt};
use serde_json::json;
use streamd::cluster::node::NodeClient;
use streamd::cluster::protocol::Inputs;
use streamd::cluster::streams::{self, Catalog, ResolveError, StreamsUpdate};
use testbed::control::{ApiServerCmd, Fault};

/// The next catalog the watch yields within 30 s (watch errors are printed and skipped);
/// prints the time since `since` (just before the change was made).
async fn next_catalog(
    updates: &mut (impl Stream<Item = StreamsUpdate> + Unpin),
    since: Instant,
) -> Catalog {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let next = tokio::time::timeout_at(deadline, updates.next())
            .await
            .expect("a catalog within 30s")
            .expect("the watch stream does not end");
        match next {
            StreamsUpdate::Catalog(c) => {
                println!("catalog {:?} after the change: {c:?}", since.elapsed());
                return c;
            }
            StreamsUpdate::Error(e) => println!("watch error (retried): {e}"),
        }
    }
}

/// The stream watch as streamd runs it: with the node's identity.
async fn watch_as_node(env: &Env) -> std::pin::Pin<Box<impl Stream<Item = StreamsUpdate> + use<>>> {
    let client = NodeClient::new(&env.dir.join("kubeconfig"), testbed::NODE_NAME)
        .await
        .expect("client")
        .client()
        .expect("credentials loaded");
    Box::pin(streams::watch(client))
}

fn stream_only(name: &str) -> Inputs {
    Inputs {
        stream: Some(name.into()),
        ..Inputs::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resolves_follows_a_digest_change_and_sees_deletion() {
    let env = Env::new("streams").await;
    let mut updates = watch_as_node(&env).await;

    // The testbed's object: both streams, resolving a stream-only request to its images.
    let catalog = next_catalog(&mut updates, Instant::now()).await;
    let resolved = streams::resolve(&stream_only("rhel-10"), Some(&catalog)).expect("resolves");
    assert_eq!(resolved.os_image, Some(env.rhel10()));
    assert_eq!(
        resolved.extensions_image.as_deref(),
        Some(env.rhel10_extensions().as_str())
    );
    assert!(resolved.desired().expect("valid").is_some());
    let resolved9 = streams::resolve(&stream_only("rhel-9"), Some(&catalog)).expect("resolves");
    assert_eq!(resolved9.os_image, Some(env.rhel9()));
    match streams::resolve(&stream_only("rhel-11"), Some(&catalog)) {
        Err(e @ ResolveError::UnknownStream { .. }) => {
            assert!(e.refuses());
            assert_eq!(
                e.to_string(),
                "stream \"rhel-11\" is not available; available streams: \"rhel-9\", \"rhel-10\""
            );
        }
        other => panic!("unknown stream resolved to {other:?}"),
    }

    // The operator publishes a new rhel-10 digest: the watch re-delivers, resolution re-targets.
    let rhel10 = env.rhel10();
    let (repo, _) = rhel10.split_once('@').expect("pinned");
    let retarget = format!("{repo}@sha256:{}", "c".repeat(64));
    let catalog_json = |rhel10_image: &str| {
        json!({"status": {"availableStreams": [
            {"name": "rhel-9", "osImage": env.rhel9(),
             "osExtensionsImage": env.vars()["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
            {"name": "rhel-10", "osImage": rhel10_image,
             "osExtensionsImage": env.vars()["TESTBED_RHEL10_EXTENSIONS_IMAGE"]},
        ]}})
        .to_string()
    };
    let patch = catalog_json(&retarget);
    let since = Instant::now();
    env.patch_streams_status(&patch);
    let catalog = next_catalog(&mut updates, since).await;
    let resolved = streams::resolve(&stream_only("rhel-10"), Some(&catalog)).expect("resolves");
    assert_eq!(resolved.os_image, Some(retarget));

    // The watch survives a dropped connection and a 410 Gone (relist): the change made
    // meanwhile still arrives.
    env.apiserver(ApiServerCmd::Fault(Fault::Gone { count: 1 }))
        .await;
    env.apiserver(ApiServerCmd::Fault(Fault::DropWatches)).await;
    let again = format!("{repo}@sha256:{}", "d".repeat(64));
    let since = Instant::now();
    env.patch_streams_status(&catalog_json(&again));
    let catalog = next_catalog(&mut updates, since).await;
    let resolved = streams::resolve(&stream_only("rhel-10"), Some(&catalog)).expect("resolves");
    assert_eq!(resolved.os_image, Some(again));

    // A change that leaves the catalog as it is (a label) yields nothing; the next real change
    // is the next item.
    env.kubectl_ok(&["label", "osimagestream", "cluster", "touched=yes"]);
    let since = Instant::now();
    env.kubectl_ok(&["delete", "osimagestream", "cluster"]);
    assert_eq!(next_catalog(&mut updates, since).await, Catalog::Missing);
    assert_eq!(
        streams::resolve(&stream_only("rhel-10"), Some(&Catalog::Missing)),
        Err(ResolveError::Missing)
    );

    // Re-created without status (created objects never carry one), then reconciled.
    let manifest = env.dir.join("osimagestream.json");
    std::fs::write(
        &manifest,
        json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "OSImageStream",
               "metadata": {"name": "cluster"}, "spec": {"defaultStream": "rhel-9"}})
        .to_string(),
    )
    .expect("write manifest");
    let since = Instant::now();
    env.kubectl_ok(&["create", "-f", manifest.to_str().expect("utf-8")]);
    assert_eq!(
        next_catalog(&mut updates, since).await,
        Catalog::Unreconciled
    );
    let status = catalog_json(&rhel10);
    let mut status: serde_json::Value = serde_json::from_str(&status).expect("json");
    status["status"]["defaultStream"] = json!("rhel-9");
    let since = Instant::now();
    env.patch_streams_status(&status.to_string());
    let catalog = next_catalog(&mut updates, since).await;
    let resolved = streams::resolve(&stream_only("rhel-10"), Some(&catalog)).expect("resolves");
    assert_eq!(resolved.os_image, Some(rhel10));
}

/// Merge-patches the status as the operator would, through whichever version is served.
fn patch_status(env: &Env, version: &str, rhel10_image: &str) {
    let v = env.vars();
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
        {"name": "rhel-10", "osImage": rhel10_image, "osExtensionsImage": v["TESTBED_RHEL10_EXTENSIONS_IMAGE"]},
    ]}})
    .to_string();
    let resource = format!("osimagestreams.{version}.machineconfiguration.openshift.io");
    env.kubectl_ok(&[
        "patch",
        &resource,
        "cluster",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
}

fn rhel10_of(catalog: &Catalog) -> Option<String> {
    streams::resolve(&stream_only("rhel-10"), Some(catalog))
        .ok()
        .and_then(|i| i.os_image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reads_the_served_version_and_says_when_it_cannot() {
    let env = Env::new("streams-versions").await;
    // OpenShift 4.21/4.22 with TechPreviewNoUpgrade: only v1alpha1 is served.
    env.apiserver(ApiServerCmd::ServeOsimagestreams {
        version: Some("v1alpha1".into()),
    })
    .await;
    let mut updates = watch_as_node(&env).await;
    let catalog = next_catalog(&mut updates, Instant::now()).await;
    assert_eq!(rhel10_of(&catalog), Some(env.rhel10()), "{catalog:?}");

    // The cluster is upgraded to 4.23: v1alpha1 goes away, v1 is served; a change made
    // through v1 arrives.
    let rhel10 = env.rhel10();
    let (repo, _) = rhel10.split_once('@').expect("pinned");
    let retarget = format!("{repo}@sha256:{}", "c".repeat(64));
    env.apiserver(ApiServerCmd::ServeOsimagestreams {
        version: Some("v1".into()),
    })
    .await;
    let since = Instant::now();
    patch_status(&env, "v1", &retarget);
    let catalog = next_catalog(&mut updates, since).await;
    assert_eq!(rhel10_of(&catalog), Some(retarget.clone()), "{catalog:?}");

    // No served version at all (the CRD is gone): said, not silent.
    let since = Instant::now();
    env.apiserver(ApiServerCmd::ServeOsimagestreams { version: None })
        .await;
    let unserved = next_catalog(&mut updates, since).await;
    let err = streams::resolve(&stream_only("rhel-10"), Some(&unserved)).expect_err("unserved");
    assert!(!err.refuses(), "waits for the API, like a missing object");
    assert!(
        err.to_string().starts_with("the cluster serves no OSImageStream API (osimagestreams.machineconfiguration.openshift.io in v1 or v1alpha1)"),
        "{err}"
    );

    // Served again: found on the next discovery.
    let since = Instant::now();
    env.apiserver(ApiServerCmd::ServeOsimagestreams {
        version: Some("v1".into()),
    })
    .await;
    let catalog = next_catalog(&mut updates, since).await;
    assert_eq!(rhel10_of(&catalog), Some(retarget), "{catalog:?}");

    // The node's identity loses its RBAC grant: 403 is reported with the server's words.
    env.kubectl_ok(&["delete", "clusterrolebinding", "streamd-node"]);
    let since = Instant::now();
    env.apiserver(ApiServerCmd::Fault(Fault::Gone { count: 1 }))
        .await;
    env.apiserver(ApiServerCmd::Fault(Fault::DropWatches)).await;
    let forbidden = next_catalog(&mut updates, since).await;
    let reason = streams::resolve(&stream_only("rhel-10"), Some(&forbidden))
        .expect_err("forbidden")
        .to_string();
    assert!(
        // The watch selects the object by name, so the server names it (as kube-apiserver does
        // for a request its RequestInfo gives a name).
        reason.starts_with("reading OSImageStream \"cluster\" (machineconfiguration.openshift.io/v1) is forbidden (osimagestreams.machineconfiguration.openshift.io \"cluster\" is forbidden: User \"system:node:worker-0\" cannot "),
        "{reason}"
    );
    assert!(reason.ends_with("(docs/deploy/rbac.yaml)"), "{reason}");
}
