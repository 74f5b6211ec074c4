//! Image inspection over the registry, before anything is pulled by rpm-ostree.
//!
//! Reads the OS image's manifest (an index resolved to the host's platform) and config labels,
//! and the extensions image's RPMs. Every blob is digest-checked and read with a size limit,
//! every operation has a total deadline; errors are classified so the agent can tell a
//! rejected pull secret from a registry blip, and a registry's own text reaches them only
//! quoted, cut and stripped of control characters.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::image::pullsecret::PullSecret;
use crate::image::reference::ImageRef;
use crate::image::registries::PullSource;
use crate::image::rpm::RpmHeader;

mod auth;
mod blob;
pub mod components;
mod endpoint;
mod extract;
mod hosts;
mod http;
mod manifest;
mod trust;

pub use extract::{EXTRACT_LIMITS, ExtractBudget, ExtractLimits, LayerRpms, rpms_in_layer};
pub use hosts::{TRUSTED_HOSTS, forbidden};
pub use trust::{CERT_DIRS, TrustError};

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
    /// `baseOSContainerImage`: the base an on-cluster-layered image was built from
    /// ([`LAYERED_FROM`]); absent on a base stream image.
    pub layered_from: Option<String>,
    /// The base's package names, when the layers' annotations list them all
    /// ([`components::base_packages`]); `None` when they do not.
    pub base_packages: Option<BTreeSet<String>>,
}

/// The label the machine-config operator's on-cluster layering puts on every image it builds,
/// naming its base (openshift/machine-config-operator:
/// pkg/controller/build/buildrequest/assets/Containerfile.on-cluster-build-template).
pub const LAYERED_FROM: &str = "baseOSContainerImage";

/// What the registry says about the extensions image.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionsInfo {
    /// `io.openshift.os.extensions` is `true`.
    pub is_extensions: bool,
    /// `io.openshift.os.streamclass`, if present.
    pub stream_class: Option<String>,
    /// Whether its layers were read: only when a package was wanted from it. Without, only
    /// the labels (from the config blob) are known and `rpms` and `headers` are empty.
    pub listed: bool,
    /// RPMs it carries, as `name-version-release.arch`.
    pub rpms: Vec<String>,
    /// The headers of those RPMs that could be read (Requires/Provides for the dependency
    /// closure, src/image/rpm.rs). No default: an extraction record from before it existed
    /// is read again.
    pub headers: Vec<RpmHeader>,
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
    /// The registry sent streamd (a token realm, a redirect) to a host outside its own, or a
    /// host is a link-local or cloud-metadata address: refused before it was contacted.
    #[error("{registry}: refused to contact {host}: {why}")]
    Untrusted {
        /// The registry being read.
        registry: String,
        /// The host refused.
        host: String,
        /// Why.
        why: String,
    },
    /// The registry's certs.d directory holds a file that cannot be used.
    #[error("{registry}: {source}")]
    Trust {
        /// The registry (`host[:port]`).
        registry: String,
        /// The file and what is wrong with it.
        source: TrustError,
    },
}

impl InspectError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            InspectError::Unauthorized(_) => "registry-unauthorized",
            InspectError::Transient { .. } => "registry-unavailable",
            InspectError::Invalid(_) => "image-invalid",
            InspectError::Untrusted { .. } => "registry-untrusted-host",
            InspectError::Trust { source, .. } => source.label(),
        }
    }

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

/// Largest manifest or index read, as containers/image and distribution allow
/// (containers/image:internal/iolimits/iolimits.go `MaxManifestBodySize`).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// Largest image config read (containers/image `MaxConfigBodySize`); the descriptor's own size
/// is the tighter bound.
pub const MAX_CONFIG: u64 = 4 << 20;
/// Largest token answer read (containers/image `MaxAuthTokenBodySize`).
pub const MAX_TOKEN: u64 = 1 << 20;
/// Bytes of an error body read: only its start ever reaches a reason.
pub const MAX_ERROR_BODY: usize = 16 << 10;
/// Characters of a registry's error text that reach a reason (quoted, one line).
const ERROR_TEXT_CHARS: usize = 200;
/// Longest one request for metadata (manifest, config, token) may take, body included.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);
/// Longest a whole OS image inspection may take (every request, retries of auth included).
pub const OS_IMAGE_DEADLINE: Duration = Duration::from_secs(120);
/// Longest a whole extensions inspection may take: its layers are hundreds of MiB.
pub const EXTENSIONS_DEADLINE: Duration = Duration::from_secs(900);

/// What streamd's own configuration says about registries (docs/config.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// `insecure-registries`: `host:port`s spoken to over plain HTTP only.
    pub plain: Vec<String>,
    /// `registry-trusted-hosts`: hosts (`host` or `*.domain`) besides [`TRUSTED_HOSTS`] that any
    /// registry's token realm and redirects may lead to.
    pub trusted_hosts: Vec<String>,
}

/// Reads images from registries with the node's pull secret.
///
/// A small client of the distribution API of its own (GET manifests and blobs, the bearer
/// token flow), so that every answer is read with a size limit and every operation has a total
/// deadline, and a layer is fetched from the registry only: a descriptor's `urls` (any host,
/// plain HTTP) are never followed. TLS, token realms and redirects follow the registry trust
/// rules of docs/reliability.md ("Registry trust").
#[derive(Clone)]
pub struct Inspector {
    secret: PullSecret,
    /// `host:port`s spoken to over plain HTTP only (streamd's `insecure-registries`).
    plain: Vec<String>,
    /// registries.conf `insecure` endpoints: TLS without verification, then plain HTTP.
    insecure: Vec<String>,
    /// The endpoints (`host[:port]`) of the registries.conf entry being read.
    peers: Vec<String>,
    /// `registry-trusted-hosts` ([`Access::trusted_hosts`]).
    trusted: Vec<String>,
    /// The root below which certs.d is read (`None`: no per-host material).
    cert_root: Option<PathBuf>,
    /// Clients by registry and verification, with the fingerprint of their certs.d files.
    clients: Shared<(String, bool), (Vec<u8>, reqwest::Client)>,
    /// The scheme an insecure endpoint answered on.
    schemes: Shared<String, &'static str>,
    /// Bearer tokens by `registry/repository`.
    tokens: Shared<String, String>,
    os_deadline: Duration,
    extensions_deadline: Duration,
}

type Shared<K, V> = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<K, V>>>;

impl std::fmt::Debug for Inspector {
    // The pull secret stays out of every Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector").finish_non_exhaustive()
    }
}

impl Inspector {
    /// An inspector; `plain` lists `host:port`s spoken to over plain HTTP (test registries).
    /// Fails only when an HTTP client cannot be built (no TLS backend, unreadable system
    /// configuration), where reqwest's own default client would panic.
    pub fn new(secret: PullSecret, plain: &[String]) -> Result<Self, InspectError> {
        // reqwest is built without a default TLS provider; use the ring provider kube uses too.
        // Installing twice fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let i = Inspector {
            secret,
            plain: plain.to_vec(),
            insecure: Vec::new(),
            peers: Vec::new(),
            trusted: Vec::new(),
            cert_root: None,
            clients: Default::default(),
            schemes: Default::default(),
            tokens: Default::default(),
            os_deadline: OS_IMAGE_DEADLINE,
            extensions_deadline: EXTENSIONS_DEADLINE,
        };
        i.client("", true)?;
        Ok(i)
    }

    /// An inspector configured as streamd's configuration says ([`Access`]), reading certs.d
    /// below the host root `root`.
    pub fn configured(
        secret: PullSecret,
        access: &Access,
        root: &Path,
    ) -> Result<Self, InspectError> {
        let mut i = Self::new(secret, &access.plain)?.with_host_root(root);
        i.trusted = access.trusted_hosts.clone();
        Ok(i)
    }

    /// The same inspector reading per-registry CAs and client certificates from [`CERT_DIRS`]
    /// below `root` (the host root).
    pub fn with_host_root(mut self, root: &Path) -> Self {
        self.cert_root = Some(root.to_path_buf());
        self
    }

    /// The same inspector (connections, tokens) for one pull source of `sources` (the
    /// registries.conf entry's endpoints, [`crate::image::registries::RegistriesConf::pull_sources`]):
    /// its `insecure` flag applies, and token realms and redirects may go to the other
    /// endpoints too, each with its own credentials only.
    pub fn for_source(&self, source: &PullSource, sources: &[PullSource]) -> Inspector {
        let mut i = self.clone();
        let host = source.image.registry().to_string();
        if source.insecure && !i.insecure.contains(&host) {
            i.insecure.push(host);
        }
        i.peers = sources
            .iter()
            .map(|s| s.image.registry().to_ascii_lowercase())
            .collect();
        i
    }

    /// The same inspector with other total deadlines (tests).
    pub fn with_deadlines(mut self, os_image: Duration, extensions: Duration) -> Self {
        self.os_deadline = os_image;
        self.extensions_deadline = extensions;
        self
    }

    fn transient(image: &ImageRef, message: String) -> InspectError {
        InspectError::Transient {
            registry: image.registry().to_string(),
            message,
        }
    }

    fn request_error(image: &ImageRef, e: &reqwest::Error) -> InspectError {
        // reqwest's text names the URL (never credentials); the source says what failed.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            // A name that resolves only to forbidden addresses (hosts::GuardedResolver).
            if let Some(r) = s.downcast_ref::<hosts::Refused>() {
                return InspectError::Untrusted {
                    registry: image.registry().to_string(),
                    host: r.host.clone(),
                    why: r.why.clone(),
                };
            }
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        Self::transient(image, crate::text::one_line(&message, ERROR_TEXT_CHARS))
    }

    /// Runs `op` within `deadline`: a registry that stalls is a transient failure, not a hang.
    async fn within<T>(
        image: &ImageRef,
        deadline: Duration,
        op: impl std::future::Future<Output = Result<T, InspectError>>,
    ) -> Result<T, InspectError> {
        tokio::time::timeout(deadline, op)
            .await
            .unwrap_or_else(|_| {
                Err(Self::transient(
                    image,
                    format!("no complete answer within {} s", deadline.as_secs_f32()),
                ))
            })
    }

    /// GETs `path` below `image`'s repository within the OS image deadline (the sigstore
    /// attachments of [`crate::image::sigstore`]): at most `max` bytes, digest-checked when
    /// `digest` is given. A 404 is [`InspectError::Invalid`].
    pub async fn fetch(
        &self,
        image: &ImageRef,
        path: &str,
        accept: &[&str],
        max: u64,
        digest: Option<&str>,
    ) -> Result<Vec<u8>, InspectError> {
        Self::within(image, self.os_deadline, async {
            let resp = self.get(image, path, accept, REQUEST_DEADLINE).await?;
            let raw = http::read_limited(resp, max)
                .await
                .map_err(|e| self.body_error(image, path, max, e))?;
            if let Some(d) = digest {
                manifest::verify(&raw, d, &format!("{path} of {image}"))?;
            }
            Ok(raw)
        })
        .await
    }

    /// Inspects the OS image for `arch`.
    pub async fn os_image(
        &self,
        image: &ImageRef,
        arch: &str,
    ) -> Result<OsImageInfo, InspectError> {
        Self::within(image, self.os_deadline, async {
            let (m, manifest_digest) = self.manifest(image, arch).await?;
            let (labels, config_arch) = self.labels(image, &m).await?;
            let label = |k: &str| labels[k].as_str().map(String::from);
            // Sizes come from the registry: a negative one or a sum that would wrap is refused.
            let size = m
                .layers
                .iter()
                .try_fold(0u64, |sum, l| {
                    u64::try_from(l.size).ok().and_then(|s| sum.checked_add(s))
                })
                .ok_or_else(|| {
                    InspectError::Invalid(format!("{image}: the layer sizes do not add up"))
                })?;
            Ok(OsImageInfo {
                bootable: matches!(label("containers.bootc").as_deref(), Some("1" | "true")),
                stream_class: label("io.openshift.os.streamclass"),
                arch: kernel_arch(&config_arch).to_string(),
                kernel_release: label("ostree.linux"),
                version: label("version").or_else(|| label("org.opencontainers.image.version")),
                size,
                manifest_digest,
                layered_from: label(LAYERED_FROM),
                base_packages: components::base_packages(m.layers.iter().map(|l| l.components())),
            })
        })
        .await
    }

    /// Inspects the extensions image for `arch`, and extracts the RPMs whose file names start
    /// with one of `wanted` (package names) into `dest`, within [`EXTRACT_LIMITS`]. With
    /// nothing wanted no layer is read: the labels come from the config blob, and a layer is
    /// most of the image (UBI plus the whole RPM repository).
    ///
    /// Files are written into a temporary directory inside `dest` first and moved up when every
    /// layer has been read; on any error (a timeout included) it is removed, so a refused image
    /// leaves nothing in `/run`.
    pub async fn extensions(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        dest: &Path,
    ) -> Result<(ExtensionsInfo, Vec<PathBuf>), InspectError> {
        let io = |e: std::io::Error| {
            InspectError::Invalid(format!("writing into {}: {e}", dest.display()))
        };
        let partial = blob::Partial::new(dest.join(".partial"))
            .await
            .map_err(io)?;
        let (info, files) = self
            .read_extensions(image, arch, wanted, Some(&partial))
            .await?;
        let mut moved = Vec::with_capacity(files.len());
        for f in files {
            let Some(name) = f.file_name() else { continue };
            let to = dest.join(name);
            std::fs::rename(&f, &to).map_err(io)?;
            moved.push(to);
        }
        drop(partial);
        Ok((info, moved))
    }

    /// What [`Self::extensions`] reads, with nothing written anywhere: the headers of the
    /// `wanted` RPMs are read from the stream like every other one. For readiness, which
    /// answers whether the packages are there and close, and stages nothing.
    pub async fn extension_headers(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
    ) -> Result<ExtensionsInfo, InspectError> {
        Ok(self.read_extensions(image, arch, wanted, None).await?.0)
    }

    /// The labels, and with something `wanted` every layer's RPM list and headers, the wanted
    /// RPMs written into `dest` when there is one.
    async fn read_extensions(
        &self,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        dest: Option<&blob::Partial>,
    ) -> Result<(ExtensionsInfo, Vec<PathBuf>), InspectError> {
        Self::within(image, self.extensions_deadline, async {
            let (m, _) = self.manifest(image, arch).await?;
            let (labels, _) = self.labels(image, &m).await?;
            let mut rpms = Vec::new();
            let mut extracted = Vec::new();
            let mut headers = Vec::new();
            let mut budget = ExtractBudget::new(EXTRACT_LIMITS);
            let layers = if wanted.is_empty() {
                &[][..]
            } else {
                &m.layers[..]
            };
            for layer in layers {
                let ((names, files, read), left) =
                    self.layer_rpms(image, layer, wanted, dest, budget).await?;
                budget = left;
                rpms.extend(names);
                extracted.extend(files);
                headers.extend(read);
            }
            rpms.sort();
            rpms.dedup();
            Ok((
                ExtensionsInfo {
                    is_extensions: labels["io.openshift.os.extensions"].as_str() == Some("true"),
                    listed: !wanted.is_empty(),
                    stream_class: labels["io.openshift.os.streamclass"]
                        .as_str()
                        .map(String::from),
                    rpms,
                    headers,
                },
                extracted,
            ))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_map_both_ways() {
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(kernel_arch("arm64"), "aarch64");
    }
}
