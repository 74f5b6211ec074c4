//! The extraction limits against the shape of a real extensions image (openshift/os
//! `extensions/Containerfile`: a UBI 9 base layer, then `usr/share/rpm-ostree/extensions/` with
//! the RPMs and `createrepo_c` repodata, then `extensions.json`), generated here, never
//! downloaded. Sizes: a base layer of 16,000 entries (1,000 directories, 15,000 files of 256
//! bytes), a repository of 3,000 RPMs (well-formed headers, no payload) and its repodata, and a
//! last layer with `extensions.json`. Entry counts are what the limits bound; bytes are kept
//! small so the test stays fast in CI.

use std::io::Write as _;
use std::time::Instant;

use streamd::image::registry::{EXTRACT_LIMITS, ExtractBudget, rpms_in_layer};
use testbed::fixtures::packages::{Nevra, fake_rpm};

const BASE_DIRS: usize = 1_000;
const BASE_FILES: usize = 15_000;
const RPMS: usize = 3_000;
const REPO: &str = "usr/share/rpm-ostree/extensions/";

fn append(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], dir: bool) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(if dir {
        tar::EntryType::Directory
    } else {
        tar::EntryType::Regular
    });
    h.set_size(data.len() as u64);
    h.set_mode(if dir { 0o755 } else { 0o644 });
    h.set_cksum();
    b.append_data(&mut h, path, data).expect("append");
}

fn gzip(tar: tar::Builder<Vec<u8>>) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&tar.into_inner().expect("tar")).expect("gzip");
    z.finish().expect("gzip")
}

/// The UBI-like base layer.
fn base_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for d in 0..BASE_DIRS {
        append(&mut b, &format!("usr/share/ubi/d{d}"), &[], true);
    }
    let body = [b'u'; 256];
    for f in 0..BASE_FILES {
        append(
            &mut b,
            &format!("usr/share/ubi/d{}/f{f}", f % BASE_DIRS),
            &body,
            false,
        );
    }
    gzip(b)
}

/// The repository layer: the RPMs and the repodata `createrepo_c` writes.
fn repo_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, REPO, &[], true);
    for n in 0..RPMS {
        let nevra = format!("ext{n}-1.0-1.el10.x86_64");
        let rpm = fake_rpm(&Nevra::parse(&nevra).expect("nevra"));
        append(&mut b, &format!("{REPO}{nevra}.rpm"), &rpm, false);
    }
    let rt = "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64";
    let rpm = fake_rpm(&Nevra::parse(rt).expect("nevra"));
    append(&mut b, &format!("{REPO}{rt}.rpm"), &rpm, false);
    append(&mut b, &format!("{REPO}repodata"), &[], true);
    for file in [
        "repomd.xml",
        "primary.xml.gz",
        "filelists.xml.gz",
        "other.xml.gz",
    ] {
        append(
            &mut b,
            &format!("{REPO}repodata/{file}"),
            &[b'x'; 4096],
            false,
        );
    }
    gzip(b)
}

/// The last layer: `extensions.json`.
fn json_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    append(
        &mut b,
        "usr/share/rpm-ostree/extensions.json",
        br#"{"ext0": "1.0-1.el10.x86_64"}"#,
        false,
    );
    gzip(b)
}

#[test]
fn a_real_sized_extensions_image_passes_the_limits() {
    let layers = [base_layer(), repo_layer(), json_layer()];
    let sizes: Vec<usize> = layers.iter().map(Vec::len).collect();
    let mut budget = ExtractBudget::new(EXTRACT_LIMITS);
    let (mut names, mut headers) = (0, 0);
    let start = Instant::now();
    for layer in &layers {
        let (n, files, h) = rpms_in_layer(
            layer.as_slice(),
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &["kernel-rt-core".to_string()],
            None,
            &mut budget,
        )
        .expect("within the limits");
        assert!(files.is_empty(), "nothing is written without a destination");
        names += n.len();
        headers += h.len();
    }
    // Figures only, never asserted on.
    println!(
        "extensions-shape: layers {sizes:?} bytes (gzip), {} entries, {names} RPMs, {headers} headers, read in {} ms",
        BASE_DIRS + BASE_FILES + RPMS + 8,
        start.elapsed().as_millis()
    );
    // A real UBI 9 layer varies from build to build: the shape must leave it room.
    let entries = (BASE_DIRS + BASE_FILES + RPMS + 8) as u64;
    assert!(
        entries * 4 <= EXTRACT_LIMITS.max_entries,
        "{entries} entries leave too little of {}",
        EXTRACT_LIMITS.max_entries
    );
    assert_eq!(names, RPMS + 1);
    assert_eq!(headers, RPMS + 1, "every RPM's header is read");
}

/// Requests and blob bytes a registry serving the generated image sees for readiness reads by
/// `nodes` nodes, each wanting `wanted` (none: a node without extensions).
async fn served(nodes: usize, wanted: &[String]) -> (usize, usize) {
    use std::sync::{Arc, Mutex};
    use testbed::fakes::registry::hostile;
    let layers = [base_layer(), repo_layer(), json_layer()];
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
    let descriptors = layers
        .iter()
        .map(|l| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": hostile::sha(l),
                "size": l.len(),
            })
        })
        .collect();
    let manifest = hostile::manifest(&config, config.len() as i64, descriptors);
    let tally = Arc::new(Mutex::new((0usize, 0usize)));
    let (m, t) = (manifest.clone(), tally.clone());
    let mut blobs = vec![config];
    blobs.extend(layers);
    let server = hostile::start(move |path| {
        let body = if path.contains("/manifests/") {
            Some(m.clone())
        } else {
            blobs
                .iter()
                .find(|b| path.ends_with(&hostile::sha(b)))
                .cloned()
        };
        let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
        t.0 += 1;
        match body {
            Some(b) => {
                t.1 += b.len();
                hostile::ok(b)
            }
            None => hostile::status(404, b"{}".to_vec()),
        }
    })
    .await
    .expect("registry");
    let image: streamd::image::reference::ImageRef =
        format!("{}/openshift/ext@{}", server.host, hostile::sha(&manifest))
            .parse()
            .expect("image");
    let insp = streamd::image::registry::Inspector::new(
        streamd::image::pullsecret::PullSecret::default(),
        std::slice::from_ref(&server.host),
    )
    .expect("inspector");
    for _ in 0..nodes {
        insp.extension_headers(&image, "x86_64", wanted)
            .await
            .expect("read");
    }
    *tally.lock().unwrap_or_else(|p| p.into_inner())
}

/// Figures for docs/performance.md "Readiness cost per node"; printed, never asserted on
/// beyond the layer counts the registry must see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_cost_per_node_figures() {
    let rt = ["kernel-rt-core".to_string()];
    let (without, with) = (served(1, &[]).await, served(1, &rt).await);
    let (fleet_without, fleet_with) = (served(100, &[]).await, served(100, &rt).await);
    println!(
        "readiness-cost: one node without extensions: {} requests, {} bytes; with: {} requests, {} bytes; \
         100 nodes after a digest change without: {} requests, {} bytes; with: {} requests, {} bytes",
        without.0,
        without.1,
        with.0,
        with.1,
        fleet_without.0,
        fleet_without.1,
        fleet_with.0,
        fleet_with.1
    );
    assert_eq!(without.0, 2, "manifest and config only");
    assert_eq!(with.0, 5, "manifest, config and the three layers");
}
