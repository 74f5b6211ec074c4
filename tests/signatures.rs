//! End-to-end: the OS image's signature (docs/reliability.md "Signatures"). Where the host's
//! `policy.json` requires a sigstore signature for the image's scope, preflight verifies the
//! registry's cosign attachment and refuses under the check `signature` when it cannot (never
//! a warning), and the stage uses the verifying origin: `ostree-image-signed:docker://…` on
//! rpm-ostree, `--enforce-container-sigpolicy` on bootc. A host booted from the verifying
//! origin is never rebased to an unverified one.
//!
//! The signatures are made here with a P-256 key from a seed and pushed as cosign pushes them
//! ([`testbed::fakes::registry::sigstore`]).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::json;
use testbed::control::RpmOstreedCmd;
use testbed::fakes::registry::sigstore;

/// Where the tests put the public key on the host (the MCO writes ClusterImagePolicy keys as
/// `keyData`; a `keyPath` exercises the host-file side).
const KEY_PATH: &str = "/etc/pki/containers/streamd-test.pub";

/// The testbed registry's repository, as scopes and signatures name it.
fn repository(env: &Env) -> String {
    env.rhel10()
        .split_once('@')
        .map(|(r, _)| r.to_string())
        .expect("pinned")
}

/// Writes the host's policy.json: `default`, and `scope` for the testbed repository.
fn write_policy(env: &Env, default: serde_json::Value, scope: serde_json::Value) {
    let policy = json!({
        "default": default,
        "transports": {"docker": {repository(env): scope}}
    });
    std::fs::write(
        env.dir.join("host/etc/containers/policy.json"),
        policy.to_string(),
    )
    .expect("policy");
}

/// Installs the public key of `seed` at [`KEY_PATH`] and requires a signature by it.
fn require_signature(env: &Env, seed: u8) {
    let pem = sigstore::public_pem(&sigstore::key(seed).expect("key")).expect("pem");
    let path = env.dir.join(format!("host{KEY_PATH}"));
    std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
    std::fs::write(&path, pem).expect("key file");
    write_policy(
        env,
        json!([{"type": "reject"}]),
        json!([{"type": "sigstoreSigned", "keyPath": KEY_PATH}]),
    );
}

/// Signs `image` (`repo@digest`) with the key of `seed` as `cosign sign` does, for the
/// identity `repo:rhel-10`.
async fn sign(env: &Env, image: &str, seed: u8) {
    let digest = image.rsplit('@').next().expect("digest");
    let payload = sigstore::payload(&format!("{}:rhel-10", repository(env)), digest);
    let sig = sigstore::sign(&sigstore::key(seed).expect("key"), &payload);
    sigstore::push_attachment(env.tb.registry().client(), digest, &[(payload, sig)])
        .await
        .expect("push attachment");
}

/// Waits until the request is refused under `signature` with a reason containing `part`.
async fn refused_for_signature(env: &Env, part: &str) -> BTreeMap<String, String> {
    let a = env
        .wait_for(&format!("refused: {part}"), Duration::from_secs(120), |a| {
            a.get(STATE).map(String::as_str) == Some("Refused")
                && a.get(REASON).is_some_and(|r| r.contains(part))
        })
        .await;
    assert_eq!(a[FAILED_CHECKS], "signature", "{a:#?}");
    assert!(
        a[REASON].starts_with("preflight check signature failed: "),
        "{}",
        a[REASON]
    );
    a
}

/// The request again (a refused request is judged once per change).
async fn request_again(env: &Env) {
    env.withdraw_request();
    env.wait_state("Idle").await;
    env.request_rhel10();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_signature_is_verified_before_staging_from_the_verifying_origin() {
    let mut env = Env::new("sig-required").await;
    require_signature(&env, 1);
    env.start_streamd();
    env.wait_state("Idle").await;
    // No attachment at all.
    env.request_rhel10();
    let a = refused_for_signature(&env, "no signature exists").await;
    assert!(a[REASON].contains(&env.rhel10()), "{}", a[REASON]);
    // Signed, but by another key.
    sign(&env, &env.rhel10(), 2).await;
    request_again(&env).await;
    refused_for_signature(&env, "cryptographic signature verification failed").await;
    assert!(env.transactions().await.is_empty(), "nothing was staged");
    // Signed by the policy's key: staged from the verifying origin.
    sign(&env, &env.rhel10(), 1).await;
    request_again(&env).await;
    let staged = env.wait_state("Staged").await;
    assert_eq!(staged[STAGED_OS_IMAGE], env.rhel10());
    let txns = env.transactions().await;
    let started = started(&txns);
    assert_eq!(started.len(), 1, "{txns:#?}");
    assert_eq!(
        started[0]["modifiers"]["set-refspec"],
        json!(format!("ostree-image-signed:docker://{}", env.rhel10()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_booted_from_the_verifying_origin_is_never_rebased_to_an_unverified_one() {
    let mut env = Env::new("sig-booted").await;
    // A signed install: the booted image deployed from the verifying origin, under a policy
    // ostree-ext takes for it (its default is not insecureAcceptAnything).
    write_policy(
        &env,
        json!([{"type": "reject"}]),
        json!([{"type": "insecureAcceptAnything"}]),
    );
    let signed_rhel9 = format!("ostree-image-signed:docker://{}", env.rhel9());
    env.rpmostreed(RpmOstreedCmd::AdminDeploy {
        image: signed_rhel9.clone(),
    })
    .await;
    env.reboot(false).await;
    let deployments = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    assert!(
        deployments.to_string().contains(&signed_rhel9),
        "{deployments:#}"
    );
    env.rpmostreed(RpmOstreedCmd::ResetTransactions).await;
    // The policy's default goes back to insecureAcceptAnything: ostree-ext refuses the
    // verifying origin then, and an unverified one is never taken instead.
    write_policy(
        &env,
        json!([{"type": "insecureAcceptAnything"}]),
        json!([{"type": "insecureAcceptAnything"}]),
    );
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = refused_for_signature(&env, "never moved to an unverified one").await;
    assert!(
        a[REASON].contains("insecureAcceptAnything"),
        "{}",
        a[REASON]
    );
    assert!(started(&env.transactions().await).is_empty());
    // With a policy that takes it, the move stays on the verifying origin.
    write_policy(
        &env,
        json!([{"type": "reject"}]),
        json!([{"type": "insecureAcceptAnything"}]),
    );
    request_again(&env).await;
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    let started = started(&txns);
    assert_eq!(started.len(), 1, "{txns:#?}");
    assert_eq!(
        started[0]["modifiers"]["set-refspec"],
        json!(format!("ostree-image-signed:docker://{}", env.rhel10()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootc_switches_under_the_policy_when_it_requires_a_signature() {
    let mut env = Env::with_backend("sig-bootc", "default", testbed::Backend::Bootc).await;
    require_signature(&env, 3);
    sign(&env, &env.rhel10(), 3).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_reboot_request().await;
    env.approve_reboot().await;
    env.wait_state("Rebooting").await;
    let units = env.systemd_units().await;
    let bootc = json!(env.vars()["TESTBED_BOOTC"]);
    let switches: Vec<serde_json::Value> = bootc_argvs(&units, &bootc)
        .into_iter()
        .filter(|argv| argv[1] == "switch")
        .collect();
    assert_eq!(
        switches,
        vec![json!([
            env.vars()["TESTBED_BOOTC"],
            "switch",
            "--transport",
            "registry",
            "--enforce-container-sigpolicy",
            env.rhel10()
        ])],
        "{units}"
    );
}
