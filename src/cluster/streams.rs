//! Stream resolution: the cluster's `OSImageStream` named `cluster`
//! (`machineconfiguration.openshift.io/v1`, cluster scoped) lists each stream's digest-pinned
//! OS and extensions images in `status.availableStreams`. With `resolve-streams = true` a node
//! that names only `desired-stream` gets that stream's images from there.
//!
//! [`resolve`] is pure (table tests below); [`watch`] follows the object and yields a
//! [`Catalog`] whenever what streamd reads of it changes.

use std::borrow::Cow;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;

use crate::cluster::protocol::{self, DESIRED_STREAM, Inputs, ProtocolError};
use crate::image::reference::{ImageRef, ImageRefError};

/// API group of `OSImageStream`.
pub const GROUP: &str = "machineconfiguration.openshift.io";
/// API version of `OSImageStream` streamd reads.
pub const VERSION: &str = "v1";
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
}

impl kube::Resource for OsImageStream {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
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
}

impl Catalog {
    /// The catalog an object (or its absence) describes.
    pub fn from_object(object: Option<&OsImageStream>) -> Catalog {
        match object.and_then(|o| o.status.as_ref()) {
            None if object.is_none() => Catalog::Missing,
            Some(s) if !s.available_streams.is_empty() => {
                Catalog::Available(s.available_streams.clone())
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
        "OSImageStream {NAME:?} does not exist; set desired-os-image or create the OSImageStream"
    )]
    Missing,
    /// The object has no `status.availableStreams` yet.
    #[error("OSImageStream {NAME:?} has no status.availableStreams yet (not reconciled)")]
    Unreconciled,
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
            ResolveError::Pending | ResolveError::Missing | ResolveError::Unreconciled => false,
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
    protocol::validate_stream(stream).map_err(|problem| ProtocolError {
        key: DESIRED_STREAM,
        problem,
    })?;
    let entries = match catalog {
        None => return Err(ResolveError::Pending),
        Some(Catalog::Missing) => return Err(ResolveError::Missing),
        Some(Catalog::Unreconciled) => return Err(ResolveError::Unreconciled),
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

/// What the stream watch yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamsUpdate {
    /// The catalog changed (the first one after start is always delivered).
    Catalog(Catalog),
    /// The watch failed; kube-rs retries with backoff and the last catalog still holds.
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
    fn on_event(
        &mut self,
        ev: Result<watcher::Event<OsImageStream>, watcher::Error>,
    ) -> Option<StreamsUpdate> {
        let catalog = match ev {
            Ok(watcher::Event::Init) => {
                self.listing = Some(None);
                return None;
            }
            Ok(watcher::Event::InitApply(o)) => {
                self.listing = Some(Some(o));
                return None;
            }
            Ok(watcher::Event::InitDone) => {
                Catalog::from_object(self.listing.take().flatten().as_ref())
            }
            Ok(watcher::Event::Apply(o)) => Catalog::from_object(Some(&o)),
            Ok(watcher::Event::Delete(_)) => Catalog::Missing,
            Err(e) => return Some(StreamsUpdate::Error(e.to_string())),
        };
        if self.last.as_ref() == Some(&catalog) {
            return None;
        }
        self.last = Some(catalog.clone());
        Some(StreamsUpdate::Catalog(catalog))
    }
}

/// Watches the `OSImageStream` named `cluster` (field selector), resuming from
/// resourceVersion and relisting on 410 Gone like the node watch.
///
/// The node identity needs `get`, `list` and `watch` on `osimagestreams` (docs/deploy/).
pub fn watch(client: kube::Client) -> impl Stream<Item = StreamsUpdate> + Send + 'static {
    let api: Api<OsImageStream> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let mut tracker = Tracker::default();
    watcher(api, cfg)
        .default_backoff()
        .filter_map(move |ev| std::future::ready(tracker.on_event(ev)))
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
    type Case<'a> = (
        &'a str,
        Inputs,
        Option<&'a Catalog>,
        Result<Inputs, &'a str>,
    );

    #[test]
    fn resolution_table() {
        let cat = catalog();
        let newline = Catalog::Available(vec![entry("a\nb", &img(D9), "")]);
        let empty = Catalog::Available(vec![]);
        let explicit = img(DX);
        let cases: Vec<Case> = vec![
            (
                "stream only: both images filled in",
                inputs(Some("rhel-9"), None, None),
                Some(&cat),
                Ok(inputs(Some("rhel-9"), Some(&img(D9)), Some(&img(DX)))),
            ),
            (
                "stream without extensions image",
                inputs(Some("rhel-10"), None, None),
                Some(&cat),
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
                Some(&cat),
                Ok(inputs(Some("rhel-9"), Some(&explicit), None)),
            ),
            (
                "no request stays no request",
                inputs(None, None, None),
                Some(&Catalog::Missing),
                Ok(inputs(None, None, None)),
            ),
            (
                "stream plus extensions only is not resolved",
                inputs(Some("rhel-9"), None, Some(&explicit)),
                Some(&cat),
                Ok(inputs(Some("rhel-9"), None, Some(&explicit))),
            ),
            (
                "unknown stream lists the available ones",
                inputs(Some("rhel-11"), None, None),
                Some(&cat),
                Err(
                    "stream \"rhel-11\" is not available; available streams: \"rhel-9\", \"rhel-10\", \"tagged\", \"bad-ext\"",
                ),
            ),
            (
                "a cluster stream name with a newline stays on one line",
                inputs(Some("rhel-11"), None, None),
                Some(&newline),
                Err("available streams: \"a\\nb\""),
            ),
            (
                "an empty catalog says so",
                inputs(Some("rhel-11"), None, None),
                Some(&empty),
                Err("available streams: none"),
            ),
            (
                "malformed stream name",
                inputs(Some("RHEL 10"), None, None),
                Some(&cat),
                Err(
                    "annotation osstream.openshift.io/desired-stream: \"RHEL 10\" is not an RFC 1123",
                ),
            ),
            (
                "tagged image in the catalog",
                inputs(Some("tagged"), None, None),
                Some(&cat),
                Err(
                    "OSImageStream \"cluster\" stream \"tagged\" osImage: image reference \"quay.io/x/rhcos:latest\" is not pinned",
                ),
            ),
            (
                "bad extensions image in the catalog",
                inputs(Some("bad-ext"), None, None),
                Some(&cat),
                Err("stream \"bad-ext\" osExtensionsImage: image reference contains whitespace"),
            ),
            (
                "catalog not read yet",
                inputs(Some("rhel-9"), None, None),
                None,
                Err("waiting for the first read"),
            ),
            (
                "object missing",
                inputs(Some("rhel-9"), None, None),
                Some(&Catalog::Missing),
                Err("OSImageStream \"cluster\" does not exist"),
            ),
            (
                "object without status",
                inputs(Some("rhel-9"), None, None),
                Some(&Catalog::Unreconciled),
                Err("has no status.availableStreams yet"),
            ),
        ];
        for (case, given, catalog, expected) in cases {
            let got = resolve(&given, catalog);
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
        assert_eq!(t.on_event(Ok(watcher::Event::Init)), None);
        assert_eq!(t.on_event(Ok(watcher::Event::InitApply(object(D9)))), None);
        assert_eq!(t.on_event(Ok(watcher::Event::InitDone)), Some(avail(D9)));
        // The same status again (a relist, a metadata-only change): nothing.
        assert_eq!(t.on_event(Ok(watcher::Event::Apply(object(D9)))), None);
        assert_eq!(
            t.on_event(Ok(watcher::Event::Apply(object(D10)))),
            Some(avail(D10))
        );
        assert_eq!(
            t.on_event(Ok(watcher::Event::Delete(object(D10)))),
            Some(StreamsUpdate::Catalog(Catalog::Missing))
        );
        // A relist that finds nothing after the object came back: missing again.
        assert_eq!(
            t.on_event(Ok(watcher::Event::Apply(object(D9)))),
            Some(avail(D9))
        );
        assert_eq!(t.on_event(Ok(watcher::Event::Init)), None);
        assert_eq!(
            t.on_event(Ok(watcher::Event::InitDone)),
            Some(StreamsUpdate::Catalog(Catalog::Missing))
        );
        let err = t.on_event(Err(watcher::Error::NoResourceVersion));
        assert!(matches!(err, Some(StreamsUpdate::Error(_))), "{err:?}");
    }
}
