//! Manifests and configs: an index resolved to the host's platform, every blob digest-checked
//! and read within its declared size.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::http::read_limited;
use super::{InspectError, Inspector, MAX_CONFIG, MAX_MANIFEST, REQUEST_DEADLINE, goarch};
use crate::image::reference::ImageRef;

/// An OCI/Docker descriptor, as far as streamd reads one: digest, size, media type and, for a
/// layer, the package names ostree-ext annotates it with ([`super::components`]). Its `urls`
/// are not even parsed: a layer comes from the registry or not at all.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Descriptor {
    #[serde(default)]
    pub(super) media_type: String,
    pub(super) digest: String,
    pub(super) size: i64,
    platform: Option<Platform>,
    #[serde(default)]
    annotations: Annotations,
}

/// The one annotation streamd reads from a descriptor; the others are not kept.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Annotations {
    #[serde(rename = "ostree.components")]
    components: Option<String>,
}

impl Descriptor {
    /// The layer's `ostree.components` annotation.
    pub(super) fn components(&self) -> Option<&str> {
        self.annotations.components.as_deref()
    }
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
pub(super) struct ImageManifest {
    pub(super) config: Descriptor,
    pub(super) layers: Vec<Descriptor>,
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

impl Inspector {
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
    pub(super) async fn manifest(
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
    pub(super) fn descriptor_size(
        image: &ImageRef,
        d: &Descriptor,
        max: u64,
    ) -> Result<u64, InspectError> {
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
    pub(super) async fn blob_response(
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

    pub(super) async fn labels(
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
}

const MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

pub(super) fn verify(bytes: &[u8], digest: &str, what: &str) -> Result<(), InspectError> {
    let got = format!("sha256:{:x}", Sha256::digest(bytes));
    if got == digest {
        Ok(())
    } else {
        Err(InspectError::Invalid(format!(
            "{what}: digest mismatch (expected {digest}, got {got})"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_mismatch_is_an_error() {
        assert!(verify(b"x", "sha256:00", "t").is_err());
    }
}
