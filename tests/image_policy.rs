//! End-to-end: the node's image policy (docs/reliability.md "Image policy"). A request for an
//! image outside it, `desired-*` or `check-*`, is `Refused` under the check `image-policy`
//! naming the rule and the repository, before any registry read and without a transaction; one
//! inside it is staged as before.
//!
//! The image outside is the testbed's own image behind a [`Mirror`] on another port: a
//! registry streamd can read (plain HTTP, like the testbed's) and that records every request,
//! so "no registry read" is what it saw.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use testbed::fakes::registry::mirror::Mirror;

const CHECK_STREAM: &str = "osstream.openshift.io/check-stream";
const CHECK_OS_IMAGE: &str = "osstream.openshift.io/check-os-image";
const READINESS: &str = "osstream.openshift.io/readiness";

/// `pullspec` with its registry replaced by `host`.
fn on_host(pullspec: &str, host: &str) -> String {
    let (_, rest) = pullspec.split_once('/').expect("host/repository@digest");
    format!("{host}/{rest}")
}

/// A testbed with a mirror of its registry that streamd may speak plain HTTP to, and streamd
/// running with `policy` in its config, `Idle`.
async fn with_mirror(name: &str, policy: &str) -> (Env, Mirror) {
    let mut env = Env::new(name).await;
    let registry = env.tb.registry().host().to_string();
    let mirror = Mirror::start(&registry).await.expect("mirror");
    env.config(
        "60-policy.toml",
        &format!(
            "insecure-registries = [{registry:?}, {:?}]\n{policy}",
            mirror.host()
        ),
    );
    env.start_streamd();
    env.wait_state("Idle").await;
    (env, mirror)
}

/// Waits until the request is refused by the image policy with a reason containing `part`.
async fn refused_by_policy(env: &Env, part: &str) -> BTreeMap<String, String> {
    env.wait_for(
        &format!("refused by image-policy: {part}"),
        Duration::from_secs(90),
        |a| {
            a.get(STATE).map(String::as_str) == Some("Refused")
                && a.get(REASON).is_some_and(|r| r.contains(part))
        },
    )
    .await
}

/// Fails the test when the mirror was asked for anything.
fn assert_unread(mirror: &Mirror) {
    let seen = mirror.seen();
    assert!(seen.is_empty(), "the registry was read: {seen:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_outside_the_default_policy_is_refused_before_any_registry_read() {
    let (env, mirror) = with_mirror("policy-default", "").await;
    let repo = format!("\"{}/openshift/rhcos\"", mirror.host());
    env.request("rhel-10", &on_host(&env.rhel10(), mirror.host()), None);
    let a = refused_by_policy(&env, &repo).await;
    assert_eq!(a[FAILED_CHECKS], "image-policy");
    let reason = &a[REASON];
    assert!(
        reason.starts_with(
            "preflight check image-policy failed: default image policy (allowed-repositories unset): the OS image's repository"
        ) && reason.contains("booted image's")
            && reason.contains("OSImageStream"),
        "{reason}"
    );
    assert!(
        env.event_reasons().contains(&"PreflightFailed".to_string()),
        "{:?}",
        env.event_reasons()
    );
    // The extensions image is judged the same way.
    let ext = on_host(&env.rhel10_extensions(), mirror.host());
    env.request("rhel-10", &env.rhel10(), Some(&ext));
    let a = refused_by_policy(&env, &format!("the extensions image's repository {repo}")).await;
    assert_eq!(a[FAILED_CHECKS], "image-policy");
    // So is a check-* request: its readiness entry is refused, nothing read.
    env.annotate(&[
        &format!("{CHECK_STREAM}=rhel-10"),
        &format!("{CHECK_OS_IMAGE}={}", on_host(&env.rhel10(), mirror.host())),
    ]);
    let a = env
        .wait_for("the checked stream's entry", Duration::from_secs(90), |a| {
            a.get(READINESS).is_some_and(|r| r.contains("rhel-10"))
        })
        .await;
    let entry: Value =
        serde_json::from_str::<Value>(&a[READINESS]).expect("JSON")["rhel-10"].clone();
    assert_eq!(entry["ready"], json!(false), "{entry}");
    assert_eq!(entry["failed"], json!(["image-policy"]), "{entry}");
    assert!(
        entry["reason"].as_str().is_some_and(|r| r.contains(&repo)),
        "{entry}"
    );
    assert_unread(&mirror);
    assert!(env.transactions().await.is_empty());
    // The same images from the testbed's registry, the booted image's repository, are staged.
    env.annotate(&[&format!("{DESIRED_EXTENSIONS_IMAGE}-")]);
    env.request_rhel10();
    let staged = env.wait_state("Staged").await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    assert!(!staged.contains_key(FAILED_CHECKS), "{staged:?}");
    assert_eq!(started(&env.transactions().await).len(), 1);
    assert_unread(&mirror);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_repository_is_taken_and_resolved_only_keeps_to_the_streams_images() {
    let (env, mirror) = with_mirror(
        "policy-resolved",
        "allowed-repositories = [\"*\"]\nresolved-only = true\n",
    )
    .await;
    // Allowed by the list, but not the image the cluster's OSImageStream gives rhel-10.
    let outside = on_host(&env.rhel10(), mirror.host());
    env.request("rhel-10", &outside, None);
    let a = refused_by_policy(&env, "resolved-only: the OS image").await;
    assert_eq!(a[FAILED_CHECKS], "image-policy");
    let (repo, digest) = env
        .rhel10()
        .split_once('@')
        .map(|(r, d)| (r.to_string(), d.to_string()))
        .expect("pinned");
    assert!(
        a[REASON].contains(&format!("gives stream \"rhel-10\" (\"{repo}\"@{digest})")),
        "{}",
        a[REASON]
    );
    assert_unread(&mirror);
    // The stream's own images are taken.
    env.request("rhel-10", &env.rhel10(), Some(&env.rhel10_extensions()));
    let staged = env.wait_state("Staged").await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    assert_eq!(started(&env.transactions().await).len(), 1);
    assert_unread(&mirror);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_takes_a_repository_the_clusters_osimagestream_names() {
    let (env, mirror) = with_mirror("policy-catalog", "").await;
    // The cluster offers rhel-10 from the mirror's repository.
    let v = env.vars();
    let from_mirror = on_host(&env.rhel10(), mirror.host());
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
        {"name": "rhel-10", "osImage": from_mirror, "osExtensionsImage": v["TESTBED_RHEL10_EXTENSIONS_IMAGE"]},
    ]}})
    .to_string();
    env.patch_streams_status(&patch);
    env.request("rhel-10", &from_mirror, None);
    // The policy lets preflight read it (whatever the read then finds).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while mirror.seen().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the image was never read; annotations: {:#?}\n{}",
            env.annotations().await,
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = env.annotations().await;
    assert!(
        !a.get(FAILED_CHECKS)
            .is_some_and(|f| f.contains("image-policy")),
        "{a:#?}"
    );
    assert!(env.log().contains("watching it"), "{}", env.log());
}
