//! Variant-aware migration end to end: each host fixture reaches `Staged` with one transaction
//! whose modifiers carry the variant; each refusal ends in `Refused` with its check id and no
//! transaction.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use testbed::control::RpmOstreedCmd;
use testbed::fakes::registry::stored_blob;

/// Stages rhel-10 (with the extensions image) on `host` and returns the one transaction.
async fn stage_on(host: &str) -> (Env, Value) {
    stage_named(&format!("variant-{host}"), host).await
}

/// [`stage_on`] in a testbed directory named after `name`: tests running side by side in
/// one process must not share one.
async fn stage_named(name: &str, host: &str) -> (Env, Value) {
    let mut env = Env::with_host(name, host).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    env.wait_state("Staged").await;
    let txns = env.transactions().await;
    let s = started(&txns);
    assert_eq!(s.len(), 1, "exactly one transaction: {txns:#?}");
    let t = s[0].clone();
    assert_eq!(t["options"]["lock-finalization"], json!(true));
    assert_eq!(t["result"]["ok"], json!(true), "{t:#}");
    (env, t)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_and_fips_hosts_stage_a_plain_rebase() {
    for host in ["default", "fips"] {
        let (env, t) = stage_on(host).await;
        let mods = t["modifiers"].as_object().expect("modifiers");
        assert_eq!(mods.len(), 1, "{host}: only set-refspec: {mods:?}");
        let host_json = host_facts(&env.annotations().await);
        assert_eq!(
            host_json["fips"],
            if host == "fips" {
                "enabled"
            } else {
                "disabled"
            }
        );
        assert_eq!(host_json["kernel"], "default");
        assert_eq!(host_json["x86_64Level"], 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_hosts_carry_kernel_rt_in_one_transaction() {
    for host in ["realtime", "fips-realtime"] {
        let (env, t) = stage_on(host).await;
        // The booted el9.6 set, -modules-core included, goes; the el10 set closed under
        // Requires (-modules-core from the headers) comes in.
        let uninstall = strings(&t["modifiers"]["uninstall-packages"]);
        assert_eq!(uninstall.len(), 4, "{host}: {t:#}");
        assert!(uninstall.iter().all(|p| p.contains("el9")), "{uninstall:?}");
        let local = strings(&t["modifiers"]["install-local-packages"]);
        assert_eq!(t["fds"], json!(4), "{t:#}");
        for p in [
            "kernel-rt-core-",
            "kernel-rt-modules-",
            "kernel-rt-modules-core-",
            "kernel-rt-modules-extra-",
        ] {
            assert!(
                local.iter().any(|l| l.starts_with(p) && l.contains("el10")),
                "{p} in {local:?}"
            );
        }
        assert!(
            !local
                .iter()
                .any(|l| l.starts_with("kernel-rt-kvm") || l.starts_with("kernel-rt-6"))
        );
        let host_json = host_facts(&env.annotations().await);
        assert_eq!(host_json["kernel"], "realtime");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aarch64_64k_host_carries_kernel_64k() {
    let (_env, t) = stage_on("64k-aarch64").await;
    let local = strings(&t["modifiers"]["install-local-packages"]);
    assert_eq!(t["fds"], json!(4), "{t:#}");
    assert!(
        local
            .iter()
            .all(|l| l.starts_with("kernel-64k-") && l.contains("el10") && l.ends_with("aarch64")),
        "{local:?}"
    );
    assert!(
        local
            .iter()
            .any(|l| l.starts_with("kernel-64k-modules-core-")),
        "{local:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layered_extension_is_reprovided_from_the_target() {
    let (_env, t) = stage_on("layered").await;
    assert_eq!(
        strings(&t["modifiers"]["uninstall-packages"]),
        vec!["usbguard".to_string()]
    );
    let local = strings(&t["modifiers"]["install-local-packages"]);
    assert_eq!(local.len(), 1, "{t:#}");
    assert!(
        local[0].starts_with("usbguard-") && local[0].contains("el10"),
        "{local:?}"
    );
}

/// Expects `Refused` naming `check`, and no transaction.
async fn refused(env: &Env, check: &str) -> String {
    let a = env
        .wait_for(
            &format!("refusal by {check}"),
            Duration::from_secs(60),
            |a| a.get(STATE).map(String::as_str) == Some("Refused"),
        )
        .await;
    let reason = a[REASON].clone();
    assert!(
        reason.contains(&format!("preflight check {check} failed")),
        "{reason}"
    );
    let failed = a.get(FAILED_CHECKS).map(String::as_str).unwrap_or_default();
    assert!(
        failed.split(',').any(|id| id == check),
        "failed-checks {failed:?} names {check}"
    );
    assert!(
        env.transactions().await.is_empty(),
        "no transaction for a refusal"
    );
    reason
}

async fn refusal_on(host: &str, check: &str, with_ext: bool) -> (Env, String) {
    let mut env = Env::with_host(&format!("refuse-{host}-{check}"), host).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, with_ext.then_some(ext.as_str()));
    let r = refused(&env, check).await;
    (env, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_refusals() {
    let (_e, r) = refusal_on("old-cpu", "cpu-level", false).await;
    assert!(r.contains("x86-64-v2"), "{r}");
    let (_e, r) = refusal_on("runc", "container-runtime", false).await;
    assert!(r.contains("crun"), "{r}");
    let (_e, r) = refusal_on("realtime", "extensions-image", false).await;
    assert!(r.contains("desired-extensions-image"), "{r}");
    let (_e, _) = refusal_on("low-disk", "disk-space", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inconsistent_fips_is_refused() {
    let mut env = Env::with_host("refuse-fips", "fips").await;
    // The kernel says FIPS is off while the command line says fips=1.
    std::fs::write(env.dir.join("host/proc/sys/crypto/fips_enabled"), "0\n").expect("write");
    env.start_streamd();
    env.wait_state("Idle").await;
    let os = env.rhel10();
    env.request("rhel-10", &os, None);
    let r = refused(&env, "fips").await;
    assert!(r.contains("inconsistent"), "{r}");
}

/// Pushes an image (see `push_os`) as `tag` with `labels`, requests it for `stream` and expects
/// the refusal by `check` (see `refused`); returns the reason.
async fn refused_image(
    env: &Env,
    stream: &str,
    tag: &str,
    labels: &[(&str, &str)],
    check: &str,
) -> String {
    let image = push_os(env, tag, labels).await;
    env.request(stream, &image, None);
    refused(env, check).await
}

/// Removes the whole request (stream, OS and extensions images) and waits for `Idle`.
async fn withdraw_all(env: &Env) {
    env.annotate(&[
        &format!("{DESIRED_STREAM}-"),
        &format!("{DESIRED_OS_IMAGE}-"),
        &format!("{DESIRED_EXTENSIONS_IMAGE}-"),
    ]);
    env.wait_state("Idle").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_refusals() {
    let mut env = Env::new("refuse-images").await;
    env.start_streamd();
    env.wait_state("Idle").await;

    // Stream class mismatch: a rhel-9 image for stream rhel-10 (the booted image is rhel-9 too,
    // so use the rhel-9 extensions image's stream check instead on a rhel-10 OS image below).
    let r = refused_image(
        &env,
        "rhel-10",
        "labelled-rhel-9",
        &[
            ("containers.bootc", "1"),
            ("io.openshift.os.streamclass", "rhel-9"),
            ("ostree.linux", "6.12.0-124.8.1.el10_1.x86_64"),
        ],
        "os-image",
    )
    .await;
    assert!(r.contains("stream class"), "{r}");
    withdraw_all(&env).await;

    // Not bootable.
    let r = refused_image(
        &env,
        "rhel-10",
        "not-bootable",
        &[("io.openshift.os.streamclass", "rhel-10")],
        "os-image",
    )
    .await;
    assert!(r.contains("not a bootable"), "{r}");
    withdraw_all(&env).await;

    // Downgrade: a bootable image of an older major.
    let r = refused_image(
        &env,
        "rhel-8",
        "rhel-8",
        &[
            ("containers.bootc", "1"),
            ("io.openshift.os.streamclass", "rhel-8"),
        ],
        "direction",
    )
    .await;
    assert!(r.contains("downgrade"), "{r}");
    withdraw_all(&env).await;

    // The registry rejects the credential the OS daemon pulls with (the host's ostree auth
    // file, not streamd's pull secret: issue 11 §3).
    let secret = env.dir.join("host/etc/ostree/auth.json");
    let good = std::fs::read_to_string(&secret).expect("secret");
    let bad = format!(
        r#"{{"auths":{{"{}":{{"username":"testbed","password":"wrong-password-value"}}}}}}"#,
        env.vars()["TESTBED_REGISTRY"]
    );
    std::fs::write(&secret, &bad).expect("write");
    let os = env.rhel10();
    env.request("rhel-10", &os, None);
    let r = refused(&env, "os-pull-credentials").await;
    assert!(
        r.contains("rejected the credential in /etc/ostree/auth.json"),
        "{r}"
    );
    assert!(!r.contains("wrong-password-value"));
    std::fs::write(&secret, good).expect("restore");
    assert!(
        !env.log().contains("wrong-password-value"),
        "the password never reaches the log"
    );
}

/// Pushes a rhel-10 extensions image (x86_64) holding the stream's RPMs that `keep` keeps.
async fn push_rhel10_extensions(
    env: &Env,
    tag: &str,
    keep: impl Fn(&testbed::fakes::registry::Rpm) -> bool,
) -> String {
    let reg = env.tb.registry();
    let files = reg
        .extensions_files("rhel-10", testbed::fakes::registry::Arch::Amd64, keep)
        .expect("files");
    let (ext, _) = reg
        .push_custom(
            tag,
            BTreeMap::from([
                ("io.openshift.os.extensions".to_string(), "true".to_string()),
                (
                    "io.openshift.os.streamclass".to_string(),
                    "rhel-10".to_string(),
                ),
            ]),
            files,
        )
        .await
        .expect("push");
    ext
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_image_without_the_variant_is_refused() {
    let mut env = Env::with_host("refuse-ext", "realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let ext = push_rhel10_extensions(&env, "ext-without-rt", |r| r.name == "usbguard").await;
    let os = env.rhel10();
    env.request("rhel-10", &os, Some(&ext));
    let r = refused(&env, "kernel-variant").await;
    assert!(r.contains("kernel-rt-core"), "{r}");
}

/// An extensions image whose kernel-rt lacks `-modules-core`: the RPMs streamd would pass are
/// not dependency-closed, which rpm-ostree would only find after pulling the OS image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_image_missing_a_dependency_is_refused_before_any_transaction() {
    let mut env = Env::with_host("refuse-ext-deps", "realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let ext = push_rhel10_extensions(&env, "ext-without-modules-core", |r| {
        r.name != "kernel-rt-modules-core"
    })
    .await;
    let os = env.rhel10();
    env.request("rhel-10", &os, Some(&ext));
    let r = refused(&env, "rpm-dependencies").await;
    assert!(
        r.contains("nothing provides kernel-rt-modules-core-uname-r = 6.12.0-")
            && r.contains("+rt needed by kernel-rt-core-6.12.0-"),
        "the reason names the package and the missing requirement: {r}"
    );
}

/// An extensions image whose kernel-rt-modules-extra (built by the real rpmbuild) needs an
/// `rpmlib(…)` feature the booted el9 rpm does not provide: rpm-ostree would import it with the
/// booted librpm, which checks no such feature; preflight refuses it before any transaction, as
/// `rpm -i` would, naming the file, the feature and the booted rpm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpm_the_booted_rpm_cannot_read_is_refused_before_any_transaction() {
    let mut env = Env::with_host("refuse-rpmlib", "realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let reg = env.tb.registry();
    let extra = reg
        .rpms()
        .iter()
        .find(|r| r.stream == "rhel-10" && r.name == "kernel-rt-modules-extra")
        .expect("rhel-10 kernel-rt-modules-extra")
        .clone();
    let cache = extra
        .path
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the rpm cache");
    let needy = testbed::fakes::registry::rpm::build_requiring(
        cache,
        "rhel-10",
        &extra.name,
        &format!("{}-{}", extra.version, extra.release),
        "rpmlib(PayloadIsZstd2) <= 6.1.0-1",
    )
    .await
    .expect("rpmbuild");
    let mut files = reg
        .extensions_files("rhel-10", testbed::fakes::registry::Arch::Amd64, |r| {
            r.name != extra.name
        })
        .expect("files");
    files.push((
        format!(
            "{}/{}",
            testbed::fakes::registry::content::EXTENSIONS_DIR,
            needy.file_name()
        ),
        std::fs::read(&needy.path).expect("built rpm"),
    ));
    let labels = BTreeMap::from([
        ("io.openshift.os.extensions".to_string(), "true".to_string()),
        (
            "io.openshift.os.streamclass".to_string(),
            "rhel-10".to_string(),
        ),
    ]);
    let (ext, _) = reg
        .push_custom("ext-needing-rpm-6", labels, files)
        .await
        .expect("push");
    let os = env.rhel10();
    env.request("rhel-10", &os, Some(&ext));
    let r = refused(&env, "rpm-dependencies").await;
    assert!(
        r.contains(&needy.file_name())
            && r.contains("rpmlib(PayloadIsZstd2) <= 6.1.0-1")
            && r.contains("rpm 4.16.1.3 (el9)"),
        "the reason names the file, the feature and the booted rpm: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_tree_without_rt_fails_verification_and_is_cleaned_up() {
    let mut env = Env::with_host("verify-rt", "realtime").await;
    env.rpmostreed(RpmOstreedCmd::DropVariantNext).await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    let a = env.wait_state("Degraded").await;
    let reason = &a[REASON];
    assert!(reason.contains("+rt"), "{reason}");
    assert!(
        reason.contains("pending deployment was removed"),
        "{reason}"
    );
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(methods, vec!["UpdateDeployment", "Cleanup"], "{txns:#?}");
    let deps = env.rpmostreed(RpmOstreedCmd::Deployments).await;
    assert!(
        deps.as_array()
            .is_some_and(|d| d.iter().all(|d| d["staged"] != json!(true))),
        "nothing staged after the cleanup: {deps:#}"
    );
    assert!(!a.contains_key(STAGED_OS_IMAGE));
    // Remembered like a failed staging (issue 20 §7): after a restart the same request is
    // neither pulled nor checked again; the new process reports the remembered reason.
    env.stop_streamd();
    env.start_streamd();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let out = env.streamctl(&["status"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("State:        Degraded") && text.contains("+rt") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let txns = env.transactions().await;
    let methods: Vec<&str> = txns.iter().filter_map(|t| t["method"].as_str()).collect();
    assert_eq!(methods, vec!["UpdateDeployment", "Cleanup"], "{txns:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fips_realtime_staging_is_verified() {
    let (env, t) = stage_named("verified-fips-realtime", "fips-realtime").await;
    assert_eq!(t["fds"], json!(4));
    assert!(
        env.log().contains("staged deployment verified"),
        "{}",
        env.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamctl_preflight_and_plan_change_nothing() {
    let mut env = Env::with_host("streamctl-preflight", "realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    // A request that passes: table, exit 0, and the plan carries kernel-rt.
    let out = env.streamctl(&[
        "preflight",
        "--stream",
        "rhel-10",
        "--os-image",
        &os,
        "--extensions-image",
        &ext,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in [
        "image-reference",
        "direction",
        "os-image",
        "cpu-level",
        "kernel-variant",
        "nic-names",
    ] {
        assert!(text.lines().any(|l| l.starts_with(id)), "{id} in\n{text}");
    }
    let out = env.streamctl(&[
        "plan",
        "--json",
        "--stream",
        "rhel-10",
        "--os-image",
        &os,
        "--extensions-image",
        &ext,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    assert_eq!(plan["options"]["lock-finalization"], json!(true));
    assert_eq!(strings(&plan["modifiers"]["uninstall-packages"]).len(), 4);
    assert_eq!(
        plan["modifiers"]["install-local-packages"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );
    // Without the extensions image: a failing check, exit 1, no plan.
    let out = preflight_rhel10(&env, &os, None);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|c| c["id"] == "extensions-image" && c["result"] == "fail")
    );
    let out = env.streamctl(&["plan", "--stream", "rhel-10", "--os-image", &os]);
    assert_eq!(out.status.code(), Some(1));
    // An invalid request cannot be checked: exit 4 with the annotation error.
    let out = env.streamctl(&["preflight", "--stream", "RHEL", "--os-image", &os]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("desired-stream"));
    // Nothing happened on the node.
    assert!(env.transactions().await.is_empty());
    assert_eq!(
        env.annotations().await.get(STATE).map(String::as_str),
        Some("Idle")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_registry_is_retried_not_refused() {
    let mut env = Env::new("registry-down").await;
    env.allow_registries(&["127.0.0.1:1"]);
    env.start_streamd();
    env.wait_state("Idle").await;
    // Nothing listens on port 1: connection refused, a transient failure.
    let digest = env
        .rhel10()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_string();
    let gone = format!("127.0.0.1:1/openshift/rhcos@{digest}");
    env.request("rhel-10", &gone, None);
    let a = env
        .wait_for("a retried preflight", Duration::from_secs(60), |a| {
            a.get(STATE).map(String::as_str) == Some("Preflight")
                && a.get(REASON).is_some_and(|r| r.contains("retrying in"))
        })
        .await;
    assert!(a[REASON].contains("127.0.0.1:1"), "{}", a[REASON]);
    // A new request replaces the failing one at once.
    let os = env.rhel10();
    env.request("rhel-10", &os, None);
    env.wait_state("Staged").await;
    assert_eq!(started(&env.transactions().await).len(), 1);
}

/// The layer digests of every platform image of the index `pullspec`, read from storage.
fn layers_of(root: &std::path::Path, pullspec: &str) -> Vec<String> {
    let read = |digest: &str| -> Value {
        let f = stored_blob(root, digest).unwrap_or_else(|| panic!("blob {digest} stored"));
        serde_json::from_slice(&std::fs::read(f).expect("blob")).expect("manifest JSON")
    };
    let (_, index) = pullspec.split_once('@').expect("pinned");
    let mut layers = Vec::new();
    for m in read(index)["manifests"].as_array().expect("an index") {
        let manifest = read(m["digest"].as_str().expect("digest"));
        for l in manifest["layers"].as_array().expect("layers") {
            layers.push(l["digest"].as_str().expect("digest").to_string());
        }
    }
    layers
}

fn extraction_dirs(env: &Env) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(env.dir.join("run/extensions"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extensions_image_is_read_once_and_only_the_current_one_is_kept() {
    let mut env = Env::with_host("ext-cache", "realtime").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    let ext9 = env.vars()["TESTBED_RHEL9_EXTENSIONS_IMAGE"].clone();
    let preflight = |ext: &str| preflight_rhel10(&env, &os, Some(ext));
    let out = preflight(&ext);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let hex = |img: &str| img.rsplit_once("sha256:").expect("pinned").1.to_string();
    assert_eq!(extraction_dirs(&env), vec![hex(&ext)]);
    // Without its layers in the registry, the image can only be checked from what was kept.
    let registry = env.dir.join("registry");
    let layers = layers_of(&registry, &ext);
    assert!(!layers.is_empty());
    for l in &layers {
        let f = stored_blob(&registry, l).expect("layer stored");
        std::fs::remove_file(f).expect("remove layer");
    }
    let out = preflight(&ext);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the second preflight pulled again: {}{}",
        String::from_utf8_lossy(&out.stdout),
        env.log()
    );
    // Another image replaces the kept one (its answer does not matter here).
    let _ = preflight(&ext9);
    assert_eq!(extraction_dirs(&env), vec![hex(&ext9)]);
    // And the removed layers are really gone: the first image now needs a pull and fails.
    let out = preflight(&ext);
    assert_ne!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A `streamctl preflight` for another request (here: none of the extensions image) while the
/// daemon's staging waits for rpm-ostreed must not delete the RPMs that staging will open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_beside_a_waiting_staging_keeps_its_rpms() {
    let mut env = Env::with_host("preflight-beside-staging", "realtime").await;
    env.rpmostreed(RpmOstreedCmd::HoldForeign { on: true })
        .await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    env.wait_for(
        "a staging waiting for rpm-ostreed",
        Duration::from_secs(60),
        |a| {
            a.get(STATE).map(String::as_str) == Some("Staging")
                && a.get(REASON)
                    .is_some_and(|r| r.contains("Transaction in progress"))
        },
    )
    .await;
    // Checks for another request prune the extraction cache of everything they do not use.
    let out = preflight_rhel10(&env, &os, None);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no extensions image: a failed check"
    );
    env.rpmostreed(RpmOstreedCmd::HoldForeign { on: false })
        .await;
    let a = env.wait_state("Staged").await;
    assert_eq!(a.get(STATE).map(String::as_str), Some("Staged"), "{a:#?}");
    let txns = env.transactions().await;
    let s = started(&txns);
    assert_eq!(s.len(), 1, "{txns:#?}");
    assert_eq!(s[0]["result"]["ok"], json!(true), "{:#}", s[0]);
}

/// A node whose real-time kernel comes from its image (no package override) is not refused
/// as inconsistent: it may move only to a target image that is itself a real-time image, and
/// the base rhel-10 image is not one (its `ostree.linux` is the default kernel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realtime_image_host_moves_only_to_a_realtime_image() {
    let mut env = Env::with_host("variant-from-image", "realtime-image").await;
    env.start_streamd();
    let idle = env.wait_state("Idle").await;
    assert_eq!(host_facts(&idle)["kernel"], "realtime", "{idle:?}");
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
    let reason = refused(&env, "kernel-variant").await;
    assert!(
        reason.contains("comes from the booted image")
            && reason.contains("the target image's kernel")
            && reason.contains("is not realtime"),
        "{reason}"
    );
    assert!(env.transactions().await.is_empty());

    // The real-time variant of the target (its `ostree.linux` a `+rt` release) passes the
    // check, and needs no extensions image: nothing is carried.
    let rhel10 = &env.tb.images()[1];
    let mut labels =
        testbed::fakes::registry::content::os_labels(rhel10, testbed::fakes::registry::Arch::Amd64)
            .expect("labels");
    let rt_release = format!("{}+rt", labels["ostree.linux"]);
    labels.insert("ostree.linux".into(), rt_release.clone());
    let files = vec![("usr/lib/os-release".into(), b"ID=rhcos\n".to_vec())];
    let (rt_image, _) = env
        .tb
        .registry()
        .push_custom("rhel10-rt", labels, files)
        .await
        .expect("push");
    let out = preflight_rhel10(&env, &rt_image, None);
    let v: Value = serde_json::from_slice(&out.stdout).expect("preflight JSON");
    let check = |id: &str| {
        v["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["id"] == id))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(check("kernel-variant")["result"], "pass", "{v:#}");
    assert!(
        check("kernel-variant")["message"]
            .as_str()
            .is_some_and(|m| m.contains(&rt_release)),
        "{v:#}"
    );
    assert_eq!(check("extensions-image")["result"], "pass", "{v:#}");
}

/// End to end, a node whose real-time kernel comes from its image moves onto the real-time
/// variant of rhel-10 (its `ostree.linux` a `+rt` release, as a variant image's is): staged with
/// nothing carried, verified on disk, booted, and still real-time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realtime_image_host_moves_onto_the_realtime_variant_and_stays_realtime() {
    let mut env = Env::with_host("variant-rt-move", "realtime-image").await;
    let rt10 = env
        .tb
        .registry()
        .variant_images()
        .iter()
        .find(|i| i.stream == "rhel-10")
        .expect("a rhel-10 real-time variant")
        .clone();
    env.start_streamd();
    let idle = env.wait_state("Idle").await;
    assert_eq!(host_facts(&idle)["kernel"], "realtime", "{idle:?}");
    env.request("rhel-10", &rt10.pullspec, None);
    let staged = env.wait_reboot_request().await;
    assert_eq!(
        staged.get(STAGED_OS_IMAGE),
        Some(&rt10.pullspec),
        "{staged:?}"
    );
    let txns = env.transactions().await;
    let s = started(&txns);
    assert_eq!(s.len(), 1, "{txns:#?}");
    let mods = s[0]["modifiers"].as_object().expect("modifiers");
    assert_eq!(mods.len(), 1, "only set-refspec, nothing carried: {mods:?}");
    env.approve_reboot().await;
    env.wait_state("Rebooting").await;
    env.wait_for("the finalization", Duration::from_secs(60), |_| {
        env.reboot_initiated()
    })
    .await;
    let out = env.reboot(false).await;
    assert_eq!(out["applied"], json!(true), "{out}");
    assert!(
        out["kernel"].as_str().is_some_and(|k| k.ends_with("+rt")),
        "the real-time kernel is kept: {out}"
    );
    env.start_streamd();
    let done = env.wait_state("Done").await;
    assert_eq!(done[CURRENT_OS_IMAGE], rt10.pullspec);
    assert_eq!(done[CURRENT_STREAM], "rhel-10");
    assert_eq!(host_facts(&done)["kernel"], "realtime", "{done:?}");
}

/// In `resolve-streams` mode the stream's image is a base image; a node booted from an
/// on-cluster-layered image (label `baseOSContainerImage`) is refused it, and nothing is staged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_mode_never_replaces_a_layered_image_with_the_base_image() {
    let mut env = Env::with_host("variant-layered-resolve", "layered-image").await;
    env.config(
        "60-resolve.toml",
        "resolve-streams = true\nresolve-spread-seconds = 0\n",
    );
    env.start_streamd();
    env.wait_state("Idle").await;
    env.annotate(&[&format!("{DESIRED_STREAM}=rhel-10")]);
    let reason = refused(&env, "os-image").await;
    assert!(
        reason.contains("on-cluster-layered image") && reason.contains(&env.rhel10()),
        "{reason}"
    );
    let a = env.annotations().await;
    assert!(!a.contains_key(STAGED_OS_IMAGE), "{a:?}");
    assert!(!a.contains_key(REBOOT_REQUESTED), "{a:?}");
}

/// A node on an on-cluster-layered rhel-9 image whose real-time kernel the layering swapped in
/// (no override), managed by the machine-config daemon (readiness mode): the machine-config
/// operator rebuilds it from the rhel-10 base image and takes kernel-rt from the stream's
/// extensions image (Containerfile.on-cluster-build-template), so rhel-10 is ready exactly
/// while the OSImageStream's extensions image provides kernel-rt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layered_realtime_node_is_ready_only_while_the_extensions_image_has_kernel_rt() {
    let mut env = Env::with_host("variant-ocl-rt-ready", "realtime-layered-image").await;
    env.annotate(&["machineconfiguration.openshift.io/currentConfig=rendered-worker-0123456789abcdef0123456789abcdef"]);
    env.start_streamd();
    let (a, e) = wait_rhel10_readiness(&env, "rhel-10 readiness", |_| true).await;
    assert_eq!(host_facts(&a)["kernel"], "realtime", "{a:?}");
    assert_eq!(e["ready"], json!(true), "{e}");
    assert_eq!(e["osImage"], json!(env.rhel10()), "{e}");
    // The cluster's rhel-10 extensions image without kernel-rt.
    let ext = push_rhel10_extensions(&env, "ext-ocl-without-rt", |r| r.name == "usbguard").await;
    serve_rhel10_extensions(&env, &ext);
    let (_, e) =
        wait_rhel10_readiness(&env, "rhel-10 not ready", |e| e["ready"] == json!(false)).await;
    assert_eq!(e["failed"], json!(["kernel-variant"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("preflight check kernel-variant failed:")
            && reason.contains("kernel-rt-core")
            && reason.contains("machine-config operator"),
        "{reason}"
    );
    assert!(
        env.transactions().await.is_empty(),
        "readiness checks change nothing"
    );
}

/// An MCD-managed on-cluster-layered node whose applied MachineConfig asks for the `usbguard`
/// extension: the build baked it into the image (no package override shows it), and the
/// operator's next build installs it from the stream's extensions image, so the stream is ready
/// only while that image has it. A new MachineConfig re-runs the checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layered_node_is_ready_only_while_the_extensions_image_has_its_machine_configs_extensions()
 {
    let mut env = Env::with_host("variant-ocl-usbguard", "mcd-layered-usbguard").await;
    env.start_streamd();
    let (_, e) = wait_rhel10_readiness(&env, "rhel-10 readiness", |_| true).await;
    assert_eq!(e["ready"], json!(true), "{e}");
    // The cluster's rhel-10 extensions image without usbguard.
    let ext = push_rhel10_extensions(&env, "ext-ocl-without-usbguard", |r| {
        r.name.starts_with("kernel-rt")
    })
    .await;
    serve_rhel10_extensions(&env, &ext);
    let (_, e) =
        wait_rhel10_readiness(&env, "rhel-10 not ready", |e| e["ready"] == json!(false)).await;
    assert_eq!(e["failed"], json!(["layered-packages"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("preflight check layered-packages failed: the MachineConfig's spec.extensions (usbguard)")
            && reason.ends_with(": usbguard"),
        "{reason}"
    );
    // The daemon applies a MachineConfig without extensions: it rewrites its record, then the
    // node's currentConfig annotation (pkg/daemon/writer.go `SetDone`).
    write_machine_config(
        &env,
        "rendered-worker-2",
        r#"{"kernelType":"default","extensions":[]}"#,
    );
    env.annotate(&["machineconfiguration.openshift.io/currentConfig=rendered-worker-2"]);
    let (_, e) =
        wait_rhel10_readiness(&env, "rhel-10 ready again", |e| e["ready"] == json!(true)).await;
    assert_eq!(e["failed"], json!([]));
    assert!(
        env.transactions().await.is_empty(),
        "readiness checks change nothing"
    );
}

/// A classic MCD-managed node with `usbguard` layered by hand (the `layered` host): the daemon's
/// rebase keeps it in the origin, and adds the extensions repository only for a MachineConfig
/// with extensions or a kernel type, so the stream is not ready until the MachineConfig asks
/// for the extension (pkg/daemon/update.go `applyLayeredOSChanges`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_layered_outside_the_machine_config_is_ready_only_with_its_repository() {
    let mut env = Env::with_host("variant-mcd-by-hand", "layered").await;
    write_machine_config(
        &env,
        "rendered-worker-1",
        r#"{"kernelType":"default","extensions":[]}"#,
    );
    env.start_streamd();
    let (_, e) =
        wait_rhel10_readiness(&env, "rhel-10 not ready", |e| e["ready"] == json!(false)).await;
    assert_eq!(e["failed"], json!(["layered-packages"]), "{e}");
    let reason = e["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("preflight check layered-packages failed: no repository provides the packages layered outside the MachineConfig"),
        "{reason}"
    );
    // The MachineConfig now asks for the extension: the daemon mounts the extensions image,
    // which has usbguard for rhel-10.
    write_machine_config(
        &env,
        "rendered-worker-1",
        r#"{"kernelType":"default","extensions":["usbguard"]}"#,
    );
    env.annotate(&["machineconfiguration.openshift.io/currentConfig=rendered-worker-2"]);
    let (_, e) = wait_rhel10_readiness(&env, "rhel-10 ready", |e| e["ready"] == json!(true)).await;
    assert_eq!(e["failed"], json!([]), "{e}");
    assert!(
        env.transactions().await.is_empty(),
        "readiness checks change nothing"
    );
}

/// Writes the MachineConfig `name` with `spec` (JSON) where the machine-config daemon records
/// the one it applied (pkg/daemon/daemon.go `storeCurrentConfigOnDisk`).
fn write_machine_config(env: &Env, name: &str, spec: &str) {
    let record = env.dir.join("host/etc/machine-config-daemon/currentconfig");
    std::fs::create_dir_all(record.parent().expect("a parent")).expect("mkdir");
    std::fs::write(
        &record,
        format!(r#"{{"kind":"MachineConfig","metadata":{{"name":"{name}"}},"spec":{spec}}}"#),
    )
    .expect("write currentconfig");
}

/// Waits until the `readiness` annotation has a `rhel-10` entry that `pred` accepts; returns
/// the annotations and the entry.
async fn wait_rhel10_readiness(
    env: &Env,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> (BTreeMap<String, String>, Value) {
    let entry = |a: &BTreeMap<String, String>| {
        a.get("osstream.openshift.io/readiness")
            .and_then(|r| serde_json::from_str::<Value>(r).ok())
            .and_then(|r| r.get("rhel-10").cloned())
    };
    let a = env
        .wait_for(what, Duration::from_secs(90), |a| {
            entry(a).is_some_and(|e| pred(&e))
        })
        .await;
    let e = entry(&a).unwrap_or_default();
    (a, e)
}

/// Publishes `ext` as the OSImageStream's rhel-10 extensions image (the images otherwise the
/// testbed's), as the machine-config operator writes the status.
fn serve_rhel10_extensions(env: &Env, ext: &str) {
    let v = env.vars();
    let patch = json!({"status": {"availableStreams": [
        {"name": "rhel-9", "osImage": env.rhel9(), "osExtensionsImage": v["TESTBED_RHEL9_EXTENSIONS_IMAGE"]},
        {"name": "rhel-10", "osImage": env.rhel10(), "osExtensionsImage": ext},
    ]}})
    .to_string();
    env.patch_streams_status(&patch);
}
