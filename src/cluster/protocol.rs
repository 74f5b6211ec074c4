//! The node annotation protocol (`docs/protocol.md`).
//!
//! The cluster writes the input keys; streamd writes only the output keys. This
//! module parses and validates the inputs and renders the outputs; it does no
//! I/O, so every rule here is covered by table tests.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::image::reference::{ImageRef, ImageRefError};
use crate::text::quote;

/// Prefix of every annotation streamd reads or writes.
pub const PREFIX: &str = "osstream.openshift.io/";

/// Input: the stream the node should run.
pub const DESIRED_STREAM: &str = "osstream.openshift.io/desired-stream";
/// Input: the digest-pinned OS image of that stream.
pub const DESIRED_OS_IMAGE: &str = "osstream.openshift.io/desired-os-image";
/// Input: the digest-pinned extensions image of that stream (optional).
pub const DESIRED_EXTENSIONS_IMAGE: &str = "osstream.openshift.io/desired-extensions-image";
/// Input: the reboot approval token.
pub const REBOOT_APPROVED: &str = "osstream.openshift.io/reboot-approved";
/// Input: a stream to run the readiness checks for, without staging anything.
pub const CHECK_STREAM: &str = "osstream.openshift.io/check-stream";
/// Input: the digest-pinned OS image of the checked stream (absent: the cluster's
/// OSImageStream says).
pub const CHECK_OS_IMAGE: &str = "osstream.openshift.io/check-os-image";
/// Input: the digest-pinned extensions image of the checked stream.
pub const CHECK_EXTENSIONS_IMAGE: &str = "osstream.openshift.io/check-extensions-image";

/// Output: the agent's [`State`].
pub const STATE: &str = "osstream.openshift.io/state";
/// Output: one line for a human.
pub const REASON: &str = "osstream.openshift.io/reason";
/// Output: `0`..`100` while staging.
pub const PROGRESS: &str = "osstream.openshift.io/progress";
/// Output: the stream the node booted.
pub const CURRENT_STREAM: &str = "osstream.openshift.io/current-stream";
/// Output: the image the node booted.
pub const CURRENT_OS_IMAGE: &str = "osstream.openshift.io/current-os-image";
/// Output: the image staged for the next boot.
pub const STAGED_OS_IMAGE: &str = "osstream.openshift.io/staged-os-image";
/// Output: short hash of the desired triple the state refers to.
pub const OBSERVED_DESIRED: &str = "osstream.openshift.io/observed-desired";
/// Output: compact JSON of host facts.
pub const HOST: &str = "osstream.openshift.io/host";
/// Output: the token the cluster echoes in `reboot-approved` to let the node reboot.
pub const REBOOT_REQUESTED: &str = "osstream.openshift.io/reboot-requested";
/// Output: [`Mode`], whether streamd manages the OS or only reports readiness.
pub const MODE: &str = "osstream.openshift.io/mode";
/// Output: compact JSON, the readiness of each checked stream.
pub const READINESS: &str = "osstream.openshift.io/readiness";
/// Output: the [`CheckId`]s whose failure the `Refused` state is for, comma-separated
/// ([`failed_checks_value`], [`parse_failed_checks`]); absent in every other case.
pub const FAILED_CHECKS: &str = "osstream.openshift.io/failed-checks";

/// The input keys, which streamd never writes.
pub const INPUT_KEYS: [&str; 7] = [
    DESIRED_STREAM,
    DESIRED_OS_IMAGE,
    DESIRED_EXTENSIONS_IMAGE,
    REBOOT_APPROVED,
    CHECK_STREAM,
    CHECK_OS_IMAGE,
    CHECK_EXTENSIONS_IMAGE,
];

/// The output keys, which only streamd writes.
pub const OUTPUT_KEYS: [&str; 12] = [
    STATE,
    REASON,
    PROGRESS,
    CURRENT_STREAM,
    CURRENT_OS_IMAGE,
    STAGED_OS_IMAGE,
    OBSERVED_DESIRED,
    HOST,
    REBOOT_REQUESTED,
    MODE,
    READINESS,
    FAILED_CHECKS,
];

/// Longest `reason` value streamd writes, in characters.
pub use crate::text::MAX_REASON_CHARS;
/// Most streams the `readiness` annotation lists.
pub const MAX_READINESS_STREAMS: usize = 8;
/// Longest `reason` of one `readiness` entry, in characters.
pub const MAX_READINESS_REASON_CHARS: usize = 256;
/// Longest `readiness` value, in bytes.
pub const MAX_READINESS_BYTES: usize = 4096;
/// Longest stream name (RFC 1123 subdomain).
pub const MAX_STREAM_LEN: usize = 253;
/// Longest reboot token accepted.
pub const MAX_TOKEN_LEN: usize = 253;

/// What the agent is doing, as written to the `state` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum State {
    /// Nothing is requested, or the node has been told to stop.
    #[default]
    Idle,
    /// Checks are running before anything is changed.
    Preflight,
    /// rpm-ostree is building the new deployment.
    Staging,
    /// The new deployment is staged and finalization-locked.
    Staged,
    /// The staged deployment is being applied by a reboot.
    Rebooting,
    /// The node booted the desired image.
    Done,
    /// Something failed; the node is unchanged or safe, `reason` says what.
    Degraded,
    /// The request is invalid or would break the node; nothing was changed.
    Refused,
}

impl State {
    /// Every state, in protocol order.
    pub const ALL: [State; 8] = [
        State::Idle,
        State::Preflight,
        State::Staging,
        State::Staged,
        State::Rebooting,
        State::Done,
        State::Degraded,
        State::Refused,
    ];

    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Preflight => "Preflight",
            State::Staging => "Staging",
            State::Staged => "Staged",
            State::Rebooting => "Rebooting",
            State::Done => "Done",
            State::Degraded => "Degraded",
            State::Refused => "Refused",
        }
    }

    /// States in which `reason` is always empty.
    pub fn clears_reason(self) -> bool {
        matches!(self, State::Idle | State::Done)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `state` value that is not one of [`State::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown state {}", quote(.0))]
pub struct UnknownState(pub String);

impl UnknownState {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "state-unknown"
    }
}

impl FromStr for State {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(crate::text::one_line(s, 64)))
    }
}

/// A preflight check, by the id it is known as in `reason`, the `failed-checks` and
/// `readiness` annotations, Events, the journal's `STREAMD_CHECK` field and `streamctl
/// preflight` (docs/protocol.md "Preflight checks").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckId {
    /// The requested images are ones the node's image policy takes (`allowed-repositories`,
    /// `resolved-only`); judged before any registry is read.
    ImagePolicy,
    /// The requested images are digest-pinned references.
    ImageReference,
    /// The move goes in the allowed direction (no 10 → 9 unless allowed).
    Direction,
    /// The OS daemon can pull the OS image with the host's credentials.
    OsPullCredentials,
    /// The OS image is bootable, of the stream and the architecture.
    OsImage,
    /// The OS image's signature is what the host's `policy.json` requires, verified before
    /// staging (never only a warning).
    Signature,
    /// The extensions image provides what the move needs.
    ExtensionsImage,
    /// The CPU meets the target's x86-64 level.
    CpuLevel,
    /// The kernel's and the command line's FIPS state agree.
    Fips,
    /// The running kernel variant can be carried to the target.
    KernelVariant,
    /// With UEFI Secure Boot on, the bootloader is updated before a move to another RHEL
    /// major by whoever makes the move.
    SecureBoot,
    /// The container runtime works on the target.
    ContainerRuntime,
    /// There is room for the new deployment.
    DiskSpace,
    /// The layered packages can be carried.
    LayeredPackages,
    /// The RPMs to pass are closed under Requires.
    RpmDependencies,
    /// NIC names survive the move (a warning only).
    NicNames,
    /// No staged deployment streamd did not create.
    PendingDeployment,
    /// The backend can carry what the move needs.
    Backend,
    /// A layered deployment is not refused by `LockLayering` or an enabled repository
    /// rpm-ostree cannot read.
    LayeringConfig,
}

impl CheckId {
    /// Every check, in the order preflight runs them.
    pub const ALL: [CheckId; 19] = [
        CheckId::ImagePolicy,
        CheckId::ImageReference,
        CheckId::Backend,
        CheckId::Direction,
        CheckId::OsPullCredentials,
        CheckId::OsImage,
        CheckId::Signature,
        CheckId::ExtensionsImage,
        CheckId::CpuLevel,
        CheckId::Fips,
        CheckId::KernelVariant,
        CheckId::SecureBoot,
        CheckId::ContainerRuntime,
        CheckId::DiskSpace,
        CheckId::LayeredPackages,
        CheckId::RpmDependencies,
        CheckId::LayeringConfig,
        CheckId::NicNames,
        CheckId::PendingDeployment,
    ];

    /// The id as written everywhere, e.g. `cpu-level`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckId::ImagePolicy => "image-policy",
            CheckId::ImageReference => "image-reference",
            CheckId::Direction => "direction",
            CheckId::OsPullCredentials => "os-pull-credentials",
            CheckId::OsImage => "os-image",
            CheckId::Signature => "signature",
            CheckId::ExtensionsImage => "extensions-image",
            CheckId::CpuLevel => "cpu-level",
            CheckId::Fips => "fips",
            CheckId::KernelVariant => "kernel-variant",
            CheckId::SecureBoot => "secure-boot",
            CheckId::ContainerRuntime => "container-runtime",
            CheckId::DiskSpace => "disk-space",
            CheckId::LayeredPackages => "layered-packages",
            CheckId::RpmDependencies => "rpm-dependencies",
            CheckId::NicNames => "nic-names",
            CheckId::PendingDeployment => "pending-deployment",
            CheckId::Backend => "backend",
            CheckId::LayeringConfig => "layering-config",
        }
    }

    /// The `reason` of a request refused because this check failed with `message`.
    pub fn failure_reason(self, message: &str) -> String {
        format!("preflight check {self} failed: {message}")
    }
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A check id that is not one of [`CheckId::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown check id {}", quote(.0))]
pub struct UnknownCheck(pub String);

impl UnknownCheck {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "check-id-unknown"
    }
}

impl FromStr for CheckId {
    type Err = UnknownCheck;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CheckId::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCheck(crate::text::one_line(s, 64)))
    }
}

/// The `failed-checks` value for `ids` (sorted, no duplicates); `None` for no id.
pub fn failed_checks_value(ids: &[CheckId]) -> Option<String> {
    let ids: std::collections::BTreeSet<CheckId> = ids.iter().copied().collect();
    let value: Vec<&str> = ids.into_iter().map(CheckId::as_str).collect();
    (!value.is_empty()).then(|| value.join(","))
}

/// The ids of a `failed-checks` value ([`parse_check_ids`] of its items).
pub fn parse_failed_checks(value: &str) -> (Vec<CheckId>, Vec<UnknownCheck>) {
    parse_check_ids(value.split(',').map(str::trim).filter(|i| !i.is_empty()))
}

/// Check ids as another component reads them (`failed-checks`, a readiness entry's
/// `failed`): an id this build does not know (written by a newer streamd) is an error naming
/// it, and the known ones are still returned beside it.
pub fn parse_check_ids<'a>(
    items: impl IntoIterator<Item = &'a str>,
) -> (Vec<CheckId>, Vec<UnknownCheck>) {
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    for item in items {
        match item.parse() {
            Ok(id) => known.push(id),
            Err(e) => unknown.push(e),
        }
    }
    (known, unknown)
}

/// Why an input annotation was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}: {problem}")]
pub struct ProtocolError {
    /// The full annotation key.
    pub key: &'static str,
    /// What is wrong with its value.
    pub problem: String,
}

impl ProtocolError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "annotation-invalid"
    }

    fn new(key: &'static str, problem: impl Into<String>) -> Self {
        ProtocolError {
            key,
            problem: problem.into(),
        }
    }
}

/// The validated (stream, OS image, extensions image) request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Stream name, e.g. `rhel-10`.
    pub stream: String,
    /// Digest-pinned OS image.
    pub os_image: ImageRef,
    /// Digest-pinned extensions image, when given.
    pub extensions_image: Option<ImageRef>,
}

impl Desired {
    /// Short, stable hash of the triple: lets a controller tell which request a state refers to.
    pub fn observed_hash(&self) -> String {
        let ext = self.extensions_image.as_ref().map(ToString::to_string);
        short_hash(&self.stream, &self.os_image.to_string(), ext.as_deref())
    }

    /// The `reboot-requested` token for this request in the boot `boot_id`: a new boot or a new
    /// request gives a new token, so an approval can never be replayed onto another reboot.
    pub fn reboot_token(&self, boot_id: &str) -> String {
        let boot: String = boot_id
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(12)
            .collect();
        format!("{}.{boot}", self.observed_hash())
    }
}

/// 16 hex digits of SHA-256 over a stream and its images: [`Desired::observed_hash`], and the
/// `checked` field of a readiness entry.
pub fn short_hash(stream: &str, os_image: &str, extensions_image: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(stream.as_bytes());
    h.update([0]);
    h.update(os_image.as_bytes());
    h.update([0]);
    if let Some(ext) = extensions_image {
        h.update(ext.as_bytes());
    }
    let digest = h.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The raw values of the input keys; equality of two `Inputs` decides whether a node update
/// is a new request (streamd's own writes never change them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// `desired-stream`, verbatim.
    pub stream: Option<String>,
    /// `desired-os-image`, verbatim.
    pub os_image: Option<String>,
    /// `desired-extensions-image`, verbatim.
    pub extensions_image: Option<String>,
    /// `reboot-approved`, verbatim.
    pub reboot_approved: Option<String>,
}

impl Inputs {
    /// Picks the input keys out of a node's annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| annotations.get(k).cloned();
        Inputs {
            stream: get(DESIRED_STREAM),
            os_image: get(DESIRED_OS_IMAGE),
            extensions_image: get(DESIRED_EXTENSIONS_IMAGE),
            reboot_approved: get(REBOOT_APPROVED),
        }
    }

    /// Validates the request. `Ok(None)`: no request (both desired keys absent).
    pub fn desired(&self) -> Result<Option<Desired>, ProtocolError> {
        if let Some(token) = &self.reboot_approved {
            validate_token(token)
                .map_err(|p| ProtocolError::new(REBOOT_APPROVED, p.to_string()))?;
        }
        let (stream, os_image) = match (&self.stream, &self.os_image) {
            (None, None) => {
                return match &self.extensions_image {
                    Some(_) => Err(ProtocolError::new(
                        DESIRED_EXTENSIONS_IMAGE,
                        "set without desired-stream and desired-os-image",
                    )),
                    None => Ok(None),
                };
            }
            (Some(_), None) => {
                return Err(ProtocolError::new(
                    DESIRED_OS_IMAGE,
                    "missing (desired-stream is set)",
                ));
            }
            (None, Some(_)) => {
                return Err(ProtocolError::new(
                    DESIRED_STREAM,
                    "missing (desired-os-image is set)",
                ));
            }
            (Some(s), Some(i)) => (s, i),
        };
        validate_stream(stream).map_err(|p| ProtocolError::new(DESIRED_STREAM, p.to_string()))?;
        let os_image = parse_image(DESIRED_OS_IMAGE, os_image)?;
        let extensions_image = self
            .extensions_image
            .as_deref()
            .map(|v| parse_image(DESIRED_EXTENSIONS_IMAGE, v))
            .transpose()?;
        Ok(Some(Desired {
            stream: stream.clone(),
            os_image,
            extensions_image,
        }))
    }
}

/// Whether streamd manages the node's OS, as written to the `mode` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// streamd stages and reboots on requests.
    #[default]
    Manage,
    /// Another agent (the machine-config daemon) manages the OS, or the config says so:
    /// streamd never stages or reboots, it only runs readiness checks.
    Readiness,
}

impl Mode {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Manage => "manage",
            Mode::Readiness => "readiness",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stream's entry in the `readiness` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// Every check passed: a move to the stream would be staged.
    pub ready: bool,
    /// Ids of the failed checks (empty when ready, or when the checks could not run).
    pub failed: Vec<CheckId>,
    /// The first failure, or why the checks could not run; empty when ready.
    pub reason: String,
    /// The OS image checked (empty when it could not be resolved).
    pub os_image: String,
    /// [`Desired::observed_hash`] of the stream and images checked.
    pub checked: String,
}

/// The `readiness` value: compact JSON keyed by stream, bounded to
/// [`MAX_READINESS_STREAMS`] entries, reasons of at most [`MAX_READINESS_REASON_CHARS`]
/// inert characters and [`MAX_READINESS_BYTES`] in all (reasons are cut shorter first, then
/// the last entries dropped). `None` when there is no entry.
pub fn readiness_json(entries: &BTreeMap<String, Readiness>) -> Option<String> {
    if entries.is_empty() {
        return None;
    }
    let mut kept: BTreeMap<&str, Readiness> = entries
        .iter()
        .take(MAX_READINESS_STREAMS)
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let mut cap = MAX_READINESS_REASON_CHARS;
    loop {
        for r in kept.values_mut() {
            r.reason = crate::text::one_line(&r.reason, cap);
        }
        let json = serde_json::to_string(&kept).unwrap_or_default();
        if json.len() <= MAX_READINESS_BYTES {
            return Some(json);
        }
        if cap > 32 {
            cap /= 2;
        } else {
            let last = kept.keys().next_back().copied().unwrap_or_default();
            kept.remove(last);
        }
    }
}

/// The raw values of the `check-*` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckInputs {
    /// `check-stream`, verbatim.
    pub stream: Option<String>,
    /// `check-os-image`, verbatim.
    pub os_image: Option<String>,
    /// `check-extensions-image`, verbatim.
    pub extensions_image: Option<String>,
}

/// A validated `check-*` request; images absent are resolved through the cluster's
/// OSImageStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    /// The stream to check.
    pub stream: String,
    /// The OS image, when given.
    pub os_image: Option<ImageRef>,
    /// The extensions image, when given.
    pub extensions_image: Option<ImageRef>,
}

impl CheckInputs {
    /// Picks the `check-*` keys out of a node's annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| annotations.get(k).cloned();
        CheckInputs {
            stream: get(CHECK_STREAM),
            os_image: get(CHECK_OS_IMAGE),
            extensions_image: get(CHECK_EXTENSIONS_IMAGE),
        }
    }

    /// Validates the check request with the rules of the `desired-*` keys. `Ok(None)`: no
    /// check asked for (no key set).
    pub fn request(&self) -> Result<Option<CheckRequest>, ProtocolError> {
        let Some(stream) = &self.stream else {
            return match (&self.os_image, &self.extensions_image) {
                (None, None) => Ok(None),
                (Some(_), _) => Err(ProtocolError::new(
                    CHECK_OS_IMAGE,
                    "set without check-stream",
                )),
                (None, Some(_)) => Err(ProtocolError::new(
                    CHECK_EXTENSIONS_IMAGE,
                    "set without check-stream",
                )),
            };
        };
        validate_stream(stream).map_err(|p| ProtocolError::new(CHECK_STREAM, p.to_string()))?;
        if self.os_image.is_none() && self.extensions_image.is_some() {
            return Err(ProtocolError::new(
                CHECK_EXTENSIONS_IMAGE,
                "set without check-os-image (without both, the cluster's OSImageStream names the images)",
            ));
        }
        let os_image = self
            .os_image
            .as_deref()
            .map(|v| parse_image(CHECK_OS_IMAGE, v))
            .transpose()?;
        let extensions_image = self
            .extensions_image
            .as_deref()
            .map(|v| parse_image(CHECK_EXTENSIONS_IMAGE, v))
            .transpose()?;
        Ok(Some(CheckRequest {
            stream: stream.clone(),
            os_image,
            extensions_image,
        }))
    }
}

fn parse_image(key: &'static str, value: &str) -> Result<ImageRef, ProtocolError> {
    value
        .parse::<ImageRef>()
        .map_err(|e: ImageRefError| ProtocolError::new(key, e.to_string()))
}

/// Why a stream name is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamNameError {
    /// The name is empty.
    #[error("empty stream name")]
    Empty,
    /// The name is longer than [`MAX_STREAM_LEN`] (its length).
    #[error("stream name is {0} characters, the limit is {MAX_STREAM_LEN}")]
    TooLong(usize),
    /// The name (quoted) is not an RFC 1123 subdomain.
    #[error(
        "{0} is not an RFC 1123 subdomain (lower-case letters, digits, '-' and '.', \
         starting and ending with a letter or digit)"
    )]
    NotSubdomain(String),
}

impl StreamNameError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            StreamNameError::Empty => "stream-empty",
            StreamNameError::TooLong(_) => "stream-too-long",
            StreamNameError::NotSubdomain(_) => "stream-not-subdomain",
        }
    }
}

/// Checks an RFC 1123 subdomain, the format of stream names.
pub fn validate_stream(value: &str) -> Result<(), StreamNameError> {
    if value.is_empty() {
        return Err(StreamNameError::Empty);
    }
    if value.len() > MAX_STREAM_LEN {
        return Err(StreamNameError::TooLong(value.len()));
    }
    for label in value.split('.') {
        let bytes = label.as_bytes();
        let valid_chars = bytes
            .iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        let alnum =
            |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !valid_chars || !alnum(bytes.first()) || !alnum(bytes.last()) {
            return Err(StreamNameError::NotSubdomain(quote(value)));
        }
    }
    Ok(())
}

/// Why a reboot-approval token is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum TokenError {
    #[error("token must be 1..{MAX_TOKEN_LEN} characters")]
    Length,
    #[error("token may hold only letters, digits and '-', '_', '.', ':'")]
    Chars,
}

fn validate_token(value: &str) -> Result<(), TokenError> {
    if value.is_empty() || value.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Length);
    }
    if !value
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(&c))
    {
        return Err(TokenError::Chars);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn inputs(stream: Option<&str>, os: Option<&str>, ext: Option<&str>) -> Inputs {
        Inputs {
            stream: stream.map(String::from),
            os_image: os.map(String::from),
            extensions_image: ext.map(String::from),
            reboot_approved: None,
        }
    }

    #[test]
    fn check_ids_round_trip_in_every_form() {
        for id in CheckId::ALL {
            assert_eq!(id.as_str().parse::<CheckId>(), Ok(id));
            let json = serde_json::to_string(&id).expect("json");
            assert_eq!(
                json,
                format!("\"{}\"", id.as_str()),
                "serde and as_str agree"
            );
            assert_eq!(serde_json::from_str::<CheckId>(&json).expect("parse"), id);
        }
        let distinct: std::collections::BTreeSet<&str> =
            CheckId::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(distinct.len(), CheckId::ALL.len(), "ALL lists each id once");
        assert!("CPU-level".parse::<CheckId>().is_err());
        assert_eq!(
            CheckId::CpuLevel.failure_reason("x86-64-v2"),
            "preflight check cpu-level failed: x86-64-v2"
        );
    }

    #[test]
    fn failed_checks_value_round_trips() {
        let ids = [CheckId::Fips, CheckId::CpuLevel, CheckId::Fips];
        let value = failed_checks_value(&ids).expect("some");
        assert_eq!(value, "cpu-level,fips", "sorted, once each");
        assert_eq!(
            parse_failed_checks(&value),
            (vec![CheckId::CpuLevel, CheckId::Fips], vec![])
        );
        assert_eq!(failed_checks_value(&[]), None);
        let (known, unknown) = parse_failed_checks("fips, quantum-level,,");
        assert_eq!(known, vec![CheckId::Fips]);
        assert_eq!(unknown, vec![UnknownCheck("quantum-level".into())]);
    }

    #[test]
    fn state_round_trips() {
        for st in State::ALL {
            assert_eq!(st.as_str().parse::<State>(), Ok(st));
        }
        assert_eq!(
            "idle\nx".parse::<State>(),
            Err(UnknownState("idle; x".into()))
        );
    }

    #[test]
    fn valid_request_parses() {
        let img = format!("quay.io/openshift/rhcos@{D}");
        let d = inputs(Some("rhel-10"), Some(&img), None)
            .desired()
            .expect("valid")
            .expect("present");
        assert_eq!(d.stream, "rhel-10");
        assert_eq!(d.os_image.to_string(), img);
        assert_eq!(d.observed_hash().len(), 16);
    }

    #[test]
    fn no_request_is_none() {
        assert_eq!(inputs(None, None, None).desired(), Ok(None));
    }

    #[test]
    fn hash_changes_with_every_field() {
        let a = format!("quay.io/a/b@{D}");
        let b = format!("quay.io/a/c@{D}");
        let h = |s, o: &str, e: Option<&str>| {
            inputs(Some(s), Some(o), e)
                .desired()
                .expect("valid")
                .expect("present")
                .observed_hash()
        };
        let base = h("rhel-10", &a, None);
        assert_ne!(base, h("rhel-9", &a, None));
        assert_ne!(base, h("rhel-10", &b, None));
        assert_ne!(base, h("rhel-10", &a, Some(&b)));
        assert_eq!(base, h("rhel-10", &a, None));
    }

    #[test]
    fn invalid_requests_name_the_key() {
        let ok = format!("quay.io/openshift/rhcos@{D}");
        let long_stream = "a".repeat(254);
        let cases: Vec<(Inputs, &str)> = vec![
            (inputs(Some(""), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("RHEL-10"), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("-rhel"), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("rhel-"), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("rhel 10"), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("rhel..10"), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some(&long_stream), Some(&ok), None), DESIRED_STREAM),
            (inputs(Some("rhel-10"), None, None), DESIRED_OS_IMAGE),
            (inputs(None, Some(&ok), None), DESIRED_STREAM),
            (inputs(None, None, Some(&ok)), DESIRED_EXTENSIONS_IMAGE),
            (
                inputs(Some("rhel-10"), Some("quay.io/openshift/rhcos:4.20"), None),
                DESIRED_OS_IMAGE,
            ),
            (
                inputs(Some("rhel-10"), Some(&ok), Some("quay.io/x/y:latest")),
                DESIRED_EXTENSIONS_IMAGE,
            ),
        ];
        for (input, key) in cases {
            let err = input.desired().expect_err("must be refused");
            assert_eq!(err.key, key, "{input:?}");
            assert!(
                err.to_string()
                    .starts_with("annotation osstream.openshift.io/")
            );
        }
    }

    #[test]
    fn check_requests_are_validated_naming_the_check_key() {
        let ok = format!("quay.io/openshift/rhcos@{D}");
        let check = |s: Option<&str>, o: Option<&str>, e: Option<&str>| CheckInputs {
            stream: s.map(String::from),
            os_image: o.map(String::from),
            extensions_image: e.map(String::from),
        };
        assert_eq!(check(None, None, None).request(), Ok(None));
        let only_stream = check(Some("rhel-10"), None, None)
            .request()
            .expect("valid")
            .expect("present");
        assert_eq!(only_stream.os_image, None);
        let pinned = check(Some("rhel-10"), Some(&ok), Some(&ok))
            .request()
            .expect("valid")
            .expect("present");
        assert_eq!(pinned.os_image.map(|i| i.to_string()), Some(ok.clone()));
        let cases = [
            (check(Some("RHEL-10"), None, None), CHECK_STREAM),
            (check(None, Some(&ok), None), CHECK_OS_IMAGE),
            (check(None, None, Some(&ok)), CHECK_EXTENSIONS_IMAGE),
            (
                check(Some("rhel-10"), None, Some(&ok)),
                CHECK_EXTENSIONS_IMAGE,
            ),
            (
                check(Some("rhel-10"), Some("quay.io/x/y:latest"), None),
                CHECK_OS_IMAGE,
            ),
            (
                check(Some("rhel-10"), Some(&ok), Some("x y")),
                CHECK_EXTENSIONS_IMAGE,
            ),
        ];
        for (input, key) in cases {
            assert_eq!(input.request().expect_err("refused").key, key, "{input:?}");
        }
    }

    #[test]
    fn readiness_is_bounded_and_inert() {
        assert_eq!(readiness_json(&BTreeMap::new()), None);
        let entry = |reason: &str| Readiness {
            ready: false,
            failed: vec![CheckId::CpuLevel],
            reason: reason.into(),
            os_image: format!("quay.io/{}@{D}", "o".repeat(200)),
            checked: "0123456789abcdef".into(),
        };
        let one = BTreeMap::from([("rhel-10".to_string(), entry("a\nb\u{1b}[31m"))]);
        let json = readiness_json(&one).expect("json");
        assert!(json.contains(r#""reason":"a; b""#), "{json}");
        let many: BTreeMap<String, Readiness> = (0..20)
            .map(|i| (format!("stream-{i:02}"), entry(&"x".repeat(1000))))
            .collect();
        let json = readiness_json(&many).expect("json");
        assert!(json.len() <= MAX_READINESS_BYTES, "{}", json.len());
        let back: BTreeMap<String, Readiness> = serde_json::from_str(&json).expect("parses");
        assert!(!back.is_empty() && back.len() <= MAX_READINESS_STREAMS);
        assert!(
            back.values()
                .all(|r| r.reason.chars().count() <= MAX_READINESS_REASON_CHARS)
        );
    }

    #[test]
    fn bad_token_is_refused() {
        let mut i = inputs(None, None, None);
        i.reboot_approved = Some("a b".into());
        assert_eq!(i.desired().expect_err("bad").key, REBOOT_APPROVED);
    }
}
