//! An extensions layer streamed from the registry through the RPM extraction on a blocking
//! thread, digest-checked, into a directory removed on failure.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::extract::{ExtractBudget, LayerRpms, rpms_in_layer};
use super::manifest::Descriptor;
use super::{InspectError, Inspector};
use crate::image::reference::ImageRef;

impl Inspector {
    /// Streams one layer through [`rpms_in_layer`] on a blocking thread.
    ///
    /// An extensions layer is hundreds of MiB: it is never held in memory or written out whole,
    /// and the async loop keeps serving the node watch and D-Bus while it is read. The digest
    /// covers every byte, including what follows the tar end marker, and no more bytes than the
    /// descriptor's size are read.
    pub(super) async fn layer_rpms(
        &self,
        image: &ImageRef,
        layer: &Descriptor,
        wanted: &[String],
        dest: Option<&Path>,
        mut budget: ExtractBudget,
    ) -> Result<(LayerRpms, ExtractBudget), InspectError> {
        let size = Self::descriptor_size(image, layer, u64::MAX)?;
        let resp = self
            .blob_response(image, layer, size, self.extensions_deadline)
            .await?;
        let stream =
            futures::StreamExt::map(resp.bytes_stream(), |r| r.map_err(std::io::Error::other));
        // The bridge must be made on the runtime; it blocks only the thread that reads it.
        let bridge = SyncIoBridge::new(StreamReader::new(stream));
        let (media_type, digest) = (layer.media_type.clone(), layer.digest.clone());
        let (wanted, dest) = (wanted.to_vec(), dest.map(Path::to_path_buf));
        let what = format!("{image}: layer {digest}");
        let registry = image.registry().to_string();
        let read = tokio::task::spawn_blocking(move || {
            // One byte past the declared size tells a longer blob without reading all of it.
            let mut hashed = Hashing::new(bridge.take(size.saturating_add(1)));
            let found = rpms_in_layer(
                &mut hashed,
                &media_type,
                &wanted,
                dest.as_deref(),
                &mut budget,
            )
            .and_then(|found| std::io::copy(&mut hashed, &mut std::io::sink()).map(|_| found));
            (found, hashed.failure(), hashed.digest(), hashed.len, budget)
        })
        .await;
        let (found, network, got, len, budget) =
            read.map_err(|e| InspectError::Invalid(format!("{what}: reader task failed: {e}")))?;
        // A failing download is retried; a layer that downloads but does not read is refused.
        if let Some(message) = network {
            return Err(InspectError::Transient { registry, message });
        }
        if len > size {
            return Err(InspectError::Invalid(format!(
                "{what}: larger than the {size} bytes its descriptor says"
            )));
        }
        let found = found.map_err(|e| InspectError::Invalid(format!("{what}: {e}")))?;
        if got != digest {
            return Err(InspectError::Invalid(format!(
                "{what}: digest mismatch (got {got})"
            )));
        }
        Ok((found, budget))
    }
}

/// A directory that is removed when dropped, with what is in it.
pub(super) struct Partial(PathBuf);

impl Partial {
    pub(super) fn new(path: PathBuf) -> std::io::Result<Self> {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&path)?;
        Ok(Partial(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove a partial extraction");
        }
    }
}

/// A reader that hashes and counts what passes through it and remembers whether its source
/// failed, so a network error is not mistaken for a malformed archive.
struct Hashing<R> {
    inner: R,
    sha: Sha256,
    len: u64,
    failure: Option<String>,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            sha: Sha256::new(),
            len: 0,
            failure: None,
        }
    }

    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }

    fn digest(&self) -> String {
        format!("sha256:{:x}", self.sha.clone().finalize())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.sha.update(buf.get(..n).unwrap_or_default());
                self.len += n as u64;
                Ok(n)
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    self.failure = Some(e.to_string());
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields `data`, then fails with `error`.
    struct Failing(Vec<u8>, Option<std::io::Error>);

    impl Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(self
                    .1
                    .take()
                    .unwrap_or_else(|| std::io::Error::other("again")));
            }
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_failing_download_is_remembered() {
        let mut net = Hashing::new(Failing(
            b"abc".to_vec(),
            Some(std::io::Error::other("reset")),
        ));
        let mut sink = Vec::new();
        assert!(net.read_to_end(&mut sink).is_err());
        assert_eq!(sink, b"abc");
        assert_eq!(net.failure().as_deref(), Some("reset"));
        assert_eq!(net.len, 3);
        assert_eq!(
            net.digest(),
            format!("sha256:{:x}", Sha256::digest(b"abc")),
            "the digest covers what was read"
        );
    }
}
