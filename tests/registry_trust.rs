//! Registry trust as containers/image has it (docs/reliability.md, "Registry trust"): per-host
//! CAs and client certificates from `certs.d`, `insecure = true` as TLS without verification
//! and then plain HTTP, token realms and redirects kept to the registry's own hosts, and
//! credentials only for the host that is contacted. Every server here listens on loopback:
//! `127.0.0.1` and `localhost` are two host names of one machine, so a realm or redirect from
//! one to the other leaves the registry's host set without leaving the machine.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use streamd::host::facts::HostRoot;
use streamd::host::ospull::{self, AttemptOutcome};
use streamd::image::pullsecret::PullSecret;
use streamd::image::reference::ImageRef;
use streamd::image::registry::{Access, InspectError, Inspector};
use testbed::fakes::registry::RegistryProcess;
use testbed::fakes::registry::hostile::{self, Answer};
use testbed::fakes::registry::tls::Pki;

const ACCEPT_ALL: &str = r#"{"default":[{"type":"insecureAcceptAnything"}]}"#;

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("trust-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("etc/containers")).expect("host root");
    std::fs::write(d.join("etc/containers/policy.json"), ACCEPT_ALL).expect("policy");
    d
}

fn put(root: &Path, path: &str, text: &str) {
    let p = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// A bootable image's manifest and config.
fn content() -> (Vec<u8>, Vec<u8>) {
    let config = hostile::config(0);
    let manifest = hostile::manifest(&config, config.len() as i64, vec![]);
    (manifest, config)
}

fn image(host: &str, manifest: &[u8]) -> ImageRef {
    format!("{host}/openshift/rhcos@{}", hostile::sha(manifest))
        .parse()
        .expect("pinned")
}

/// Serves the image's manifest and config to anyone, over TLS when `tls` is given.
async fn registry(tls: Option<Arc<rustls::ServerConfig>>) -> (hostile::Server, ImageRef) {
    let (manifest, config) = content();
    let m = manifest.clone();
    let server = hostile::start_with_head(
        move |path, _| {
            if path.contains("/manifests/") {
                hostile::ok(m.clone())
            } else if path.ends_with(&hostile::sha(&config)) {
                hostile::ok(config.clone())
            } else {
                hostile::status(200, b"{}".to_vec())
            }
        },
        tls,
    )
    .await
    .expect("registry");
    let img = image(&server.host, &manifest);
    (server, img)
}

/// What the OS daemon's view makes of `image` under `root`: the image, or the last outcome.
async fn pull(root: &Path, image: &ImageRef, plain: &[String]) -> Result<(), String> {
    let access = Access {
        plain: plain.to_vec(),
        ..Default::default()
    };
    match ospull::inspect(&HostRoot::new(root), image, "x86_64", &access).await {
        Ok((_, Ok(info))) if info.bootable => Ok(()),
        Ok((view, _)) => Err(view
            .attempts
            .last()
            .map(|a| match &a.outcome {
                AttemptOutcome::Failed(m) => m.clone(),
                other => format!("{other:?}"),
            })
            .unwrap_or_else(|| format!("{view:?}"))),
        Err(e) => Err(e.to_string()),
    }
}

/// A TLS registry (asking for a client certificate when `client`) whose CA is in a fresh host
/// root's `/etc/containers/certs.d/<host:port>/ca.crt`: the PKI, the server, its image, the
/// root and that certs.d directory (as an absolute path under the root).
async fn trusted_by_ca(
    name: &str,
    client: bool,
) -> (Pki, hostile::Server, ImageRef, PathBuf, String) {
    let pki = Pki::generate().expect("pki");
    let (server, img) = registry(Some(pki.server(client).expect("tls"))).await;
    let root = dir(name);
    let certs = format!("/etc/containers/certs.d/{}", server.host);
    put(&root, &format!("{certs}/ca.crt"), &pki.ca_pem);
    (pki, server, img, root, certs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_in_certs_d_is_trusted_for_its_host_only() {
    let pki = Pki::generate().expect("pki");
    let (server, img) = registry(Some(pki.server(false).expect("tls"))).await;
    let root = dir("ca");
    let e = pull(&root, &img, &[]).await.expect_err("unknown issuer");
    assert!(e.to_string().contains("invalid peer cert"), "{e}");
    // containers/image reads /etc/containers/certs.d/<host:port>/*.crt ...
    let containers = format!("/etc/containers/certs.d/{}", server.host);
    put(&root, &format!("{containers}/ca.crt"), &pki.ca_pem);
    pull(&root, &img, &[])
        .await
        .expect("trusted through certs.d");
    // ... and /etc/docker/certs.d/<host:port>/ when the first has no directory for the host.
    std::fs::remove_dir_all(root.join(containers.trim_start_matches('/'))).expect("rm");
    let docker = format!("/etc/docker/certs.d/{}", server.host);
    put(&root, &format!("{docker}/ca.crt"), &pki.ca_pem);
    pull(&root, &img, &[])
        .await
        .expect("trusted through docker's certs.d");
    // Only the first directory that exists for the host counts (dockerCertDir).
    std::fs::create_dir_all(root.join(containers.trim_start_matches('/'))).expect("mkdir");
    pull(&root, &img, &[])
        .await
        .expect_err("an empty containers directory hides docker's");
    // Another host's directory is not this one's.
    std::fs::remove_dir_all(root.join("etc")).expect("rm");
    put(&root, "/etc/containers/policy.json", ACCEPT_ALL);
    put(
        &root,
        "/etc/containers/certs.d/localhost/ca.crt",
        &pki.ca_pem,
    );
    pull(&root, &img, &[])
        .await
        .expect_err("a CA for localhost does not cover 127.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_pair_in_certs_d_is_presented() {
    let (pki, _server, img, root, certs) = trusted_by_ca("client", true).await;
    pull(&root, &img, &[])
        .await
        .expect_err("the registry wants a client certificate");
    put(&root, &format!("{certs}/client.cert"), &pki.client_cert_pem);
    put(&root, &format!("{certs}/client.key"), &pki.client_key_pem);
    pull(&root, &img, &[])
        .await
        .expect("the client.cert / client.key pair is presented");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_in_certs_d_refuse_the_host_naming_the_file() {
    let (pki, _server, img, root, certs) = trusted_by_ca("bad", false).await;
    let cases = [
        (
            "extra.crt",
            "not a certificate\n",
            "no usable PEM certificate",
        ),
        ("client.cert", pki.client_cert_pem.as_str(), "missing key"),
        (
            "lonely.key",
            pki.client_key_pem.as_str(),
            "missing client certificate",
        ),
    ];
    for (name, text, why) in cases {
        let file = format!("{certs}/{name}");
        put(&root, &file, text);
        let e = pull(&root, &img, &[]).await.expect_err(name);
        assert!(e.contains(&file) && e.contains(why), "{name}: {e}");
        std::fs::remove_file(root.join(file.trim_start_matches('/'))).expect("rm");
        // Nothing was kept from the bad read: the good directory works again.
        pull(&root, &img, &[]).await.expect("good again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_means_tls_without_verification_then_plain_http() {
    let pki = Pki::generate().expect("pki");
    let (tls, tls_img) = registry(Some(pki.server(false).expect("tls"))).await;
    let (plain, plain_img) = registry(None).await;
    let root = dir("insecure");
    // Verified TLS, no fallback: neither is reachable as a secure registry.
    pull(&root, &tls_img, &[]).await.expect_err("unknown CA");
    pull(&root, &plain_img, &[]).await.expect_err("no TLS");
    put(
        &root,
        "/etc/containers/registries.conf",
        &format!(
            "[[registry]]\nlocation = \"{}\"\ninsecure = true\n[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
            tls.host, plain.host
        ),
    );
    pull(&root, &tls_img, &[])
        .await
        .expect("TLS without verification first");
    pull(&root, &plain_img, &[]).await.expect("then plain HTTP");
}

/// A registry that answers every GET with a bearer challenge naming `realm`.
async fn challenging(realm: String) -> hostile::Server {
    hostile::start(move |_| Answer::Full {
        status: 401,
        headers: vec![(
            "WWW-Authenticate".into(),
            format!(r#"Bearer realm="{realm}",service="x""#),
        )],
        body: Vec::new(),
        eof_delimited: false,
    })
    .await
    .expect("registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_realm_outside_the_registrys_hosts_is_refused() {
    let elsewhere = hostile::start(|_| hostile::ok(br#"{"token":"t"}"#.to_vec()))
        .await
        .expect("token server");
    let port = elsewhere
        .host
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let reg = challenging(format!("http://localhost:{port}/token")).await;
    let secret = format!(r#"{{"auths":{{"{}":{{"auth":"dTpw"}}}}}}"#, reg.host);
    let insp = Inspector::new(
        PullSecret::parse(&secret).expect("secret"),
        std::slice::from_ref(&reg.host),
    )
    .expect("inspector");
    let (manifest, _) = content();
    let e = insp
        .os_image(&image(&reg.host, &manifest), "x86_64")
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, InspectError::Untrusted { host, .. } if host == "localhost"),
        "{e:?}"
    );
    assert!(!e.is_transient());
    assert_eq!(elsewhere.hits(), 0, "the realm was never contacted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_outside_the_registrys_hosts_is_refused() {
    let elsewhere = hostile::start(|_| hostile::ok(Vec::new()))
        .await
        .expect("elsewhere");
    let port = elsewhere
        .host
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let reg = hostile::start(move |path| Answer::Full {
        status: 307,
        headers: vec![("Location".into(), format!("http://localhost:{port}{path}"))],
        body: Vec::new(),
        eof_delimited: false,
    })
    .await
    .expect("registry");
    let insp =
        Inspector::new(PullSecret::default(), std::slice::from_ref(&reg.host)).expect("inspector");
    let (manifest, _) = content();
    let e = insp
        .os_image(&image(&reg.host, &manifest), "x86_64")
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, InspectError::Untrusted { host, .. } if host == "localhost"),
        "{e:?}"
    );
    assert_eq!(elsewhere.hits(), 0, "the redirect was never followed");
    // Listed in registry-trusted-hosts, the same redirect is followed (and its empty answer
    // is then no manifest).
    let access = Access {
        plain: vec![reg.host.clone()],
        trusted_hosts: vec!["localhost".into()],
    };
    let root = dir("trusted-redirect");
    let e = Inspector::configured(PullSecret::default(), &access, &root)
        .expect("inspector")
        .os_image(&image(&reg.host, &manifest), "x86_64")
        .await
        .expect_err("no manifest there");
    assert!(e.to_string().contains("digest mismatch"), "{e}");
    assert_eq!(elsewhere.hits(), 1, "followed to the trusted host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_never_receives_the_primarys_credentials() {
    // The mirror serves no image but hands out tokens, and records what it was sent.
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let mirror = hostile::start_with_head(
        move |path, head| {
            if path.starts_with("/token") {
                log.lock().expect("log").push(head.to_ascii_lowercase());
                return hostile::ok(br#"{"token":"from-the-mirror"}"#.to_vec());
            }
            hostile::status(404, Vec::new())
        },
        None,
    )
    .await
    .expect("mirror");
    let mirror_host = format!(
        "localhost:{}",
        mirror.host.rsplit(':').next().unwrap_or_default()
    );
    // The primary's challenge names the mirror's token endpoint.
    let (manifest, config) = content();
    let realm = format!("http://{mirror_host}/token");
    let m = manifest.clone();
    let primary = hostile::start_with_head(
        move |path, head| {
            if !head.contains("Bearer from-the-mirror") {
                return Answer::Full {
                    status: 401,
                    headers: vec![(
                        "WWW-Authenticate".into(),
                        format!(r#"Bearer realm="{realm}",service="x""#),
                    )],
                    body: Vec::new(),
                    eof_delimited: false,
                };
            }
            if path.contains("/manifests/") {
                hostile::ok(m.clone())
            } else {
                hostile::ok(config.clone())
            }
        },
        None,
    )
    .await
    .expect("primary");
    let root = dir("mirror");
    put(
        &root,
        "/etc/containers/registries.conf",
        &format!(
            "[[registry]]\nlocation = \"{}/openshift\"\n[[registry.mirror]]\nlocation = \"{mirror_host}/openshift\"\n",
            primary.host
        ),
    );
    // "cHJpbWFyeTpzZWNyZXQ=" is primary:secret.
    put(
        &root,
        "/etc/ostree/auth.json",
        &format!(
            r#"{{"auths":{{"{}":{{"auth":"cHJpbWFyeTpzZWNyZXQ="}}}}}}"#,
            primary.host
        ),
    );
    let img = image(&primary.host, &manifest);
    pull(&root, &img, &[primary.host.clone(), mirror_host.clone()])
        .await
        .expect("pulled from the primary with the mirror's anonymous token");
    let seen = seen.lock().expect("log").clone();
    assert!(!seen.is_empty(), "the token endpoint was asked");
    for head in seen {
        assert!(
            !head.contains("authorization:"),
            "the mirror was sent credentials: {head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_registry_over_mutual_tls_takes_the_certs_d_pair() {
    // distribution 2.8 with http.tls and clientcas: Go's TLS server, a client certificate
    // required. An empty registry: a 404 for the manifest means the handshake succeeded.
    let pki = Pki::generate().expect("pki");
    let root = dir("real");
    let tls = pki
        .write_server_files(&root.join("registry-tls"), true)
        .expect("tls files");
    let reg = RegistryProcess::start_with_tls(&root.join("registry"), None, Some(&tls))
        .await
        .expect("docker-registry over TLS");
    let (manifest, _) = content();
    let img = image(reg.host(), &manifest);
    let read = || async {
        Inspector::configured(PullSecret::default(), &Access::default(), &root)
            .expect("inspector")
            .os_image(&img, "x86_64")
            .await
            .expect_err("an empty registry")
    };
    let e = read().await;
    assert!(e.is_transient(), "unknown CA: {e}");
    let certs = format!("/etc/containers/certs.d/{}", reg.host());
    put(&root, &format!("{certs}/ca.crt"), &pki.ca_pem);
    let e = read().await;
    assert!(e.is_transient(), "no client certificate: {e}");
    put(&root, &format!("{certs}/client.cert"), &pki.client_cert_pem);
    put(&root, &format!("{certs}/client.key"), &pki.client_key_pem);
    let e = read().await;
    assert!(
        matches!(&e, InspectError::Invalid(m) if m.contains("unknown to")),
        "the registry answered over mutual TLS: {e}"
    );
    reg.stop().await.expect("stop");
}
