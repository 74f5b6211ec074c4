//! The repositories a layered stage makes rpm-ostree read, end to end: an enabled repository
//! in the host's `/etc/yum.repos.d` that does not answer refuses the move before any
//! transaction (rpm-ostree would fail it after pulling the image); one that answers lets the
//! real-time host stage as usual.

mod common;

use std::time::Duration;

use common::*;

/// Writes `text` as the host's `/etc/yum.repos.d/<name>`; its host path.
fn write_repo(env: &Env, name: &str, text: &str) -> String {
    let dir = env.dir.join("host/etc/yum.repos.d");
    std::fs::create_dir_all(&dir).expect("yum.repos.d");
    std::fs::write(dir.join(name), text).expect("repo file");
    format!("/etc/yum.repos.d/{name}")
}

/// A loopback HTTP server answering every request with a `repomd.xml`; its base URL.
async fn serve_repomd() -> String {
    let body = "<?xml version=\"1.0\"?><repomd></repomd>";
    testbed::loopback::serve(Vec::new(), testbed::loopback::Answer::Ok(body.into()))
        .await
        .expect("loopback server")
}

/// A loopback address nothing listens on.
async fn closed_port() -> String {
    testbed::loopback::closed_port()
        .await
        .expect("a closed port")
}

/// A real-time host (its kernel is layered, so the move is a layered stage) asked to move to
/// rhel-10 with the extensions image.
async fn request_on_realtime(env: &mut Env) {
    env.start_streamd();
    env.wait_state("Idle").await;
    let (os, ext) = (env.rhel10(), env.rhel10_extensions());
    env.request("rhel-10", &os, Some(&ext));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_repository_is_refused_before_any_transaction() {
    let mut env = Env::with_host("repo-unreachable", "realtime").await;
    let url = closed_port().await;
    let file = write_repo(
        &env,
        "admin.repo",
        &format!("[admin]\nname=Admin\nbaseurl={url}/el$releasever/$basearch/\ngpgcheck=0\n"),
    );
    request_on_realtime(&mut env).await;
    let a = env
        .wait_for(
            "refusal by layering-config",
            Duration::from_secs(120),
            |a| a.get(STATE).map(String::as_str) == Some("Refused"),
        )
        .await;
    let reason = &a[REASON];
    assert!(
        reason.contains("preflight check layering-config failed"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!(
            "{file}:3 [admin]: {url}/el10/x86_64/repodata/repomd.xml"
        )),
        "the reason names the file, the baseurl's line and the substituted URL: {reason}"
    );
    assert!(reason.contains("cannot connect"), "{reason}");
    assert!(
        env.transactions().await.is_empty(),
        "no transaction for a refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reachable_repository_lets_the_layered_stage_run() {
    let mut env = Env::with_host("repo-reachable", "realtime").await;
    let url = serve_repomd().await;
    write_repo(&env, "admin.repo", &format!("[admin]\nbaseurl={url}/el/\n"));
    // A disabled repository is not read, reachable or not.
    let closed = closed_port().await;
    write_repo(
        &env,
        "old.repo",
        &format!("[old]\nenabled=0\nbaseurl={closed}/\n"),
    );
    request_on_realtime(&mut env).await;
    env.wait_state("Staged").await;
    assert_eq!(started(&env.transactions().await).len(), 1);
}
