//! An extensions layer streamed from the registry through the RPM extraction on a blocking
//! thread, digest-checked, into a directory removed on failure.
//!
//! The blocking thread outlives a dropped caller (a preflight aborted for a new request, a
//! deadline): the caller's end stops the stream it reads, and the directory it writes into
//! stays held, and is removed, only once the thread has ended, so the next extraction never
//! shares it with a reader of an older one.

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
        dest: Option<&Partial>,
        mut budget: ExtractBudget,
    ) -> Result<(LayerRpms, ExtractBudget), InspectError> {
        let size = Self::descriptor_size(image, layer, u64::MAX)?;
        let resp = self
            .blob_response(image, layer, size, self.extensions_deadline)
            .await?;
        // The stream ends when this future is dropped (`_reading` with it): the thread then
        // reads a truncated layer, fails and ends, instead of reading on for nobody.
        let (_reading, dropped) = tokio::sync::oneshot::channel::<()>();
        let stream = futures::StreamExt::take_until(
            futures::StreamExt::map(resp.bytes_stream(), |r| r.map_err(std::io::Error::other)),
            dropped,
        );
        // The bridge must be made on the runtime; it blocks only the thread that reads it.
        let bridge = SyncIoBridge::new(StreamReader::new(stream));
        let (media_type, digest) = (layer.media_type.clone(), layer.digest.clone());
        // The thread holds the directory (and with it the extraction lock) until it ends.
        let (wanted, held) = (wanted.to_vec(), dest.map(Partial::hold));
        let what = format!("{image}: layer {digest}");
        let registry = image.registry().to_string();
        let read = tokio::task::spawn_blocking(move || {
            // One byte past the declared size tells a longer blob without reading all of it.
            let mut hashed = Hashing::new(bridge.take(size.saturating_add(1)));
            let found = rpms_in_layer(
                &mut hashed,
                &media_type,
                &wanted,
                held.as_deref().map(Held::path),
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

/// One extraction at a time in the process: a new one waits until the blocking thread of an
/// aborted one has ended (its directory is the same `.partial`).
static EXTRACTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A directory that is removed, with what is in it, once neither its extraction nor a thread
/// reading into it holds it; until then no other extraction starts.
pub(super) struct Partial(std::sync::Arc<Held>);

/// The directory and the extraction lock, shared by the extraction and its reading threads.
pub(super) struct Held {
    path: PathBuf,
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

impl Partial {
    /// Waits for any earlier extraction's threads to end, then empties `path`.
    pub(super) async fn new(path: PathBuf) -> std::io::Result<Self> {
        let one = EXTRACTING.lock().await;
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&path)?;
        Ok(Partial(std::sync::Arc::new(Held {
            path,
            _one_at_a_time: one,
        })))
    }

    /// A hold for a thread that writes into the directory.
    fn hold(&self) -> std::sync::Arc<Held> {
        self.0.clone()
    }
}

impl Held {
    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Held {
    // Runs before the lock is released: the next extraction finds the directory gone.
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(dir = %self.path.display(), error = %e, "cannot remove a partial extraction");
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
