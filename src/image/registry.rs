//! Image inspection over the registry, before anything is pulled by rpm-ostree.
//!
//! Reads the OS image's manifest (an index resolved to the host's platform) and config labels,
//! and the extensions image's RPMs. Every blob is digest-checked and read with a size limit,
//! every operation has a total deadline; errors are classified so the agent can tell a
//! rejected pull secret from a registry blip, and a registry's own text reaches them only
//! quoted, cut and stripped of control characters.

use std::io::{BufRead as _, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::image::pullsecret::{Credentials, PullSecret};
use crate::image::reference::ImageRef;
use crate::image::rpm::{HEADER_LIMITS, HeaderBudget, HeaderError, HeaderLimits, RpmHeader};

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

/// An OCI/Docker descriptor, as far as streamd reads one: digest, size and media type. Its
/// `urls` are not even parsed: a layer comes from the registry or not at all.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    platform: Option<Platform>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// An image manifest or an index (`manifests` present).
#[derive(Debug, serde::Deserialize)]
struct Manifest {
    manifests: Option<Vec<Descriptor>>,
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// A platform's image manifest.
#[derive(Debug)]
struct ImageManifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

impl ImageManifest {
    fn parse(image: &ImageRef, raw: &[u8], what: &str) -> Result<Manifest, InspectError> {
        serde_json::from_slice(raw)
            .map_err(|e| InspectError::Invalid(format!("{image}: {what} is not valid: {e}")))
    }

    fn from(image: &ImageRef, m: Manifest) -> Result<Self, InspectError> {
        let config = m.config.ok_or_else(|| {
            InspectError::Invalid(format!("{image}: the image manifest has no config"))
        })?;
        Ok(ImageManifest {
            config,
            layers: m.layers,
        })
    }
}

/// Reads images from registries with the node's pull secret.
///
/// A small client of the distribution API of its own (GET manifests and blobs, the bearer
/// token flow), so that every answer is read with a size limit and every operation has a total
/// deadline, and a layer is fetched from the registry only: a descriptor's `urls` (any host,
/// plain HTTP) are never followed.
#[derive(Clone)]
pub struct Inspector {
    http: reqwest::Client,
    secret: PullSecret,
    insecure: Vec<String>,
    /// Bearer tokens by `registry/repository`.
    tokens: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
    os_deadline: Duration,
    extensions_deadline: Duration,
}

impl std::fmt::Debug for Inspector {
    // The pull secret stays out of every Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector").finish_non_exhaustive()
    }
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// Parses `Bearer realm="…",service="…",scope="…"` or `Basic realm="…"`.
fn challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut rest = params;
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        match key {
            "realm" => realm = Some(value.to_string()),
            "service" => service = Some(value.to_string()),
            _ => {}
        }
        rest = next;
    }
    Some(Challenge::Bearer {
        realm: realm?,
        service,
    })
}

/// Reads at most `max` bytes of a body; more (or a `Content-Length` saying so) is an error.
async fn read_limited(
    mut resp: reqwest::Response,
    max: u64,
) -> Result<Vec<u8>, Result<u64, reqwest::Error>> {
    if let Some(len) = resp.content_length().filter(|l| *l > max) {
        return Err(Ok(len));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Err)? {
        if (out.len() + chunk.len()) as u64 > max {
            return Err(Ok((out.len() + chunk.len()) as u64));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The first `max` bytes of a body (an error's: the rest is not read).
async fn read_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(max);
    out
}

/// A registry's error text, fit for a reason: the OCI error envelope's codes and messages (or
/// the start of the body), one line, quoted and cut.
fn error_text(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let text = match serde_json::from_slice::<Envelope>(body) {
        Ok(e) if !e.errors.is_empty() => e
            .errors
            .iter()
            .map(|x| format!("{} {}", x.code, x.message))
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::from_utf8_lossy(body).into_owned(),
    };
    crate::text::quote(&crate::text::one_line(&text, ERROR_TEXT_CHARS))
}

impl Inspector {
    /// An inspector; `insecure` lists `host:port`s spoken to over plain HTTP (test registries).
    /// Fails only when the HTTP client cannot be built (no TLS backend, unreadable system
    /// configuration), where reqwest's own default client would panic.
    pub fn new(secret: PullSecret, insecure: &[String]) -> Result<Self, InspectError> {
        // reqwest is built without a default TLS provider; use the ring provider kube uses too.
        // Installing twice fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("streamd/", env!("CARGO_PKG_VERSION")))
            // Blob storage redirects (S3, a CDN); reqwest drops credentials on a cross-host
            // redirect.
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(|e| {
                InspectError::Invalid(format!(
                    "the HTTP client cannot be built: {}",
                    crate::text::one_line_reason(&e.to_string())
                ))
            })?;
        Ok(Inspector {
            http,
            secret,
            insecure: insecure.to_vec(),
            tokens: Default::default(),
            os_deadline: OS_IMAGE_DEADLINE,
            extensions_deadline: EXTENSIONS_DEADLINE,
        })
    }

    /// The same inspector (connections, tokens), also speaking plain HTTP to `host` (a mirror
    /// registries.conf marks `insecure`).
    pub fn with_plain_http(&self, host: &str) -> Inspector {
        let mut i = self.clone();
        if !i.insecure.iter().any(|h| h == host) {
            i.insecure.push(host.to_string());
        }
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
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        Self::transient(image, crate::text::one_line(&message, ERROR_TEXT_CHARS))
    }

    fn url(&self, image: &ImageRef, path: &str) -> String {
        let host = match image.registry() {
            // Docker Hub's API lives on another host than its name.
            "docker.io" => "registry-1.docker.io",
            h => h,
        };
        let scheme = if self.insecure.iter().any(|i| i == image.registry()) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{host}/v2/{}/{path}", image.repository())
    }

    /// Gets a bearer token for `image`'s repository from `realm`.
    async fn token(
        &self,
        image: &ImageRef,
        realm: &str,
        service: Option<&str>,
    ) -> Result<String, InspectError> {
        let mut url = reqwest::Url::parse(realm).map_err(|_| {
            InspectError::Invalid(format!(
                "{}: the token realm {} is not a URL",
                image.registry(),
                crate::text::quote(realm)
            ))
        })?;
        url.query_pairs_mut()
            .append_pair("scope", &format!("repository:{}:pull", image.repository()));
        if let Some(s) = service {
            url.query_pairs_mut().append_pair("service", s);
        }
        let mut req = self.http.get(url).timeout(REQUEST_DEADLINE);
        if let Some(Credentials::Basic { username, password }) = self.credentials(image) {
            req = req.basic_auth(username, Some(password));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Self::request_error(image, &e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(InspectError::Unauthorized(image.registry().to_string()));
        }
        if !status.is_success() {
            return Err(self.status_error(image, "token", resp).await);
        }
        let body = read_limited(resp, MAX_TOKEN)
            .await
            .map_err(|e| self.body_error(image, "token answer", MAX_TOKEN, e))?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|_| {
            InspectError::Invalid(format!(
                "{}: the token answer is not JSON",
                image.registry()
            ))
        })?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| InspectError::Unauthorized(image.registry().to_string()))
    }

    fn credentials(&self, image: &ImageRef) -> Option<&Credentials> {
        self.secret
            .for_repository(image.registry(), image.repository())
    }

    fn token_key(image: &ImageRef) -> String {
        format!("{}/{}", image.registry(), image.repository())
    }

    /// GETs `path` under the image's repository, following the registry's auth challenge once.
    /// A non-2xx answer becomes a classified error.
    async fn get(
        &self,
        image: &ImageRef,
        path: &str,
        accept: &[&str],
        timeout: Duration,
    ) -> Result<reqwest::Response, InspectError> {
        let url = self.url(image, path);
        let send = |auth: Option<String>| {
            let mut req = self.http.get(&url).timeout(timeout);
            if !accept.is_empty() {
                req = req.header(reqwest::header::ACCEPT, accept.join(", "));
            }
            if let Some(a) = auth {
                req = req.header(reqwest::header::AUTHORIZATION, a);
            }
            req.send()
        };
        let cached = self
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(&Self::token_key(image)).cloned());
        let first = match (cached, self.credentials(image)) {
            (Some(token), _) => Some(format!("Bearer {token}")),
            (None, Some(Credentials::Bearer(token))) => Some(format!("Bearer {token}")),
            _ => None,
        };
        let mut resp = send(first.clone())
            .await
            .map_err(|e| Self::request_error(image, &e))?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            let header = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .and_then(challenge);
            let auth = match (header, self.credentials(image)) {
                (Some(Challenge::Bearer { realm, service }), _) => {
                    let token = self.token(image, &realm, service.as_deref()).await?;
                    if let Ok(mut t) = self.tokens.lock() {
                        t.insert(Self::token_key(image), token.clone());
                    }
                    format!("Bearer {token}")
                }
                (Some(Challenge::Basic), Some(Credentials::Basic { username, password })) => {
                    use base64::Engine as _;
                    let pair = base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{password}"));
                    format!("Basic {pair}")
                }
                _ => return Err(InspectError::Unauthorized(image.registry().to_string())),
            };
            if Some(&auth) != first.as_ref() {
                resp = send(Some(auth))
                    .await
                    .map_err(|e| Self::request_error(image, &e))?;
            }
        }
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.status_error(image, path, resp).await)
        }
    }

    /// The error for a non-2xx answer; only the first [`MAX_ERROR_BODY`] bytes of its body are
    /// read and only its quoted, cut start reaches the message.
    async fn status_error(
        &self,
        image: &ImageRef,
        what: &str,
        resp: reqwest::Response,
    ) -> InspectError {
        let code = resp.status().as_u16();
        let registry = image.registry().to_string();
        if code == 401 || code == 403 {
            return InspectError::Unauthorized(registry);
        }
        let text = error_text(&read_prefix(resp, MAX_ERROR_BODY).await);
        if code >= 500 || code == 429 {
            InspectError::Transient {
                registry,
                message: format!("HTTP {code} for {what}: {text}"),
            }
        } else if code == 404 {
            InspectError::Invalid(format!("{image}: {what} unknown to {registry} ({text})"))
        } else {
            InspectError::Invalid(format!("{image}: HTTP {code} for {what}: {text}"))
        }
    }

    fn body_error(
        &self,
        image: &ImageRef,
        what: &str,
        max: u64,
        e: Result<u64, reqwest::Error>,
    ) -> InspectError {
        match e {
            Ok(size) => InspectError::Invalid(format!(
                "{image}: the {what} is larger than {max} bytes ({size} or more)"
            )),
            Err(e) => Self::request_error(image, &e),
        }
    }

    /// Reads a manifest by digest, at most `max` bytes, digest-checked.
    async fn manifest_bytes(
        &self,
        image: &ImageRef,
        digest: &str,
        max: u64,
        what: &str,
    ) -> Result<Vec<u8>, InspectError> {
        let resp = self
            .get(
                image,
                &format!("manifests/{digest}"),
                MEDIA_TYPES,
                REQUEST_DEADLINE,
            )
            .await?;
        let raw = read_limited(resp, max)
            .await
            .map_err(|e| self.body_error(image, what, max, e))?;
        verify(&raw, digest, &format!("{what} of {image}"))?;
        Ok(raw)
    }

    /// The platform manifest of `image` for `arch` and its digest.
    async fn manifest(
        &self,
        image: &ImageRef,
        arch: &str,
    ) -> Result<(ImageManifest, String), InspectError> {
        let raw = self
            .manifest_bytes(image, image.digest(), MAX_MANIFEST, "manifest")
            .await?;
        let manifest = ImageManifest::parse(image, &raw, "manifest")?;
        let Some(index) = manifest.manifests else {
            return Ok((
                ImageManifest::from(image, manifest)?,
                image.digest().to_string(),
            ));
        };
        let want = goarch(arch);
        let entry = index
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.architecture == want && p.os == "linux")
            })
            .ok_or_else(|| {
                InspectError::Invalid(format!("{image} has no manifest for linux/{want}"))
            })?;
        // The index says how large the platform manifest is: no more is read.
        let max = Self::descriptor_size(image, entry, MAX_MANIFEST)?;
        let raw = self
            .manifest_bytes(image, &entry.digest, max, &format!("linux/{want} manifest"))
            .await?;
        let m = ImageManifest::parse(image, &raw, "platform manifest")?;
        Ok((ImageManifest::from(image, m)?, entry.digest.clone()))
    }

    /// The size a descriptor declares, refused when negative or over `max`.
    fn descriptor_size(image: &ImageRef, d: &Descriptor, max: u64) -> Result<u64, InspectError> {
        u64::try_from(d.size)
            .ok()
            .filter(|s| *s <= max)
            .ok_or_else(|| {
                InspectError::Invalid(format!(
                    "{image}: blob {} declares size {} (allowed: 0..={max})",
                    d.digest, d.size
                ))
            })
    }

    /// GETs a blob and checks a `Content-Length` against the descriptor's size.
    async fn blob_response(
        &self,
        image: &ImageRef,
        d: &Descriptor,
        size: u64,
        timeout: Duration,
    ) -> Result<reqwest::Response, InspectError> {
        let resp = self
            .get(image, &format!("blobs/{}", d.digest), &[], timeout)
            .await?;
        match resp.content_length() {
            Some(len) if len != size => Err(InspectError::Invalid(format!(
                "{image}: blob {} is {len} bytes, its descriptor says {size}",
                d.digest
            ))),
            _ => Ok(resp),
        }
    }

    async fn labels(
        &self,
        image: &ImageRef,
        m: &ImageManifest,
    ) -> Result<(serde_json::Value, String), InspectError> {
        let size = Self::descriptor_size(image, &m.config, MAX_CONFIG)?;
        let resp = self
            .blob_response(image, &m.config, size, REQUEST_DEADLINE)
            .await?;
        let config = read_limited(resp, size)
            .await
            .map_err(|e| self.body_error(image, "config", size, e))?;
        verify(
            &config,
            &m.config.digest,
            &format!("config {} of {image}", m.config.digest),
        )?;
        let json: serde_json::Value = serde_json::from_slice(&config)
            .map_err(|e| InspectError::Invalid(format!("{image}: config is not JSON: {e}")))?;
        let arch = json["architecture"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok((json["config"]["Labels"].clone(), arch))
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
            })
        })
        .await
    }

    /// Inspects the extensions image for `arch`, and extracts the RPMs whose file names start
    /// with one of `wanted` (package names) into `dest`, within [`EXTRACT_LIMITS`].
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
        let partial = Partial::new(dest.join(".partial")).map_err(io)?;
        let (info, files) = Self::within(image, self.extensions_deadline, async {
            let (m, _) = self.manifest(image, arch).await?;
            let (labels, _) = self.labels(image, &m).await?;
            let mut rpms = Vec::new();
            let mut extracted = Vec::new();
            let mut headers = Vec::new();
            let mut budget = ExtractBudget::new(EXTRACT_LIMITS);
            for layer in &m.layers {
                let ((names, files, read), left) = self
                    .layer_rpms(image, layer, wanted, partial.path(), budget)
                    .await?;
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
                    stream_class: labels["io.openshift.os.streamclass"]
                        .as_str()
                        .map(String::from),
                    rpms,
                    headers,
                },
                extracted,
            ))
        })
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

    /// Streams one layer through [`rpms_in_layer`] on a blocking thread.
    ///
    /// An extensions layer is hundreds of MiB: it is never held in memory or written out whole,
    /// and the async loop keeps serving the node watch and D-Bus while it is read. The digest
    /// covers every byte, including what follows the tar end marker, and no more bytes than the
    /// descriptor's size are read.
    async fn layer_rpms(
        &self,
        image: &ImageRef,
        layer: &Descriptor,
        wanted: &[String],
        dest: &Path,
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
        let (wanted, dest) = (wanted.to_vec(), dest.to_path_buf());
        let what = format!("{image}: layer {digest}");
        let registry = image.registry().to_string();
        let read = tokio::task::spawn_blocking(move || {
            // One byte past the declared size tells a longer blob without reading all of it.
            let mut hashed = Hashing::new(bridge.take(size.saturating_add(1)));
            let found = rpms_in_layer(&mut hashed, &media_type, &wanted, &dest, &mut budget)
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

    // --- sigstore attachments (crate::image::sigstore) ---
    /// GETs `path` below `image`'s repository within the OS image deadline: at most `max`
    /// bytes, digest-checked when `digest` is given. A 404 is [`InspectError::Invalid`].
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
            let raw = read_limited(resp, max)
                .await
                .map_err(|e| self.body_error(image, path, max, e))?;
            if let Some(d) = digest {
                verify(&raw, d, &format!("{path} of {image}"))?;
            }
            Ok(raw)
        })
        .await
    }
}

/// A directory that is removed when dropped, with what is in it.
struct Partial(PathBuf);

impl Partial {
    fn new(path: PathBuf) -> std::io::Result<Self> {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&path)?;
        Ok(Partial(path))
    }

    fn path(&self) -> &Path {
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

const MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

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

/// Caps on what one extensions image may make streamd read into memory and write into `/run`
/// (a tmpfs: memory too). An extensions layer is the only thing streamd unpacks, and it comes
/// from whoever controls the registry or the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Largest RPM written, bytes (the declared size is checked before a byte is written).
    pub max_file: u64,
    /// Largest sum of the RPMs written over all layers, bytes.
    pub max_total: u64,
    /// Most tar entries read over all layers (headers included).
    pub max_entries: u64,
    /// Largest GNU long name/link or PAX extension record, bytes. tar reads these whole into
    /// memory; a path is at most `PATH_MAX` (4096), the rest is generous room for xattrs.
    pub max_header: u64,
    /// What the RPMs' own headers may make streamd read and keep over all layers.
    pub rpm_headers: HeaderLimits,
}

/// The limits streamd extracts with. A real extensions image carries a few hundred files and
/// its largest RPMs (kernel modules) are tens of MiB.
pub const EXTRACT_LIMITS: ExtractLimits = ExtractLimits {
    max_file: 256 << 20,
    max_total: 512 << 20,
    max_entries: 20_000,
    max_header: 64 << 10,
    rpm_headers: HEADER_LIMITS,
};

/// What is left of [`ExtractLimits`] while an image's layers are read one after the other.
#[derive(Debug)]
pub struct ExtractBudget {
    limits: ExtractLimits,
    written: u64,
    entries: u64,
    headers: HeaderBudget,
}

impl ExtractBudget {
    /// A full budget.
    pub fn new(limits: ExtractLimits) -> Self {
        ExtractBudget {
            limits,
            written: 0,
            entries: 0,
            headers: HeaderBudget::new(limits.rpm_headers),
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }
}

fn too_big(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// What one layer holds under [`EXTENSIONS_DIR`]: the RPM names, the extracted files and the
/// headers of the files that are RPMs.
pub type LayerRpms = (Vec<String>, Vec<PathBuf>, Vec<RpmHeader>);

/// Lists the RPMs under [`EXTENSIONS_DIR`] in a (gzip'd or plain) tar layer, reads every RPM's header and writes the
/// wanted ones into `dest`. Names are `name-version-release.arch` (the file name without `.rpm`).
///
/// Entries are read raw, so GNU long names and PAX records are read here, each at most
/// [`ExtractLimits::max_header`] bytes, instead of whole by the tar reader; the files written,
/// their sum, the entries and the RPM headers are counted against `budget`. A file that is no
/// RPM at all (no lead) is listed but offers nothing to the closure; an RPM whose header is
/// malformed or over a limit refuses the layer, naming the file. On an error, files already
/// written stay: the caller extracts into a directory it removes.
pub fn rpms_in_layer<R: Read>(
    layer: R,
    media_type: &str,
    wanted: &[String],
    dest: &Path,
    budget: &mut ExtractBudget,
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
    let limits = budget.limits;
    // The path a GNU long name or PAX record gave the next entry.
    let mut long_path: Option<Vec<u8>> = None;
    for entry in archive.entries()?.raw(true) {
        let mut entry = entry?;
        budget.entries += 1;
        if budget.entries > limits.max_entries {
            return Err(too_big(format!(
                "more than {} tar entries",
                limits.max_entries
            )));
        }
        let kind = entry.header().entry_type();
        let size = entry.header().entry_size()?;
        if kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            if let Some(path) = path_record(&mut entry, kind, size, limits.max_header)? {
                long_path = Some(path);
            }
            continue;
        }
        let raw_path = long_path
            .take()
            .unwrap_or_else(|| entry.path_bytes().into_owned());
        let path = String::from_utf8_lossy(&raw_path);
        let Some(rest) = path.trim_start_matches("./").strip_prefix(EXTENSIONS_DIR) else {
            continue;
        };
        let Some(file) = rest.rsplit('/').next().filter(|f| f.ends_with(".rpm")) else {
            continue;
        };
        // No file system takes a longer name; refusing it also bounds the list kept in memory.
        if file.len() > 255 {
            return Err(too_big(format!(
                "a file name of {} bytes under {EXTENSIONS_DIR}",
                file.len()
            )));
        }
        let nevra = file.trim_end_matches(".rpm").to_string();
        let want = wanted
            .iter()
            .any(|w| crate::image::rpm::names_package(&nevra, w));
        let header = if want {
            if size > limits.max_file {
                return Err(too_big(format!(
                    "{file} is {size} bytes (at most {} per RPM)",
                    limits.max_file
                )));
            }
            let total = budget.written.saturating_add(size);
            if total > limits.max_total {
                return Err(too_big(format!(
                    "the wanted RPMs exceed {} bytes",
                    limits.max_total
                )));
            }
            // Only the file name is used: a path in the archive can never escape `dest`.
            let out = dest.join(file);
            std::io::copy(&mut entry, &mut std::fs::File::create(&out)?)?;
            budget.written = total;
            let header = RpmHeader::read_file(&out, &mut budget.headers);
            files.push(out);
            header
        } else {
            // The header is the first few KiB of the file: read from the stream for every RPM,
            // as the dependency closure needs all of them.
            RpmHeader::read(&mut entry, file, &mut budget.headers)
        };
        if let Some(h) = header_of(header, file)? {
            headers.push(h);
        }
        names.push(nevra);
    }
    Ok((names, files, headers))
}

/// Reads a GNU long name or link, or a PAX record, of `size` bytes (at most `max`); the path it
/// gives the next entry, if it gives one.
fn path_record(
    entry: &mut impl Read,
    kind: tar::EntryType,
    size: u64,
    max: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    if size > max {
        return Err(too_big(format!(
            "a tar header record of {size} bytes (at most {max})"
        )));
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data)?;
    let mut path = None;
    if kind.is_gnu_longname() {
        let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        data.truncate(end);
        path = Some(data);
    } else if kind.is_pax_local_extensions() {
        for ext in tar::PaxExtensions::new(&data) {
            let ext = ext?;
            if ext.key_bytes() == b"path" {
                path = Some(ext.value_bytes().to_vec());
            }
        }
    }
    Ok(path)
}

/// The header read from `file`: none for a file that is no RPM at all (listed, but no candidate
/// for the closure; a wanted one missing from it is refused there), an error naming the file for
/// a malformed one.
fn header_of(
    read: Result<RpmHeader, HeaderError>,
    file: &str,
) -> std::io::Result<Option<RpmHeader>> {
    match read {
        Ok(h) => Ok(Some(h)),
        Err(HeaderError::NotRpm) => {
            tracing::debug!(file, "not an rpm package");
            Ok(None)
        }
        Err(HeaderError::Io(e)) => Err(std::io::Error::new(e.kind(), format!("{file}: {e}"))),
        Err(e @ HeaderError::Invalid(_)) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{file}: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads an uncompressed `layer` wanting `kernel-rt-core`, with the shipped limits.
    fn rt_core_from(layer: &[u8], dest: &Path) -> LayerRpms {
        rpms_in_layer(
            layer,
            "application/vnd.oci.image.layer.v1.tar",
            &["kernel-rt-core".to_string()],
            dest,
            &mut ExtractBudget::new(EXTRACT_LIMITS),
        )
        .expect("read")
    }

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
        let (names, files, _) = rt_core_from(&layer, &dest);
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

    fn gzip(raw: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(raw).expect("gzip");
        z.finish().expect("gzip")
    }

    /// A tar header block for `name` of `kind` declaring `size` bytes (the data is not there).
    fn header(name: &str, kind: tar::EntryType, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).expect("name");
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("streamd-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn read(layer: &[u8], wanted: &[&str], dest: &Path, limits: ExtractLimits) -> String {
        let wanted: Vec<String> = wanted.iter().map(|w| w.to_string()).collect();
        rpms_in_layer(
            layer,
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &wanted,
            dest,
            &mut ExtractBudget::new(limits),
        )
        .expect_err("a hostile layer is refused")
        .to_string()
    }

    #[test]
    fn header_records_are_capped_before_they_are_read() {
        // A GNU long name of 256 MiB of zeros: 254 KiB of gzip. tar's own reader would hold
        // all of it in memory; the cap refuses it from the header alone.
        let mut raw = header("././@LongLink", tar::EntryType::GNULongName, 256 << 20);
        raw.resize(raw.len() + (256 << 20), 0);
        let bomb = gzip(&raw);
        drop(raw);
        assert!(bomb.len() < 300 << 10, "{}", bomb.len());
        let dest = scratch("longname");
        let e = read(&bomb, &[], &dest, EXTRACT_LIMITS);
        assert!(e.contains("tar header record of 268435456 bytes"), "{e}");
        let pax = gzip(&header("pax", tar::EntryType::XHeader, 1 << 30));
        let e = read(&pax, &[], &dest, EXTRACT_LIMITS);
        assert!(e.contains("tar header record"), "{e}");
        std::fs::remove_dir_all(&dest).ok();
    }

    #[test]
    fn files_total_and_entries_are_capped() {
        let dest = scratch("caps");
        let rpm = |n: &str| format!("{EXTENSIONS_DIR}{n}-1-1.el10.x86_64.rpm");
        // One wanted RPM declaring 8 GiB: refused before a byte is written.
        let huge = gzip(&header(
            &rpm("kernel-rt-core"),
            tar::EntryType::Regular,
            8 << 30,
        ));
        let e = read(&huge, &["kernel-rt-core"], &dest, EXTRACT_LIMITS);
        assert!(e.contains("at most 268435456 per RPM"), "{e}");
        assert_eq!(std::fs::read_dir(&dest).expect("dest").count(), 0);
        // Each under the per-file cap, together over the total.
        let small = ExtractLimits {
            max_file: 10,
            max_total: 15,
            ..EXTRACT_LIMITS
        };
        let two = tar_with(&[(&rpm("a"), &[1u8; 10][..]), (&rpm("b"), &[2u8; 10][..])]);
        let e = read(&gzip(&two), &["a", "b"], &dest, small);
        assert!(e.contains("exceed 15 bytes"), "{e}");
        // Many empty entries.
        let files: Vec<(String, Vec<u8>)> =
            (0..30).map(|i| (format!("f{i}"), Vec::new())).collect();
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
        let many = ExtractLimits {
            max_entries: 20,
            ..EXTRACT_LIMITS
        };
        let e = read(&gzip(&tar_with(&refs)), &[], &dest, many);
        assert!(e.contains("more than 20 tar entries"), "{e}");
        std::fs::remove_dir_all(&dest).ok();
    }

    #[test]
    fn long_names_still_name_rpms() {
        // Real layers use PAX or GNU long names for long paths: within the cap they still work.
        let long = format!(
            "{EXTENSIONS_DIR}{}/kernel-rt-core-6.12.0-1.el10.x86_64.rpm",
            "d".repeat(150)
        );
        let layer = tar_with(&[(&long, b"rt")]);
        let dest = scratch("long");
        let (names, files, _) = rt_core_from(&layer, &dest);
        assert_eq!(
            names,
            vec!["kernel-rt-core-6.12.0-1.el10.x86_64".to_string()]
        );
        assert_eq!(std::fs::read(&files[0]).expect("read"), b"rt");
        std::fs::remove_dir_all(&dest).ok();
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
                &mut ExtractBudget::new(EXTRACT_LIMITS),
            );
        }
        assert!(verify(b"x", "sha256:00", "t").is_err());
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(kernel_arch("arm64"), "aarch64");
    }
}
