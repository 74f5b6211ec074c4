//! Property tests of the registry's extensions-layer reader against hostile tarballs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use testbed::scratch::ScratchDir;

use streamd::image::registry::{EXTENSIONS_DIR, EXTRACT_LIMITS, ExtractBudget, rpms_in_layer};
use streamd::image::rpm::{names_package, package_name};

use super::{config, evr, fail, pkg_name};

/// A scratch directory with an empty `dest` in it.
fn scratch() -> ScratchDir {
    let d = ScratchDir::new("fuzz-layer").expect("scratch dir");
    std::fs::create_dir_all(d.join("dest")).expect("scratch dir");
    d
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).expect("gzip");
    e.finish().expect("gzip")
}

#[derive(Debug, Clone)]
enum LayerItem {
    Rpm {
        dot: bool,
        sub: &'static str,
        nevra: String,
        data: Vec<u8>,
    },
    Other(&'static str),
}

fn layer_item() -> impl Strategy<Value = LayerItem> {
    prop_oneof![
        3 => (
            any::<bool>(),
            select(vec!["", "Packages/", "x86_64/"]),
            (pkg_name(), evr()).prop_map(|(n, e)| format!("{n}-{e}")),
            vec(any::<u8>(), 0..64),
        )
            .prop_map(|(dot, sub, nevra, data)| LayerItem::Rpm { dot, sub, nevra, data }),
        1 => select(vec![
            "usr/bin/true",
            "etc/pki/x.rpm",
            "usr/share/rpm-ostree/extensions/repodata/repomd.xml",
            "usr/share/rpm-ostree/extensionsX/a-1-1.x86_64.rpm",
            "usr/lib/a-1-1.x86_64.rpm",
        ])
        .prop_map(LayerItem::Other),
    ]
}

fn layer_tar(items: &[LayerItem]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for it in items {
        let (path, data): (String, &[u8]) = match it {
            LayerItem::Rpm {
                dot,
                sub,
                nevra,
                data,
            } => (
                format!(
                    "{}{EXTENSIONS_DIR}{sub}{nevra}.rpm",
                    if *dot { "./" } else { "" }
                ),
                data,
            ),
            LayerItem::Other(p) => (p.to_string(), b"x"),
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, data).expect("append");
    }
    b.into_inner().expect("tar")
}

#[derive(Debug, Clone)]
struct RawEntry {
    name: Vec<u8>,
    kind: u8,
    link: Vec<u8>,
    data: Vec<u8>,
}

/// A tar archive written byte by byte, so names may hold `..`, absolute paths or anything.
fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_gnu();
        {
            let g = h.as_gnu_mut().expect("gnu header");
            let n = e.name.len().min(100);
            g.name[..n].copy_from_slice(&e.name[..n]);
            let l = e.link.len().min(100);
            g.linkname[..l].copy_from_slice(&e.link[..l]);
        }
        h.set_entry_type(tar::EntryType::new(e.kind));
        h.set_size(e.data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&e.data);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn pax_path(path: &[u8]) -> Vec<u8> {
    // "<len> path=<value>\n" where <len> counts the whole record, itself included.
    let body_len = " path=".len() + path.len() + 1;
    let mut len = body_len + 1;
    while len.to_string().len() + body_len != len {
        len = len.to_string().len() + body_len;
    }
    let mut r = format!("{len} path=").into_bytes();
    r.extend_from_slice(path);
    r.push(b'\n');
    r
}

fn hostile_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (
            select(vec!["", "./", "/", "../", "././"]),
            select(vec!["", "../", "../../", "x/../../", "./", "..//", "/", "../../../../../"]),
            "[a-z0-9.-]{0,12}",
        )
            .prop_map(|(p, s, f)| format!("{p}{EXTENSIONS_DIR}{s}{f}.rpm").into_bytes()),
        1 => select(vec![
            "../escape.rpm",
            "/tmp/escape.rpm",
            "usr/share/rpm-ostree/extensions/..",
            "usr/share/rpm-ostree/extensions/../../../../../../escape.rpm",
            "usr/share/rpm-ostree/extensions/.rpm",
            "usr/share/rpm-ostree/extensions/..rpm",
            "usr/share/rpm-ostree/extensions/",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => vec(any::<u8>(), 0..100),
        1 => vec(any::<u8>(), 0..60).prop_map(|tail| {
            let mut n = EXTENSIONS_DIR.as_bytes().to_vec();
            n.extend(tail);
            n
        }),
    ]
}

fn hostile_entry() -> impl Strategy<Value = RawEntry> {
    (
        hostile_name(),
        select(vec![
            b'0', b'0', b'0', b'5', b'2', b'1', b'L', b'x', b'g', b'7',
        ]),
        prop_oneof![
            Just(b"/etc/passwd".to_vec()),
            "[a-z./]{0,20}".prop_map(String::into_bytes)
        ],
        vec(any::<u8>(), 0..64),
    )
        .prop_map(|(name, kind, link, data)| {
            let data = match kind {
                // GNU long name / pax record: the hostile name is the payload.
                b'L' => name.clone(),
                b'x' => pax_path(&name),
                b'5' | b'2' | b'1' => Vec::new(),
                _ => data,
            };
            let name = if kind == b'L' {
                b"././@LongLink".to_vec()
            } else {
                name
            };
            RawEntry {
                name,
                kind,
                link,
                data,
            }
        })
}

/// The RPM name a layer path would yield, so it can be listed as wanted.
fn candidate_nevra(name: &[u8]) -> String {
    let s = String::from_utf8_lossy(name);
    let file = s.rsplit('/').next().unwrap_or_default();
    file.trim_end_matches(".rpm").to_string()
}

type LayerResult = std::io::Result<streamd::image::registry::LayerRpms>;

/// Runs `rpms_in_layer` in a scratch directory and checks that nothing landed outside `dest`
/// and that `dest` holds only the regular `*.rpm` files it reported; returns the result and what
/// `dest` held (file name → content).
fn run_layer(
    blob: &[u8],
    media_type: &str,
    wanted: &[String],
) -> Result<(LayerResult, BTreeMap<String, Vec<u8>>), TestCaseError> {
    let root = scratch();
    let dest = root.join("dest");
    let res = rpms_in_layer(
        blob,
        media_type,
        wanted,
        Some(&dest),
        &mut ExtractBudget::new(EXTRACT_LIMITS),
    );
    let outside: Vec<_> = std::fs::read_dir(&root)
        .expect("read root")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != "dest")
        .collect();
    let mut in_dest = BTreeMap::new();
    let mut bad = Vec::new();
    for e in std::fs::read_dir(&dest).expect("read dest") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        let meta = std::fs::symlink_metadata(e.path()).expect("metadata");
        if !meta.file_type().is_file() || !name.ends_with(".rpm") {
            bad.push(e.path());
        } else {
            in_dest.insert(name, std::fs::read(e.path()).expect("read extracted file"));
        }
    }
    prop_assert!(outside.is_empty(), "escaped dest: {:?}", outside);
    prop_assert!(bad.is_empty(), "not regular *.rpm files: {:?}", bad);
    if let Ok((_, files, _)) = &res {
        for f in files {
            prop_assert_eq!(f.parent(), Some(dest.as_path()));
        }
        let reported: BTreeSet<String> = files
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        prop_assert_eq!(&reported, &in_dest.keys().cloned().collect::<BTreeSet<_>>());
    }
    Ok((res, in_dest))
}

const MEDIA_TYPES: [&str; 4] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
];

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn layer_lists_and_extracts_the_extensions_rpms(
        items in vec(layer_item(), 0..6),
        extra_wanted in vec(pkg_name(), 0..2),
        pick in vec(any::<bool>(), 6),
        gz in any::<bool>(),
    ) {
        let tar = layer_tar(&items);
        let (blob, media) = if gz { (gzip(&tar), MEDIA_TYPES[1]) } else { (tar, MEDIA_TYPES[0]) };
        let rpms: Vec<(&String, &Vec<u8>)> = items
            .iter()
            .filter_map(|i| match i {
                LayerItem::Rpm { nevra, data, .. } => Some((nevra, data)),
                LayerItem::Other(_) => None,
            })
            .collect();
        let mut wanted = extra_wanted;
        for ((nevra, _), p) in rpms.iter().zip(&pick) {
            if *p {
                wanted.push(package_name(nevra).to_string());
            }
        }
        let (res, extracted) = run_layer(&blob, media, &wanted)?;
        let (names, _, _) = res.map_err(|e| fail(e.to_string()))?;
        prop_assert_eq!(names, rpms.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>());
        // Last one of a name wins, as a later layer entry overwrites an earlier one.
        let mut want_files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (nevra, data) in &rpms {
            if wanted.iter().any(|w| names_package(nevra, w)) {
                want_files.insert(format!("{nevra}.rpm"), data.to_vec());
            }
        }
        prop_assert_eq!(extracted, want_files);
    }

    #[test]
    fn layer_hostile_archives_never_escape(
        entries in vec(hostile_entry(), 0..6),
        extra_wanted in vec(prop_oneof![pkg_name(), Just(String::new())], 0..2),
        media in select(MEDIA_TYPES.to_vec()),
        gz in any::<bool>(),
    ) {
        let tar = raw_tar(&entries);
        let blob = if gz { gzip(&tar) } else { tar };
        let mut wanted = extra_wanted;
        wanted.extend(entries.iter().map(|e| candidate_nevra(&e.name)));
        let _ = run_layer(&blob, media, &wanted)?;
    }

    #[test]
    fn layer_corrupted_archives_never_panic(
        items in vec(layer_item(), 1..5),
        flips in vec((any::<Index>(), any::<u8>()), 1..8),
        fix_checksum in any::<bool>(),
        gz_before in any::<bool>(),
        media in select(MEDIA_TYPES.to_vec()),
    ) {
        let tar = layer_tar(&items);
        let mut blob = if gz_before { gzip(&tar) } else { tar };
        for (i, b) in &flips {
            let at = i.index(blob.len());
            blob[at] = *b;
        }
        if fix_checksum && !gz_before && blob.len() >= 512 {
            let mut h = tar::Header::new_old();
            h.as_mut_bytes().copy_from_slice(&blob[..512]);
            h.set_cksum();
            blob[..512].copy_from_slice(h.as_bytes());
        }
        let wanted: Vec<String> = items
            .iter()
            .filter_map(|i| match i {
                LayerItem::Rpm { nevra, .. } => Some(package_name(nevra).to_string()),
                LayerItem::Other(_) => None,
            })
            .collect();
        let _ = run_layer(&blob, media, &wanted)?;
    }

    #[test]
    fn layer_arbitrary_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..2048),
        gzip_magic in any::<bool>(),
        media in select(MEDIA_TYPES.to_vec()),
    ) {
        let mut blob = bytes;
        if gzip_magic {
            blob.splice(0..0, [0x1f, 0x8b, 0x08, 0x00]);
        }
        let _ = run_layer(&blob, media, &["kernel-rt-core".to_string()])?;
    }
}
