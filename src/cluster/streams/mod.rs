//! Stream resolution: the cluster's `OSImageStream` named `cluster`
//! (`machineconfiguration.openshift.io`, `v1` or `v1alpha1`, cluster scoped) lists each
//! stream's digest-pinned OS and extensions images in `status.availableStreams`. With
//! `resolve-streams = true` a node that names only `desired-stream` gets that stream's images
//! from there.
//!
//! This module holds the object's model and the pure decisions on it: [`resolve`],
//! [`catalog_refresh`] and [`spread_delay`] (table tests in `tests.rs`). `watch.rs` is the I/O:
//! [`watch`] discovers the served version ([`served_version`]), follows the object and yields a
//! [`Catalog`] whenever what streamd reads of it changes.

#[cfg(test)]
mod tests;
mod watch;

pub use watch::{StreamsUpdate, not_served, served_version, watch};

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use sha2::{Digest, Sha256};

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
/// The feature sets that serve `v1alpha1` on 4.21 and 4.22 (`CustomNoUpgrade` only with the
/// `OSStreams` gate enabled), as the reasons and docs name them.
pub const NO_UPGRADE_FEATURE_SETS: [&str; 3] = [
    "TechPreviewNoUpgrade",
    "DevPreviewNoUpgrade",
    "CustomNoUpgrade",
];
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
