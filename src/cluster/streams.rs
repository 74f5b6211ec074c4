//! Stream resolution: the cluster's `OSImageStream` named `cluster`
//! (`machineconfiguration.openshift.io`, `v1` or `v1alpha1`, cluster scoped) lists each
//! stream's digest-pinned OS and extensions images in `status.availableStreams`. With
//! `resolve-streams = true` a node that names only `desired-stream` gets that stream's images
//! from there.
//!
//! [`resolve`], [`served_version`], [`catalog_refresh`] and [`spread_delay`] are pure (table
//! tests below); [`watch`] discovers the served version, follows the object and yields a
//! [`Catalog`] whenever what streamd reads of it changes.

use std::borrow::Cow;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList, ObjectMeta};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::cluster::protocol::{self, DESIRED_STREAM, Inputs, ProtocolError};
use crate::image::reference::{ImageRef, ImageRefError};

/// API group of `OSImageStream`.
pub const GROUP: &str = "machineconfiguration.openshift.io";
/// The API versions of `OSImageStream` streamd reads, preferred first. openshift/api serves
/// exactly one of them: `v1alpha1` on 4.21 (TechPreviewNoUpgrade, DevPreviewNoUpgrade,
/// CustomNoUpgrade) and 4.22 (the same feature sets), `v1` from 4.23 (Default on self-managed
/// clusters), and none before 4.21 (payload-manifests/crds/0000_80_machine-config_01_osimagestreams*.crd.yaml
/// on each release branch).
pub const VERSIONS: [&str; 2] = ["v1", "v1alpha1"];
/// Kind.
pub const KIND: &str = "OSImageStream";
/// Resource (plural) name.
pub const PLURAL: &str = "osimagestreams";
/// Name of the singleton object.
pub const NAME: &str = "cluster";

/// The `OSImageStream` object, reduced to what streamd reads; unknown fields are ignored, as
/// a Kubernetes client must (the API grows).
#[derive(Debug, Clone, Deserialize)]
pub struct OsImageStream {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Absent until the machine-config operator has reconciled the object.
    #[serde(default)]
    pub status: Option<OsImageStreamStatus>,
}

/// `status` of an `OSImageStream`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsImageStreamStatus {
    /// The streams the cluster offers.
    #[serde(default)]
    pub available_streams: Vec<StreamImages>,
}

/// One entry of `status.availableStreams`, verbatim (validated only when resolved).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamImages {
    /// Stream name, e.g. `rhel-10`.
    pub name: String,
    /// Digest-pinned OS image.
    #[serde(default)]
    pub os_image: String,
    /// Digest-pinned extensions image; empty when absent.
    #[serde(default)]
    pub os_extensions_image: String,
    /// The object's [`VERSION_ANNOTATION`]: the machine-config operator build that wrote it,
    /// the same on every entry; `None` without one. Not a field of the entry: set by
    /// [`Catalog::from_object`].
    #[serde(skip)]
    pub written_by: Option<String>,
}

/// The annotation the machine-config operator puts on the OSImageStream it writes: its build
/// (`version.Hash`), which its render controller compares with its own on 4.22 and 4.23
/// (openshift/machine-config-operator:pkg/osimagestream/osimagestream.go; the guard:
/// pkg/controller/render/render_controller.go `getOSImageStreamForPool`).
pub const VERSION_ANNOTATION: &str = "machineconfiguration.openshift.io/release-image-version";

/// The object's shape is the same in `v1alpha1` and `v1` for every field streamd reads, so one
/// type serves both; the version is the one discovery found served.
impl kube::Resource for OsImageStream {
    type DynamicType = &'static str;
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &Self::DynamicType) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }

    fn group(_: &Self::DynamicType) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(version: &Self::DynamicType) -> Cow<'_, str> {
        Cow::Borrowed(version)
    }

    fn plural(_: &Self::DynamicType) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What streamd knows of the cluster's streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catalog {
    /// The `cluster` object does not exist (or was deleted).
    Missing,
    /// The object exists but has no `status.availableStreams` yet.
    Unreconciled,
    /// The streams in `status.availableStreams`, in the object's order.
    Available(Vec<StreamImages>),
    /// The cluster serves no `OSImageStream` API: it offers no OS image streams (every
    /// OpenShift cluster before 4.23 on the Default feature set).
    NotServed,
    /// The cluster refuses the node's identity (403); the reason says so.
    Unreadable(String),
}

impl Catalog {
    /// The catalog an object (or its absence) describes.
    pub fn from_object(object: Option<&OsImageStream>) -> Catalog {
        match object.and_then(|o| o.status.as_ref()) {
            None if object.is_none() => Catalog::Missing,
            Some(s) if !s.available_streams.is_empty() => {
                let written_by = object
                    .and_then(|o| o.metadata.annotations.as_ref())
                    .and_then(|a| a.get(VERSION_ANNOTATION))
                    .cloned();
                Catalog::Available(
                    s.available_streams
                        .iter()
                        .map(|e| StreamImages {
                            written_by: written_by.clone(),
                            ..e.clone()
                        })
                        .collect(),
                )
            }
            _ => Catalog::Unreconciled,
        }
    }
}

/// Why a request could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The watch has not delivered the object (or its absence) yet.
    #[error("waiting for the first read of OSImageStream {NAME:?}")]
    Pending,
    /// There is no `OSImageStream` named `cluster`.
    #[error(
        "OSImageStream {NAME:?} does not exist; set desired-os-image (off OpenShift, whoever publishes the streams creates it; on OpenShift the machine-config operator does)"
    )]
    Missing,
    /// The object has no `status.availableStreams` yet.
    #[error("OSImageStream {NAME:?} has no status.availableStreams yet (not reconciled)")]
    Unreconciled,
    /// The cluster serves no `OSImageStream` API.
    #[error("{}; set desired-os-image on the node instead", not_served())]
    NotServed,
    /// The object cannot be read (forbidden).
    #[error("{0}")]
    Unreadable(String),
    /// The node's stream name is malformed.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The node names a stream the cluster does not offer.
    #[error("stream {} is not available; available streams: {}", crate::text::quote(.name), quote_all(.available))]
    UnknownStream {
        /// The requested name.
        name: String,
        /// The names in `status.availableStreams`.
        available: Vec<String>,
    },
    /// The stream's image is not a valid digest-pinned reference.
    #[error("OSImageStream {NAME:?} stream {} {field}: {source}", crate::text::quote(.stream))]
    BadImage {
        /// The stream name.
        stream: String,
        /// `osImage` or `osExtensionsImage`.
        field: &'static str,
        /// What is wrong with it.
        source: ImageRefError,
    },
}

/// The cluster's stream names, each quoted, so a name with a newline or control character
/// cannot break the one-line reason it ends up in.
fn quote_all(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names
        .iter()
        .map(|n| crate::text::quote(n))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ResolveError {
    /// `true` when the request itself cannot be served as given (state `Refused`); `false` when
    /// the cluster's object is not ready and the request should wait for it.
    pub fn refuses(&self) -> bool {
        match self {
            ResolveError::Protocol(_)
            | ResolveError::UnknownStream { .. }
            | ResolveError::BadImage { .. } => true,
            ResolveError::Pending
            | ResolveError::Missing
            | ResolveError::Unreconciled
            | ResolveError::NotServed
            | ResolveError::Unreadable(_) => false,
        }
    }
}

/// The request the node makes once streams are resolved.
///
/// Only a node naming `desired-stream` and neither image is filled in from `catalog` (`None`:
/// not read yet); any other input is returned unchanged, so an explicit `desired-os-image`
/// always wins and a half-given request still gets the protocol's own error from
/// [`Inputs::desired`]. The filled-in images are validated here with the same parser as
/// annotation images, so a bad catalog entry names the OSImageStream field, not an annotation.
pub fn resolve(inputs: &Inputs, catalog: Option<&Catalog>) -> Result<Inputs, ResolveError> {
    let stream = match (&inputs.stream, &inputs.os_image, &inputs.extensions_image) {
        (Some(stream), None, None) => stream,
        _ => return Ok(inputs.clone()),
    };
    protocol::validate_stream(stream).map_err(|e| ProtocolError {
        key: DESIRED_STREAM,
        problem: e.to_string(),
    })?;
    let entries = match catalog {
        None => return Err(ResolveError::Pending),
        Some(Catalog::Missing) => return Err(ResolveError::Missing),
        Some(Catalog::Unreconciled) => return Err(ResolveError::Unreconciled),
        Some(Catalog::NotServed) => return Err(ResolveError::NotServed),
        Some(Catalog::Unreadable(reason)) => return Err(ResolveError::Unreadable(reason.clone())),
        Some(Catalog::Available(entries)) => entries,
    };
    let Some(entry) = entries.iter().find(|e| e.name == *stream) else {
        return Err(ResolveError::UnknownStream {
            name: stream.clone(),
            available: entries.iter().map(|e| e.name.clone()).collect(),
        });
    };
    let check = |field: &'static str, value: &str| {
        value
            .parse::<ImageRef>()
            .map(|_| value.to_string())
            .map_err(|source| ResolveError::BadImage {
                stream: stream.clone(),
                field,
                source,
            })
    };
    let os_image = check("osImage", &entry.os_image)?;
    // `osExtensionsImage` is required by the API, but the node protocol allows none: an
    // absent (omitempty) value means no extensions rather than a guess.
    let extensions_image = match entry.os_extensions_image.as_str() {
        "" => None,
        value => Some(check("osExtensionsImage", value)?),
    };
    Ok(Inputs {
        stream: Some(stream.clone()),
        os_image: Some(os_image),
        extensions_image,
        reboot_approved: inputs.reboot_approved.clone(),
    })
}

/// Whether a newly resolved request differs from the previous one only because the cluster's
/// catalog changed (the node's annotations are the same): a digest refresh of the node's
/// stream, which every node of that stream sees at once. `previous` is the (annotations,
/// resolved request) pair acted on last.
pub fn catalog_refresh(
    previous: Option<(&Inputs, &Inputs)>,
    raw: &Inputs,
    resolved: &Inputs,
) -> bool {
    previous.is_some_and(|(prev_raw, prev_resolved)| prev_raw == raw && prev_resolved != resolved)
}

/// This node's share of `spread`: a fraction of it fixed by the node's name and the request,
/// so a fleet's nodes start their pulls spread evenly over `spread`, and a restart of streamd
/// does not draw a new delay.
pub fn spread_delay(spread: Duration, node: &str, resolved: &Inputs) -> Duration {
    share_of(
        spread,
        &[
            node,
            resolved.os_image.as_deref().unwrap_or_default(),
            resolved.extensions_image.as_deref().unwrap_or_default(),
        ],
    )
}

/// A fraction of `spread` fixed by `parts` (the node's name first, then what it is for), so
/// a fleet's nodes spread evenly over it and a restart draws the same share.
pub fn share_of(spread: Duration, parts: &[&str]) -> Duration {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // 53 bits are all an f64 holds; the fraction is in [0, 1).
    let fraction = (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64;
    spread.mul_f64(fraction)
}

/// The first of [`VERSIONS`] whose discovery document (`GET /apis/<group>/<version>`) lists
/// `osimagestreams`. A group can be served without it (the machine-config operator's other
/// types on OpenShift before 4.21, or without the feature set).
pub fn served_version(lists: &[APIResourceList]) -> Option<&'static str> {
    VERSIONS.into_iter().find(|v| {
        lists.iter().any(|l| {
            l.group_version == format!("{GROUP}/{v}")
                && l.resources.iter().any(|r| r.name == PLURAL)
        })
    })
}

/// The versions of [`GROUP`] the group list names, among [`VERSIONS`].
fn listed_versions(groups: &APIGroupList) -> Vec<&'static str> {
    let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
        return Vec::new();
    };
    VERSIONS
        .into_iter()
        .filter(|v| group.versions.iter().any(|gv| gv.version == *v))
        .collect()
}

/// The reason reported when no version is served.
/// Why a cluster offers no streams: the `OSStreams` feature gate of openshift/api, per release
/// (docs/fidelity.md "OSImageStream per release").
pub fn not_served() -> String {
    format!(
        "the cluster serves no OSImageStream API ({PLURAL}.{GROUP} in {}): OpenShift serves v1 from 4.23 (on HyperShift only with a no-upgrade feature set) and v1alpha1 on 4.21 and 4.22 only with the TechPreviewNoUpgrade, DevPreviewNoUpgrade or CustomNoUpgrade (OSStreams gate) feature set",
        VERSIONS.join(" or ")
    )
}

/// How a request to the API failed, as far as the stream watch cares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// 404: the version (or the whole CRD) is not served (any more).
    NotServed,
    /// 403: the node's identity may not read the object.
    Forbidden(String),
    /// Anything else (connection, 5xx, 410): retried, the last catalog holds.
    Other(String),
}

fn classify(err: &kube::Error) -> Failure {
    match err {
        kube::Error::Api(s) if s.code == 404 => Failure::NotServed,
        kube::Error::Api(s) if s.code == 403 => Failure::Forbidden(s.message.clone()),
        other => Failure::Other(other.to_string()),
    }
}

fn classify_watch(err: &watcher::Error) -> Failure {
    match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => classify(e),
        other => Failure::Other(other.to_string()),
    }
}

fn forbidden(version: &str, message: &str) -> String {
    format!(
        "reading OSImageStream {NAME:?} ({GROUP}/{version}) is forbidden ({}); the node's identity needs get, list and watch on {PLURAL} (docs/deploy/rbac.yaml)",
        // The server's own words, kept to one bounded line.
        crate::text::one_line(message, 400)
    )
}

/// What the stream watch yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamsUpdate {
    /// The catalog changed (the first one after start is always delivered).
    Catalog(Catalog),
    /// A transient failure; it is retried with backoff and the last catalog still holds.
    Error(String),
}

/// Turns watcher events into catalog changes: a (re)list is reported once it is complete
/// (an empty list means the object is missing), and an unchanged catalog is not repeated.
#[derive(Debug, Default)]
struct Tracker {
    /// During a (re)list: the object listed so far.
    listing: Option<Option<OsImageStream>>,
    last: Option<Catalog>,
}

impl Tracker {
    fn on_event(&mut self, ev: watcher::Event<OsImageStream>) -> Option<StreamsUpdate> {
        let catalog = match ev {
            watcher::Event::Init => {
                self.listing = Some(None);
                return None;
            }
            watcher::Event::InitApply(o) => {
                self.listing = Some(Some(o));
                return None;
            }
            watcher::Event::InitDone => {
                Catalog::from_object(self.listing.take().flatten().as_ref())
            }
            watcher::Event::Apply(o) => Catalog::from_object(Some(&o)),
            watcher::Event::Delete(_) => Catalog::Missing,
        };
        self.report(catalog)
    }

    /// The update for `catalog`, unless it is the one reported last.
    fn report(&mut self, catalog: Catalog) -> Option<StreamsUpdate> {
        if self.last.as_ref() == Some(&catalog) {
            return None;
        }
        self.last = Some(catalog.clone());
        Some(StreamsUpdate::Catalog(catalog))
    }

    /// What a failure means: not served (`None`: discover again), forbidden (a catalog the
    /// node reports), anything else (retried).
    fn on_failure(&mut self, version: &str, failure: Failure) -> Option<StreamsUpdate> {
        match failure {
            Failure::NotServed => None,
            Failure::Forbidden(m) => self.report(Catalog::Unreadable(forbidden(version, &m))),
            Failure::Other(m) => Some(StreamsUpdate::Error(m)),
        }
    }
}

/// First delay before discovering the served version again; doubles up to [`REDISCOVER_MAX`].
const REDISCOVER_MIN: Duration = Duration::from_secs(1);
/// Longest delay between discoveries.
const REDISCOVER_MAX: Duration = Duration::from_secs(300);

/// Discovers which version of `OSImageStream` the cluster serves (`None`: none).
async fn discover(client: &kube::Client) -> Result<Option<&'static str>, kube::Error> {
    let groups = client.list_api_groups().await?;
    let mut lists = Vec::new();
    for v in listed_versions(&groups) {
        match client
            .list_api_group_resources(&format!("{GROUP}/{v}"))
            .await
        {
            Ok(list) => lists.push(list),
            // Removed between the two requests: as if not listed.
            Err(e) if classify(&e) == Failure::NotServed => {}
            Err(e) => return Err(e),
        }
    }
    Ok(served_version(&lists))
}

/// Watches the `OSImageStream` named `cluster` (field selector) in the version the cluster
/// serves, found by API discovery, resuming from resourceVersion and relisting on 410 Gone
/// like the node watch. A 404 (the version is no longer served, e.g. after an upgrade from
/// 4.22 to 4.23) discovers again; no served version is [`Catalog::NotServed`] and 403
/// [`Catalog::Unreadable`], so the node says why it cannot resolve.
///
/// The node identity needs `get`, `list` and `watch` on `osimagestreams` (docs/deploy/).
pub fn watch(client: kube::Client) -> impl Stream<Item = StreamsUpdate> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let closed = tx.clone();
    // Ends with the stream, also while the watch is quiet.
    tokio::spawn(async move {
        tokio::select! {
            () = follow(client, tx) => {}
            () = closed.closed() => {}
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|u| (u, rx)) })
}

/// The task behind [`watch`]; ends when the stream is dropped.
async fn follow(client: kube::Client, tx: tokio::sync::mpsc::Sender<StreamsUpdate>) {
    let mut tracker = Tracker::default();
    let mut backoff = Backoff::new(REDISCOVER_MIN, REDISCOVER_MAX);
    loop {
        let update = match discover(&client).await {
            Ok(Some(version)) => {
                info!(version, "reading osimagestreams");
                let api: Api<OsImageStream> = Api::all_with(client.clone(), &version);
                let cfg = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
                let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
                while let Some(ev) = events.next().await {
                    let update = match ev {
                        Ok(ev) => {
                            backoff.reset();
                            tracker.on_event(ev)
                        }
                        Err(e) => match classify_watch(&e) {
                            Failure::NotServed => {
                                warn!(
                                    version,
                                    "osimagestreams no longer served in this version; discovering again"
                                );
                                break;
                            }
                            failure => tracker.on_failure(version, failure),
                        },
                    };
                    if let Some(u) = update
                        && tx.send(u).await.is_err()
                    {
                        return;
                    }
                }
                None
            }
            Ok(None) => tracker.report(Catalog::NotServed),
            Err(e) => tracker.on_failure(VERSIONS[0], classify(&e)),
        };
        if let Some(u) = update
            && tx.send(u).await.is_err()
        {
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D9: &str = "sha256:9999999999999999999999999999999999999999999999999999999999999999";
    const D10: &str = "sha256:1010101010101010101010101010101010101010101010101010101010101010";
    const DX: &str = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

    fn img(d: &str) -> String {
        format!("quay.io/openshift-release-dev/rhcos@{d}")
    }

    fn entry(name: &str, os: &str, ext: &str) -> StreamImages {
        StreamImages {
            name: name.into(),
            os_image: os.into(),
            os_extensions_image: ext.into(),
            written_by: None,
        }
    }

    fn catalog() -> Catalog {
        Catalog::Available(vec![
            entry("rhel-9", &img(D9), &img(DX)),
            entry("rhel-10", &img(D10), ""),
            entry("tagged", "quay.io/x/rhcos:latest", ""),
            entry("bad-ext", &img(D10), "not an image"),
        ])
    }

    fn inputs(stream: Option<&str>, os: Option<&str>, ext: Option<&str>) -> Inputs {
        Inputs {
            stream: stream.map(String::from),
            os_image: os.map(String::from),
            extensions_image: ext.map(String::from),
            reboot_approved: Some("token-1".into()),
        }
    }

    /// (case, inputs, catalog, the expected inputs or a fragment of the expected error).
    type Case = (
        &'static str,
        Inputs,
        Option<Catalog>,
        Result<Inputs, &'static str>,
    );

    /// Requests that resolve, or are left as they are.
    fn resolving_rows() -> Vec<Case> {
        let explicit = img(DX);
        vec![
            (
                "stream only: both images filled in",
                inputs(Some("rhel-9"), None, None),
                Some(catalog()),
                Ok(inputs(Some("rhel-9"), Some(&img(D9)), Some(&img(DX)))),
            ),
            (
                "stream without extensions image",
                inputs(Some("rhel-10"), None, None),
                Some(catalog()),
                Ok(inputs(Some("rhel-10"), Some(&img(D10)), None)),
            ),
            (
                "explicit os image wins, catalog unread",
                inputs(Some("rhel-10"), Some(&explicit), None),
                None,
                Ok(inputs(Some("rhel-10"), Some(&explicit), None)),
            ),
            (
                "explicit os image wins over the catalog",
                inputs(Some("rhel-9"), Some(&explicit), None),
                Some(catalog()),
                Ok(inputs(Some("rhel-9"), Some(&explicit), None)),
            ),
            (
                "no request stays no request",
                inputs(None, None, None),
                Some(Catalog::Missing),
                Ok(inputs(None, None, None)),
            ),
            (
                "stream plus extensions only is not resolved",
                inputs(Some("rhel-9"), None, Some(&explicit)),
                Some(catalog()),
                Ok(inputs(Some("rhel-9"), None, Some(&explicit))),
            ),
        ]
    }

    /// Requests the catalog refuses, each with the reason's fragment.
    fn refusing_rows() -> Vec<Case> {
        let newline = Catalog::Available(vec![entry("a\nb", &img(D9), "")]);
        vec![
            (
                "unknown stream lists the available ones",
                inputs(Some("rhel-11"), None, None),
                Some(catalog()),
                Err(
                    "stream \"rhel-11\" is not available; available streams: \"rhel-9\", \"rhel-10\", \"tagged\", \"bad-ext\"",
                ),
            ),
            (
                "a cluster stream name with a newline stays on one line",
                inputs(Some("rhel-11"), None, None),
                Some(newline),
                Err("available streams: \"a\\nb\""),
            ),
            (
                "an empty catalog says so",
                inputs(Some("rhel-11"), None, None),
                Some(Catalog::Available(vec![])),
                Err("available streams: none"),
            ),
            (
                "malformed stream name",
                inputs(Some("RHEL 10"), None, None),
                Some(catalog()),
                Err(
                    "annotation osstream.openshift.io/desired-stream: \"RHEL 10\" is not an RFC 1123",
                ),
            ),
            (
                "tagged image in the catalog",
                inputs(Some("tagged"), None, None),
                Some(catalog()),
                Err(
                    "OSImageStream \"cluster\" stream \"tagged\" osImage: image reference \"quay.io/x/rhcos:latest\" is not pinned",
                ),
            ),
            (
                "bad extensions image in the catalog",
                inputs(Some("bad-ext"), None, None),
                Some(catalog()),
                Err("stream \"bad-ext\" osExtensionsImage: image reference contains whitespace"),
            ),
        ]
    }

    /// Requests that wait for a catalog that cannot be used yet.
    fn waiting_rows() -> Vec<Case> {
        vec![
            (
                "catalog not read yet",
                inputs(Some("rhel-9"), None, None),
                None,
                Err("waiting for the first read"),
            ),
            (
                "object missing",
                inputs(Some("rhel-9"), None, None),
                Some(Catalog::Missing),
                Err("OSImageStream \"cluster\" does not exist"),
            ),
            (
                "object without status",
                inputs(Some("rhel-9"), None, None),
                Some(Catalog::Unreconciled),
                Err("has no status.availableStreams yet"),
            ),
        ]
    }

    /// Every row of [`resolving_rows`], [`refusing_rows`] and [`waiting_rows`] resolves as it says.
    #[test]
    fn resolution_table() {
        let rows = [resolving_rows(), refusing_rows(), waiting_rows()];
        for (case, given, catalog, expected) in rows.into_iter().flatten() {
            let got = resolve(&given, catalog.as_ref());
            match (&got, expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, &want, "{case}"),
                (Err(err), Err(fragment)) => {
                    let msg = err.to_string();
                    assert!(msg.contains(fragment), "{case}: {msg:?} lacks {fragment:?}");
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn resolved_inputs_pass_the_protocol_validation() {
        let resolved =
            resolve(&inputs(Some("rhel-9"), None, None), Some(&catalog())).expect("resolves");
        let desired = resolved.desired().expect("valid").expect("a request");
        assert_eq!(desired.os_image.to_string(), img(D9));
        assert_eq!(
            desired.extensions_image.map(|i| i.to_string()),
            Some(img(DX))
        );
    }

    #[test]
    fn refusal_versus_waiting() {
        let refused = [
            resolve(&inputs(Some("nope"), None, None), Some(&catalog())),
            resolve(&inputs(Some("tagged"), None, None), Some(&catalog())),
            resolve(&inputs(Some("-x"), None, None), Some(&catalog())),
        ];
        for r in refused {
            assert!(r.as_ref().is_err_and(ResolveError::refuses), "{r:?}");
        }
        for c in [None, Some(&Catalog::Missing), Some(&Catalog::Unreconciled)] {
            let r = resolve(&inputs(Some("rhel-9"), None, None), c);
            assert!(r.as_ref().is_err_and(|e| !e.refuses()), "{r:?}");
        }
    }

    #[test]
    fn objects_parse_tolerating_unknown_fields() {
        let json = serde_json::json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "OSImageStream",
            "metadata": {"name": "cluster", "labels": {"openshift.io/operator-managed": ""}},
            "spec": {"defaultStream": "rhel-9"},
            "status": {
                "defaultStream": "rhel-9",
                "someFutureField": [1, 2],
                "availableStreams": [
                    {"name": "rhel-9", "osImage": img(D9), "osExtensionsImage": img(DX), "extra": true},
                    {"name": "rhel-10", "osImage": img(D10)},
                ],
            },
        });
        let obj: OsImageStream = serde_json::from_value(json).expect("parses");
        assert_eq!(
            Catalog::from_object(Some(&obj)),
            Catalog::Available(vec![
                entry("rhel-9", &img(D9), &img(DX)),
                entry("rhel-10", &img(D10), ""),
            ])
        );
        let bare: OsImageStream =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "cluster"}}))
                .expect("parses");
        assert_eq!(Catalog::from_object(Some(&bare)), Catalog::Unreconciled);
        let empty: OsImageStream = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "cluster"}, "status": {"availableStreams": []}}),
        )
        .expect("parses");
        assert_eq!(Catalog::from_object(Some(&empty)), Catalog::Unreconciled);
        assert_eq!(Catalog::from_object(None), Catalog::Missing);
        // The operator's build annotation is the object's, carried by every entry.
        let mut written: OsImageStream = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cluster", "annotations": {VERSION_ANNOTATION: "0a1b2c"}},
            "status": {"availableStreams": [{"name": "rhel-10", "osImage": img(D10)}]},
        }))
        .expect("parses");
        let Catalog::Available(e) = Catalog::from_object(Some(&written)) else {
            panic!("available");
        };
        assert_eq!(e[0].written_by.as_deref(), Some("0a1b2c"));
        written.metadata.annotations = None;
        assert_eq!(
            Catalog::from_object(Some(&written)),
            Catalog::Available(vec![entry("rhel-10", &img(D10), "")])
        );
    }

    fn object(digest: &str) -> OsImageStream {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cluster"},
            "status": {"availableStreams": [{"name": "rhel-10", "osImage": img(digest)}]},
        }))
        .expect("parses")
    }

    #[test]
    fn tracker_reports_complete_lists_and_only_changes() {
        let mut t = Tracker::default();
        let avail = |d: &str| {
            StreamsUpdate::Catalog(Catalog::Available(vec![entry("rhel-10", &img(d), "")]))
        };
        // A list with the object: reported once the list is complete.
        assert_eq!(t.on_event(watcher::Event::Init), None);
        assert_eq!(t.on_event(watcher::Event::InitApply(object(D9))), None);
        assert_eq!(t.on_event(watcher::Event::InitDone), Some(avail(D9)));
        // The same status again (a relist, a metadata-only change): nothing.
        assert_eq!(t.on_event(watcher::Event::Apply(object(D9))), None);
        assert_eq!(
            t.on_event(watcher::Event::Apply(object(D10))),
            Some(avail(D10))
        );
        assert_eq!(
            t.on_event(watcher::Event::Delete(object(D10))),
            Some(StreamsUpdate::Catalog(Catalog::Missing))
        );
        // A relist that finds nothing after the object came back: missing again.
        assert_eq!(
            t.on_event(watcher::Event::Apply(object(D9))),
            Some(avail(D9))
        );
        assert_eq!(t.on_event(watcher::Event::Init), None);
        assert_eq!(
            t.on_event(watcher::Event::InitDone),
            Some(StreamsUpdate::Catalog(Catalog::Missing))
        );
        // A 403 is reported once as a catalog the node shows; a 404 asks for discovery; the
        // rest is retried.
        let forbidden = t.on_failure("v1alpha1", Failure::Forbidden("nope".into()));
        match &forbidden {
            Some(StreamsUpdate::Catalog(Catalog::Unreadable(r))) => assert!(
                r.starts_with("reading OSImageStream \"cluster\" (machineconfiguration.openshift.io/v1alpha1) is forbidden (nope); "),
                "{r}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            t.on_failure("v1alpha1", Failure::Forbidden("nope".into())),
            None
        );
        assert_eq!(t.on_failure("v1", Failure::NotServed), None);
        assert_eq!(
            t.on_failure("v1", Failure::Other("reset".into())),
            Some(StreamsUpdate::Error("reset".into()))
        );
        // Readable again: the same catalog as before the refusal is news.
        assert_eq!(t.on_event(watcher::Event::Init), None);
        assert_eq!(t.on_event(watcher::Event::InitApply(object(D9))), None);
        assert_eq!(t.on_event(watcher::Event::InitDone), Some(avail(D9)));
    }

    #[test]
    fn failures_are_classified_by_status_code() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("m", "r")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(classify(&api(404)), Failure::NotServed);
        assert_eq!(classify(&api(403)), Failure::Forbidden("m".into()));
        assert!(matches!(classify(&api(500)), Failure::Other(_)));
        assert_eq!(
            classify_watch(&watcher::Error::InitialListFailed(api(404))),
            Failure::NotServed
        );
        assert!(matches!(
            classify_watch(&watcher::Error::NoResourceVersion),
            Failure::Other(_)
        ));
    }

    fn resource_list(group_version: &str, plurals: &[&str]) -> APIResourceList {
        serde_json::from_value(serde_json::json!({
            "groupVersion": group_version,
            "resources": plurals.iter().map(|p| serde_json::json!({
                "name": p, "singularName": "", "namespaced": false, "kind": "K", "verbs": ["get"],
            })).collect::<Vec<_>>(),
        }))
        .expect("parses")
    }

    #[test]
    fn served_version_table() {
        let v1 = resource_list(
            "machineconfiguration.openshift.io/v1",
            &["machineconfigs", "osimagestreams", "osimagestreams/status"],
        );
        let v1_without = resource_list(
            "machineconfiguration.openshift.io/v1",
            &["machineconfigs", "machineconfigpools"],
        );
        let alpha = resource_list(
            "machineconfiguration.openshift.io/v1alpha1",
            &["osimagestreams"],
        );
        let other_group = resource_list("example.com/v1", &["osimagestreams"]);
        let cases: Vec<(&str, Vec<APIResourceList>, Option<&str>)> = vec![
            ("4.23: v1", vec![v1.clone()], Some("v1")),
            (
                "4.21/4.22 with the feature set: v1alpha1 beside v1's other types",
                vec![v1_without.clone(), alpha.clone()],
                Some("v1alpha1"),
            ),
            (
                "both (not shipped): the stable one",
                vec![alpha, v1],
                Some("v1"),
            ),
            (
                "4.20, or 4.22 without the feature set",
                vec![v1_without],
                None,
            ),
            ("no group", vec![], None),
            ("another group's osimagestreams", vec![other_group], None),
        ];
        for (case, lists, want) in cases {
            assert_eq!(served_version(&lists), want, "{case}");
        }
        let groups: APIGroupList = serde_json::from_value(serde_json::json!({"groups": [
            {"name": "machineconfiguration.openshift.io", "versions": [
                {"groupVersion": "machineconfiguration.openshift.io/v1", "version": "v1"},
                {"groupVersion": "machineconfiguration.openshift.io/v1alpha1", "version": "v1alpha1"},
                {"groupVersion": "machineconfiguration.openshift.io/v2", "version": "v2"},
            ]},
        ]}))
        .expect("parses");
        assert_eq!(listed_versions(&groups), vec!["v1", "v1alpha1"]);
        assert!(listed_versions(&APIGroupList::default()).is_empty());
    }

    #[test]
    fn unserved_catalog_waits_with_its_reason() {
        let reason = not_served();
        let err = resolve(
            &inputs(Some("rhel-9"), None, None),
            Some(&Catalog::NotServed),
        )
        .expect_err("not served");
        assert!(!err.refuses());
        assert_eq!(
            err.to_string(),
            format!("{reason}; set desired-os-image on the node instead")
        );
        for set in [
            "TechPreviewNoUpgrade",
            "DevPreviewNoUpgrade",
            "CustomNoUpgrade",
        ] {
            assert!(reason.contains(set), "names {set}: {reason}");
        }
        assert!(
            reason.contains("osimagestreams.machineconfiguration.openshift.io in v1 or v1alpha1"),
            "{reason}"
        );
    }

    #[test]
    fn a_refresh_is_a_changed_resolution_of_unchanged_annotations() {
        let raw = inputs(Some("rhel-10"), None, None);
        let old = inputs(Some("rhel-10"), Some(&img(D9)), None);
        let new = inputs(Some("rhel-10"), Some(&img(D10)), None);
        let other_raw = inputs(Some("rhel-9"), None, None);
        assert!(catalog_refresh(Some((&raw, &old)), &raw, &new));
        assert!(
            !catalog_refresh(Some((&raw, &old)), &raw, &old),
            "nothing changed"
        );
        assert!(
            !catalog_refresh(Some((&other_raw, &old)), &raw, &new),
            "the admin changed the node"
        );
        assert!(!catalog_refresh(None, &raw, &new), "the first resolution");
    }

    #[test]
    fn spread_delays_are_stable_per_node_and_cover_the_spread() {
        let spread = Duration::from_secs(600);
        let req = inputs(Some("rhel-10"), Some(&img(D10)), None);
        assert_eq!(
            spread_delay(spread, "worker-0", &req),
            spread_delay(spread, "worker-0", &req)
        );
        assert_eq!(
            spread_delay(Duration::ZERO, "worker-0", &req),
            Duration::ZERO
        );
        let delays: Vec<Duration> = (0..200)
            .map(|i| spread_delay(spread, &format!("worker-{i}"), &req))
            .collect();
        assert!(delays.iter().all(|d| *d < spread));
        // Spread over the whole window, not bunched: each tenth of it gets some nodes.
        for tenth in 0..10u32 {
            let (lo, hi) = (spread * tenth / 10, spread * (tenth + 1) / 10);
            assert!(
                delays.iter().any(|d| *d >= lo && *d < hi),
                "nothing in tenth {tenth}"
            );
        }
        let other = inputs(Some("rhel-10"), Some(&img(D9)), None);
        assert_ne!(
            spread_delay(spread, "worker-0", &req),
            spread_delay(spread, "worker-0", &other)
        );
    }
}
