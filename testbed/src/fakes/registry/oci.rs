//! Deterministic OCI images built in memory: ustar layers compressed as gzip, config, manifest
//! and image index documents, and the on-disk OCI image layout.
//!
//! Everything that could vary between runs is fixed (mtimes, owners, entry order, JSON key
//! order, gzip header), so the same content always has the same digests.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// `mediaType` of an OCI image index.
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// `mediaType` of an OCI image manifest.
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// `mediaType` of an OCI image config.
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// `mediaType` of a gzip-compressed tar layer.
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Timestamp of every file, layer and config (2025-11-01T00:00:00Z); also the RPMs'
/// `SOURCE_DATE_EPOCH`.
pub const SOURCE_DATE_EPOCH: u64 = 1_761_955_200;
/// The `created` of images that are not from the catalog (which carry their own).
pub const CREATED: &str = "2025-11-01T00:00:00Z";

/// The `sha256:<hex>` digest of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

/// A CPU architecture an image is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// `amd64` / `x86_64`.
    Amd64,
    /// `arm64` / `aarch64` (variant `v8`).
    Arm64,
}

impl Arch {
    /// Both architectures, `amd64` first.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The OCI / Go name (`amd64`, `arm64`).
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The architecture of an RPM / kernel name (`x86_64`, `aarch64`).
    pub fn from_rpm(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.rpm() == name)
    }

    /// The RPM / kernel name (`x86_64`, `aarch64`).
    pub fn rpm(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    fn variant(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some("v8"),
        }
    }

    fn platform(self) -> Value {
        let mut p = json!({ "architecture": self.oci(), "os": "linux" });
        if let Some(v) = self.variant() {
            p["variant"] = json!(v);
        }
        p
    }
}

/// A content-addressed blob with its media type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The media type its descriptor carries.
    pub media_type: &'static str,
    /// `sha256:<hex>` of `data`.
    pub digest: String,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Blob {
    /// Wraps `data`, computing its digest.
    pub fn new(media_type: &'static str, data: Vec<u8>) -> Blob {
        Blob {
            media_type,
            digest: sha256_digest(&data),
            data,
        }
    }

    fn descriptor(&self) -> Value {
        json!({ "mediaType": self.media_type, "digest": self.digest, "size": self.data.len() })
    }
}

/// One entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file.
    File {
        /// Relative path (`usr/lib/os-release`).
        path: String,
        /// Permission bits.
        mode: u32,
        /// Contents.
        data: Vec<u8>,
    },
    /// A symbolic link.
    Symlink {
        /// Relative path of the link.
        path: String,
        /// What it points to.
        target: String,
    },
}

impl Entry {
    /// A regular file with mode 0644.
    pub fn file(path: impl Into<String>, data: impl Into<Vec<u8>>) -> Entry {
        Entry::File {
            path: path.into(),
            mode: 0o644,
            data: data.into(),
        }
    }

    /// A regular file with mode 0755.
    pub fn executable(path: impl Into<String>, data: impl Into<Vec<u8>>) -> Entry {
        Entry::File {
            path: path.into(),
            mode: 0o755,
            data: data.into(),
        }
    }

    fn path(&self) -> &str {
        match self {
            Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// A single-platform image: its config, layers and manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The platform it was built for.
    pub arch: Arch,
    /// The labels in its config.
    pub labels: BTreeMap<String, String>,
    /// The config blob.
    pub config: Blob,
    /// The gzip'd layer blobs.
    pub layers: Vec<Blob>,
    /// The manifest document.
    pub manifest: Blob,
}

impl Image {
    /// Builds an image with one layer per element of `layers`.
    pub fn build(
        arch: Arch,
        created: &str,
        labels: BTreeMap<String, String>,
        layers: Vec<Vec<Entry>>,
    ) -> anyhow::Result<Image> {
        let mut blobs = Vec::new();
        let mut diff_ids = Vec::new();
        for entries in layers {
            let tar = tar(entries)?;
            diff_ids.push(sha256_digest(&tar));
            blobs.push(Blob::new(MEDIA_LAYER_GZIP, gzip(&tar)));
        }
        let mut config = json!({
            "created": created,
            "architecture": arch.oci(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"],
                "Labels": labels,
            },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
            "history": diff_ids.iter().map(|_| json!({
                "created": created,
                "created_by": "streamd testbed",
            })).collect::<Vec<_>>(),
        });
        if let Some(v) = arch.variant() {
            config["variant"] = json!(v);
        }
        let config = Blob::new(MEDIA_CONFIG, canonical_json(&config));
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": config.descriptor(),
            "layers": blobs.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        });
        Ok(Image {
            arch,
            labels,
            config,
            layers: blobs,
            manifest: Blob::new(MEDIA_MANIFEST, canonical_json(&manifest)),
        })
    }

    /// Every blob the manifest references (config first).
    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        std::iter::once(&self.config).chain(&self.layers)
    }
}

/// An image index over single-platform images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// The images, in index order.
    pub images: Vec<Image>,
    /// The index document.
    pub index: Blob,
}

impl Index {
    /// Builds the index document for `images` (each with its platform).
    pub fn build(images: Vec<Image>) -> Index {
        let manifests: Vec<Value> = images
            .iter()
            .map(|img| {
                let mut d = img.manifest.descriptor();
                d["platform"] = img.arch.platform();
                d
            })
            .collect();
        let doc = json!({ "schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests });
        Index {
            images,
            index: Blob::new(MEDIA_INDEX, canonical_json(&doc)),
        }
    }

    /// The image for `arch`, if the index has one.
    pub fn image(&self, arch: Arch) -> Option<&Image> {
        self.images.iter().find(|i| i.arch == arch)
    }
}

/// Serializes `v` with object keys sorted at every level, whatever map type serde_json was
/// built with (a dependency enabling `preserve_order` must not change digests).
pub fn canonical_json(v: &Value) -> Vec<u8> {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out.into_bytes()
}

/// A ustar archive of `entries` plus every parent directory, sorted by path, owned by 0:0 and
/// dated [`SOURCE_DATE_EPOCH`].
pub fn tar(entries: Vec<Entry>) -> anyhow::Result<Vec<u8>> {
    let mut by_path: BTreeMap<String, Option<Entry>> = BTreeMap::new();
    for e in entries {
        let path = e.path().trim_start_matches('/').to_string();
        if path.is_empty() || path.split('/').any(|c| c.is_empty() || c == "..") {
            bail!("invalid layer path {:?}", e.path());
        }
        for (slash, _) in path.match_indices('/') {
            by_path.entry(path[..=slash].to_string()).or_insert(None);
        }
        if by_path.insert(path.clone(), Some(e)).is_some() {
            bail!("duplicate layer path {path}");
        }
    }
    let mut out = Vec::new();
    for (path, entry) in &by_path {
        match entry {
            None => out.extend(header(path, 0o755, 0, b'5', "")?),
            Some(Entry::File { mode, data, .. }) => {
                out.extend(header(path, *mode, data.len() as u64, b'0', "")?);
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(512), 0);
            }
            Some(Entry::Symlink { target, .. }) => {
                out.extend(header(path, 0o777, 0, b'2', target)?);
            }
        }
    }
    out.resize(out.len() + 1024, 0);
    Ok(out)
}

fn header(path: &str, mode: u32, size: u64, kind: u8, link: &str) -> anyhow::Result<[u8; 512]> {
    let mut h = [0u8; 512];
    let (prefix, name) =
        split_path(path).with_context(|| format!("path too long for ustar: {path}"))?;
    if link.len() > 100 {
        bail!("link target too long for ustar: {link}");
    }
    fn put(h: &mut [u8; 512], at: usize, bytes: &[u8]) {
        h[at..at + bytes.len()].copy_from_slice(bytes);
    }
    put(&mut h, 0, name.as_bytes());
    put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{size:011o}\0").as_bytes());
    put(
        &mut h,
        136,
        format!("{SOURCE_DATE_EPOCH:011o}\0").as_bytes(),
    );
    put(&mut h, 148, b"        ");
    h[156] = kind;
    put(&mut h, 157, link.as_bytes());
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 265, b"root");
    put(&mut h, 297, b"root");
    put(&mut h, 329, b"0000000\0");
    put(&mut h, 337, b"0000000\0");
    put(&mut h, 345, prefix.as_bytes());
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    Ok(h)
}

/// Splits `path` into ustar's (prefix ≤ 155, name ≤ 100) at a `/`.
fn split_path(path: &str) -> Option<(&str, &str)> {
    if path.len() <= 100 {
        return Some(("", path));
    }
    // A directory's trailing '/' belongs to the name part.
    let body = path.strip_suffix('/').unwrap_or(path);
    body.match_indices('/')
        .map(|(i, _)| (&path[..i], &path[i + 1..]))
        .find(|(p, n)| p.len() <= 155 && n.len() <= 100 && !n.is_empty())
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks: valid for every
/// decompressor, byte-for-byte stable, and no compression library needed (the layers are
/// small and the RPMs in them are compressed already).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    // Header: magic, deflate, no flags, mtime 0, no extra flags, OS "unknown" (as Go writes it).
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut chunks = data.chunks(0xffff).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = chunk.len() as u16;
        out.push(u8::from(last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Writes an OCI image layout at `dir` (`oci-layout`, `index.json`, `blobs/sha256/…`) whose
/// `index.json` names each top-level document by `org.opencontainers.image.ref.name`.
pub fn write_layout(dir: &Path, refs: &[(&str, &Blob)], blobs: &[&Blob]) -> anyhow::Result<()> {
    let blob_dir = dir.join("blobs").join("sha256");
    std::fs::create_dir_all(&blob_dir)
        .with_context(|| format!("creating {}", blob_dir.display()))?;
    for blob in blobs.iter().copied().chain(refs.iter().map(|(_, b)| *b)) {
        let hex = blob.digest.trim_start_matches("sha256:");
        let path = blob_dir.join(hex);
        let same = std::fs::metadata(&path).is_ok_and(|m| m.len() == blob.data.len() as u64);
        if !same {
            std::fs::write(&path, &blob.data)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let manifests: Vec<Value> = refs
        .iter()
        .map(|(name, blob)| {
            let mut d = blob.descriptor();
            d["annotations"] = json!({ "org.opencontainers.image.ref.name": name });
            d
        })
        .collect();
    let index = json!({ "schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests });
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
        .with_context(|| format!("writing {}", dir.join("oci-layout").display()))?;
    std::fs::write(dir.join("index.json"), canonical_json(&index))
        .with_context(|| format!("writing {}", dir.join("index.json").display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = json!({"b": 1, "a": {"d": [1, "x"], "c": null}});
        assert_eq!(canonical_json(&v), br#"{"a":{"c":null,"d":[1,"x"]},"b":1}"#);
    }

    #[test]
    fn tar_adds_parents_and_pads() {
        let t = tar(vec![Entry::file("usr/lib/os-release", "x")]).unwrap();
        // usr/, usr/lib/, the file header + one data block, two end blocks.
        assert_eq!(t.len(), 512 * 6);
        assert_eq!(&t[0..4], b"usr/");
        assert_eq!(&t[512..520], b"usr/lib/");
        assert!(tar(vec![Entry::file("a/../b", "")]).is_err());
        assert!(tar(vec![Entry::file("a", ""), Entry::file("a", "")]).is_err());
    }

    #[test]
    fn long_paths_use_the_prefix_field() {
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        assert_eq!(split_path(&long), Some((&long[..120], &long[121..])));
        assert_eq!(split_path(&"x".repeat(101)), None);
    }

    #[test]
    fn gzip_of_empty_and_large_inputs_is_well_formed() {
        let empty = gzip(b"");
        assert_eq!(empty.len(), 10 + 5 + 8);
        let big = vec![7u8; 0x1_0000 + 3];
        let g = gzip(&big);
        assert_eq!(g.len(), 10 + 2 * 5 + big.len() + 8);
    }
}
