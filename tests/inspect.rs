//! Image inspection against a real `docker-registry` holding real images and RPMs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use streamd::image::pullsecret::PullSecret;
use streamd::image::reference::ImageRef;
use streamd::image::registry::{InspectError, Inspector};
use testbed::fakes::registry::{Registry, RegistryConfig, hostile, stored_blob};

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn registry(name: &str) -> (Registry, Inspector) {
    let reg = Registry::start(RegistryConfig { dir: dir(name) })
        .await
        .expect("registry starts");
    let secret = PullSecret::parse(&reg.pull_secret_json()).expect("pull secret");
    let insp = Inspector::new(secret, &[reg.host().to_string()]).expect("inspector");
    (reg, insp)
}

fn image(s: &str) -> ImageRef {
    s.parse().expect("pinned pullspec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_images_resolve_per_platform_with_real_labels() {
    let (reg, insp) = registry("os").await;
    for (img, stream) in reg.images().iter().zip(["rhel-9", "rhel-10"]) {
        let x86 = insp
            .os_image(&image(&img.pullspec), "x86_64")
            .await
            .expect("x86_64");
        assert!(x86.bootable);
        assert_eq!(x86.stream_class.as_deref(), Some(stream));
        assert_eq!(x86.arch, "x86_64");
        assert!(
            x86.kernel_release
                .as_deref()
                .is_some_and(|k| k.contains(&format!("el{}", &stream[5..])))
        );
        assert!(x86.size > 0);
        let arm = insp
            .os_image(&image(&img.pullspec), "aarch64")
            .await
            .expect("aarch64");
        assert_eq!(arm.arch, "aarch64");
    }
    let missing = insp
        .os_image(&image(&reg.images()[1].pullspec), "s390x")
        .await;
    assert!(matches!(missing, Err(InspectError::Invalid(m)) if m.contains("linux/s390x")));
}

/// The base's package list comes from the chunked layers' `ostree.components` annotations that
/// ostree-ext's chunked encapsulation writes, as docker-registry serves them: every name of the
/// fixture's base, the kernel's five included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_os_images_base_packages_are_read_from_its_layer_annotations() {
    let (reg, insp) = registry("components").await;
    for img in reg.images() {
        for arch in ["x86_64", "aarch64"] {
            let info = insp
                .os_image(&image(&img.pullspec), arch)
                .await
                .expect("inspected");
            // rpm-ostree's name for the content no package owns is a component too; a package
            // that owns no file (the `kernel` meta-package) is in no layer's list.
            let want: std::collections::BTreeSet<String> =
                testbed::fixtures::packages::base_packages(img, arch)
                    .into_iter()
                    .map(|p| p.name)
                    .filter(|name| name != "kernel")
                    .chain(["rpmostree-unpackaged-content".to_string()])
                    .collect();
            assert_eq!(info.base_packages.as_ref(), Some(&want), "{arch}");
            assert!(want.contains("kernel-modules-extra"));
            // What streamd asks rpm-ostree to remove still names it (kernel requires kernel-core).
            assert_eq!(
                streamd::backend::kernel::default_kernel_packages_in(info.base_packages.as_ref()),
                streamd::backend::kernel::DEFAULT_KERNEL_PACKAGES.to_vec(),
                "{arch}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_rpms_are_listed_and_extracted() {
    let (reg, insp) = registry("ext").await;
    let ext = reg
        .extensions()
        .iter()
        .find(|e| e.stream == "rhel-10")
        .expect("rhel-10 extensions");
    let out = dir("ext-out");
    let (info, files) = insp
        .extensions(
            &image(&ext.pullspec),
            "x86_64",
            &["kernel-rt-core".into(), "usbguard".into()],
            &out,
        )
        .await
        .expect("inspect");
    assert!(info.is_extensions);
    assert_eq!(info.stream_class.as_deref(), Some("rhel-10"));
    assert!(
        info.rpms
            .iter()
            .any(|r| r.starts_with("kernel-rt-modules-extra-") && r.contains("el10")),
        "{:?}",
        info.rpms
    );
    assert_eq!(files.len(), 2, "{files:?}");
    // What was extracted is a real RPM for the target release.
    for f in &files {
        let q = std::process::Command::new("rpm")
            .args([
                "-qp",
                "--nosignature",
                "--queryformat",
                "%{NAME} %{RELEASE}",
            ])
            .arg(f)
            .output()
            .expect("rpm runs");
        let text = String::from_utf8_lossy(&q.stdout);
        assert!(text.contains("el10"), "{text}");
    }
    let (arm, _) = insp
        .extensions(
            &image(&ext.pullspec),
            "aarch64",
            &["kernel-64k-core".into()],
            &out,
        )
        .await
        .expect("aarch64");
    assert!(arm.rpms.iter().any(|r| r.starts_with("kernel-64k-core-")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_and_unknown_images() {
    let (reg, _) = registry("auth").await;
    let img = image(&reg.images()[1].pullspec);
    let wrong = format!(
        r#"{{"auths":{{"{}":{{"username":"testbed","password":"not-the-password-s3cret"}}}}}}"#,
        reg.host()
    );
    let insp = Inspector::new(
        PullSecret::parse(&wrong).expect("json"),
        &[reg.host().to_string()],
    )
    .expect("inspector");
    let e = insp.os_image(&img, "x86_64").await.expect_err("401");
    assert_eq!(e, InspectError::Unauthorized(reg.host().to_string()));
    assert_eq!(
        e.to_string(),
        format!("pull secret rejected by {}", reg.host())
    );
    assert!(!e.to_string().contains("s3cret"));
    let anon = Inspector::new(PullSecret::default(), &[reg.host().to_string()]).expect("inspector");
    assert!(matches!(
        anon.os_image(&img, "x86_64").await,
        Err(InspectError::Unauthorized(_))
    ));

    let good = Inspector::new(
        PullSecret::parse(&reg.pull_secret_json()).expect("json"),
        &[reg.host().to_string()],
    )
    .expect("inspector");
    let unknown = image(&format!(
        "{}/openshift/rhcos@sha256:{}",
        reg.host(),
        "e".repeat(64)
    ));
    let e = good
        .os_image(&unknown, "x86_64")
        .await
        .expect_err("unknown");
    assert!(!e.is_transient(), "{e}");

    // A non-bootable image with the wrong stream class is reported as such, not as an error.
    let (custom, _) = reg
        .push_custom(
            "not-bootable",
            BTreeMap::from([(
                "io.openshift.os.streamclass".to_string(),
                "rhel-9".to_string(),
            )]),
            vec![("usr/lib/os-release".into(), b"ID=rhcos\n".to_vec())],
        )
        .await
        .expect("push");
    let info = good
        .os_image(&image(&custom), "x86_64")
        .await
        .expect("inspect");
    assert!(!info.bootable);
    assert_eq!(info.stream_class.as_deref(), Some("rhel-9"));

    // A registry that is gone is a transient failure.
    let host = reg.host().to_string();
    reg.stop().await.expect("stop");
    let e = good.os_image(&img, "x86_64").await.expect_err("down");
    assert!(e.is_transient(), "{e} ({host})");
}

/// A registry front that speaks the bearer-token flow (`WWW-Authenticate: Bearer realm=…`,
/// a token endpoint checking the pull secret's basic credentials) and forwards authorised
/// requests to the real registry.
mod token_front {
    use std::convert::Infallible;
    use std::sync::Arc;

    use base64::Engine as _;
    use http_body_util::{BodyExt, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper::{Request, Response, StatusCode};
    use hyper_util::rt::TokioIo;

    pub const TOKEN: &str = "bearer-token-for-streamd";

    pub struct Front {
        pub host: String,
    }

    struct Ctx {
        upstream: String,
        basic: String,
        me: String,
    }

    pub async fn start(upstream: &str, user: &str, password: &str) -> Front {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let me = listener.local_addr().expect("addr").to_string();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let ctx = Arc::new(Ctx {
            upstream: upstream.to_string(),
            basic,
            me: me.clone(),
        });
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(ctx.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Front { host: me }
    }

    fn reply(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = status;
        r
    }

    async fn handle(
        ctx: Arc<Ctx>,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        if req.uri().path() == "/token" {
            // The token endpoint takes the pull secret's credentials.
            return Ok(if auth == format!("Basic {}", ctx.basic) {
                reply(
                    StatusCode::OK,
                    &format!(r#"{{"token":"{TOKEN}","expires_in":300}}"#),
                )
            } else {
                reply(
                    StatusCode::UNAUTHORIZED,
                    r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#,
                )
            });
        }
        if auth != format!("Bearer {TOKEN}") {
            let mut r = reply(
                StatusCode::UNAUTHORIZED,
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            );
            let challenge = format!(
                r#"Bearer realm="http://{}/token",service="testbed",scope="repository:openshift/rhcos:pull""#,
                ctx.me
            );
            r.headers_mut()
                .insert("www-authenticate", challenge.parse().expect("header"));
            return Ok(r);
        }
        // Forward to the real registry with its basic credentials.
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let accept = req.headers().get("accept").cloned();
        let Ok(tcp) = tokio::net::TcpStream::connect(&ctx.upstream).await else {
            return Ok(reply(StatusCode::BAD_GATEWAY, "upstream down"));
        };
        let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
        else {
            return Ok(reply(StatusCode::BAD_GATEWAY, "handshake"));
        };
        tokio::spawn(conn);
        let mut up = Request::get(path)
            .header("host", &ctx.upstream)
            .header("authorization", format!("Basic {}", ctx.basic));
        if let Some(a) = accept {
            up = up.header("accept", a);
        }
        let Ok(up) = up.body(Full::new(Bytes::new())) else {
            return Ok(reply(StatusCode::BAD_GATEWAY, "request"));
        };
        let Ok(resp) = sender.send_request(up).await else {
            return Ok(reply(StatusCode::BAD_GATEWAY, "send"));
        };
        let (parts, body) = resp.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut out = Response::new(Full::new(bytes));
        *out.status_mut() = parts.status;
        for (k, v) in parts.headers.iter() {
            if k != "content-length" && k != "transfer-encoding" && k != "connection" {
                out.headers_mut().insert(k.clone(), v.clone());
            }
        }
        Ok(out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_challenge_is_followed() {
    let reg = Registry::start(RegistryConfig { dir: dir("bearer") })
        .await
        .expect("registry starts");
    let front = token_front::start(reg.host(), reg.username(), reg.password()).await;
    let digest = reg.images()[1]
        .pullspec
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_string();
    let img = image(&format!("{}/openshift/rhcos@{digest}", front.host));
    let secret = format!(
        r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#,
        front.host,
        reg.username(),
        reg.password()
    );
    let insp = Inspector::new(
        PullSecret::parse(&secret).expect("json"),
        std::slice::from_ref(&front.host),
    )
    .expect("inspector");
    let info = insp
        .os_image(&img, "x86_64")
        .await
        .expect("inspect through the token flow");
    assert!(info.bootable);
    assert_eq!(info.stream_class.as_deref(), Some("rhel-10"));
    // Wrong credentials: the token endpoint refuses, and that is a rejected pull secret.
    let bad = secret.replace(reg.password(), "nope-not-it");
    let insp = Inspector::new(
        PullSecret::parse(&bad).expect("json"),
        std::slice::from_ref(&front.host),
    )
    .expect("inspector");
    let e = insp.os_image(&img, "x86_64").await.expect_err("refused");
    assert_eq!(e, InspectError::Unauthorized(front.host.clone()), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_that_does_not_match_its_digest_is_refused_not_retried() {
    let root = dir("tampered");
    let (reg, insp) = registry("tampered").await;
    let ext = reg
        .extensions()
        .iter()
        .find(|e| e.stream == "rhel-10")
        .expect("rhel-10 extensions");
    let x86 = &ext.platforms[0];
    let stored = |digest: &str| stored_blob(&root, digest).expect("blob stored");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stored(&x86.digest)).expect("read"))
            .expect("manifest");
    let layer = manifest["layers"][0]["digest"].as_str().expect("a layer");
    // Bytes after the gzip member: the RPMs would still read; the size the registry announces
    // differs from the descriptor's, which refuses the layer before a byte is read (a tamper
    // of the same size is refused by the digest: a_refused_extraction_leaves_nothing_behind).
    let file = stored(layer);
    let mut bytes = std::fs::read(&file).expect("read layer");
    bytes.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&file, bytes).expect("write layer");
    let out = dir("tampered-out");
    let err = insp
        .extensions(
            &image(&ext.pullspec),
            "x86_64",
            &["kernel-rt-core".into()],
            &out,
        )
        .await
        .expect_err("a tampered layer is refused");
    assert!(!err.is_transient(), "{err:?}");
    assert!(err.to_string().contains(layer), "{err}");
    assert!(err.to_string().contains("its descriptor says"), "{err}");
    assert!(walk(&out).is_empty(), "{:?}", walk(&out));
}

fn hostile_image(host: &str, manifest: &[u8]) -> ImageRef {
    image(&format!(
        "{host}/openshift/rhcos@{}",
        hostile::sha(manifest)
    ))
}

fn hostile_inspector(host: &str) -> Inspector {
    Inspector::new(PullSecret::default(), &[host.to_string()]).expect("inspector")
}

/// Serves `manifest` and `blobs` (by digest); everything else is 404.
async fn serve(manifest: Vec<u8>, blobs: Vec<Vec<u8>>) -> hostile::Server {
    let m = manifest.clone();
    hostile::start(move |path| {
        if path.contains("/manifests/") {
            return hostile::ok(m.clone());
        }
        for b in &blobs {
            if path.ends_with(&hostile::sha(b)) {
                return hostile::ok(b.clone());
            }
        }
        hostile::status(
            404,
            br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#.to_vec(),
        )
    })
    .await
    .expect("hostile registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_manifest_is_refused_unread() {
    let config = hostile::config(0);
    // A valid manifest padded to 5 MiB, pinned by its real digest.
    let mut manifest = hostile::manifest(&config, config.len() as i64, vec![]);
    manifest.pop();
    manifest.extend(std::iter::repeat_n(b' ', 5 << 20));
    manifest.push(b'}');
    let server = serve(manifest.clone(), vec![config]).await;
    let e = hostile_inspector(&server.host)
        .os_image(&hostile_image(&server.host, &manifest), "x86_64")
        .await
        .expect_err("refused");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("larger than 4194304 bytes"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_larger_than_its_descriptor_is_refused() {
    let config = hostile::config(2 << 20);
    // The descriptor says 100 bytes; the registry sends 2 MiB (its digest is right).
    let manifest = hostile::manifest(&config, 100, vec![]);
    let server = serve(manifest.clone(), vec![config.clone()]).await;
    let insp = hostile_inspector(&server.host);
    let img = hostile_image(&server.host, &manifest);
    let e = insp.os_image(&img, "x86_64").await.expect_err("refused");
    assert!(e.to_string().contains("its descriptor says 100"), "{e}");
    // Without a Content-Length, reading stops at the descriptor's size.
    let m = manifest.clone();
    let eof = hostile::start(move |path| {
        if path.contains("/manifests/") {
            hostile::ok(m.clone())
        } else {
            hostile::Answer::Full {
                status: 200,
                headers: Vec::new(),
                body: config.clone(),
                eof_delimited: true,
            }
        }
    })
    .await
    .expect("hostile registry");
    let e = hostile_inspector(&eof.host)
        .os_image(&hostile_image(&eof.host, &manifest), "x86_64")
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("larger than 100 bytes"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_body_becomes_a_short_inert_reason() {
    let mut body = b"\nWATCHDOG=trigger\n\x1b[31mdenied\x1b[0m\r\n".to_vec();
    body.extend(std::iter::repeat_n(b'x', 32 << 20));
    let server = hostile::start(move |_| hostile::status(400, body.clone()))
        .await
        .expect("hostile registry");
    let img = image(&format!(
        "{}/openshift/rhcos@sha256:{}",
        server.host,
        "a".repeat(64)
    ));
    let e = hostile_inspector(&server.host)
        .os_image(&img, "x86_64")
        .await
        .expect_err("refused");
    let text = e.to_string();
    assert!(!e.is_transient(), "{text}");
    assert!(text.len() < 1024, "{} bytes", text.len());
    assert!(!text.chars().any(char::is_control), "{text:?}");
    assert!(text.contains("HTTP 400"), "{text}");
    assert!(text.contains("\"WATCHDOG=trigger; denied; xxx"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_registry_is_a_transient_error_within_the_deadline() {
    let server = hostile::start(|_| hostile::Answer::Trickle)
        .await
        .expect("hostile registry");
    let img = image(&format!(
        "{}/openshift/rhcos@sha256:{}",
        server.host,
        "a".repeat(64)
    ));
    let insp = hostile_inspector(&server.host).with_deadlines(
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(2),
    );
    let start = std::time::Instant::now();
    let e = insp.os_image(&img, "x86_64").await.expect_err("stalled");
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("within 2 s"), "{e}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    let out = dir("stalled-out");
    let start = std::time::Instant::now();
    let e = insp
        .extensions(&img, "x86_64", &[], &out)
        .await
        .expect_err("stalled");
    assert!(e.is_transient(), "{e}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_token_answer_is_refused() {
    let host = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
    let me = host.clone();
    let server = hostile::start(move |path| {
        if path.starts_with("/token") {
            let token = format!(r#"{{"token":"{}"}}"#, "t".repeat(2 << 20));
            return hostile::ok(token.into_bytes());
        }
        hostile::Answer::Full {
            status: 401,
            headers: vec![(
                "WWW-Authenticate".into(),
                format!(
                    r#"Bearer realm="http://{}/token",service="hostile""#,
                    me.get().map(String::as_str).unwrap_or_default()
                ),
            )],
            body: Vec::new(),
            eof_delimited: false,
        }
    })
    .await
    .expect("hostile registry");
    host.set(server.host.clone()).expect("once");
    let img = image(&format!(
        "{}/openshift/rhcos@sha256:{}",
        server.host,
        "a".repeat(64)
    ));
    let e = hostile_inspector(&server.host)
        .os_image(&img, "x86_64")
        .await
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains("token answer is larger than 1048576"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_sizes_that_would_wrap_are_refused() {
    let config = hostile::config(0);
    let layer = |d: char| {
        serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", d.to_string().repeat(64)),
            "size": i64::MAX,
        })
    };
    let manifest = hostile::manifest(
        &config,
        config.len() as i64,
        vec![layer('1'), layer('2'), layer('3')],
    );
    let server = serve(manifest.clone(), vec![config]).await;
    let e = hostile_inspector(&server.host)
        .os_image(&hostile_image(&server.host, &manifest), "x86_64")
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("layer sizes do not add up"), "{e}");
}

/// The descriptor of a gzip'd layer.
fn gzip_layer(layer: &[u8]) -> serde_json::Value {
    serde_json::json!({
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": hostile::sha(layer),
        "size": layer.len(),
    })
}

/// A gzip'd tar layer with one RPM in the extensions directory.
fn rpm_layer(name: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(
        &mut h,
        format!("usr/share/rpm-ostree/extensions/{name}"),
        data,
    )
    .expect("append");
    let tar = b.into_inner().expect("tar");
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&tar).expect("gzip");
    z.finish().expect("gzip")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_urls_are_never_followed() {
    let layer = rpm_layer("kernel-rt-core-6.12.0-1.el10.x86_64.rpm", b"foreign");
    let evil = {
        let layer = layer.clone();
        hostile::start(move |_| hostile::ok(layer.clone()))
            .await
            .expect("hostile registry")
    };
    let config = hostile::config(0);
    let manifest = hostile::manifest(
        &config,
        config.len() as i64,
        vec![serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": hostile::sha(&layer),
            "size": layer.len(),
            "urls": [format!("http://{}/elsewhere.tar.gz", evil.host)],
        })],
    );
    // The registry has the manifest and config but not the layer.
    let server = serve(manifest.clone(), vec![config]).await;
    let out = dir("urls-out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let e = rt_core_extensions(&server.host, &manifest, &out)
        .await
        .expect_err("the layer is not in the registry");
    assert!(e.to_string().contains("unknown"), "{e}");
    assert_eq!(evil.hits(), 0, "the descriptor's urls were fetched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_extraction_leaves_nothing_behind() {
    let layer = rpm_layer("kernel-rt-core-6.12.0-1.el10.x86_64.rpm", &[7u8; 4096]);
    let config = hostile::config(0);
    // The descriptor names other bytes: the RPM is written, then the digest refuses the layer.
    let manifest = hostile::manifest(
        &config,
        config.len() as i64,
        vec![serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", "b".repeat(64)),
            "size": layer.len(),
        })],
    );
    let server = one_layer_server(&manifest, &config, move || hostile::ok(layer.clone())).await;
    let out = dir("refused-out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let e = rt_core_extensions(&server.host, &manifest, &out)
        .await
        .expect_err("digest mismatch");
    assert!(e.to_string().contains("digest mismatch"), "{e}");
    let left: Vec<_> = walk(&out);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_rpm_header_refuses_the_image_naming_the_file() {
    // An RPM lead, then a signature header claiming 4G index entries.
    let mut rpm = vec![0u8; 96];
    rpm[..4].copy_from_slice(&[0xed, 0xab, 0xee, 0xdb]);
    rpm.extend([
        0x8e, 0xad, 0xe8, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,
    ]);
    let layer = rpm_layer("usbguard-1.1.3-3.el10.x86_64.rpm", &rpm);
    let config = hostile::config(0);
    let manifest = hostile::manifest(&config, config.len() as i64, vec![gzip_layer(&layer)]);
    let server = serve(manifest.clone(), vec![config, layer]).await;
    let out = dir("bad-header-out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let e = rt_core_extensions(&server.host, &manifest, &out)
        .await
        .expect_err("a malformed header is refused");
    let (text, img) = (e.to_string(), hostile_image(&server.host, &manifest));
    assert!(!e.is_transient(), "{e}");
    assert!(text.starts_with(&img.to_string()), "{e}");
    assert!(
        text.contains("usbguard-1.1.3-3.el10.x86_64.rpm: malformed RPM header"),
        "{e}"
    );
    assert!(walk(&out).is_empty(), "left behind: {:?}", walk(&out));
}

/// Reads the extensions image `manifest` names on the hostile registry at `host`, wanting
/// `kernel-rt-core`, into `out`.
async fn rt_core_extensions(
    host: &str,
    manifest: &[u8],
    out: &std::path::Path,
) -> Result<(streamd::image::registry::ExtensionsInfo, Vec<PathBuf>), InspectError> {
    hostile_inspector(host)
        .extensions(
            &hostile_image(host, manifest),
            "x86_64",
            &["kernel-rt-core".into()],
            out,
        )
        .await
}

/// Serves `manifest` and `config`, and answers every other path (the layer) with `layer()`.
async fn one_layer_server(
    manifest: &[u8],
    config: &[u8],
    layer: impl Fn() -> hostile::Answer + Send + Sync + 'static,
) -> hostile::Server {
    let (m, c) = (manifest.to_vec(), config.to_vec());
    hostile::start(move |path| {
        if path.contains("/manifests/") {
            hostile::ok(m.clone())
        } else if path.ends_with(&hostile::sha(&c)) {
            hostile::ok(c.clone())
        } else {
            layer()
        }
    })
    .await
    .expect("hostile registry")
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// An extensions image (labels as openshift/os sets them) with one RPM layer, served by a
/// registry that records the paths asked for.
async fn counted_extensions() -> (hostile::Server, Vec<u8>, Vec<u8>, Arc<Mutex<Vec<String>>>) {
    let layer = rpm_layer("kernel-rt-core-6.12.0-1.el10.x86_64.rpm", b"not an rpm");
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {
            "io.openshift.os.extensions": "true",
            "io.openshift.os.streamclass": "rhel-10",
        }},
        "rootfs": {"type": "layers", "diff_ids": []},
    })
    .to_string()
    .into_bytes();
    let manifest = hostile::manifest(&config, config.len() as i64, vec![gzip_layer(&layer)]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let (m, blobs, seen) = (manifest.clone(), [config, layer.clone()], asked.clone());
    let server = hostile::start(move |path| {
        seen.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.to_string());
        if path.contains("/manifests/") {
            return hostile::ok(m.clone());
        }
        match blobs.iter().find(|b| path.ends_with(&hostile::sha(b))) {
            Some(b) => hostile::ok(b.clone()),
            None => hostile::status(404, b"{}".to_vec()),
        }
    })
    .await
    .expect("hostile registry");
    (server, manifest, layer, asked)
}

/// The blob requests among `asked`.
fn blob_requests(asked: &Mutex<Vec<String>>) -> Vec<String> {
    let asked = asked.lock().unwrap_or_else(|p| p.into_inner());
    asked
        .iter()
        .filter(|p| p.contains("/blobs/"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_layer_is_read_when_no_package_is_wanted() {
    let (server, manifest, layer, asked) = counted_extensions().await;
    let out = dir("labels-only-out");
    let (info, files) = hostile_inspector(&server.host)
        .extensions(&hostile_image(&server.host, &manifest), "x86_64", &[], &out)
        .await
        .expect("labels");
    assert!(info.is_extensions && !info.listed, "{info:?}");
    assert_eq!(info.stream_class.as_deref(), Some("rhel-10"));
    assert!(files.is_empty() && info.rpms.is_empty(), "{info:?}");
    let blobs = blob_requests(&asked);
    assert_eq!(blobs.len(), 1, "the config blob alone: {blobs:?}");
    assert!(!blobs[0].ends_with(&hostile::sha(&layer)), "{blobs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_read_without_writing_a_file() {
    let (server, manifest, layer, asked) = counted_extensions().await;
    let info = hostile_inspector(&server.host)
        .extension_headers(
            &hostile_image(&server.host, &manifest),
            "x86_64",
            &["kernel-rt-core".into()],
        )
        .await
        .expect("headers");
    assert!(info.listed, "{info:?}");
    assert_eq!(info.rpms, ["kernel-rt-core-6.12.0-1.el10.x86_64"]);
    let blobs = blob_requests(&asked);
    assert_eq!(
        blobs.len(),
        2,
        "the config and the one layer, once: {blobs:?}"
    );
    assert!(blobs[1].ends_with(&hostile::sha(&layer)), "{blobs:?}");
}

/// A preflight dropped mid-layer (a new request, a deadline) stops its extractor, and the next
/// extraction into the same directory starts only once that extractor has ended (issue 20 §7).
/// The layer trickles (uncompressed, so the reader waits for each byte rather than refusing
/// the first); before, the aborted extractor read on for nobody until the tar parser refused
/// 512 trickled bytes, about 100 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_extraction_ends_before_the_next_uses_its_directory() {
    let config = hostile::config(0);
    let layer = serde_json::json!({
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": format!("sha256:{}", "c".repeat(64)),
        // The trickle's Content-Length.
        "size": 1_000_000,
    });
    let manifest = hostile::manifest(&config, config.len() as i64, vec![layer]);
    let server = one_layer_server(&manifest, &config, || hostile::Answer::Trickle).await;
    let out = dir("aborted-out");
    let long = std::time::Duration::from_secs(600);
    let insp = hostile_inspector(&server.host).with_deadlines(long, long);
    let img = hostile_image(&server.host, &manifest);
    let first = {
        let (insp, img, out) = (insp.clone(), img.clone(), out.clone());
        tokio::spawn(async move {
            insp.extensions(&img, "x86_64", &["kernel-rt-core".into()], &out)
                .await
        })
    };
    // Manifest, config, layer: the layer's answer has begun and its reader is running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while server.hits() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the layer was never asked for"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    // The next extraction into the same directory (labels only: no layer to read).
    let (info, files) = insp
        .extensions(&img, "x86_64", &[], &out)
        .await
        .expect("labels");
    assert!(files.is_empty() && !info.listed, "{info:?}");
    assert!(walk(&out).is_empty(), "left behind: {:?}", walk(&out));
    // The aborted reader let go of the layer (the server notices at its next byte).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.abandoned() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the aborted extractor still reads the layer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
