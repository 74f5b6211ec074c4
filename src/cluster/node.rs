//! The Kubernetes client: this node's Node object (watch, merge patch) and its Events.
//!
//! An edge over kube-rs: the watcher resumes from resourceVersion and relists on 410 Gone; this
//! module only narrows it to one node and to annotations.
//!
//! Retries are not left to kube-rs' client layer (its default retries 429/503/504 up to 15 times
//! inside one call, starting 5 ms apart): the watch has the watcher's own backoff, and a failed
//! patch comes back at once as a [`PatchError`] so the agent can retry the *latest* status on its
//! own schedule, honouring `Retry-After`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};

/// The field manager streamd patches as.
pub const FIELD_MANAGER: &str = "streamd";
/// Namespace of node Events (where the kubelet posts them too).
const EVENT_NAMESPACE: &str = "default";
/// Longest wait for the answer to a patch: an API server that hangs must not hold the status back
/// (or the agent loop, which waits for the patch) for longer.
pub const PATCH_TIMEOUT: Duration = Duration::from_secs(15);
/// At most this much of an error body goes into a message.
const MAX_ERROR_TEXT: usize = 300;

/// Why a node patch failed, as far as sending it again is concerned.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The API server could not take the patch now: 408, 429 or 5xx, the connection was refused
    /// or cut, or no answer came within [`PATCH_TIMEOUT`]. Sending it again later can work, but
    /// not before `retry_after` when the server named one.
    #[error("{message}")]
    Transient {
        /// What happened.
        message: String,
        /// The HTTP status, if the server answered at all.
        status: Option<u16>,
        /// The server's `Retry-After` (header, else the Status' `retryAfterSeconds`).
        retry_after: Option<Duration>,
    },
    /// The API server refused this patch (401, 403, 404, 422, …): sending it again cannot help
    /// until something else changes (RBAC, credentials, the Node object).
    #[error("the API server rejected the patch with {status}: {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// The patch request could not be built (an invalid node name).
    #[error("building the patch request: {0}")]
    Build(#[from] kube::core::request::Error),
}

impl PatchError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            PatchError::Transient { .. } => "patch-transient",
            PatchError::Rejected { .. } => "patch-rejected",
            PatchError::Build(_) => "patch-build",
        }
    }

    /// Whether the same patch may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, PatchError::Transient { .. })
    }

    /// How long the server asked the client to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            PatchError::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            PatchError::Transient { status, .. } => *status,
            PatchError::Rejected { status, .. } => Some(*status),
            PatchError::Build(_) => None,
        }
    }

    /// Classifies an error answer from its status, `Retry-After` header and body.
    fn from_answer(status: u16, retry_after_header: Option<&str>, body: &[u8]) -> PatchError {
        // The body is usually a Status; proxies and the flow-control filter answer plain text.
        let parsed = serde_json::from_slice::<kube::core::Status>(body).ok();
        let message = match &parsed {
            Some(st) if !st.message.is_empty() => st.message.clone(),
            _ => String::from_utf8_lossy(body).trim().to_string(),
        };
        let message: String = message.chars().take(MAX_ERROR_TEXT).collect();
        // kube-apiserver sends delta-seconds; an HTTP-date is not used by it and falls back to
        // the client's own backoff.
        let retry_after = retry_after_header
            .and_then(|v| v.trim().parse::<u64>().ok())
            .or_else(|| {
                let secs = parsed?.details?.retry_after_seconds;
                (secs > 0).then_some(u64::from(secs))
            })
            .map(Duration::from_secs);
        if status == 408 || status == 429 || status >= 500 {
            PatchError::Transient {
                message: format!("the API server answered {status}: {message}"),
                status: Some(status),
                retry_after,
            }
        } else {
            PatchError::Rejected { status, message }
        }
    }
}

/// `e` and its sources, `outer: inner: …`, as anyhow prints them.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// What the node watch yields.
#[derive(Debug, Clone)]
pub enum NodeUpdate {
    /// The node's annotations after a change (or after a relist).
    Annotations(BTreeMap<String, String>),
    /// The Node object was deleted.
    Deleted,
    /// A (re)list found no Node of this name.
    Absent,
    /// The watch failed; kube-rs retries with backoff.
    Error {
        /// What failed.
        message: String,
        /// The API server answered 401: the credentials may have been rotated.
        unauthorized: bool,
    },
}

/// Whether the API server refused the watch's credentials (401).
fn is_unauthorized(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => {
            matches!(k, kube::Error::Api(s) if s.code == 401)
        }
        watcher::Error::WatchError(s) => s.code == 401,
        watcher::Error::NoResourceVersion => false,
    }
}

/// The kubeconfig's bytes and those of every file its current context names (CA bundle, client
/// certificate and key, token file), in a fixed order.
fn read_sources(kubeconfig: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CredentialsError> {
    let read = |path: &Path| match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(CredentialsError::Missing(path.to_path_buf()))
        }
        Err(e) => Err(CredentialsError::Invalid(format!(
            "reading {}: {e}",
            path.display()
        ))),
    };
    let mut sources = vec![(kubeconfig.to_path_buf(), read(kubeconfig)?)];
    // Relative paths in it are resolved against its directory by `read_from`.
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| {
        CredentialsError::Invalid(format!("reading kubeconfig {}: {e}", kubeconfig.display()))
    })?;
    let context = kc
        .current_context
        .as_ref()
        .and_then(|name| kc.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref());
    let cluster = context
        .and_then(|c| kc.clusters.iter().find(|n| n.name == c.cluster))
        .and_then(|n| n.cluster.as_ref());
    let user = context
        .and_then(|c| c.user.as_ref())
        .and_then(|u| kc.auth_infos.iter().find(|n| &n.name == u))
        .and_then(|n| n.auth_info.as_ref());
    let files = [
        cluster.and_then(|c| c.certificate_authority.as_ref()),
        user.and_then(|u| u.client_certificate.as_ref()),
        user.and_then(|u| u.client_key.as_ref()),
        user.and_then(|u| u.token_file.as_ref()),
    ];
    for f in files.into_iter().flatten() {
        let path = PathBuf::from(f);
        let bytes = read(&path)?;
        sources.push((path, bytes));
    }
    Ok(sources)
}

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Progress.
    Normal,
    /// Something needs attention.
    Warning,
}

/// One watch event as the agent sees it; `listed` tracks whether the current (re)list found the
/// node, so a list without it is reported as [`NodeUpdate::Absent`].
fn to_update(
    ev: Result<watcher::Event<Node>, watcher::Error>,
    uid: &OnceLock<String>,
    listed: &mut bool,
) -> Option<NodeUpdate> {
    match ev {
        Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
            *listed = true;
            if let Some(u) = &n.metadata.uid {
                let _ = uid.set(u.clone());
            }
            Some(NodeUpdate::Annotations(
                n.metadata.annotations.unwrap_or_default(),
            ))
        }
        Ok(watcher::Event::Delete(_)) => Some(NodeUpdate::Deleted),
        Ok(watcher::Event::Init) => {
            *listed = false;
            None
        }
        Ok(watcher::Event::InitDone) => (!*listed).then_some(NodeUpdate::Absent),
        Err(e) => Some(NodeUpdate::Error {
            unauthorized: is_unauthorized(&e),
            message: e.to_string(),
        }),
    }
}

/// Client for one node.
///
/// The credentials (the kubeconfig and the files it names: the CA bundle, the client certificate
/// and key, a token file) are loaded by [`NodeClient::load`], which the agent calls at start, every
/// [`CREDENTIALS_CHECK`] and after a 401: the kubelet rotates its client certificate
/// (`kubelet-client-current.pem`) and kube-rs reads it only when a client is built, so a changed
/// file means a new client. Until the first load succeeds every call fails with "no credentials".
#[derive(Clone)]
pub struct NodeClient {
    kubeconfig: PathBuf,
    name: String,
    /// The node's uid, learnt from the watch; Events carry it so `kubectl describe node`
    /// shows them.
    uid: Arc<OnceLock<String>>,
    loaded: Arc<RwLock<Option<Loaded>>>,
}

// By hand: the loaded credentials must never reach a log line.
impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("name", &self.name)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// A client built from one version of the credential files.
struct Loaded {
    client: kube::Client,
    /// The files' contents it was built from, to tell a rotation from an unchanged file.
    sources: Vec<(PathBuf, Vec<u8>)>,
}

/// How often the agent looks at the credential files while it has a client.
pub const CREDENTIALS_CHECK: Duration = Duration::from_secs(60);

/// Why the credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The kubeconfig, or a file it names, does not exist (yet): a new node before its kubelet
    /// got its client certificate, for example.
    #[error("{} does not exist yet", .0.display())]
    Missing(PathBuf),
    /// The files exist but do not make a client.
    #[error("{0}")]
    Invalid(String),
}

impl CredentialsError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CredentialsError::Missing(_) => "credentials-missing",
            CredentialsError::Invalid(_) => "credentials-invalid",
        }
    }
}

impl NodeClient {
    /// A client for `node` whose credentials come from `kubeconfig` once [`Self::load`]
    /// succeeds; reads nothing yet.
    pub fn unloaded(kubeconfig: &Path, node: &str) -> Self {
        NodeClient {
            kubeconfig: kubeconfig.to_path_buf(),
            name: node.to_string(),
            uid: Arc::default(),
            loaded: Arc::default(),
        }
    }

    /// Reads the kubeconfig (client certificates and bearer tokens both work) and builds a client.
    /// kube-rs' built-in request retries are off (see the module documentation).
    pub async fn new(kubeconfig: &Path, node: &str) -> anyhow::Result<Self> {
        let client = Self::unloaded(kubeconfig, node);
        client.load().await?;
        Ok(client)
    }

    /// (Re)builds the client when the credential files differ from those the current client was
    /// built from; `Ok(true)` when a new client was built (watches must then be started again).
    pub async fn load(&self) -> Result<bool, CredentialsError> {
        let sources = read_sources(&self.kubeconfig)?;
        let unchanged = self
            .loaded
            .read()
            .map_err(|_| CredentialsError::Invalid("credential lock poisoned".into()))?
            .as_ref()
            .is_some_and(|l| l.sources == sources);
        if unchanged {
            return Ok(false);
        }
        let shown = self.kubeconfig.display();
        let kc = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| CredentialsError::Invalid(format!("reading kubeconfig {shown}: {e}")))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| CredentialsError::Invalid(format!("loading kubeconfig {shown}: {e}")))?;
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| {
            CredentialsError::Invalid(format!("building the Kubernetes client from {shown}: {e}"))
        })?;
        let mut slot = self
            .loaded
            .write()
            .map_err(|_| CredentialsError::Invalid("credential lock poisoned".into()))?;
        *slot = Some(Loaded { client, sources });
        Ok(true)
    }

    /// The current client, once credentials are loaded (also for watches of other objects,
    /// e.g. [`crate::cluster::streams::watch`]).
    pub fn client(&self) -> Option<kube::Client> {
        self.loaded
            .read()
            .ok()
            .and_then(|l| l.as_ref().map(|l| l.client.clone()))
    }

    fn nodes(&self) -> Option<Api<Node>> {
        self.client().map(Api::all)
    }

    /// The node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Watches only this node (field selector), resuming from resourceVersion.
    ///
    /// After a failed list or watch the stream pauses before trying again: kube-rs'
    /// `default_backoff` (as client-go's reflector) waits 0.8 s doubling to 30 s, each wait
    /// stretched by a random 0–100 % (so never 60 s or more), and starts over after a success or
    /// 120 s without failures. A watch the server ends cleanly is resumed at once.
    ///
    /// `None` until credentials are loaded; a reload needs a new watch.
    pub fn watch(&self) -> Option<impl Stream<Item = NodeUpdate> + Send + 'static> {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let uid = self.uid.clone();
        let mut listed = false;
        Some(
            watcher(self.nodes()?, cfg)
                .default_backoff()
                .filter_map(move |ev| std::future::ready(to_update(ev, &uid, &mut listed))),
        )
    }

    /// Merge-patches the node once (no retries, at most [`PATCH_TIMEOUT`]) and returns its
    /// annotations afterwards.
    pub async fn patch(
        &self,
        patch: &serde_json::Value,
    ) -> Result<BTreeMap<String, String>, PatchError> {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        let url = Node::url_path(&(), None);
        let req = kube::core::Request::new(url).patch(&self.name, &params, &Patch::Merge(patch))?;
        // Sent raw rather than through `Api::patch`, which drops the response headers and so
        // `Retry-After`.
        let client = self.client().ok_or_else(|| PatchError::Transient {
            message: "no credentials loaded yet".into(),
            status: None,
            retry_after: None,
        })?;
        let exchange = async {
            let res =
                client
                    .send(req.map(Body::from))
                    .await
                    .map_err(|e| PatchError::Transient {
                        message: format!("cannot reach the API server: {}", error_chain(&e)),
                        status: None,
                        retry_after: None,
                    })?;
            let status = res.status().as_u16();
            let retry_after = res
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body =
                res.into_body()
                    .collect_bytes()
                    .await
                    .map_err(|e| PatchError::Transient {
                        message: format!("reading the API server's answer: {}", error_chain(&e)),
                        status: Some(status),
                        retry_after: None,
                    })?;
            if !(200..300).contains(&status) {
                return Err(PatchError::from_answer(
                    status,
                    retry_after.as_deref(),
                    &body,
                ));
            }
            let node: Node = serde_json::from_slice(&body).map_err(|e| PatchError::Transient {
                message: format!("the API server's answer is not a Node: {e}"),
                status: Some(status),
                retry_after: None,
            })?;
            Ok(node.metadata.annotations.unwrap_or_default())
        };
        tokio::time::timeout(PATCH_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(PatchError::Transient {
                    message: format!(
                        "no answer from the API server within {} s",
                        PATCH_TIMEOUT.as_secs()
                    ),
                    status: None,
                    retry_after: None,
                })
            })
    }

    /// Posts an Event about this node.
    pub async fn event(&self, kind: EventType, reason: &str, message: &str) -> anyhow::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = format!("{}.{:x}", self.name, now.as_nanosecond());
        let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let ev: Event = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": EVENT_NAMESPACE },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.name,
                "uid": self.uid.get(),
            },
            "reason": reason,
            "message": crate::text::one_line_reason(message),
            "type": match kind { EventType::Normal => "Normal", EventType::Warning => "Warning" },
            "source": { "component": FIELD_MANAGER, "host": self.name },
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": self.name,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
        }))
        .context("building an event")?;
        let client = self.client().context("no credentials loaded yet")?;
        Api::<Event>::namespaced(client, EVENT_NAMESPACE)
            .create(&PostParams::default(), &ev)
            .await
            .with_context(|| format!("posting event {reason}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_transient_or_rejected() {
        let status_body = |code: u16, retry: u32| {
            serde_json::to_vec(&serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": format!("m{code}"), "reason": "R", "code": code,
                "details": { "retryAfterSeconds": retry },
            }))
            .unwrap()
        };
        /// (status, Retry-After header, body, transient, retry_after seconds, message contains)
        type Case<'a> = (u16, Option<&'a str>, Vec<u8>, bool, Option<u64>, &'a str);
        let cases: &[Case] = &[
            (429, Some("3"), status_body(429, 0), true, Some(3), "m429"),
            (429, None, status_body(429, 7), true, Some(7), "m429"),
            (
                429,
                Some(" 2 "),
                b"Too many requests, please try again later.".to_vec(),
                true,
                Some(2),
                "Too many",
            ),
            (
                429,
                Some("Wed, 21 Oct 2015 07:28:00 GMT"),
                Vec::new(),
                true,
                None,
                "429",
            ),
            (503, Some("5"), status_body(503, 0), true, Some(5), "m503"),
            (500, None, status_body(500, 0), true, None, "m500"),
            (
                504,
                None,
                b"<html>gateway</html>".to_vec(),
                true,
                None,
                "gateway",
            ),
            (408, None, Vec::new(), true, None, "408"),
            (403, None, status_body(403, 0), false, None, "m403"),
            (422, Some("9"), status_body(422, 0), false, None, "m422"),
            (404, None, status_body(404, 0), false, None, "m404"),
            (401, None, Vec::new(), false, None, ""),
        ];
        for (status, header, body, transient, retry, text) in cases {
            let e = PatchError::from_answer(*status, *header, body);
            assert_eq!(e.is_transient(), *transient, "{status}: {e}");
            assert_eq!(
                e.retry_after(),
                retry.map(Duration::from_secs),
                "{status}: {e}"
            );
            assert_eq!(e.status(), Some(*status));
            assert!(e.to_string().contains(text), "{status}: {e}");
        }
    }

    #[test]
    fn long_error_bodies_are_cut() {
        let body = "x".repeat(10_000);
        let e = PatchError::from_answer(502, None, body.as_bytes());
        assert!(
            e.to_string().len() < MAX_ERROR_TEXT + 100,
            "{}",
            e.to_string().len()
        );
    }

    /// Pins what `watch` documents about kube-rs' `default_backoff`: jittered, and capped below
    /// 60 s however long the outage.
    #[test]
    fn watch_backoff_is_jittered_and_capped() {
        let run = || -> Vec<Duration> { watcher::DefaultBackoff::default().take(40).collect() };
        let a = run();
        assert!(
            a[0] >= Duration::from_millis(800) && a[0] < Duration::from_millis(1600),
            "{a:?}"
        );
        assert!(a.iter().all(|d| *d < Duration::from_secs(60)), "{a:?}");
        assert!(a[39] >= Duration::from_secs(30), "{a:?}");
        let total: Duration = a.iter().sum();
        println!("watch backoff: first {:?}, 40 retries span {total:?}", a[0]);
        let b = run();
        assert_ne!(a, b, "two backoffs draw different jitter");
    }
}
