//! The OS images the testbed knows about.
//!
//! Digests are the sha256 of a deterministic manifest document, so every run
//! names the same digest-pinned pullspecs and nothing has to be guessed.

use sha2::{Digest, Sha256};

use crate::fixtures::Kernel;

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
    /// Image version label, e.g. `9.6.20261120-0`.
    pub version: String,
    /// `RHEL_VERSION` of the image's os-release, e.g. `9.6`.
    pub rhel_version: String,
    /// Default kernel release shipped in the image.
    pub kernel: String,
    /// Full pullspec `host/repo@sha256:…`.
    pub pullspec: String,
    /// The kernel the image itself carries: the default one for the catalog, a variant for a
    /// variant image ([`variants`]), whose `ostree.linux` then ends in the variant's suffix.
    pub variant: Kernel,
    /// `baseOSContainerImage`: set on an image the machine-config operator's on-cluster
    /// layering built from that base (a fixture's booted image only).
    pub layered_from: Option<String>,
}

impl TestImage {
    fn new(registry: &str, stream: &str, rhel_version: &str, version: &str, kernel: &str) -> Self {
        Self::with_variant(
            registry,
            stream,
            rhel_version,
            version,
            kernel,
            Kernel::Default,
        )
    }

    fn with_variant(
        registry: &str,
        stream: &str,
        rhel_version: &str,
        version: &str,
        kernel: &str,
        variant: Kernel,
    ) -> Self {
        let repository = "openshift/rhcos".to_string();
        let linux = format!("{kernel}{}", variant.release_suffix());
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
             \"annotations\":{{\"io.openshift.os.streamclass\":\"{stream}\",\"version\":\"{version}\"{}}}}}",
            if variant == Kernel::Default {
                String::new()
            } else {
                format!(",\"ostree.linux\":\"{linux}\"")
            }
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
            variant,
            layered_from: None,
        }
    }

    /// The registry tag: the stream (`rhel-10`), with the variant for a variant image
    /// (`rhel-10-rt`, `rhel-10-64k`).
    pub fn tag(&self) -> String {
        match self.variant {
            Kernel::Default => self.stream.clone(),
            Kernel::Realtime => format!("{}-rt", self.stream),
            Kernel::SixtyFourK => format!("{}-64k", self.stream),
        }
    }

    /// The kernel release its `ostree.linux` label names (x86_64).
    pub fn linux(&self) -> String {
        format!("{}{}", self.kernel, self.variant.release_suffix())
    }

    /// This image as the on-cluster layering of the machine-config operator rebuilds it for a
    /// pool: the labels its Containerfile adds (`machineconfig`, `machineconfigpool`,
    /// `baseOSContainerImage`: openshift/machine-config-operator:pkg/controller/build/
    /// buildrequest/assets/Containerfile.on-cluster-build-template), the base's inherited.
    pub fn layered(&self) -> TestImage {
        TestImage {
            layered_from: Some(self.pullspec.clone()),
            ..self.clone()
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

    /// When the image was built, in Unix seconds: midnight UTC of the date in its version
    /// (`9.6.20261120-0` → 2026-11-20). It is the config's `created`, which ostree-ext makes
    /// the imported commit's timestamp, which rpm-ostree's downgrade check compares.
    pub fn created_unix(&self) -> u64 {
        let date = self
            .version
            .split('.')
            .find(|part| part.len() >= 8 && part.as_bytes()[..8].iter().all(u8::is_ascii_digit))
            .map(|part| &part[..8]);
        let Some(date) = date else {
            return 1;
        };
        let num = |r: std::ops::Range<usize>| date[r].parse::<i64>().unwrap_or(1);
        let days = days_from_civil(num(0..4), num(4..6), num(6..8));
        u64::try_from(days * 86_400).unwrap_or(1)
    }

    /// [`Self::created_unix`] as the RFC 3339 `created` of the image config.
    pub fn created(&self) -> String {
        let secs = i64::try_from(self.created_unix()).unwrap_or(0);
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        let t = secs.rem_euclid(86_400);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            t / 3600,
            t % 3600 / 60,
            t % 60
        )
    }

    /// The image config JSON (`ostree.container.image-config` in commit metadata).
    pub fn config_json(&self) -> String {
        let mut labels = serde_json::json!({
            "containers.bootc": "1",
            "io.openshift.os.streamclass": self.stream,
            "ostree.linux": self.linux(),
            "version": self.version,
        });
        if let Some(base) = &self.layered_from {
            labels["baseOSContainerImage"] = serde_json::json!(base);
            labels["machineconfig"] = serde_json::json!("rendered-worker-testbed");
            labels["machineconfigpool"] = serde_json::json!("worker");
        }
        serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Labels": labels }
        })
        .to_string()
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date (year, month, day) of a day count since 1970-01-01 (the inverse of
/// [`days_from_civil`], same algorithm).
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The images served by a testbed whose registry is `registry`: `rhel-9` first, then `rhel-10`.
/// The rhel-9 image is a later z-stream build than the rhel-10 one (built 2026-11-20 against
/// 2026-11-15), as is common in the field: rpm-ostree's build-time check would refuse that
/// rebase unless the client allows a downgrade (or leaves the option out).
pub fn catalog(registry: &str) -> Vec<TestImage> {
    vec![
        TestImage::new(
            registry,
            "rhel-9",
            "9.6",
            "9.6.20261120-0",
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

/// The real-time variant images of the catalog's streams (`rhel-9-rt`, `rhel-10-rt`): the
/// same release with kernel-rt in place of the default kernel, so `ostree.linux` is the `+rt`
/// release, as ostree-ext copies it from the commit of a variant tree
/// (bootc-dev/bootc:crates/ostree-ext/src/container/encapsulate.rs `commit_meta_to_labels`).
pub fn variants(registry: &str) -> Vec<TestImage> {
    catalog(registry)
        .into_iter()
        .map(|img| {
            TestImage::with_variant(
                registry,
                &img.stream,
                &img.rhel_version,
                &img.version,
                &img.kernel,
                Kernel::Realtime,
            )
        })
        .collect()
}

/// A later build of the catalog's `rhel-10` (built 2026-11-25, a newer z-stream kernel): what
/// a refresh of the stream's image in the OSImageStream brings while a node still holds the
/// earlier one staged. Served as the tag `rhel-10-update`.
pub fn update(registry: &str) -> TestImage {
    TestImage::new(
        registry,
        "rhel-10",
        "10.1",
        "10.1.20261125-0",
        "6.12.0-124.13.1.el10_1.x86_64",
    )
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
        assert_eq!(a[0].created(), "2026-11-20T00:00:00Z");
        assert_eq!(a[1].created_unix(), 1_794_700_800);
        // Built before the booted rhel-9 image, like a field rhel-10 image often is.
        assert!(a[1].created_unix() < a[0].created_unix());
    }
}
