//! RPMs extracted from extensions images, kept under the runtime directory between preflights.
//!
//! A request is checked again on every reconcile until it is staged, and each check needs the
//! extensions image's RPM list and the variant RPMs it carries. The image is digest-pinned, so
//! what was read from it once stays true: an extraction is recorded next to its files and
//! reused while the image, architecture and wanted packages are the same. Only the directory of
//! the current request is kept; the rest is removed, so `/run` (memory) holds one image's RPMs
//! at most.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::image::reference::ImageRef;
use crate::image::registry::ExtensionsInfo;

/// The record written last into an extraction directory.
pub const RECORD: &str = "extracted.json";

/// What one extraction read and wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extraction {
    /// The image, by digest.
    pub image: String,
    /// The host architecture it was read for.
    pub arch: String,
    /// The packages whose RPMs were wanted.
    pub wanted: Vec<String>,
    /// What the image carries.
    pub info: ExtensionsInfo,
    /// The extracted files (names inside the directory) and their sizes in bytes.
    pub files: Vec<(String, u64)>,
}

/// The extraction directories under one root (`<runtime-dir>/extensions`).
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root`; nothing is created until an extraction is stored.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Cache { root: root.into() }
    }

    /// The directory for `image`: named by its digest, so two images never share one.
    pub fn dir(&self, image: &ImageRef) -> PathBuf {
        let hex = image.digest().trim_start_matches("sha256:");
        self.root.join(hex)
    }

    /// The stored extraction for exactly this image and architecture that holds every wanted
    /// package (it may hold more), with the paths of its files; `None` when any of them
    /// differs or a file is missing or changed.
    pub fn get(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
    ) -> Option<(ExtensionsInfo, Vec<PathBuf>)> {
        let dir = self.dir(image);
        let text = std::fs::read(dir.join(RECORD)).ok()?;
        let record: Extraction = match serde_json::from_slice(&text) {
            Ok(r) => r,
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "unreadable extraction record; extracting again");
                return None;
            }
        };
        // A superset serves too: after the dependency closure added providers (gather), the
        // next preflight asks for the wanted packages alone.
        if record.image != image.to_string()
            || record.arch != arch
            || !wanted.iter().all(|w| record.wanted.contains(w))
        {
            return None;
        }
        let mut paths = Vec::with_capacity(record.files.len());
        for (name, size) in &record.files {
            // Only plain names were ever recorded; anything else is not ours.
            if name.contains('/') || name.starts_with('.') {
                return None;
            }
            let path = dir.join(name);
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() && m.len() == *size => paths.push(path),
                _ => return None,
            }
        }
        debug!(image = %image, files = paths.len(), "reusing extracted extensions");
        Some((record.info, paths))
    }

    /// An empty directory for a new extraction of `image` (what was there is removed first,
    /// so a half-finished earlier extraction never mixes in).
    pub fn fresh(&self, image: &ImageRef) -> std::io::Result<PathBuf> {
        let dir = self.dir(image);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Records a finished extraction. The record is written last (temporary file, rename), so
    /// a directory without one is never reused. Failing to record only costs the next pull.
    pub fn put(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        info: &ExtensionsInfo,
        files: &[PathBuf],
    ) {
        let dir = self.dir(image);
        let record = Extraction {
            image: image.to_string(),
            arch: arch.to_string(),
            wanted: wanted.to_vec(),
            info: info.clone(),
            files: files
                .iter()
                .filter_map(|p| {
                    let name = p.file_name()?.to_str()?.to_string();
                    let size = std::fs::metadata(p).ok()?.len();
                    Some((name, size))
                })
                .collect(),
        };
        let result = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                let tmp = dir.join(format!(".{RECORD}.tmp"));
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, dir.join(RECORD))
            });
        if let Err(e) = result {
            warn!(dir = %dir.display(), error = %e, "cannot record the extraction; the next preflight pulls again");
        }
    }

    /// Removes every extraction but the directories in `keep` (see [`Cache::dir`]). Best
    /// effort: what cannot be removed is logged and tried again next time.
    pub fn prune(&self, keep: &[PathBuf]) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if keep.contains(&path) {
                continue;
            }
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => debug!(path = %path.display(), "removed an old extraction"),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "cannot remove an old extraction")
                }
            }
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(d: char) -> ImageRef {
        format!("quay.io/x/ext@sha256:{}", d.to_string().repeat(64))
            .parse()
            .expect("image")
    }

    /// A cache in a scratch directory, removed when the directory is dropped.
    fn scratch(name: &str) -> (testbed::scratch::ScratchDir, Cache) {
        let dir =
            testbed::scratch::ScratchDir::new(&format!("extcache-{name}")).expect("scratch dir");
        let cache = Cache::new(dir.join("cache"));
        (dir, cache)
    }

    fn info() -> ExtensionsInfo {
        ExtensionsInfo {
            is_extensions: true,
            listed: true,
            stream_class: Some("rhel-10".into()),
            rpms: vec!["kernel-rt-core-6.12.0-1.el10.x86_64".into()],
            headers: Vec::new(),
        }
    }

    fn extract(cache: &Cache, img: &ImageRef, wanted: &[String]) -> Vec<PathBuf> {
        let dir = cache.fresh(img).expect("fresh");
        let f = dir.join("kernel-rt-core-6.12.0-1.el10.x86_64.rpm");
        std::fs::write(&f, b"rpm").expect("write");
        cache.put(img, "x86_64", wanted, &info(), std::slice::from_ref(&f));
        vec![f]
    }

    #[test]
    fn a_recorded_extraction_is_reused_only_for_the_same_request() {
        let (_dir, cache) = scratch("reuse");
        let (a, b) = (image('a'), image('b'));
        let wanted = vec!["kernel-rt-core".to_string()];
        assert!(cache.get(&a, "x86_64", &wanted).is_none(), "nothing yet");
        let files = extract(&cache, &a, &wanted);
        assert_eq!(cache.get(&a, "x86_64", &wanted), Some((info(), files)));
        assert!(cache.get(&b, "x86_64", &wanted).is_none(), "another image");
        assert!(cache.get(&a, "aarch64", &wanted).is_none(), "another arch");
        assert!(
            cache.get(&a, "x86_64", &["usbguard".to_string()]).is_none(),
            "other packages"
        );
        assert!(cache.get(&a, "x86_64", &[]).is_some(), "a subset is served");
    }

    #[test]
    fn a_changed_missing_or_unrecorded_file_means_extracting_again() {
        let (_dir, cache) = scratch("changed");
        let a = image('a');
        let wanted = vec!["kernel-rt-core".to_string()];
        let files = extract(&cache, &a, &wanted);
        std::fs::write(&files[0], b"truncated or replaced").expect("write");
        assert!(cache.get(&a, "x86_64", &wanted).is_none(), "size changed");
        let files = extract(&cache, &a, &wanted);
        std::fs::remove_file(&files[0]).expect("rm");
        assert!(cache.get(&a, "x86_64", &wanted).is_none(), "file gone");
        // A fresh directory has no record until put: a crash mid-extraction is never reused.
        let dir = cache.fresh(&a).expect("fresh");
        std::fs::write(dir.join("x.rpm"), b"half").expect("write");
        assert!(cache.get(&a, "x86_64", &wanted).is_none(), "no record");
        std::fs::write(dir.join(RECORD), b"{not json").expect("write");
        assert!(cache.get(&a, "x86_64", &wanted).is_none(), "bad record");
    }

    #[test]
    fn a_record_naming_a_path_outside_its_directory_is_not_trusted() {
        let (_dir, cache) = scratch("escape");
        let a = image('a');
        let dir = cache.fresh(&a).expect("fresh");
        let record = Extraction {
            image: a.to_string(),
            arch: "x86_64".into(),
            wanted: vec![],
            info: info(),
            files: vec![("../../etc/passwd".into(), 0)],
        };
        std::fs::write(dir.join(RECORD), serde_json::to_vec(&record).expect("json"))
            .expect("write");
        assert!(cache.get(&a, "x86_64", &[]).is_none());
    }

    #[test]
    fn prune_keeps_only_the_current_image() {
        let (_dir, cache) = scratch("prune");
        let (a, b) = (image('a'), image('b'));
        extract(&cache, &a, &[]);
        extract(&cache, &b, &[]);
        std::fs::write(cache.root().join("stray"), b"x").expect("write");
        cache.prune(&[cache.dir(&b)]);
        let left: Vec<PathBuf> = std::fs::read_dir(cache.root())
            .expect("root")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        assert_eq!(left, vec![cache.dir(&b)]);
        cache.prune(&[]);
        assert_eq!(std::fs::read_dir(cache.root()).expect("root").count(), 0);
    }
}
