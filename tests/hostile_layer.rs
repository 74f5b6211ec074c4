//! What a hostile extensions layer costs: peak memory and `/run` (tmpfs) usage while streamd
//! reads it, and what is left after the refusal. One test per process, so the peak resident
//! set (`VmHWM`) is this test's own. The figures are in docs/reliability.md.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use streamd::image::pullsecret::PullSecret;
use streamd::image::reference::ImageRef;
use streamd::image::registry::{EXTENSIONS_DIR, EXTRACT_LIMITS, Inspector};
use testbed::fakes::registry::hostile;

/// Peak resident set of this process, bytes.
fn vm_hwm() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                du(&p)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

/// A gzip'd tar stream of `(header, zero bytes)` entries, built without holding the
/// uncompressed data: a GNU long name of 256 MiB is 254 KiB here.
fn zeros_layer(entries: &[(&str, tar::EntryType, u64)]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for (name, kind, size) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).expect("name");
        h.set_entry_type(*kind);
        h.set_size(*size);
        h.set_mode(0o644);
        h.set_cksum();
        z.write_all(h.as_bytes()).expect("gzip");
        let mut left = *size;
        while left > 0 {
            let n = left.min(chunk.len() as u64);
            z.write_all(&chunk[..n as usize]).expect("gzip");
            left -= n;
        }
        let pad = (512 - size % 512) % 512;
        z.write_all(&chunk[..pad as usize]).expect("gzip");
    }
    z.write_all(&[0u8; 1024]).expect("gzip");
    z.finish().expect("gzip")
}

/// An extensions image of one `layer` on a hostile registry.
async fn serve(layer: Vec<u8>) -> (hostile::Server, ImageRef) {
    let config = hostile::config(0);
    let manifest = hostile::manifest(
        &config,
        config.len() as i64,
        vec![serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": hostile::sha(&layer),
            "size": layer.len(),
        })],
    );
    let m = manifest.clone();
    let server = hostile::start(move |path| {
        if path.contains("/manifests/") {
            hostile::ok(m.clone())
        } else if path.ends_with(&hostile::sha(&config)) {
            hostile::ok(config.clone())
        } else {
            hostile::ok(layer.clone())
        }
    })
    .await
    .expect("hostile registry");
    let img = format!(
        "{}/openshift/rhcos@{}",
        server.host,
        hostile::sha(&manifest)
    )
    .parse()
    .expect("image");
    (server, img)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_layer_costs_little_memory_and_leaves_nothing_in_run() {
    let run = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hostile-layer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).expect("mkdir");
    let rpm = |n: &str| format!("{EXTENSIONS_DIR}{n}-6.12.0-1.el10.x86_64.rpm");
    let big = 200 << 20;
    let layers = [
        (
            "GNU long name of 256 MiB",
            zeros_layer(&[("././@LongLink", tar::EntryType::GNULongName, 256 << 20)]),
        ),
        (
            "PAX record of 256 MiB",
            zeros_layer(&[("pax", tar::EntryType::XHeader, 256 << 20)]),
        ),
        (
            "wanted RPMs of 3 x 200 MiB",
            zeros_layer(&[
                (&rpm("kernel-rt-core"), tar::EntryType::Regular, big),
                (&rpm("kernel-rt-modules"), tar::EntryType::Regular, big),
                (
                    &rpm("kernel-rt-modules-extra"),
                    tar::EntryType::Regular,
                    big,
                ),
            ]),
        ),
    ];
    let wanted: Vec<String> = [
        "kernel-rt-core",
        "kernel-rt-modules",
        "kernel-rt-modules-extra",
    ]
    .map(String::from)
    .to_vec();
    for (what, layer) in layers {
        let gz = layer.len();
        let (server, img) = serve(layer).await;
        let insp = Inspector::new(PullSecret::default(), std::slice::from_ref(&server.host))
            .expect("inspector");
        let dest = run.join("extensions");
        std::fs::create_dir_all(&dest).expect("mkdir");
        // Sample the directory's size while the layer is read.
        let (peak, done) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let sampler = {
            let (peak, done, dest) = (peak.clone(), done.clone(), dest.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    peak.fetch_max(du(&dest), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        // Reset the high-water mark to the current resident set (Linux >= 4.0), so each
        // layer's peak is its own.
        std::fs::write("/proc/self/clear_refs", "5").expect("clear_refs");
        let rss_before = vm_hwm();
        let start = std::time::Instant::now();
        let e = insp
            .extensions(&img, "x86_64", &wanted, &dest)
            .await
            .expect_err("a hostile layer is refused");
        let took = start.elapsed();
        done.store(true, Ordering::SeqCst);
        sampler.join().expect("sampler");
        let rss_growth = vm_hwm().saturating_sub(rss_before);
        let left = du(&dest);
        let peak = peak.load(Ordering::SeqCst);
        eprintln!(
            "FIGURE {what}: {gz} bytes of gzip; refused in {:.2} s ({e}); peak RSS growth {} KiB; \
             peak /run usage {} MiB; left in /run {left} bytes",
            took.as_secs_f64(),
            rss_growth / 1024,
            peak >> 20,
        );
        assert!(!e.is_transient(), "{e}");
        assert!(
            rss_growth < 64 << 20,
            "{what}: RSS grew by {rss_growth} bytes"
        );
        assert!(
            peak <= EXTRACT_LIMITS.max_total,
            "{what}: {peak} bytes in /run"
        );
        assert_eq!(left, 0, "{what}: left behind in /run");
    }
    std::fs::remove_dir_all(&run).ok();
}
