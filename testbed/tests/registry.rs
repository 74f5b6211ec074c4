//! The testbed registry: a real `docker-registry` behind basic auth, serving OS and extensions
//! images built here with RPMs built by the real `rpmbuild`. Everything is checked from the
//! outside: raw HTTP (not the testbed's own client), GNU tar and gzip on the layers, `rpm -qp` on
//! the packages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use testbed::fakes::registry::{Arch, CustomImage, Entry, Registry, RegistryConfig};
use testbed::fixtures::images::{self, TestImage};
use testbed::scratch::ScratchDir;
use tokio::net::TcpStream;
use tokio::process::Command;

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn temp_dir(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("registry-{name}")).expect("scratch dir")
}

fn sha(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

struct Resp {
    status: u16,
    headers: hyper::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// One GET on a fresh connection, with an optional `Authorization` and `Accept`.
async fn get(host: &str, path: &str, auth: Option<&str>, accept: Option<&str>) -> Resp {
    let fut = async {
        let tcp = TcpStream::connect(host).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let mut req = hyper::Request::get(path).header("host", host);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = tx
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        conn.abort();
        Resp {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("GET timed out")
}

async fn run(program: &str, args: &[&str]) -> Vec<u8> {
    let child = Command::new(program)
        .args(args)
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("command timed out")
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn b64decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = A.iter().position(|&a| a == c).expect("base64 alphabet") as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

/// An authenticated view of the registry as a pulling client sees it.
struct Puller {
    host: String,
    auth: String,
}

impl Puller {
    /// Credentials come from the pull secret, as they would on a node.
    fn from_pull_secret(reg: &Registry) -> Puller {
        let secret: Value = serde_json::from_str(&reg.pull_secret_json()).unwrap();
        let auths = secret["auths"].as_object().unwrap();
        assert_eq!(auths.len(), 1);
        let auth = auths[reg.host()]["auth"].as_str().unwrap();
        let decoded = String::from_utf8(b64decode(auth)).unwrap();
        assert_eq!(decoded, format!("{}:{}", reg.username(), reg.password()));
        Puller {
            host: reg.host().to_string(),
            auth: format!("Basic {auth}"),
        }
    }

    async fn get(&self, path: &str, accept: Option<&str>) -> Resp {
        get(&self.host, path, Some(&self.auth), accept).await
    }

    /// A manifest or index by digest; checks status, media type and that the bytes hash to it.
    async fn manifest(&self, digest: &str, media_type: &str) -> Value {
        let r = self
            .get(
                &format!("/v2/openshift/rhcos/manifests/{digest}"),
                Some(&format!("{INDEX},{MANIFEST}")),
            )
            .await;
        assert_eq!(
            r.status,
            200,
            "{digest}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("content-type"), media_type);
        assert_eq!(
            sha(&r.body),
            digest,
            "manifest bytes must hash to the digest"
        );
        assert_eq!(r.header("docker-content-digest"), digest);
        let v = r.json();
        assert_eq!(v["mediaType"], media_type);
        v
    }

    /// A blob by digest, verified.
    async fn blob(&self, digest: &str) -> Vec<u8> {
        let r = self
            .get(&format!("/v2/openshift/rhcos/blobs/{digest}"), None)
            .await;
        assert_eq!(r.status, 200, "blob {digest}");
        assert_eq!(sha(&r.body), digest, "blob bytes must hash to the digest");
        r.body
    }

    /// Image config and unpacked layers of the manifest `digest`, with diff_ids checked.
    async fn image(&self, digest: &str, work: &Path) -> (Value, PathBuf) {
        let m = self.manifest(digest, MANIFEST).await;
        assert_eq!(
            m["config"]["mediaType"],
            "application/vnd.oci.image.config.v1+json"
        );
        let config: Value =
            serde_json::from_slice(&self.blob(m["config"]["digest"].as_str().unwrap()).await)
                .unwrap();
        let root = work.join(digest.trim_start_matches("sha256:"));
        std::fs::create_dir_all(&root).unwrap();
        let layers = m["layers"].as_array().unwrap();
        assert_eq!(
            layers.len(),
            config["rootfs"]["diff_ids"].as_array().unwrap().len()
        );
        for (i, layer) in layers.iter().enumerate() {
            assert_eq!(
                layer["mediaType"],
                "application/vnd.oci.image.layer.v1.tar+gzip"
            );
            let data = self.blob(layer["digest"].as_str().unwrap()).await;
            assert_eq!(layer["size"].as_u64().unwrap(), data.len() as u64);
            let file = work.join(format!(
                "{}.tar.gz",
                layer["digest"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("sha256:")
            ));
            std::fs::write(&file, &data).unwrap();
            let file = file.to_str().unwrap();
            let tar = run("gzip", &["-dc", file]).await;
            assert_eq!(
                sha(&tar),
                config["rootfs"]["diff_ids"][i],
                "diff_id of layer {i}"
            );
            // Every entry owned by 0:0 and dated SOURCE_DATE_EPOCH (2025-11-01 00:00 UTC); an
            // ostree-encapsulated OS image's entries carry ostree's own mtime, the epoch.
            let date = if labels(&config).contains_key("ostree.commit") {
                " 1970-01-01 00:00 "
            } else {
                " 2025-11-01 00:00 "
            };
            let listing =
                String::from_utf8(run("tar", &["--numeric-owner", "-tvzf", file]).await).unwrap();
            assert!(!listing.is_empty());
            for line in listing.lines() {
                assert!(line.contains(" 0/0 ") && line.contains(date), "{line}");
            }
            run("tar", &["-xzf", file, "-C", root.to_str().unwrap()]).await;
        }
        (config, root)
    }
}

fn labels(config: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(config["config"]["Labels"].clone()).unwrap()
}

fn kernel_for(img: &TestImage, arch: &str) -> String {
    img.kernel.replace(".x86_64", &format!(".{arch}"))
}

/// What `rpm -qp` reports for every RPM in `dir`, sorted.
async fn rpm_query(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rpm"))
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no rpms in {}", dir.display());
    let mut args = vec![
        "-qp",
        "--queryformat",
        "%{NAME} %{VERSION}-%{RELEASE} %{ARCH}\n",
    ];
    args.extend(files.iter().map(String::as_str));
    let out = String::from_utf8(run("rpm", &args).await).unwrap();
    let mut lines: Vec<String> = out.lines().map(String::from).collect();
    lines.sort();
    lines
}

fn expected_rpms(stream: &str, arch: &str) -> Vec<String> {
    let (kernel, usbguard) = match stream {
        "rhel-9" => ("5.14.0-570.60.1.el9_6", "1.1.3-1.el9"),
        "rhel-10" => ("6.12.0-124.8.1.el10_1", "1.1.3-3.el10"),
        other => panic!("unknown stream {other}"),
    };
    let mut v: Vec<String> = match arch {
        "x86_64" => [
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-core",
            "kernel-rt-modules-extra",
        ]
        .iter()
        .map(|n| format!("{n} {kernel} x86_64"))
        .chain([format!("usbguard {usbguard} x86_64")])
        // The same el9 build in both streams, as RHCOS's rhel-10 extensions take it.
        .chain(["kata-containers 3.21.0-1.el9 x86_64".to_string()])
        .collect(),
        _ => [
            "kernel-64k-core",
            "kernel-64k-modules",
            "kernel-64k-modules-core",
            "kernel-64k-modules-extra",
        ]
        .iter()
        .map(|n| format!("{n} {kernel} aarch64"))
        .collect(),
    };
    v.sort();
    v
}

#[tokio::test]
async fn serves_real_os_and_extensions_images_behind_basic_auth() {
    let dir = temp_dir("content");
    let reg = Registry::start(RegistryConfig {
        dir: dir.join("reg"),
    })
    .await
    .unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let host = reg.host().to_string();
    assert!(host.starts_with("127.0.0.1:"), "{host}");

    // Auth: anonymous and wrong credentials are challenged, the pull secret's work.
    let anon = get(&host, "/v2/", None, None).await;
    assert_eq!(anon.status, 401);
    assert!(
        anon.header("www-authenticate").starts_with("Basic realm="),
        "{}",
        anon.header("www-authenticate")
    );
    let anon_manifest = get(
        &host,
        &format!("/v2/openshift/rhcos/manifests/{}", reg.images()[0].digest),
        None,
        None,
    )
    .await;
    assert_eq!(anon_manifest.status, 401);
    let wrong = format!(
        "Basic {}",
        testbed::fakes::registry::client::base64(b"testbed:wrong")
    );
    assert_eq!(get(&host, "/v2/", Some(&wrong), None).await.status, 401);
    let p = Puller::from_pull_secret(&reg);
    let ok = p.get("/v2/", None).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("docker-distribution-api-version"), "registry/2.0");
    let tags = p.get("/v2/openshift/rhcos/tags/list", None).await.json();
    let mut tags: Vec<&str> = tags["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    tags.sort();
    assert_eq!(
        tags,
        [
            "rhel-10",
            "rhel-10-extensions",
            "rhel-10-rt",
            "rhel-10-update",
            "rhel-9",
            "rhel-9-extensions",
            "rhel-9-rt"
        ]
    );
    // The real-time variants: `+rt` in `ostree.linux`, their own digests.
    for v in reg.variant_images() {
        let by_tag = p
            .get(
                &format!("/v2/openshift/rhcos/manifests/{}", v.tag()),
                Some(INDEX),
            )
            .await;
        assert_eq!(by_tag.header("docker-content-digest"), v.digest);
        assert!(v.linux().ends_with("+rt"), "{}", v.linux());
        assert!(reg.images().iter().all(|i| i.digest != v.digest));
    }
    // The later rhel-10 build: the same stream, a digest of its own.
    let update = reg.update_image();
    let by_tag = p
        .get("/v2/openshift/rhcos/manifests/rhel-10-update", Some(INDEX))
        .await;
    assert_eq!(by_tag.header("docker-content-digest"), update.digest);
    assert_eq!(update.stream, "rhel-10");
    assert!(reg.images().iter().all(|i| i.digest != update.digest));
    let unknown = p
        .get(
            &format!("/v2/openshift/rhcos/manifests/sha256:{}", "0".repeat(64)),
            Some(INDEX),
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["errors"][0]["code"], "MANIFEST_UNKNOWN");

    // OS images: same stream data as the catalog, real digests.
    let catalog = images::catalog(images::DEFAULT_REGISTRY);
    assert_eq!(reg.images().len(), catalog.len());
    for (img, cat) in reg.images().iter().zip(&catalog) {
        assert_eq!(
            (&img.stream, &img.version, &img.rhel_version, &img.kernel),
            (&cat.stream, &cat.version, &cat.rhel_version, &cat.kernel)
        );
        assert_eq!(
            img.pullspec,
            format!("{host}/openshift/rhcos@{}", img.digest)
        );
        let index = p.manifest(&img.digest, INDEX).await;
        let by_tag = p
            .get(
                &format!("/v2/openshift/rhcos/manifests/{}", img.stream),
                Some(INDEX),
            )
            .await;
        assert_eq!(
            by_tag.header("docker-content-digest"),
            img.digest,
            "tag {} names the index",
            img.stream
        );
        let entries = index["manifests"].as_array().unwrap();
        let platforms: Vec<String> = entries
            .iter()
            .map(|m| {
                format!(
                    "{}/{}/{}",
                    m["platform"]["os"].as_str().unwrap(),
                    m["platform"]["architecture"].as_str().unwrap(),
                    m["platform"]["variant"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(platforms, ["linux/amd64/", "linux/arm64/v8"]);
        for (m, (oci_arch, rpm_arch)) in entries
            .iter()
            .zip([("amd64", "x86_64"), ("arm64", "aarch64")])
        {
            assert_eq!(m["mediaType"], MANIFEST);
            let (config, root) = p.image(m["digest"].as_str().unwrap(), &work).await;
            assert_eq!(config["architecture"], oci_arch);
            assert_eq!(config["os"], "linux");
            let kernel = kernel_for(img, rpm_arch);
            let want: BTreeMap<String, String> = [
                ("containers.bootc", "1"),
                ("ostree.bootable", "true"),
                ("io.openshift.os.streamclass", img.stream.as_str()),
                ("ostree.linux", kernel.as_str()),
                ("version", img.version.as_str()),
                ("org.opencontainers.image.version", img.version.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            // The image is an ostree commit encapsulated by ostree-ext, which adds its own
            // labels: the commit and the diff ID of the layer that ends the ostree content.
            let mut got = labels(&config);
            let commit = got.remove("ostree.commit").unwrap_or_default();
            assert_eq!(commit.len(), 64, "ostree.commit {commit:?}");
            let final_diffid = got.remove("ostree.final-diffid").unwrap_or_default();
            assert!(
                config["rootfs"]["diff_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d == final_diffid.as_str()),
                "ostree.final-diffid {final_diffid:?} is one of the layers"
            );
            assert_eq!(got, want, "{} {oci_arch}", img.stream);
            assert_eq!(
                std::fs::read_to_string(root.join("usr/lib/os-release")).unwrap(),
                img.os_release()
            );
            assert_eq!(
                std::fs::read_link(root.join("etc/os-release")).unwrap(),
                Path::new("../usr/lib/os-release")
            );
            assert!(
                root.join(format!("usr/lib/modules/{kernel}/vmlinuz"))
                    .is_file()
            );
            assert!(
                root.join("usr/share/crypto-policies/policies/FIPS.pol")
                    .is_file()
            );
            assert!(
                root.join("usr/lib/dracut/modules.d/01fips/module-setup.sh")
                    .is_file()
            );
            // RHEL 10 dropped fips-mode-setup.
            assert_eq!(
                root.join("usr/bin/fips-mode-setup").is_file(),
                img.stream == "rhel-9",
                "{}",
                img.stream
            );
        }
        let os = reg.os_images().iter().find(|o| o.image == *img).unwrap();
        let listed: Vec<&str> = os.platforms.iter().map(|p| p.digest.as_str()).collect();
        let served: Vec<&str> = entries
            .iter()
            .map(|m| m["digest"].as_str().unwrap())
            .collect();
        assert_eq!(listed, served);
    }
    assert_ne!(reg.images()[0].digest, reg.images()[1].digest);

    // Extensions images: the RPMs rpm reads back are the stream's, per architecture.
    assert_eq!(reg.extensions().len(), 2);
    for ext in reg.extensions() {
        assert_eq!(
            ext.pullspec,
            format!("{host}/openshift/rhcos@{}", ext.digest)
        );
        let index = p.manifest(&ext.digest, INDEX).await;
        let mut seen = Vec::new();
        for (m, rpm_arch) in index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .zip(["x86_64", "aarch64"])
        {
            let (config, root) = p.image(m["digest"].as_str().unwrap(), &work).await;
            let l = labels(&config);
            assert_eq!(
                l.get("io.openshift.os.extensions").map(String::as_str),
                Some("true")
            );
            assert_eq!(l.get("io.openshift.os.streamclass"), Some(&ext.stream));
            assert!(
                !l.contains_key("containers.bootc"),
                "an extensions image is not bootable"
            );
            let repo = root.join("usr/share/rpm-ostree/extensions");
            let got = rpm_query(&repo).await;
            assert_eq!(
                got,
                expected_rpms(&ext.stream, rpm_arch),
                "{} {rpm_arch}",
                ext.stream
            );
            assert!(repo.join("testbed-repo.json").is_file());
            // The kernel packages install the variant kernel where the bootloader looks.
            let flavor = if rpm_arch == "x86_64" { "rt" } else { "64k" };
            let core = std::fs::read_dir(&repo)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .starts_with(&format!("kernel-{flavor}-core-"))
                })
                .unwrap();
            let files =
                String::from_utf8(run("rpm", &["-qlp", core.to_str().unwrap()]).await).unwrap();
            let kernel = kernel_for(
                &reg.images()
                    .iter()
                    .find(|i| i.stream == ext.stream)
                    .unwrap()
                    .clone(),
                rpm_arch,
            );
            assert!(
                files
                    .lines()
                    .any(|f| f == format!("/usr/lib/modules/{kernel}+{flavor}/vmlinuz")),
                "{files}"
            );
            seen.extend(got);
        }
        seen.sort();
        let mut listed: Vec<String> = ext
            .rpms
            .iter()
            .map(|r| format!("{} {}-{} {}", r.name, r.version, r.release, r.arch))
            .collect();
        listed.sort();
        assert_eq!(
            seen, listed,
            "ExtensionsImage.rpms lists what the image holds"
        );
        assert!(
            !seen
                .iter()
                .any(|s| s.starts_with("kernel-rt ") || s.contains("kvm")),
            "{seen:?}"
        );
    }

    // Custom images for negative tests.
    let mut not_bootable = BTreeMap::new();
    not_bootable.insert(
        "io.openshift.os.streamclass".to_string(),
        "rhel-10".to_string(),
    );
    let (pullspec, digest) = reg
        .push_custom(
            "not-bootable",
            not_bootable.clone(),
            vec![("usr/lib/os-release".into(), b"ID=rhel\n".to_vec())],
        )
        .await
        .unwrap();
    assert_eq!(pullspec, format!("{host}/openshift/rhcos@{digest}"));
    let (config, root) = p.image(&digest, &work).await;
    assert_eq!(labels(&config), not_bootable);
    assert_eq!(
        std::fs::read(root.join("usr/lib/os-release")).unwrap(),
        b"ID=rhel\n"
    );

    let no_rt = reg
        .extensions_files("rhel-10", Arch::Amd64, |r| !r.name.starts_with("kernel-rt"))
        .unwrap();
    let ext_labels: BTreeMap<String, String> = [
        ("io.openshift.os.extensions", "true"),
        ("io.openshift.os.streamclass", "rhel-10"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let (_, digest) = reg
        .push_custom("rhel-10-extensions-no-rt", ext_labels, no_rt)
        .await
        .unwrap();
    let (_, root) = p.image(&digest, &work).await;
    assert_eq!(
        rpm_query(&root.join("usr/share/rpm-ostree/extensions")).await,
        [
            "kata-containers 3.21.0-1.el9 x86_64",
            "usbguard 1.1.3-3.el10 x86_64"
        ]
    );

    let arm_only = reg
        .push_custom_image(CustomImage {
            tag: "arm64-only".into(),
            labels: BTreeMap::from([("containers.bootc".to_string(), "1".to_string())]),
            files: vec![Entry::file("usr/lib/os-release", "ID=rhcos\n")],
            arches: vec![Arch::Arm64],
        })
        .await
        .unwrap();
    let (config, _) = p.image(&arm_only.digest, &work).await;
    assert_eq!(config["architecture"], "arm64");
    assert!(
        reg.push_custom("bad/tag", BTreeMap::new(), vec![])
            .await
            .is_err()
    );

    reg.stop().await.unwrap();
    assert!(
        TcpStream::connect(&host).await.is_err(),
        "the registry is gone after stop"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every digest a start produced, in a fixed order.
fn digests(reg: &Registry) -> Vec<String> {
    let mut v = Vec::new();
    for o in reg.os_images() {
        v.push(o.image.digest.clone());
        v.extend(
            o.platforms
                .iter()
                .flat_map(|p| [p.digest.clone(), p.config_digest.clone()]),
        );
    }
    for e in reg.extensions() {
        v.push(e.digest.clone());
        v.extend(
            e.platforms
                .iter()
                .flat_map(|p| [p.digest.clone(), p.config_digest.clone()]),
        );
        v.extend(e.rpms.iter().map(|r| r.digest.clone()));
    }
    v
}

fn mtimes(reg: &Registry) -> Vec<std::time::SystemTime> {
    reg.rpms()
        .iter()
        .map(|r| std::fs::metadata(&r.path).unwrap().modified().unwrap())
        .collect()
}

#[tokio::test]
async fn digests_are_stable_and_a_second_start_reuses_the_cache() {
    let dir = temp_dir("cache");
    let cfg = RegistryConfig { dir: dir.join("a") };

    let t = Instant::now();
    let cold = Registry::start(cfg.clone()).await.unwrap();
    let cold_time = t.elapsed();
    let cold_stats = cold.stats().clone();
    let first = digests(&cold);
    let first_mtimes = mtimes(&cold);
    assert_eq!(
        cold_stats.rpm_specs_built, cold_stats.rpm_specs_total,
        "a fresh dir builds every spec"
    );
    assert_eq!(cold_stats.rpm_specs_total, 8);
    assert_eq!(cold.rpms().len(), 20);
    assert!(cold_stats.blobs_uploaded > 0);
    cold.stop().await.unwrap();

    let t = Instant::now();
    let warm = Registry::start(cfg.clone()).await.unwrap();
    let warm_time = t.elapsed();
    let warm_stats = warm.stats().clone();
    assert_eq!(
        warm_stats.rpm_specs_built, 0,
        "the second start takes every rpm from the cache"
    );
    assert_eq!(
        warm_stats.blobs_uploaded, 0,
        "the registry storage already has every blob"
    );
    assert_eq!(mtimes(&warm), first_mtimes, "cached rpms are not rewritten");
    assert_eq!(digests(&warm), first, "same dir, same digests");
    warm.stop().await.unwrap();

    // A fresh dir builds everything again, byte for byte the same.
    let other = Registry::start(RegistryConfig { dir: dir.join("b") })
        .await
        .unwrap();
    assert_eq!(other.stats().rpm_specs_built, 8);
    assert_eq!(digests(&other), first, "another dir, same digests");

    println!(
        "registry start: cold {cold_time:?} (rpms {:?}), warm {warm_time:?} (rpms {:?})",
        cold_stats.rpm_time, warm_stats.rpm_time
    );
    for o in other.os_images() {
        println!("{} index {}", o.tag, o.image.digest);
    }
    for e in other.extensions() {
        println!("{} index {}", e.tag, e.digest);
    }
    other.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
