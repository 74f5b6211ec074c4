//! Image inspection over the registry, before anything is pulled by rpm-ostree.
//!
//! An edge over `oci-client`: reads the OS image's manifest (an index resolved to the host's
//! platform) and config labels, and the extensions image's RPMs. Every blob is digest-checked;
//! errors are classified so the agent can tell a rejected pull secret from a registry blip.

use std::io::{BufRead as _, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::errors::DigestError;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::image::pullsecret::{Credentials, PullSecret};
use crate::image::reference::ImageRef;

/// What the registry says about the OS image (from its manifest and config).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OsImageInfo {
    /// `containers.bootc` is `1` or `true`.
    pub bootable: bool,
    /// `io.openshift.os.streamclass`, if present.
    pub stream_class: Option<String>,
    /// Config architecture in kernel terms (`x86_64`, `aarch64`).
    pub arch: String,
    /// `ostree.linux`: the target's default kernel release.
    pub kernel_release: Option<String>,
    /// Version label.
    pub version: Option<String>,
    /// Sum of the layer sizes, bytes.
    pub size: u64,
    /// Digest of the platform manifest (differs from the pullspec's when that names an index).
    pub manifest_digest: String,
}

/// What the registry says about the extensions image.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionsInfo {
    /// `io.openshift.os.extensions` is `true`.
    pub is_extensions: bool,
    /// `io.openshift.os.streamclass`, if present.
    pub stream_class: Option<String>,
    /// RPMs it carries, as `name-version-release.arch`.
    pub rpms: Vec<String>,
    /// The headers of those RPMs that could be read (Requires/Provides for the dependency
    /// closure, src/image/rpm.rs). No default: an extraction record from before it existed
    /// is read again.
    pub headers: Vec<crate::image::rpm::RpmHeader>,
}

/// Where real extensions images keep their RPM repository.
pub const EXTENSIONS_DIR: &str = "usr/share/rpm-ostree/extensions/";

/// Why an inspection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    /// The registry rejected the credentials (or there are none for it).
    #[error("pull secret rejected by {0}")]
    Unauthorized(String),
    /// A network, DNS or 5xx failure: retried with backoff.
    #[error("registry {registry} unavailable: {message}")]
    Transient {
        /// The registry.
        registry: String,
        /// What happened.
        message: String,
    },
    /// The image is not what it must be (missing manifest, bad digest, wrong shape).
    #[error("{0}")]
    Invalid(String),
}

impl InspectError {
    /// Whether a retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, InspectError::Transient { .. })
    }
}

/// The Go architecture name registries use for a kernel architecture.
pub fn goarch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "ppc64le" => "ppc64le",
        "s390x" => "s390x",
        other => other,
    }
}

fn kernel_arch(goarch: &str) -> &str {
    match goarch {
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        other => other,
    }
}

/// Reads images from registries with the node's pull secret.
#[derive(Clone)]
pub struct Inspector {
    client: Client,
    secret: PullSecret,
}

impl std::fmt::Debug for Inspector {
    // The pull secret stays out of every Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector").finish_non_exhaustive()
    }
}

impl Inspector {
    /// An inspector; `insecure` lists `host:port`s spoken to over plain HTTP (test registries).
    pub fn new(secret: PullSecret, insecure: &[String]) -> Self {
        // reqwest is built without a default TLS provider; use the ring provider kube uses too.
        // Installing twice fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::HttpsExcept(insecure.to_vec()),
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: concat!("streamd/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        };
        Inspector {
            client: Client::new(config),
            secret,
        }
    }

    fn auth(&self, registry: &str) -> RegistryAuth {
        match self.secret.for_registry(registry) {
            Some(Credentials::Basic { username, password }) => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Some(Credentials::Bearer(t)) => RegistryAuth::Bearer(t.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    fn classify(
        &self,
        image: &ImageRef,
        e: oci_client::errors::OciDistributionError,
    ) -> InspectError {
        use oci_client::errors::OciDistributionError as E;
        let registry = image.registry().to_string();
        match e {
            E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => {
                InspectError::Unauthorized(registry)
            }
            E::ServerError { code, .. } if code == 401 || code == 403 => {
                InspectError::Unauthorized(registry)
            }
            E::ServerError { code, message, .. } if code >= 500 || code == 429 => {
                InspectError::Transient {
                    registry,
                    message: format!("HTTP {code}: {message}"),
                }
            }
            E::RequestError(r) => InspectError::Transient {
                registry,
                // reqwest's text can carry the URL but never credentials.
                message: r.to_string(),
            },
            E::IoError(io) => InspectError::Transient {
                registry,
                message: io.to_string(),
            },
            E::ImageManifestNotFoundError(_) => {
                InspectError::Invalid(format!("{image}: manifest unknown to {registry}"))
            }
            other => InspectError::Invalid(format!("{image}: {other}")),
        }
    }

    /// The platform manifest of `image` for `arch`, with its digest verified.
    async fn manifest(
        &self,
        image: &ImageRef,
        arch: &str,
    ) -> Result<(Reference, OciImageManifest, String), InspectError> {
        let reference = reference(image)?;
        let auth = self.auth(image.registry());
        let (raw, _) = self
            .client
            .pull_manifest_raw(&reference, &auth, MEDIA_TYPES)
            .await
            .map_err(|e| self.classify(image, e))?;
        verify(&raw, image.digest(), &format!("manifest of {image}"))?;
        let manifest: OciManifest = serde_json::from_slice(&raw)
            .map_err(|e| InspectError::Invalid(format!("{image}: manifest is not valid: {e}")))?;
        match manifest {
            OciManifest::Image(m) => Ok((reference, m, image.digest().to_string())),
            OciManifest::ImageIndex(index) => {
                let want = goarch(arch);
                let entry = index
                    .manifests
                    .iter()
                    .find(|m| {
                        m.platform.as_ref().is_some_and(|p| {
                            p.architecture.to_string() == want && p.os.to_string() == "linux"
                        })
                    })
                    .ok_or_else(|| {
                        InspectError::Invalid(format!("{image} has no manifest for linux/{want}"))
                    })?;
                let platform = Reference::with_digest(
                    reference.registry().to_string(),
                    reference.repository().to_string(),
                    entry.digest.clone(),
                );
                let (raw, _) = self
                    .client
                    .pull_manifest_raw(&platform, &auth, MEDIA_TYPES)
                    .await
                    .map_err(|e| self.classify(image, e))?;
                verify(
                    &raw,
                    &entry.digest,
                    &format!("linux/{want} manifest of {image}"),
                )?;
                let m: OciImageManifest = serde_json::from_slice(&raw).map_err(|e| {
                    InspectError::Invalid(format!("{image}: platform manifest is not valid: {e}"))
                })?;
                Ok((platform, m, entry.digest.clone()))
            }
        }
    }

    async fn blob(
        &self,
        image: &ImageRef,
        reference: &Reference,
        digest: &str,
    ) -> Result<Vec<u8>, InspectError> {
        let mut out = Vec::new();
        self.client
            .pull_blob(reference, digest, &mut out)
            .await
            .map_err(|e| self.classify(image, e))?;
        // oci-client checks the digest too; checking here keeps the guarantee local.
        verify(&out, digest, &format!("blob {digest} of {image}"))?;
        Ok(out)
    }

    async fn labels(
        &self,
        image: &ImageRef,
        reference: &Reference,
        m: &OciImageManifest,
    ) -> Result<(serde_json::Value, String), InspectError> {
        let config = self.blob(image, reference, &m.config.digest).await?;
        let json: serde_json::Value = serde_json::from_slice(&config)
            .map_err(|e| InspectError::Invalid(format!("{image}: config is not JSON: {e}")))?;
        let arch = json["architecture"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok((json["config"]["Labels"].clone(), arch))
    }

    /// Inspects the OS image for `arch`.
    pub async fn os_image(
        &self,
        image: &ImageRef,
        arch: &str,
    ) -> Result<OsImageInfo, InspectError> {
        let (reference, m, manifest_digest) = self.manifest(image, arch).await?;
        let (labels, config_arch) = self.labels(image, &reference, &m).await?;
        let label = |k: &str| labels[k].as_str().map(String::from);
        Ok(OsImageInfo {
            bootable: matches!(label("containers.bootc").as_deref(), Some("1" | "true")),
            stream_class: label("io.openshift.os.streamclass"),
            arch: kernel_arch(&config_arch).to_string(),
            kernel_release: label("ostree.linux"),
            version: label("version").or_else(|| label("org.opencontainers.image.version")),
            size: m
                .layers
                .iter()
                .map(|l| u64::try_from(l.size).unwrap_or(0))
                .sum(),
            manifest_digest,
        })
    }

    /// Inspects the extensions image for `arch`, and extracts the RPMs whose file names start
    /// with one of `wanted` (package names) into `dest`.
    pub async fn extensions(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        dest: &Path,
    ) -> Result<(ExtensionsInfo, Vec<PathBuf>), InspectError> {
        let (reference, m, _) = self.manifest(image, arch).await?;
        let (labels, _) = self.labels(image, &reference, &m).await?;
        let mut rpms = Vec::new();
        let mut extracted = Vec::new();
        let mut headers = Vec::new();
        std::fs::create_dir_all(dest)
            .map_err(|e| InspectError::Invalid(format!("creating {}: {e}", dest.display())))?;
        for layer in &m.layers {
            let (names, files, read) = self
                .layer_rpms(image, &reference, layer, wanted, dest)
                .await?;
            rpms.extend(names);
            extracted.extend(files);
            headers.extend(read);
        }
        rpms.sort();
        rpms.dedup();
        Ok((
            ExtensionsInfo {
                is_extensions: labels["io.openshift.os.extensions"].as_str() == Some("true"),
                stream_class: labels["io.openshift.os.streamclass"]
                    .as_str()
                    .map(String::from),
                rpms,
                headers,
            },
            extracted,
        ))
    }

    /// Streams one layer through [`rpms_in_layer`] on a blocking thread.
    ///
    /// An extensions layer is hundreds of MiB: it is never held in memory or written out whole,
    /// and the async loop keeps serving the node watch and D-Bus while it is read. The digest
    /// covers every byte, including what follows the tar end marker.
    async fn layer_rpms(
        &self,
        image: &ImageRef,
        reference: &Reference,
        layer: &OciDescriptor,
        wanted: &[String],
        dest: &Path,
    ) -> Result<LayerRpms, InspectError> {
        let sized = self
            .client
            .pull_blob_stream(reference, layer)
            .await
            .map_err(|e| self.classify(image, e))?;
        // The bridge must be made on the runtime; it blocks only the thread that reads it.
        let bridge = SyncIoBridge::new(StreamReader::new(sized));
        let (media_type, digest) = (layer.media_type.clone(), layer.digest.clone());
        let (wanted, dest) = (wanted.to_vec(), dest.to_path_buf());
        let what = format!("{image}: layer {digest}");
        let registry = image.registry().to_string();
        let read = tokio::task::spawn_blocking(move || {
            let mut hashed = Hashing::new(bridge);
            let found = rpms_in_layer(&mut hashed, &media_type, &wanted, &dest)
                .and_then(|found| std::io::copy(&mut hashed, &mut std::io::sink()).map(|_| found));
            (found, hashed.failure(), hashed.digest())
        })
        .await;
        let (found, network, got) =
            read.map_err(|e| InspectError::Invalid(format!("{what}: reader task failed: {e}")))?;
        // A failing download is retried; a layer that downloads but does not read is refused.
        if let Some(message) = network {
            return Err(InspectError::Transient { registry, message });
        }
        let found = found.map_err(|e| InspectError::Invalid(format!("{what}: {e}")))?;
        if got != digest {
            return Err(InspectError::Invalid(format!(
                "{what}: digest mismatch (got {got})"
            )));
        }
        Ok(found)
    }
}

/// A reader that hashes what passes through it and remembers whether its source failed, so a
/// network error is not mistaken for a malformed archive.
struct Hashing<R> {
    inner: R,
    sha: Sha256,
    failure: Option<String>,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            sha: Sha256::new(),
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
                Ok(n)
            }
            Err(e) => {
                // oci-client reports a digest mismatch through the same channel: that is a bad
                // image, refused like any other, not a download to retry.
                let mismatch = e.get_ref().is_some_and(|inner| inner.is::<DigestError>());
                if e.kind() != std::io::ErrorKind::Interrupted && !mismatch {
                    self.failure = Some(e.to_string());
                }
                Err(e)
            }
        }
    }
}

const MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

fn reference(image: &ImageRef) -> Result<Reference, InspectError> {
    Ok(Reference::with_digest(
        image.registry().to_string(),
        image.repository().to_string(),
        image.digest().to_string(),
    ))
}

fn verify(bytes: &[u8], digest: &str, what: &str) -> Result<(), InspectError> {
    let got = format!("sha256:{:x}", Sha256::digest(bytes));
    if got == digest {
        Ok(())
    } else {
        Err(InspectError::Invalid(format!(
            "{what}: digest mismatch (expected {digest}, got {got})"
        )))
    }
}

/// What one layer holds under [`EXTENSIONS_DIR`]: the RPM names, the extracted files and the
/// headers that could be read.
pub type LayerRpms = (Vec<String>, Vec<PathBuf>, Vec<crate::image::rpm::RpmHeader>);

/// Lists the RPMs under [`EXTENSIONS_DIR`] in a (gzip'd or plain) tar layer, reads every RPM's
/// header and writes the wanted ones into `dest`. Names are `name-version-release.arch` (the
/// file name without `.rpm`).
pub fn rpms_in_layer<R: Read>(
    layer: R,
    media_type: &str,
    wanted: &[String],
    dest: &Path,
) -> std::io::Result<LayerRpms> {
    let mut layer = std::io::BufReader::new(layer);
    let gzip = media_type.contains("gzip") || layer.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(layer))
    } else {
        Box::new(layer)
    };
    let mut archive = tar::Archive::new(reader);
    let mut names = Vec::new();
    let mut files = Vec::new();
    let mut headers = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let Some(rest) = path.strip_prefix(EXTENSIONS_DIR) else {
            continue;
        };
        let Some(file) = rest.rsplit('/').next().filter(|f| f.ends_with(".rpm")) else {
            continue;
        };
        let nevra = file.trim_end_matches(".rpm").to_string();
        let want = wanted
            .iter()
            .any(|w| crate::image::rpm::names_package(&nevra, w));
        // The header is the first few KiB of the file: read from the stream for every RPM
        // (the dependency closure needs all of them), from the written file for wanted ones.
        let header = if want {
            // Only the file name is used: a path in the archive can never escape `dest`.
            let out = dest.join(file);
            std::io::copy(&mut entry, &mut std::fs::File::create(&out)?)?;
            let header = crate::image::rpm::RpmHeader::read_file(&out);
            files.push(out);
            header
        } else {
            crate::image::rpm::RpmHeader::read(&mut entry, file)
        };
        match header {
            Ok(h) => headers.push(h),
            // Not a candidate for the closure; a wanted one missing from it is refused there.
            Err(e) => tracing::debug!(file, error = %e, "unreadable rpm header"),
        }
        names.push(nevra);
    }
    Ok((names, files, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, *data).expect("append");
        }
        b.into_inner().expect("tar")
    }

    #[test]
    fn finds_and_extracts_rpms() {
        let layer = tar_with(&[
            (
                "usr/share/rpm-ostree/extensions/kernel-rt-core-6.12.0-1.el10.x86_64.rpm",
                b"rt",
            ),
            (
                "usr/share/rpm-ostree/extensions/usbguard-1.1.3-3.el10.x86_64.rpm",
                b"ug",
            ),
            ("usr/share/rpm-ostree/extensions/repodata/repomd.xml", b"x"),
            ("usr/bin/true", b"t"),
        ]);
        let dest = std::env::temp_dir().join(format!("streamd-rpms-{}", std::process::id()));
        std::fs::create_dir_all(&dest).expect("mkdir");
        let (names, files, _) = rpms_in_layer(
            &layer[..],
            "application/vnd.oci.image.layer.v1.tar",
            &["kernel-rt-core".to_string()],
            &dest,
        )
        .expect("read");
        assert_eq!(
            names,
            vec![
                "kernel-rt-core-6.12.0-1.el10.x86_64".to_string(),
                "usbguard-1.1.3-3.el10.x86_64".to_string()
            ]
        );
        assert_eq!(files.len(), 1);
        assert_eq!(std::fs::read(&files[0]).expect("read"), b"rt");
        std::fs::remove_dir_all(&dest).ok();
    }

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
    fn a_failing_download_is_told_from_a_digest_mismatch() {
        let mut net = Hashing::new(Failing(
            b"abc".to_vec(),
            Some(std::io::Error::other("reset")),
        ));
        let mut sink = Vec::new();
        assert!(net.read_to_end(&mut sink).is_err());
        assert_eq!(sink, b"abc");
        assert_eq!(net.failure().as_deref(), Some("reset"));
        assert_eq!(
            net.digest(),
            format!("sha256:{:x}", Sha256::digest(b"abc")),
            "the digest covers what was read"
        );
        let mismatch = DigestError::VerificationError {
            expected: "sha256:00".into(),
            actual: "sha256:11".into(),
        };
        let mut bad = Hashing::new(Failing(Vec::new(), Some(std::io::Error::other(mismatch))));
        assert!(bad.read_to_end(&mut sink).is_err());
        assert_eq!(
            bad.failure(),
            None,
            "a mismatch is not retried as a network failure"
        );
    }

    #[test]
    fn bad_layers_are_errors_not_panics() {
        let dest = std::env::temp_dir();
        for blob in [&b"\x1f\x8bnot gzip"[..], &[0u8; 10][..], &b"garbage"[..]] {
            let _ = rpms_in_layer(
                blob,
                "application/vnd.oci.image.layer.v1.tar+gzip",
                &[],
                &dest,
            );
        }
        assert!(verify(b"x", "sha256:00", "t").is_err());
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(kernel_arch("arm64"), "aarch64");
    }
}
