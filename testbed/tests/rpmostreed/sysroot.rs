//! The real ostree sysroot behind the fake rpm-ostreed's deployments.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use testbed::control::RpmOstreedCmd;
use testbed::fixtures;
use testbed::scratch::ScratchDir;
use zbus::zvariant::Value;

use super::{
    Dict, Env, Peer, bool_of, dict, handles, rebase_to, registry_ref, string_of, update_deployment,
};

/// `(checksum, serial)` of every deployment in boot order, as `ostree admin status` lists them.
fn ostree_status(sysroot: &Path) -> Vec<(String, i32)> {
    let out = Command::new("ostree")
        .args(["admin", "status"])
        .arg(format!("--sysroot={}", sysroot.display()))
        .output()
        .expect("ostree admin status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rhcos "))
        .map(|id| {
            let (csum, serial) = id.rsplit_once('.').expect("csum.serial");
            (csum.to_string(), serial.parse().expect("serial"))
        })
        .collect()
}

/// `ostree --repo=<sysroot>/ostree/repo <args>`: its standard output, trimmed.
fn ostree_repo(sysroot: &Path, args: &[&str]) -> String {
    let out = Command::new("ostree")
        .arg(format!("--repo={}", sysroot.join("ostree/repo").display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ostree {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The bootloader entry options of the deployment `(checksum, serial)`.
fn entry_options(sysroot: &Path, checksum: &str, serial: i32) -> String {
    for entry in std::fs::read_dir(sysroot.join("boot/loader/entries")).expect("entries") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("read");
        let options = text
            .lines()
            .find_map(|l| l.strip_prefix("options "))
            .expect("options");
        let ostree = options
            .split_whitespace()
            .find_map(|a| a.strip_prefix("ostree="))
            .expect("ostree=");
        let target =
            std::fs::read_link(sysroot.join(ostree.trim_start_matches('/'))).expect("link");
        if target.ends_with(format!("{checksum}.{serial}")) {
            return options.to_string();
        }
    }
    panic!("no bootloader entry for {checksum}.{serial}");
}

/// Kernel arguments without the ones ostree manages.
fn user_kargs(options: &str) -> Vec<String> {
    options
        .split_whitespace()
        .filter(|a| !a.starts_with("ostree="))
        .map(str::to_string)
        .collect()
}

fn deploy_root(sysroot: &Path, checksum: &str, serial: i32) -> PathBuf {
    sysroot.join(format!("ostree/deploy/rhcos/deploy/{checksum}.{serial}"))
}

fn strv_of(d: &Dict, key: &str) -> Vec<String> {
    Vec::<String>::try_from(d.get(key).unwrap_or_else(|| panic!("no {key}")).clone())
        .unwrap_or_else(|e| panic!("{key} is not as: {e}"))
}

fn serial_of(d: &Dict) -> i32 {
    i32::try_from(d.get("serial").expect("serial").clone()).expect("i")
}

/// Writes fixture RPMs for `nevras` and opens them.
fn rpm_files(dir: &Path, nevras: &[&str]) -> Vec<std::fs::File> {
    nevras
        .iter()
        .map(|n| {
            let nevra = fixtures::packages::Nevra::parse(n).expect("nevra");
            let path = dir.join(format!("{n}.rpm"));
            std::fs::write(&path, fixtures::packages::fake_rpm(&nevra)).expect("write rpm");
            std::fs::File::open(&path).expect("open rpm")
        })
        .collect()
}

#[tokio::test]
async fn deployments_are_real_ostree_deployments() {
    let env = Env::new().await;
    let sysroot = env.sysroot();

    // The booted deployment is on disk with its kernel arguments.
    let on_disk = ostree_status(&sysroot);
    let booted = &env.deployments().await[0];
    assert_eq!(
        on_disk,
        [(string_of(booted, "checksum"), serial_of(booted))]
    );
    let booted_options = entry_options(&sysroot, &on_disk[0].0, on_disk[0].1);
    assert!(booted_options.contains("root=UUID="), "{booted_options}");
    assert!(!booted_options.contains("fips=1"), "{booted_options}");
    let booted_root = deploy_root(&sysroot, &on_disk[0].0, on_disk[0].1);
    let os = std::fs::read_to_string(booted_root.join("usr/lib/os-release")).expect("os-release");
    assert!(os.contains("RHEL_VERSION=9.6"), "{os}");
    // GetDeploymentBootConfig reports the real entry.
    let config = env.boot_config("0").await;
    assert_eq!(string_of(&config, "options"), booted_options);
    assert!(
        string_of(&config, "linux").ends_with("/vmlinuz-5.14.0-570.60.1.el9_6.x86_64"),
        "{config:?}"
    );
    assert!(string_of(&config, "title").starts_with("Red Hat Enterprise Linux CoreOS 9.6"));

    // Staging writes a real deployment of the target, first in boot order.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let deployments = env.deployments().await;
    let on_disk = ostree_status(&sysroot);
    assert_eq!(on_disk.len(), 2);
    for (d, (csum, serial)) in deployments.iter().zip(&on_disk) {
        assert_eq!((&string_of(d, "checksum"), serial_of(d)), (csum, *serial));
    }
    assert!(bool_of(&deployments[0], "staged"));
    let (csum, serial) = on_disk[0].clone();
    let root = deploy_root(&sysroot, &csum, serial);
    let os = std::fs::read_to_string(root.join("usr/lib/os-release")).expect("os-release");
    assert!(os.contains("RHEL_VERSION=10.1"), "{os}");
    assert!(
        root.join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64/vmlinuz")
            .exists()
    );
    assert!(
        root.join("usr/share/crypto-policies/policies/FIPS.pol")
            .exists()
    );
    // The booted deployment's kernel arguments were carried.
    assert_eq!(
        user_kargs(&entry_options(&sysroot, &csum, serial)),
        user_kargs(&booted_options)
    );
    // The commit carries the image's manifest digest, as an ostree-ext import does.
    assert_eq!(
        ostree_repo(
            &sysroot,
            &["show", "--print-metadata-key=ostree.manifest-digest", &csum]
        ),
        format!("'{}'", env.rhel10().digest)
    );

    // Cleanup undeploys it for real.
    env.cleanup_pending().await;
    assert_eq!(ostree_status(&sysroot).len(), 1);
    assert!(!root.exists(), "the deployment directory is gone");
    assert_eq!(env.deployments().await.len(), 1);
    // Deployments are not immutable: a testbed directory can simply be deleted.
    std::fs::remove_dir_all(&sysroot).expect("the sysroot can be removed");
}

#[tokio::test]
async fn realtime_hosts_carry_el9_kernel_overrides_until_replaced() {
    let env = Env::with_host("fips-realtime").await;
    let sysroot = env.sysroot();
    let booted = &env.deployments().await[0];
    assert_eq!(
        strv_of(booted, "requested-local-packages"),
        [
            "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-core-5.14.0-570.60.1.el9_6.x86_64",
            "kernel-rt-modules-extra-5.14.0-570.60.1.el9_6.x86_64"
        ]
    );
    assert_eq!(
        strv_of(booted, "requested-base-removals"),
        fixtures::DEFAULT_KERNEL_PACKAGES
    );
    assert!(booted.contains_key("base-checksum"), "layered");
    let booted_options = entry_options(&sysroot, &string_of(booted, "checksum"), serial_of(booted));
    assert!(booted_options.contains("fips=1"), "{booted_options}");
    let cmdline = std::fs::read_to_string(env.dir.join("host/proc/cmdline")).expect("cmdline");
    assert!(cmdline.trim_end().ends_with(&booted_options), "{cmdline}");

    // A plain rebase carries the el9 kernel-rt overrides onto el10: depsolve fails.
    let set_refspec = ("set-refspec", Value::from(registry_ref(env.rhel10())));
    let (ok, message) = env.deploy(&dict(std::slice::from_ref(&set_refspec))).await;
    assert!(!ok);
    assert!(
        message.starts_with("Could not depsolve transaction; 1 problem detected:\n Problem: "),
        "{message}"
    );
    assert!(
        message.contains("kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64 from @commandline"),
        "{message}"
    );
    assert_eq!(ostree_status(&sysroot).len(), 1, "nothing staged");

    let uninstall = Value::from(vec![
        "kernel-rt-core",
        "kernel-rt-modules",
        "kernel-rt-modules-core",
        "kernel-rt-modules-extra",
    ]);
    // The el10 RPMs without -modules-core are not dependency-closed: the local packages
    // depsolve against the el10 base (its kernel removed) and each other, as the real daemon
    // does (testbed/src/fakes/rpmostreed/depsolve.rs), and fail before anything is staged.
    let open = [
        "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-extra-6.12.0-124.8.1.el10_1.x86_64",
    ];
    let files = rpm_files(&env.dir, &open);
    let modifiers = dict(&[
        set_refspec.clone(),
        ("uninstall-packages", uninstall.clone()),
        ("install-local-packages", Value::from(handles(&files))),
    ]);
    let (ok, message) = env.deploy(&modifiers).await;
    assert!(!ok);
    let need = "kernel-rt-modules-core-uname-r = 6.12.0-124.8.1.el10_1.x86_64+rt";
    assert_eq!(
        message,
        format!(
            "Could not depsolve transaction; 3 problems detected:\n \
             Problem 1: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline\n \
             Problem 2: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline\n \
             Problem 3: conflicting requests\n  \
             - nothing provides {need} needed by {} from @commandline",
            open[0], open[1], open[2]
        )
    );
    assert_eq!(ostree_status(&sysroot).len(), 1, "nothing staged");

    // Replacing them with the closed el10 set in the same transaction works and boots +rt.
    let el10 = [
        "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-core-6.12.0-124.8.1.el10_1.x86_64",
        "kernel-rt-modules-extra-6.12.0-124.8.1.el10_1.x86_64",
    ];
    let files = rpm_files(&env.dir, &el10);
    let fds = handles(&files);
    let modifiers = dict(&[
        set_refspec,
        ("uninstall-packages", uninstall),
        ("install-local-packages", Value::from(fds)),
    ]);
    let signals = env.update(&modifiers, &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    // The assembly's own percentages, from 0 again after the pull, and its tasks, as rpm-ostree
    // v2026.2 sent them for this move beside the project.
    let percents: Vec<(String, u32)> = signals
        .all
        .iter()
        .filter(|(m, _)| m == "PercentProgress")
        .map(|(_, msg)| msg.body().deserialize().expect("(su)"))
        .collect();
    let mut want = vec![
        ("Importing rpm-md".to_string(), 0),
        ("Processing packages".to_string(), 0),
    ];
    want.extend((1..=9).map(|k| {
        (
            format!("Processing packages ({k}/9)"),
            if k == 9 { 100 } else { 0 },
        )
    }));
    assert_eq!(percents, want);
    let tasks = signals.strings("TaskBegin");
    let after = tasks
        .iter()
        .skip_while(|t| *t != "Resolving dependencies")
        .skip(1)
        .map(String::as_str)
        .collect::<Vec<_>>();
    assert_eq!(
        after,
        [
            "Running systemd-sysusers",
            "Running pre scripts",
            "Running post scripts",
            "Running posttrans scripts",
            "Writing rpmdb",
            "Generating initramfs",
            "Writing OSTree commit",
            "Staging deployment"
        ]
    );
    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "staged"));
    assert_eq!(strv_of(staged, "requested-local-packages"), el10);
    assert_eq!(
        strv_of(staged, "requested-base-removals"),
        fixtures::DEFAULT_KERNEL_PACKAGES
    );
    let (csum, serial) = (string_of(staged, "checksum"), serial_of(staged));
    assert_eq!(ostree_status(&sysroot)[0], (csum.clone(), serial));
    let root = deploy_root(&sysroot, &csum, serial);
    assert!(
        root.join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64+rt/vmlinuz")
            .exists()
    );
    assert!(
        !root
            .join("usr/lib/modules/6.12.0-124.8.1.el10_1.x86_64")
            .exists(),
        "the default kernel was removed"
    );
    let options = entry_options(&sysroot, &csum, serial);
    assert!(options.contains("fips=1"), "FIPS carried: {options}");
    assert_eq!(user_kargs(&options), user_kargs(&booted_options));
    // The layered commit sits on the image's commit.
    let base = string_of(staged, "base-checksum");
    assert_eq!(
        ostree_repo(&sysroot, &["rev-parse", &format!("{csum}^")]),
        base
    );
    // The record shows the NEVRAs read from the descriptors.
    let record = env.last_record().await;
    assert_eq!(record["fds"], 4);
    assert_eq!(record["modifiers"]["install-local-packages"], json!(el10));
    assert_eq!(
        record["modifiers"]["uninstall-packages"],
        json!([
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-core",
            "kernel-rt-modules-extra"
        ])
    );
}

#[tokio::test]
async fn package_failures_of_the_real_daemon() {
    let env = Env::new().await;
    let set_refspec = ("set-refspec", Value::from(registry_ref(env.rhel10())));

    // An el9 RPM onto an el10 target.
    let files = rpm_files(&env.dir, &["usbguard-1.1.3-1.el9.x86_64"]);
    let fds = handles(&files);
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("install-local-packages", Value::from(fds)),
        ]))
        .await;
    assert!(!ok);
    assert!(
        message.starts_with("Could not depsolve transaction; 1 problem detected:\n"),
        "{message}"
    );
    assert!(message.contains("usbguard-1.1.3-1.el9.x86_64"), "{message}");
    assert_eq!(
        env.last_record().await["modifiers"]["install-local-packages"],
        json!(["usbguard-1.1.3-1.el9.x86_64"])
    );
    // The same RPM built for el10 is fine.
    let files = rpm_files(&env.dir, &["usbguard-1.1.3-1.el10.x86_64"]);
    let fds = handles(&files);
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("install-local-packages", Value::from(fds)),
        ]))
        .await;
    assert!(ok, "{message}");
    env.cleanup_pending().await;

    // Removing a package the base does not have.
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("override-remove-packages", Value::from(vec!["nano"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (false, "Package \"nano\" not found")
    );
    let (ok, message) = env
        .deploy(&dict(&[
            set_refspec.clone(),
            ("override-reset-packages", Value::from(vec!["kernel"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (false, "No overrides for package 'kernel'")
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");
}

#[tokio::test]
async fn old_cpu_fails_the_el10_sanity_check() {
    let env = Env::with_host("old-cpu").await;
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert_eq!(
        (ok, message.as_str()),
        (
            false,
            "Sanity-checking final rootfs: bwrap(/usr/bin/true): Child process exited with code 127"
        )
    );
    assert_eq!(
        env.last_record().await["journal"],
        json!(["Fatal glibc error: CPU does not support x86-64-v3"])
    );
    // A plain rebase is staged before the check (rpm-ostree v2025.5), and stays staged.
    assert_eq!(ostree_status(&env.sysroot()).len(), 2, "left staged");
    assert!(bool_of(&env.deployments().await[0], "staged"));
    env.cleanup_pending().await;
    // An x86-64-v3 CPU passes (the host root is what the fake reads).
    let v3 = fixtures::fixture("default").expect("default").cpuinfo();
    std::fs::write(env.dir.join("host/proc/cpuinfo"), v3).expect("cpuinfo");
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
}

#[tokio::test]
async fn low_disk_fails_the_import() {
    let env = Env::with_host("low-disk").await;
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(!ok);
    assert!(
        message.starts_with("Importing: Unencapsulating base: Layer sha256:"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "Writing content object: min-free-space-percent '3%' would be exceeded, at least 20.5 kB requested"
        ),
        "{message}"
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");
    std::fs::remove_file(env.dir.join("host/run/testbed/low-disk")).expect("marker");
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
}

#[tokio::test]
async fn layered_packages_are_carried() {
    let env = Env::with_host("layered").await;
    let booted = &env.deployments().await[0];
    assert_eq!(strv_of(booted, "requested-packages"), ["usbguard"]);
    let (ok, message) = env.deploy(&rebase_to(env.rhel10())).await;
    assert!(ok, "{message}");
    let staged = &env.deployments().await[0];
    assert_eq!(strv_of(staged, "requested-packages"), ["usbguard"]);
    assert_eq!(strv_of(staged, "packages"), ["usbguard"]);
    assert!(staged.contains_key("base-checksum"));
    // A repo package the target's repositories lack.
    env.cleanup_pending().await;
    let (ok, message) = env
        .deploy(&dict(&[
            ("set-refspec", Value::from(registry_ref(env.rhel10()))),
            ("install-packages", Value::from(vec!["htop"])),
        ]))
        .await;
    assert_eq!((ok, message.as_str()), (false, "Packages not found: htop"));
}

#[tokio::test]
async fn every_fixture_starts() {
    for name in fixtures::NAMES {
        let env = Env::with_host(name).await;
        let f = fixtures::fixture(name).expect("fixture");
        let booted = &env.deployments().await[0];
        assert!(bool_of(booted, "booted"), "{name}");
        let config = env.boot_config("").await;
        let release = std::fs::read_to_string(env.dir.join("host/proc/sys/kernel/osrelease"))
            .expect("osrelease");
        assert!(
            string_of(&config, "linux").ends_with(&format!("/vmlinuz-{}", release.trim())),
            "{name}: {config:?}"
        );
        assert_eq!(
            string_of(&config, "options").contains("fips=1"),
            f.fips,
            "{name}"
        );
        assert_eq!(
            ostree_status(&env.sysroot()),
            [(string_of(booted, "checksum"), serial_of(booted))],
            "{name}"
        );
    }
}

#[tokio::test]
async fn testbed_start_takes_the_host_fixture() {
    let dir = ScratchDir::new("rpmostreed").expect("scratch dir");
    let tb = testbed::Testbed::start(testbed::Options {
        host: "64k-aarch64".into(),
        ..testbed::Options::new(dir.to_path_buf())
    })
    .await
    .expect("testbed starts");
    let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).expect(rel);
    assert_eq!(read("host/proc/sys/kernel/arch"), "aarch64\n");
    assert_eq!(
        read("host/proc/sys/kernel/osrelease"),
        "5.14.0-570.60.1.el9_6.aarch64+64k\n"
    );
    let deployments = tb
        .control(RpmOstreedCmd::Deployments)
        .await
        .expect("deployments");
    assert_eq!(
        deployments[0]["requested-local-packages"][0],
        "kernel-64k-core-5.14.0-570.60.1.el9_6.aarch64"
    );
    assert!(
        testbed::Testbed::start(testbed::Options {
            host: "nope".into(),
            ..testbed::Options::new(dir.join("other"))
        })
        .await
        .is_err()
    );
}

/// rpm-ostree before v2024.6 (the `legacy-lock-file` knob): the lock is the legacy file,
/// `Deployments` says `finalization-locked`, and unlocking or cleaning up removes the file.
#[tokio::test]
async fn legacy_lock_file_mode_reports_the_lock_on_dbus() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::LegacyLockFile { on: true })
        .await;
    let options = dict(&[("lock-finalization", Value::from(true))]);
    assert_eq!(
        env.update(&rebase_to(env.rhel10()), &options)
            .await
            .finished,
        Some((true, String::new()))
    );
    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "finalization-locked"));
    assert!(env.legacy_lock_file().exists());
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked"), None, "older libostree wrote no key");
    env.cleanup_pending().await;
    assert!(!env.legacy_lock_file().exists());
    assert!(env.staged_record().is_none());
    assert!(!env.deployments().await[0].contains_key("finalization-locked"));
}

/// rpm-ostree's build-time check: with `allow-downgrade: false` a rebase to an image built
/// before the booted one fails with libostree's message; without the option (a rebase allows
/// older bases by default) or with true it is staged.
#[tokio::test]
async fn allow_downgrade_false_checks_build_timestamps() {
    let env = Env::new().await;
    assert!(env.rhel10().created_unix() < env.rhel9().created_unix());
    let run = |options: Dict| {
        let env = &env;
        async move {
            let addr = update_deployment(&env.client, &rebase_to(env.rhel10()), &options)
                .await
                .expect("UpdateDeployment");
            let mut peer = Peer::connect(&addr).await;
            assert!(peer.start().await);
            let finished = peer.until_finished().await.finished.expect("Finished");
            drop(peer);
            env.wait_idle().await;
            finished
        }
    };
    let (ok, message) = run(dict(&[("allow-downgrade", Value::from(false))])).await;
    assert!(!ok);
    assert!(
        message
            .starts_with("While checking against deployment timestamp: Upgrade target revision '"),
        "{message}"
    );
    assert!(
        message.contains("' with timestamp 'Sun Nov 15 00:00:00 2026' is chronologically older than current revision '"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "' with timestamp 'Fri Nov 20 00:00:00 2026'; use --allow-downgrade to permit"
        ),
        "{message}"
    );
    assert_eq!(env.deployments().await.len(), 1, "nothing staged");
    assert_eq!(run(dict(&[])).await, (true, String::new()));
    env.cleanup_pending().await;
    assert_eq!(
        run(dict(&[("allow-downgrade", Value::from(true))])).await,
        (true, String::new())
    );
}

/// The origin a deploy edits is the pending deployment's when there is one
/// (`rpmostree_syscore_get_origin_merge_deployment`); an override already there fails
/// (`add_packages_override_remove`), and removals the new base lacks are dropped, not failed
/// (`finalize_removal_overrides`).
#[tokio::test]
async fn overrides_are_edited_on_the_pending_origin_and_inactive_ones_dropped() {
    let env = Env::new().await;
    let remove = || dict(&[("override-remove-packages", Value::from(vec!["dhcp-client"]))]);
    // The booted rhel-9 with one base package removed: staged, not booted.
    assert_eq!(env.deploy(&remove()).await, (true, String::new()));
    let deployments = env.deployments().await;
    assert!(bool_of(&deployments[0], "staged"));
    assert_eq!(
        strv_of(&deployments[0], "requested-base-removals"),
        ["dhcp-client"]
    );
    assert!(strv_of(&deployments[1], "requested-base-removals").is_empty());
    // Asking again edits the pending origin, which already has it.
    assert_eq!(
        env.deploy(&remove()).await,
        (
            false,
            "Override already exists for package 'dhcp-client'".to_string()
        )
    );
    // rhel-10 has no dhcp-client: the inherited removal is reported and dropped.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let messages = signals.strings("Message");
    let at = messages
        .iter()
        .position(|m| m == "Inactive base removals:")
        .unwrap_or_else(|| panic!("{messages:#?}"));
    assert_eq!(messages[at + 1], "  dhcp-client");
    let staged = &env.deployments().await[0];
    assert!(strv_of(staged, "requested-base-removals").is_empty());
    assert!(!staged.contains_key("base-checksum"), "nothing layered");
}

/// `ostree admin deploy` (no `--stage`) leaves a pending deployment that is not staged: it is
/// the origin rpm-ostree edits, libostree records nothing staged, and `Cleanup` removes it.
#[tokio::test]
async fn an_admin_deployed_pending_deployment_is_the_origin_but_not_staged() {
    let env = Env::with_host("layered").await;
    env.control(RpmOstreedCmd::AdminDeploy {
        image: env.rhel9().pullspec.clone(),
    })
    .await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    assert!(!bool_of(&deployments[0], "staged"));
    assert!(!bool_of(&deployments[0], "booted"));
    assert!(strv_of(&deployments[0], "requested-packages").is_empty());
    assert_eq!(strv_of(&deployments[1], "requested-packages"), ["usbguard"]);
    assert_eq!(
        env.staged_record(),
        None,
        "libostree records no staged deployment"
    );

    // The booted origin layers usbguard; the pending one, which is edited, does not.
    let (ok, message) = env
        .deploy(&dict(&[
            ("set-refspec", Value::from(registry_ref(env.rhel10()))),
            ("uninstall-packages", Value::from(vec!["usbguard"])),
        ]))
        .await;
    assert_eq!(
        (ok, message.as_str()),
        (
            false,
            "Package/capability 'usbguard' is not currently requested"
        )
    );
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 3, "staged, the admin's pending, booted");
    assert!(bool_of(&deployments[0], "staged"));
    assert!(strv_of(&deployments[0], "requested-packages").is_empty());
    assert!(!bool_of(&deployments[1], "staged"));
    env.cleanup_pending().await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1, "both pending deployments go");
    assert!(bool_of(&deployments[0], "booted"));
}

/// rpm-ostree leaves `container-image-reference-digest` out when it cannot read the image's
/// metadata back (coreos/rpm-ostree#4185), and `FinalizeDeployment` then compares the base
/// commit.
#[tokio::test]
async fn a_deployment_whose_image_metadata_is_lost_has_no_digest() {
    let env = Env::new().await;
    let booted = &env.deployments().await[0];
    assert!(booted.contains_key("container-image-reference-digest"));
    env.control(RpmOstreedCmd::LoseImageMetadata { index: 0 })
        .await;
    let booted = &env.deployments().await[0];
    assert!(!booted.contains_key("container-image-reference-digest"));
    assert_eq!(
        string_of(booted, "container-image-reference"),
        registry_ref(env.rhel9())
    );
}

/// A local RPM already in the origin fails (`filter_package_requests`), and `uninstall`
/// removes one entry per request: the repo request before a local package of that name
/// (`remove_packages`).
#[tokio::test]
async fn local_packages_are_layered_once_and_uninstalled_one_entry_at_a_time() {
    let env = Env::with_host("realtime").await;
    let core = "kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64";
    let files = rpm_files(&env.dir, &[core]);
    let (ok, message) = env
        .deploy(&dict(&[(
            "install-local-packages",
            Value::from(handles(&files)),
        )]))
        .await;
    assert!(!ok);
    assert!(
        message.starts_with("Package '")
            && message.ends_with(&format!(":{core}' is already layered")),
        "{message}"
    );
    assert_eq!(ostree_status(&env.sysroot()).len(), 1, "nothing staged");

    let env = Env::with_host("layered").await;
    let local = "usbguard-1.1.3-1.el9.x86_64";
    let files = rpm_files(&env.dir, &[local]);
    let (ok, message) = env
        .deploy(&dict(&[(
            "install-local-packages",
            Value::from(handles(&files)),
        )]))
        .await;
    assert!(ok, "{message}");
    let uninstall = dict(&[("uninstall-packages", Value::from(vec!["usbguard"]))]);
    assert_eq!(env.deploy(&uninstall).await, (true, String::new()));
    let staged = &env.deployments().await[0];
    assert!(strv_of(staged, "requested-packages").is_empty());
    assert_eq!(strv_of(staged, "requested-local-packages"), [local]);
}
