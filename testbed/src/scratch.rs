//! Scratch directories: where tests (and the testbed's own unit tests) put a testbed, a
//! registry or a sysroot for one run.
//!
//! They live below a short runtime directory, never below the clone: a testbed directory holds
//! UNIX sockets (the bus, `control.sock`, the transaction socket, a fleet's per-node ones), and
//! a socket path is limited to the 108 bytes of `sun_path`, less in dbus-daemon's
//! configuration. So the directory's own path is kept to [`MAX_PATH_LEN`] bytes whatever the
//! test's name.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;

/// The longest path a scratch directory gets: the deepest socket the testbed makes,
/// `nodes/worker-NN/rpm-ostree-transaction.sock` (43 bytes), fits below it within 100 bytes.
pub const MAX_PATH_LEN: usize = 56;

/// The fallback parent when `TMPDIR` names a long path.
const SHORT_TMP: &str = "/tmp";

/// A fresh, empty directory `<tmp>/streamd-<name>-<pid>-<n>`, removed when dropped, unless the
/// thread is panicking: a failed test leaves its testbed (logs, state, sysroot) to read.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates the directory, after removing a leftover of the same name; `name` is cut short
    /// to keep the path within [`MAX_PATH_LEN`].
    pub fn new(name: &str) -> anyhow::Result<ScratchDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let parent = parent();
        let suffix = format!(
            "-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let room = MAX_PATH_LEN
            .saturating_sub(parent.as_os_str().len() + "/streamd-".len() + suffix.len());
        let name: String = name.chars().take(room).collect();
        let path = parent.join(format!("streamd-{name}{suffix}"));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ScratchDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for a look at what failed", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `TMPDIR` (`std::env::temp_dir`) when it leaves room for a name, else `/tmp`.
fn parent() -> PathBuf {
    let tmp = std::env::temp_dir();
    if tmp.is_absolute() && tmp.as_os_str().len() <= MAX_PATH_LEN / 2 {
        tmp
    } else {
        PathBuf::from(SHORT_TMP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dirs_are_fresh_short_and_removed() {
        let long = "a-test-name-long-enough-to-push-a-socket-path-past-what-dbus-accepts";
        let a = ScratchDir::new(long).expect("scratch");
        let b = ScratchDir::new(long).expect("scratch");
        assert_ne!(a.path(), b.path());
        for dir in [&a, &b] {
            assert!(dir.path().is_dir());
            assert!(
                dir.path().as_os_str().len() <= MAX_PATH_LEN,
                "{}",
                dir.path().display()
            );
            assert!(!dir.path().starts_with(env!("CARGO_MANIFEST_DIR")));
            let socket = dir
                .path()
                .join("nodes/worker-10/rpm-ostree-transaction.sock");
            assert!(socket.as_os_str().len() <= 100, "{}", socket.display());
        }
        let path = a.path().to_path_buf();
        std::fs::write(path.join("f"), "x").expect("write");
        drop(a);
        assert!(!path.exists());
    }
}
