//! End-to-end: the manage-mode migrations through `Done` on each rpm-ostree release the
//! testbed plays (`testbed::RpmOstreeVersion::SUPPORTED`, docs/fidelity.md "since"): RHEL
//! 10.0's 2025.5, whose `FinalizeDeployment` compares the checksum with the staged base commit
//! and whose layer tasks count from 0, and 2026.2, which compares the image digest. The fake
//! stages, unlocks and finalizes through real libostree 2025.x where it can (`real_libostree`:
//! always on CI), so the record streamd reads and the lock it relies on are libostree's own,
//! and imports the image with ostree-ext over skopeo, as rpm-ostree does.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use testbed::RpmOstreeVersion;

/// Moves host `host` to rhel-10 (with the extensions image when it carries a variant kernel)
/// through the approval, the reboot and `Done`; returns the FinalizeDeployment records and the
/// digest the staged deployment reported: the platform (amd64) manifest's of the pinned index,
/// what rpm-ostree v2026.2 run beside the project compared `FinalizeDeployment`'s with.
async fn migrate(version: RpmOstreeVersion, host: &str, extensions: bool) -> (Vec<Value>, String) {
    let name = format!("ver-{version}-{host}");
    let real = real_libostree(&name);
    let mut env = Env::with_rpm_ostree_over_libostree(&name, host, version).await;
    let entries = loader_entries(&env);
    env.start_streamd();
    env.wait_state("Idle").await;
    if extensions {
        env.request_rhel10_extensions();
    }
    env.request_rhel10();
    env.approve_reboot().await;
    env.wait_for(
        "rpm-ostreed initiates the reboot",
        Duration::from_secs(60),
        |_| env.reboot_initiated(),
    )
    .await;
    let finalizes: Vec<Value> = env
        .transactions()
        .await
        .into_iter()
        .filter(|t| t["method"] == "FinalizeDeployment")
        // A call made while the previous transaction is still winding down is refused with
        // "Transaction in progress" (as rpm-ostreed refuses it until the last peer of the old
        // one is gone) and retried: what counts is the transactions the daemon ran.
        .filter(|t| t["started"] == true)
        .collect();
    if real {
        // Staged by real libostree as rpm-ostree stages: its record, no legacy lock file, and
        // no bootloader entry until the shutdown finalizes it.
        assert!(env.dir.join("host/run/ostree/staged-deployment").exists());
        assert!(
            !env.dir
                .join("host/run/ostree/staged-deployment-locked")
                .exists()
        );
        assert_eq!(
            loader_entries(&env),
            entries,
            "a staged deployment has no entry"
        );
    }
    // The image came in through ostree-ext's importer (as rpm-ostree's), which keeps each layer
    // under an `ostree/container/blob/` ref; the testbed's own commits make none.
    let refs = std::process::Command::new("ostree")
        .arg("refs")
        .arg(format!(
            "--repo={}",
            env.dir.join("sysroot/ostree/repo").display()
        ))
        .output()
        .expect("ostree refs");
    assert!(
        String::from_utf8_lossy(&refs.stdout).contains("ostree/container/blob/"),
        "no layer ref of ostree-ext: {}",
        String::from_utf8_lossy(&refs.stdout)
    );
    let done = env.reboot_into_rhel10().await;
    if real {
        assert!(!env.dir.join("host/run/ostree/staged-deployment").exists());
    }
    if host == "realtime" {
        assert_eq!(host_facts(&done)["kernel"], "realtime", "{done:?}");
    }
    let platform = env.tb.registry().os_images()[1].platforms[0].digest.clone();
    (finalizes, platform)
}

/// The bootloader entries of the testbed's sysroot.
fn loader_entries(env: &Env) -> usize {
    std::fs::read_dir(env.dir.join("sysroot/boot/loader/entries"))
        .expect("the sysroot's bootloader entries")
        .count()
}

/// The checksum a FinalizeDeployment record was called with.
fn checksum(t: &Value) -> &str {
    t["options"]["checksum"].as_str().unwrap_or_default()
}

/// 2025.5 refuses the digest ("Expected staged base checksum …, but found <commit>"); streamd
/// answers once with the base commit, and the node moves.
async fn oldest(host: &str, extensions: bool) {
    let (fin, platform) = migrate(RpmOstreeVersion::OLDEST, host, extensions).await;
    assert_eq!(fin.len(), 2, "the digest, then the commit: {fin:#?}");
    assert_eq!(checksum(&fin[0]), platform, "{fin:#?}");
    assert!(
        fin[0]["result"]["message"]
            .as_str()
            .is_some_and(|e| e.starts_with("Expected staged base checksum sha256:")),
        "{fin:#?}"
    );
    let commit = checksum(&fin[1]);
    assert!(
        commit.len() == 64 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "an ostree commit: {fin:#?}"
    );
}

/// 2026.2 takes the digest at once.
async fn newest(host: &str, extensions: bool) {
    let (fin, platform) = migrate(RpmOstreeVersion::NEWEST, host, extensions).await;
    assert_eq!(fin.len(), 1, "{fin:#?}");
    assert_eq!(checksum(&fin[0]), platform, "{fin:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_host_moves_on_the_oldest_rpm_ostree() {
    oldest("default", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realtime_host_moves_on_the_oldest_rpm_ostree() {
    oldest("realtime", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_host_moves_on_the_newest_rpm_ostree() {
    newest("default", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realtime_host_moves_on_the_newest_rpm_ostree() {
    newest("realtime", true).await;
}
