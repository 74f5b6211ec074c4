//! End-to-end: the image labels of a bootc host (issue 11 §5). `bootc status` prints none, so
//! streamd reads the booted deployment's from its commit through libostree; a node booted from
//! an on-cluster-layered image is then refused a base image on bootc as on rpm-ostree.

mod common;

use common::*;

/// What no `bootc switch` ran leaves: no unit that ran `switch`, nothing staged.
async fn nothing_staged(env: &Env) {
    let units = env.systemd_units().await;
    assert!(
        !units.to_string().contains("\"switch\""),
        "no bootc switch ran: {units}"
    );
    let a = env.annotations().await;
    assert!(!a.contains_key(STAGED_OS_IMAGE), "{a:?}");
    assert!(!a.contains_key(REBOOT_REQUESTED), "{a:?}");
}

/// Starts streamd, requests the rhel-10 base image and expects the `os-image` refusal whose
/// reason contains `why` and names the image, with nothing staged.
async fn base_image_refused(env: &mut Env, why: &str) {
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let refused = env.wait_state("Refused").await;
    let reason = &refused[REASON];
    assert!(
        reason.contains("preflight check os-image failed")
            && reason.contains(why)
            && reason.contains(&env.rhel10()),
        "{reason}"
    );
    nothing_staged(env).await;
}

/// `streamctl preflight --json` for stream rhel-10 and `os`: the os-image check's result and
/// message.
fn os_image_check(env: &Env, os: &str) -> (String, String) {
    let out = preflight_rhel10(env, os, None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "preflight JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let check = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["id"] == "os-image")
        .expect("an os-image check")
        .clone();
    (
        check["result"].as_str().unwrap_or_default().to_string(),
        check["message"].as_str().unwrap_or_default().to_string(),
    )
}

/// A bootc host booted from an on-cluster-layered image (the `layered-image` fixture: label
/// `baseOSContainerImage`) is refused the rhel-10 base image, naming it, and nothing is staged;
/// a layered rhel-10 image passes the same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layered_bootc_host_is_refused_a_base_image() {
    let mut env =
        Env::with_backend("bootc-layered", "layered-image", testbed::Backend::Bootc).await;
    base_image_refused(&mut env, "the node runs an on-cluster-layered image").await;

    // The same request with a layered rhel-10 target passes that check.
    let base = env.rhel10();
    let layered = push_os(
        &env,
        "rhel-10-layered",
        &[
            ("containers.bootc", "1"),
            ("io.openshift.os.streamclass", "rhel-10"),
            ("baseOSContainerImage", base.as_str()),
            ("machineconfigpool", "worker"),
        ],
    )
    .await;
    let (result, message) = os_image_check(&env, &layered);
    assert_eq!(result, "pass", "{message}");
    let (result, message) = os_image_check(&env, &base);
    assert_eq!(result, "fail", "{message}");
}

/// When the booted commit's labels cannot be read (here its commit object is gone from the
/// repository), streamd cannot tell whether the image is layered: a base image is refused with
/// the reason, nothing is staged, and the daemon keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_labels_refuse_a_base_image_on_bootc() {
    let mut env = Env::with_backend(
        "bootc-labels-unread",
        "layered-image",
        testbed::Backend::Bootc,
    )
    .await;
    let objects = env.dir.join("host/sysroot/ostree/repo/objects");
    let mut commits = Vec::new();
    for dir in std::fs::read_dir(&objects).expect("objects").flatten() {
        for f in std::fs::read_dir(dir.path()).expect("object dir").flatten() {
            if f.path().extension().is_some_and(|e| e == "commit") {
                commits.push(f.path());
            }
        }
    }
    assert!(!commits.is_empty(), "the booted image's commit is on disk");
    for c in &commits {
        std::fs::remove_file(c).expect("remove a commit object");
    }
    base_image_refused(&mut env, "the booted image's labels could not be read").await;
}
