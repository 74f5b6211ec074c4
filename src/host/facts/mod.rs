//! Host facts, read relative to the configured host root.

pub mod cpu;
pub mod crio;
pub mod fips;
pub mod journal;
pub mod machineconfig;
pub mod mcd;
pub mod mco_release;
pub mod osrelease;
pub mod secureboot;

pub use journal::finalize_failure;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use fips::{Fips, FipsSources};
pub use osrelease::OsRelease;

use crate::backend::{BackendKind, Deployment, KernelVariant, kernel};

/// Facts published in the `host` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Kernel architecture name (`x86_64`, `aarch64`).
    pub arch: String,
    /// Staging backend.
    pub backend: BackendKind,
    /// FIPS mode.
    pub fips: Fips,
    /// The two values the FIPS mode was read from (for reasons; not published).
    #[serde(skip)]
    pub fips_sources: FipsSources,
    /// Kernel variant of the booted deployment; `None` when it could not be determined
    /// (no booted deployment yet, or overrides and running kernel disagree).
    pub kernel: Option<KernelVariant>,
    /// x86-64 micro-architecture level (x86_64 only).
    #[serde(
        rename = "x86_64Level",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub x86_64_level: Option<u8>,
    /// Whether UEFI Secure Boot is on (the `SecureBoot` EFI variable; off on a host that did
    /// not boot by EFI); `None` when the variable cannot be read.
    #[serde(
        rename = "secureBoot",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub secure_boot: Option<bool>,
    /// Whether bootupd's `bootloader-update.service` ran and succeeded this boot, as systemd
    /// said when the readiness checks last ran (`None`: not asked yet, or systemd could not
    /// say).
    #[serde(
        rename = "bootloaderUpdated",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub bootloader_updated: Option<bool>,
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

    /// This boot's id (`/proc/sys/kernel/random/boot_id`): tells a reboot from a restart.
    pub fn boot_id(&self) -> std::io::Result<String> {
        let id = self
            .read("/proc/sys/kernel/random/boot_id")?
            .trim()
            .to_string();
        if id.len() < 8 || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("boot id {} is not a UUID", crate::text::quote(&id)),
            ));
        }
        Ok(id)
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

/// Gathers the facts streamd publishes; `booted` is the booted deployment, if known.
pub fn gather(root: &HostRoot, backend: BackendKind, booted: Option<&Deployment>) -> HostFacts {
    let arch = root.arch();
    let (fips_enabled, cmdline) = (
        root.read("/proc/sys/crypto/fips_enabled").ok(),
        root.read("/proc/cmdline").unwrap_or_default(),
    );
    let fips = fips::fips(fips_enabled.as_deref(), &cmdline);
    let fips_sources = FipsSources::read(fips_enabled.as_deref(), &cmdline);
    let kernel = booted.and_then(|d| kernel_variant(root, d).ok());
    let x86_64_level = (arch == "x86_64")
        .then(|| root.read("/proc/cpuinfo").ok())
        .flatten()
        .and_then(|c| cpu::x86_64_level(&c));
    let secure_boot = secureboot::secure_boot(root).ok();
    HostFacts {
        arch,
        backend,
        fips,
        fips_sources,
        kernel,
        x86_64_level,
        secure_boot,
        bootloader_updated: None,
    }
}

/// Why the running kernel variant is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelVariantError {
    /// `/proc/sys/kernel/osrelease` could not be read (why).
    #[error("cannot read the running kernel release: {0}")]
    Release(String),
    /// The overrides and the running kernel disagree.
    #[error(transparent)]
    Mismatch(#[from] kernel::KernelMismatch),
}

impl KernelVariantError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            KernelVariantError::Release(_) => "kernel-release-unreadable",
            KernelVariantError::Mismatch(e) => e.label(),
        }
    }
}

/// The booted deployment's kernel variant, cross-checked with the running kernel.
pub fn kernel_variant(
    root: &HostRoot,
    booted: &Deployment,
) -> Result<KernelVariant, KernelVariantError> {
    let release = root
        .read("/proc/sys/kernel/osrelease")
        .map_err(|e| KernelVariantError::Release(e.to_string()))?;
    let rt = root.read("/sys/kernel/realtime").ok();
    Ok(kernel::checked_variant(booted, &release, rt.as_deref())?)
}

/// CRI-O's effective default runtime: `/etc/crio/crio.conf`, then `/etc/crio/crio.conf.d/*.conf`
/// in name order, the last setting winning.
pub fn crio_default_runtime(root: &HostRoot) -> Result<String, crio::CrioConfigError> {
    let mut files = Vec::new();
    if let Ok(t) = root.read("/etc/crio/crio.conf") {
        files.push(("/etc/crio/crio.conf".to_string(), t));
    }
    let dir = root.path("/etc/crio/crio.conf.d");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".conf"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for n in names {
        let host_path = format!("/etc/crio/crio.conf.d/{n}");
        let text = root.read(&host_path).map_err(|e| crio::CrioConfigError {
            file: host_path.clone(),
            message: e.to_string(),
        })?;
        files.push((host_path, text));
    }
    crio::default_runtime(&files)
}

/// The images pinned in CRI-O's storage by the node's PinnedImageSets
/// ([`crio::PINNED_IMAGES`]); none without the file.
pub fn pinned_images(root: &HostRoot) -> Result<Vec<String>, crio::CrioConfigError> {
    match std::fs::read_to_string(root.path(crio::PINNED_IMAGES)) {
        Ok(text) => crio::pinned_images(crio::PINNED_IMAGES, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(crio::CrioConfigError {
            file: crio::PINNED_IMAGES.to_string(),
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_below_root() {
        let d = testbed::scratch::ScratchDir::new("host").expect("scratch dir");
        std::fs::create_dir_all(d.join("proc/sys/kernel")).expect("mkdir");
        std::fs::create_dir_all(d.join("usr/lib")).expect("mkdir");
        std::fs::write(d.join("proc/sys/kernel/hostname"), "worker-0\n").expect("write");
        std::fs::write(d.join("proc/sys/kernel/arch"), "aarch64\n").expect("write");
        std::fs::write(d.join("usr/lib/os-release"), "ID=rhcos\nRHEL_VERSION=9.6\n").expect("w");
        let root = HostRoot::new(d.path());
        assert_eq!(root.hostname().expect("hostname"), "worker-0");
        assert_eq!(
            root.os_release().expect("os").stream().as_deref(),
            Some("rhel-9")
        );
        std::fs::create_dir_all(d.join("proc/sys/crypto")).expect("mkdir");
        std::fs::write(d.join("proc/sys/crypto/fips_enabled"), "1\n").expect("write");
        std::fs::write(d.join("proc/cmdline"), "root=x fips=1\n").expect("write");
        std::fs::write(
            d.join("proc/sys/kernel/osrelease"),
            "5.14.0-570.el9_6.aarch64+64k\n",
        )
        .expect("write");
        let booted = Deployment {
            requested_packages: vec!["kernel-64k-core".into()],
            ..Deployment::default()
        };
        let facts = gather(&root, BackendKind::RpmOstree, Some(&booted));
        assert_eq!(facts.arch, "aarch64");
        assert_eq!(
            facts.to_json(),
            r#"{"arch":"aarch64","backend":"rpm-ostree","fips":"enabled","kernel":"64k-pages","secureBoot":false}"#
        );
        std::fs::create_dir_all(d.join("etc/crio/crio.conf.d")).expect("mkdir");
        std::fs::write(
            d.join("etc/crio/crio.conf"),
            "[crio.runtime]\ndefault_runtime = \"runc\"\n",
        )
        .expect("write");
        assert_eq!(crio_default_runtime(&root).as_deref(), Ok("runc"));
        std::fs::write(
            d.join("etc/crio/crio.conf.d/99-crun.conf"),
            "[crio.runtime]\ndefault_runtime = \"crun\"\n",
        )
        .expect("write");
        assert_eq!(crio_default_runtime(&root).as_deref(), Ok("crun"));
    }
}
