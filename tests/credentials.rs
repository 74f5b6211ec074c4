//! The OS daemons pull with the host's ostree auth file and containers registries.conf, not
//! with streamd's pull secret (issue 11 §3): preflight reads the OS image where and as the
//! daemon will, and refuses under `os-pull-credentials` when that pull cannot succeed.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use testbed::fakes::registry::mirror::Mirror;
use testbed::fakes::registry::node;

/// The ostree auth file the testbed writes, as the machine-config daemon links it.
fn etc_auth(env: &Env) -> PathBuf {
    env.dir.join("host/etc/ostree/auth.json")
}

/// Writes a registries.conf drop-in on the host.
fn drop_in(env: &Env, name: &str, text: &str) {
    let d = env.dir.join("host").join(node::REGISTRIES_CONF_D);
    std::fs::create_dir_all(&d).expect("drop-in dir");
    std::fs::write(d.join(name), text).expect("drop-in");
}

/// What the MCO writes for an ImageDigestMirrorSet with NeverContactSource: the source is
/// blocked, a mirror serves it, the host's auth file has a credential for the mirror only (the
/// pull secret JSON returned). The mirror speaks plain HTTP, which registries.conf must allow
/// (`insecure`).
async fn mirrored(env: &Env) -> (Mirror, String) {
    let (host, secret) = {
        let reg = env.tb.registry();
        (reg.host().to_string(), reg.pull_secret_json())
    };
    let mirror = Mirror::start(&host).await.expect("mirror");
    drop_in(
        env,
        "99-idms.conf",
        &format!(
            "[[registry]]\n  prefix = \"\"\n  location = \"{src}/openshift/rhcos\"\n  \
             blocked = true\n  [[registry.mirror]]\n    location = \"{m}/openshift/rhcos\"\n    \
             insecure = true\n    pull-from-mirror = \"digest-only\"\n",
            src = host,
            m = mirror.host()
        ),
    );
    let only_mirror = secret.replace(&host, mirror.host());
    std::fs::write(etc_auth(env), &only_mirror).expect("auth file");
    (mirror, only_mirror)
}

/// Waits until streamd settles on a result of the request (refused, staged, failed).
async fn settled(env: &Env) -> BTreeMap<String, String> {
    env.wait_for("a result of the request", Duration::from_secs(90), |a| {
        matches!(
            a.get(STATE).map(String::as_str),
            Some("Refused" | "Staged" | "Degraded" | "Failed")
        )
    })
    .await
}

/// Starts streamd, requests rhel-10 and expects it staged.
async fn staged(env: &mut Env) {
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = settled(env).await;
    assert_eq!(
        a.get(STATE).map(String::as_str),
        Some("Staged"),
        "{a:#?}\n{}",
        env.log()
    );
}

/// Refused under `os-pull-credentials`, nothing handed to the OS daemon.
async fn assert_refused_for_credentials(env: &Env, a: &BTreeMap<String, String>, want: &str) {
    assert_eq!(
        a.get(STATE).map(String::as_str),
        Some("Refused"),
        "{a:#?}\n{}",
        env.log()
    );
    let reason = &a[REASON];
    assert!(
        reason.contains("preflight check os-pull-credentials failed"),
        "{reason}"
    );
    assert!(reason.contains(want), "{reason}");
    assert!(env.transactions().await.is_empty(), "nothing is staged");
}

/// No secret reaches the annotations or the log.
async fn assert_no_secret(env: &Env) {
    let password = env.tb.registry().password().to_string();
    let a = env.annotations().await;
    assert!(a.values().all(|v| !v.contains(&password)), "{a:#?}");
    assert!(!env.log().contains(&password), "the log shows the password");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_auth_file_is_refused_and_nothing_staged() {
    let mut env = Env::new("creds-missing").await;
    // streamd's own pull secret stays: it is not what the OS daemon pulls with.
    std::fs::remove_file(etc_auth(&env)).expect("remove the host auth file");
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = settled(&env).await;
    assert_refused_for_credentials(&env, &a, "unauthorized").await;
    assert!(
        a[REASON].contains("rpm-ostreed would pull anonymously"),
        "{}",
        a[REASON]
    );
    assert_no_secret(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_file_the_mcd_links_in_run_is_used_not_the_pull_secret() {
    let mut env = Env::new("creds-run").await;
    // As the machine-config daemon: /run/ostree/auth.json -> /var/lib/kubelet/config.json.
    let secret = env.tb.registry().pull_secret_json();
    std::fs::remove_file(etc_auth(&env)).expect("remove /etc/ostree/auth.json");
    let kubelet = env.dir.join("host/var/lib/kubelet");
    std::fs::create_dir_all(&kubelet).expect("kubelet dir");
    std::fs::write(kubelet.join("config.json"), &secret).expect("kubelet pull secret");
    let run = env.dir.join("host/run/ostree");
    std::fs::create_dir_all(&run).expect("run dir");
    std::os::unix::fs::symlink("/var/lib/kubelet/config.json", run.join("auth.json"))
        .expect("link");
    // streamd's own pull secret is gone: the OS image is read with the daemon's credentials.
    std::fs::remove_file(&env.vars()["TESTBED_PULL_SECRET"]).expect("remove the pull secret");
    staged(&mut env).await;
    assert_no_secret(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_in_registries_conf_is_where_preflight_and_the_daemon_go() {
    let mut env = Env::new("creds-mirror").await;
    let (mirror, _) = mirrored(&env).await;
    staged(&mut env).await;
    let seen = mirror.seen();
    let by = |ua: &dyn Fn(&str) -> bool| {
        seen.iter()
            .filter(|s| ua(&s.user_agent) && s.path.contains("/manifests/sha256:"))
            .count()
    };
    assert!(
        by(&|ua| ua.starts_with("streamd/")) > 0,
        "preflight asked the mirror: {seen:#?}"
    );
    assert!(
        by(&|ua| ua == node::USER_AGENT) > 0,
        "the daemon pulled from the mirror: {seen:#?}"
    );
    assert_no_secret(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extensions_image_comes_from_the_mirror_too() {
    let mut env = Env::new("creds-ext-mirror").await;
    // Every credential, the OS daemon's and streamd's own pull secret, is for the mirror.
    // podman pulls the extensions image through the same registries.conf for the
    // machine-config daemon.
    let (mirror, only_mirror) = mirrored(&env).await;
    std::fs::write(&env.vars()["TESTBED_PULL_SECRET"], &only_mirror).expect("pull secret");
    env.start_streamd();
    env.wait_state("Idle").await;
    let ext = env.rhel10_extensions();
    env.request("rhel-10", &env.rhel10(), Some(&ext));
    let a = settled(&env).await;
    assert_eq!(
        a.get(STATE).map(String::as_str),
        Some("Staged"),
        "{a:#?}\n{}",
        env.log()
    );
    let digest = ext.rsplit('@').next().expect("digest-pinned");
    let seen = mirror.seen();
    assert!(
        seen.iter().any(|s| s.user_agent.starts_with("streamd/")
            && s.path.ends_with(&format!("/manifests/{digest}"))),
        "streamd read the extensions image from the mirror: {seen:#?}"
    );
    assert_no_secret(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_registry_is_refused() {
    let mut env = Env::new("creds-blocked").await;
    let host = env.tb.registry().host().to_string();
    drop_in(
        &env,
        "50-block.conf",
        &format!("[[registry]]\n  location = \"{host}\"\n  blocked = true\n"),
    );
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = settled(&env).await;
    assert_refused_for_credentials(&env, &a, "is blocked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_rejects_the_registry_is_refused() {
    let mut env = Env::new("creds-policy").await;
    let host = env.tb.registry().host().to_string();
    // What the MCO writes for image.config.openshift.io allowedRegistries without this one.
    let policy = format!(
        r#"{{"default":[{{"type":"insecureAcceptAnything"}}],
            "transports":{{"docker":{{"{host}":[{{"type":"reject"}}]}}}}}}"#
    );
    std::fs::write(env.dir.join("host/etc/containers/policy.json"), policy).expect("policy");
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    let a = settled(&env).await;
    assert_refused_for_credentials(&env, &a, "/etc/containers/policy.json rejects").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_bootc_pulls_with_the_host_auth_file() {
    let env = Env::with_backend("creds-bootc", "default", testbed::Backend::Bootc).await;
    let image = env.rhel10();
    let bootc = |args: &[&str]| {
        std::process::Command::new(&env.vars()["TESTBED_BOOTC"])
            .args(args)
            .output()
            .expect("fake bootc runs")
    };
    let auth = std::fs::read(etc_auth(&env)).expect("auth file");
    std::fs::remove_file(etc_auth(&env)).expect("remove");
    let out = bootc(&["switch", "--transport", "registry", &image]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let repo = image.split('@').next().unwrap_or_default();
    let digest = image.rsplit('@').next().unwrap_or_default();
    assert!(
        stderr.contains(&format!(
            "Switching: Pulling: {}: reading manifest {digest} in {repo}: unauthorized: authentication required",
            node::OPEN_IMAGE
        )),
        "{stderr}"
    );
    std::fs::write(etc_auth(&env), auth).expect("restore");
    let out = bootc(&["switch", "--transport", "registry", &image]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_registry_needs_no_auth_file() {
    use testbed::fakes::registry::{Auth, Registry, RegistryConfig};
    let dir = scratch_dir("creds", "anonymous");
    let reg = Registry::start_with(
        RegistryConfig {
            dir: dir.join("registry"),
        },
        Auth::Anonymous,
    )
    .await
    .expect("anonymous registry starts");
    let root = dir.join("host");
    node::write_node_config(&root, "{}").expect("node config");
    std::fs::remove_file(root.join("etc/ostree/auth.json")).expect("no auth file");
    let image = reg.images()[1].pullspec.clone();
    // The fake daemons' pull and streamd's view agree: an anonymous pull works.
    node::pull_check(&root, &image)
        .await
        .expect("the node pulls anonymously");
    let (view, info) = streamd::host::ospull::inspect(
        &streamd::host::facts::HostRoot::new(&root),
        &image.parse().expect("pinned"),
        "x86_64",
        &streamd::image::registry::Access {
            plain: vec![reg.host().to_string()],
            ..Default::default()
        },
    )
    .await
    .expect("not transient");
    assert_eq!(view.auth_file, None);
    assert!(view.pulled().is_some(), "{view:?}");
    assert!(info.expect("read anonymously").bootable);
}
