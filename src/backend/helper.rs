//! The `streamd-verify` helper: the one streamd program that links libostree (read-only).
//!
//! libostree is blocking and brings glib, gio and some sixty shared libraries along, so the
//! daemon never links it: it runs the helper (installed next to `streamd`) once per question,
//! one JSON request on stdin and one JSON answer on stdout, with a timeout
//! (src/bin/streamd-verify.rs). Without an argument the request is a staged-deployment
//! verification (src/host/verify.rs); with [`IMAGE_CONFIGS`] it is an [`ImageConfigs`]
//! request, which the bootc backend asks because `bootc status` prints no image labels.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// File name of the helper, next to the `streamd` executable.
pub const HELPER: &str = "streamd-verify";

/// The helper's argument for an [`ImageConfigs`] request.
pub const IMAGE_CONFIGS: &str = "image-configs";

/// The commit metadata key under which ostree-ext stores the image configuration (JSON) on the
/// merge commit of an imported container image: bootc-dev/bootc:crates/ostree-ext/src/container/store.rs
/// (`META_CONFIG`).
pub const META_CONFIG: &str = "ostree.container.image-config";

/// Read the ostree-ext image configuration ([`META_CONFIG`]) of some commits, read-only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfigs {
    /// The ostree repository (`/sysroot/ostree/repo` on a host).
    pub repo: PathBuf,
    /// The commits (64 hex digits each): deployments' checksums, which for a container
    /// deployment are ostree-ext's merge commit.
    pub commits: Vec<String>,
}

/// The helper's answer to [`ImageConfigs`]: per commit, the [`META_CONFIG`] string of its
/// metadata (`None` where the key is absent) or why it could not be read; an error when the
/// repository could not be opened.
pub type ImageConfigsAnswer = Result<ConfigsByCommit, RemoteError>;

/// Per commit, its [`META_CONFIG`] string (`None` where the key is absent) or why it could not
/// be read.
pub type ConfigsByCommit = BTreeMap<String, Result<Option<String>, RemoteError>>;

/// Why the helper could not read something, in its words: made in the helper's process and
/// sent as a plain JSON string (the wire format of a `String`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[serde(transparent)]
#[error("{0}")]
pub struct RemoteError(pub String);

impl RemoteError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "helper-read-failed"
    }
}

/// Why the helper gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelperError {
    /// The running program's path is unknown, so the helper next to it is too.
    #[error("locating the {HELPER} helper next to this program: {0}")]
    Locate(String),
    /// A run of the helper failed.
    #[error("{}: {failure}", helper.display())]
    Run {
        /// The helper.
        helper: PathBuf,
        /// What went wrong.
        failure: RunFailure,
    },
}

/// What went wrong in one run of the helper.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunFailure {
    /// The request could not be encoded.
    #[error("{0}")]
    Encode(String),
    /// The helper could not be started.
    #[error("cannot run the verification helper: {0}")]
    Spawn(String),
    /// The request could not be written to its stdin.
    #[error("writing the request: {0}")]
    Write(String),
    /// No answer within the limit (seconds).
    #[error("no answer within {0} s")]
    Timeout(u64),
    /// Waiting for it failed.
    #[error("{0}")]
    Wait(String),
    /// It exited without an answer: its exit status and its stderr on one line.
    #[error("{status}: {stderr}")]
    NoAnswer {
        /// The exit status.
        status: String,
        /// Its stderr.
        stderr: String,
    },
}

impl HelperError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            HelperError::Locate(_) => "helper-not-located",
            HelperError::Run { failure, .. } => match failure {
                RunFailure::Encode(_) => "helper-request-encoding",
                RunFailure::Spawn(_) => "helper-not-started",
                RunFailure::Write(_) => "helper-request-not-written",
                RunFailure::Timeout(_) => "helper-timeout",
                RunFailure::Wait(_) => "helper-wait-failed",
                RunFailure::NoAnswer { .. } => "helper-no-answer",
            },
        }
    }
}

/// The helper next to the running executable (how the daemon finds it).
pub fn beside_current_exe() -> Result<PathBuf, HelperError> {
    std::env::current_exe()
        .map(|exe| exe.with_file_name(HELPER))
        .map_err(|e| HelperError::Locate(e.to_string()))
}

/// Runs `helper ARGS` with `request` (JSON) on stdin and parses its stdout as `A`; an error
/// names the helper and says what went wrong (could not start, no answer in `limit`, exited
/// without an answer: then with its stderr).
pub async fn run<A: serde::de::DeserializeOwned>(
    helper: &Path,
    args: &[&str],
    request: &impl serde::Serialize,
    limit: Duration,
) -> Result<A, HelperError> {
    use tokio::io::AsyncWriteExt as _;
    let fail = |failure: RunFailure| HelperError::Run {
        helper: helper.to_path_buf(),
        failure,
    };
    let input = serde_json::to_vec(request).map_err(|e| fail(RunFailure::Encode(e.to_string())))?;
    let mut child = tokio::process::Command::new(helper)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(RunFailure::Spawn(e.to_string())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&input)
            .await
            .map_err(|e| fail(RunFailure::Write(e.to_string())))?;
    }
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| fail(RunFailure::Timeout(limit.as_secs())))?
        .map_err(|e| fail(RunFailure::Wait(e.to_string())))?;
    match serde_json::from_slice::<A>(&out.stdout) {
        Ok(answer) if out.status.success() => Ok(answer),
        _ => Err(fail(RunFailure::NoAnswer {
            status: out.status.to_string(),
            stderr: crate::text::one_line_reason(&String::from_utf8_lossy(&out.stderr)),
        })),
    }
}
