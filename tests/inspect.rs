//! Image inspection against a real `docker-registry` holding real images and RPMs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use streamd::image::pullsecret::PullSecret;
use streamd::image::reference::ImageRef;
use streamd::image::registry::{InspectError, Inspector};
use testbed::registry::{Registry, RegistryConfig, stored_blob};

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
    let insp = Inspector::new(secret, &[reg.host().to_string()]);
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
        .extensions(&image(&ext.pullspec), "aarch64", &[], &out)
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
    );
    let e = insp.os_image(&img, "x86_64").await.expect_err("401");
    assert_eq!(e, InspectError::Unauthorized(reg.host().to_string()));
    assert_eq!(
        e.to_string(),
        format!("pull secret rejected by {}", reg.host())
    );
    assert!(!e.to_string().contains("s3cret"));
    let anon = Inspector::new(PullSecret::default(), &[reg.host().to_string()]);
    assert!(matches!(
        anon.os_image(&img, "x86_64").await,
        Err(InspectError::Unauthorized(_))
    ));

    let good = Inspector::new(
        PullSecret::parse(&reg.pull_secret_json()).expect("json"),
        &[reg.host().to_string()],
    );
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
    );
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
    );
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
    // Bytes after the gzip member: the RPMs still read, only the digest tells.
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
    assert!(err.to_string().to_lowercase().contains("digest"), "{err}");
}
