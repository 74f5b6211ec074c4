//! The OS images the testbed knows about.
//!
//! Digests are the sha256 of a deterministic manifest document, so every run
//! names the same digest-pinned pullspecs and nothing has to be guessed.

use sha2::{Digest, Sha256};

/// Registry host the testbed's pullspecs name (issue 3 puts a real registry behind it).
pub const DEFAULT_REGISTRY: &str = "127.0.0.1:5000";

/// One OS image the fake `rpm-ostreed` can "pull".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestImage {
    /// Stream class label (`io.openshift.os.streamclass`), e.g. `rhel-9`.
    pub stream: String,
    /// Repository without registry, e.g. `openshift/rhcos`.
    pub repository: String,
    /// `sha256:<64 hex>` manifest digest.
    pub digest: String,
    /// Image version label, e.g. `9.6.20261101-0`.
    pub version: String,
    /// `RHEL_VERSION` of the image's os-release, e.g. `9.6`.
    pub rhel_version: String,
    /// Default kernel release shipped in the image.
    pub kernel: String,
    /// Full pullspec `host/repo@sha256:…`.
    pub pullspec: String,
}

impl TestImage {
    fn new(registry: &str, stream: &str, rhel_version: &str, version: &str, kernel: &str) -> Self {
        let repository = "openshift/rhcos".to_string();
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
             \"annotations\":{{\"io.openshift.os.streamclass\":\"{stream}\",\"version\":\"{version}\"}}}}"
        );
        let digest = format!("sha256:{:x}", Sha256::digest(manifest.as_bytes()));
        let pullspec = format!("{registry}/{repository}@{digest}");
        TestImage {
            stream: stream.to_string(),
            repository,
            digest,
            version: version.to_string(),
            rhel_version: rhel_version.to_string(),
            kernel: kernel.to_string(),
            pullspec,
        }
    }

    /// The image's `/usr/lib/os-release`, shaped like RHEL CoreOS's.
    pub fn os_release(&self) -> String {
        let major = self.rhel_version.split('.').next().unwrap_or_default();
        format!(
            "NAME=\"Red Hat Enterprise Linux CoreOS\"\nID=\"rhcos\"\nID_LIKE=\"rhel fedora\"\n\
             VERSION=\"{v}\"\nVERSION_ID=\"{major}\"\nVARIANT=\"CoreOS\"\nVARIANT_ID=coreos\n\
             PLATFORM_ID=\"platform:el{major}\"\nPRETTY_NAME=\"Red Hat Enterprise Linux CoreOS {v}\"\n\
             RHEL_VERSION={rv}\nOSTREE_VERSION='{v}'\n",
            v = self.version,
            rv = self.rhel_version,
        )
    }

    /// The image config JSON (`ostree.container.image-config` in commit metadata).
    pub fn config_json(&self) -> String {
        serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Labels": {
                "containers.bootc": "1",
                "io.openshift.os.streamclass": self.stream,
                "ostree.linux": self.kernel,
                "version": self.version,
            }}
        })
        .to_string()
    }
}

/// The images served by a testbed whose registry is `registry`: `rhel-9` first, then `rhel-10`.
pub fn catalog(registry: &str) -> Vec<TestImage> {
    vec![
        TestImage::new(
            registry,
            "rhel-9",
            "9.6",
            "9.6.20261101-0",
            "5.14.0-570.60.1.el9_6.x86_64",
        ),
        TestImage::new(
            registry,
            "rhel-10",
            "10.1",
            "10.1.20261115-0",
            "6.12.0-124.8.1.el10_1.x86_64",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_digests_are_distinct_pinned_and_stable() {
        let a = catalog(DEFAULT_REGISTRY);
        let b = catalog(DEFAULT_REGISTRY);
        assert_eq!(a, b);
        assert_ne!(a[0].digest, a[1].digest);
        for img in &a {
            let hex = img.digest.strip_prefix("sha256:").unwrap_or_default();
            assert_eq!(hex.len(), 64);
            assert!(
                hex.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
            );
            assert!(img.pullspec.ends_with(&img.digest));
        }
        assert!(a[1].os_release().contains("RHEL_VERSION=10.1"));
    }
}
