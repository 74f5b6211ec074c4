//! Host facts, read relative to the configured host root.

pub mod osrelease;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use osrelease::OsRelease;

/// Which service stages deployments on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// rpm-ostreed over D-Bus.
    RpmOstree,
}

impl Backend {
    /// The name used in annotations and status.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::RpmOstree => "rpm-ostree",
        }
    }
}

/// Facts published in the `host` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Kernel architecture name (`x86_64`, `aarch64`).
    pub arch: String,
    /// Staging backend.
    pub backend: Backend,
}

impl HostFacts {
    /// Compact JSON for the annotation.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Reads host files below a root directory.
#[derive(Debug, Clone)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// A host root at `path` (`/` on a real host).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        HostRoot(path.into())
    }

    /// Joins an absolute host path below the root.
    pub fn path(&self, host_path: &str) -> PathBuf {
        self.0.join(host_path.trim_start_matches('/'))
    }

    fn read(&self, host_path: &str) -> std::io::Result<String> {
        std::fs::read_to_string(self.path(host_path))
    }

    /// The host name (`/proc/sys/kernel/hostname`).
    pub fn hostname(&self) -> std::io::Result<String> {
        Ok(self.read("/proc/sys/kernel/hostname")?.trim().to_string())
    }

    /// The booted OS's os-release (`/etc/os-release`, else `/usr/lib/os-release`).
    pub fn os_release(&self) -> std::io::Result<OsRelease> {
        self.read("/etc/os-release")
            .or_else(|_| self.read("/usr/lib/os-release"))
            .map(|t| OsRelease::parse(&t))
    }

    /// The architecture: `/proc/sys/kernel/arch` when the kernel has it, else this build's.
    pub fn arch(&self) -> String {
        self.read("/proc/sys/kernel/arch")
            .map(|a| a.trim().to_string())
            .ok()
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| std::env::consts::ARCH.to_string())
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.0
    }
}

/// Gathers the facts streamd publishes.
pub fn gather(root: &HostRoot, backend: Backend) -> HostFacts {
    HostFacts {
        arch: root.arch(),
        backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_below_root() {
        let d = std::env::temp_dir().join(format!("streamd-host-{}", std::process::id()));
        std::fs::create_dir_all(d.join("proc/sys/kernel")).expect("mkdir");
        std::fs::create_dir_all(d.join("usr/lib")).expect("mkdir");
        std::fs::write(d.join("proc/sys/kernel/hostname"), "worker-0\n").expect("write");
        std::fs::write(d.join("proc/sys/kernel/arch"), "aarch64\n").expect("write");
        std::fs::write(d.join("usr/lib/os-release"), "ID=rhcos\nRHEL_VERSION=9.6\n").expect("w");
        let root = HostRoot::new(&d);
        assert_eq!(root.hostname().expect("hostname"), "worker-0");
        assert_eq!(
            root.os_release().expect("os").stream().as_deref(),
            Some("rhel-9")
        );
        let facts = gather(&root, Backend::RpmOstree);
        assert_eq!(facts.arch, "aarch64");
        assert_eq!(
            facts.to_json(),
            r#"{"arch":"aarch64","backend":"rpm-ostree"}"#
        );
    }
}
