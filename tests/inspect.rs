//! Image inspection against a real `docker-registry` holding real images and RPMs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use streamd::imageref::ImageRef;
use streamd::pullsecret::PullSecret;
use streamd::registry::{InspectError, Inspector};
use testbed::registry::{Registry, RegistryConfig};

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
