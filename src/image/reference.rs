//! Digest-pinned container image references: `host[:port][/ns…]/name@sha256:<64 hex>`.
//!
//! Only this form is accepted: a tag can move under the node's feet, and an image that is not
//! pinned cannot be verified after staging.

use std::fmt;
use std::str::FromStr;

use crate::config::scope::{valid_path_component, valid_registry};

/// Longest reference accepted (the OSImageStream API limit).
pub const MAX_LEN: usize = 447;

/// The prefix rpm-ostree needs to treat a reference as a container image without signature policy.
pub const UNVERIFIED_REGISTRY: &str = "ostree-unverified-registry:";

/// The refspec prefix of the verifying origin on rpm-ostree (ostree-ext
/// `SignatureSource::ContainerPolicy`).
pub const SIGNED_PREFIX: &str = "ostree-image-signed:";

/// A validated, digest-pinned image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    registry: String,
    repository: String,
    digest: String,
}

/// What is wrong with an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    /// Empty value.
    #[error("empty image reference")]
    Empty,
    /// Longer than [`MAX_LEN`].
    #[error("image reference is {0} characters, the limit is {MAX_LEN}")]
    TooLong(usize),
    /// Contains whitespace or control characters.
    #[error("image reference contains whitespace or control characters")]
    Whitespace,
    /// Starts with `-`, which a command line could take for an option.
    #[error("image reference starts with '-'")]
    LeadingDash,
    /// Has no `@sha256:` digest (a tag, or nothing).
    #[error("image reference {0} is not pinned by digest (expected …@sha256:<64 hex>)")]
    NotPinned(String),
    /// Carries a tag as well as a digest.
    #[error("image reference {0} has both a tag and a digest; give only the digest")]
    TagAndDigest(String),
    /// The digest is not `sha256:` followed by 64 lower-case hex digits.
    #[error("digest {0} is not sha256: followed by 64 lower-case hex digits")]
    BadDigest(String),
    /// No registry host, or an invalid one.
    #[error("image reference {0} has no valid registry host (host[:port]/…)")]
    BadRegistry(String),
    /// A repository path component is invalid.
    #[error("repository path component {0} is invalid (lower-case letters, digits, '.', '_', '-')")]
    BadRepository(String),
}

impl ImageRefError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ImageRefError::Empty => "image-ref-empty",
            ImageRefError::TooLong(_) => "image-ref-too-long",
            ImageRefError::Whitespace => "image-ref-whitespace",
            ImageRefError::LeadingDash => "image-ref-leading-dash",
            ImageRefError::NotPinned(_) => "image-ref-not-pinned",
            ImageRefError::TagAndDigest(_) => "image-ref-tag-and-digest",
            ImageRefError::BadDigest(_) => "image-ref-bad-digest",
            ImageRefError::BadRegistry(_) => "image-ref-bad-registry",
            ImageRefError::BadRepository(_) => "image-ref-bad-repository",
        }
    }
}

impl ImageRef {
    /// Registry host with optional port.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Repository path below the registry.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The rpm-ostree refspec for this image.
    pub fn ostree_refspec(&self) -> String {
        format!("{UNVERIFIED_REGISTRY}{self}")
    }

    /// The rpm-ostree refspec of the verifying origin (ostree-ext `ContainerPolicy`).
    pub fn signed_refspec(&self) -> String {
        format!("{SIGNED_PREFIX}docker://{self}")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.registry, self.repository, self.digest)
    }
}

impl FromStr for ImageRef {
    type Err = ImageRefError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ImageRefError::Empty);
        }
        if s.len() > MAX_LEN {
            return Err(ImageRefError::TooLong(s.len()));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ImageRefError::Whitespace);
        }
        if s.starts_with('-') {
            return Err(ImageRefError::LeadingDash);
        }
        let quoted = crate::text::quote(s);
        let Some((name, digest)) = s.split_once('@') else {
            return Err(ImageRefError::NotPinned(quoted));
        };
        validate_digest(digest)?;
        let Some((registry, repository)) = name.split_once('/') else {
            return Err(ImageRefError::BadRegistry(quoted));
        };
        if !valid_registry(registry) {
            return Err(ImageRefError::BadRegistry(quoted));
        }
        let mut components = repository.split('/').peekable();
        while let Some(c) = components.next() {
            // Only the last component can carry a tag; a tag next to a digest is ambiguous.
            let c = if components.peek().is_none() {
                match c.split_once(':') {
                    Some(_) => return Err(ImageRefError::TagAndDigest(quoted)),
                    None => c,
                }
            } else {
                c
            };
            if !valid_path_component(c) {
                return Err(ImageRefError::BadRepository(crate::text::quote(c)));
            }
        }
        Ok(ImageRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            digest: digest.to_string(),
        })
    }
}

fn validate_digest(digest: &str) -> Result<(), ImageRefError> {
    let hex = digest.strip_prefix("sha256:");
    match hex {
        Some(h) if h.len() == 64 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(())
        }
        _ => Err(ImageRefError::BadDigest(crate::text::quote(digest))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn accepts_pinned_references() {
        for s in [
            format!("quay.io/openshift/rhcos@sha256:{HEX}"),
            format!("127.0.0.1:5000/openshift/rhcos@sha256:{HEX}"),
            format!("registry.example.com:443/a/b/c__d.e-f@sha256:{HEX}"),
            format!("localhost/rhcos@sha256:{HEX}"),
        ] {
            let r: ImageRef = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(r.to_string(), s);
            assert_eq!(
                r.ostree_refspec(),
                format!("ostree-unverified-registry:{s}")
            );
        }
    }

    #[test]
    fn parts_are_split() {
        let r: ImageRef = format!("127.0.0.1:5000/openshift/rhcos@sha256:{HEX}")
            .parse()
            .expect("valid");
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "openshift/rhcos");
        assert_eq!(r.digest(), format!("sha256:{HEX}"));
    }

    #[test]
    fn rejects_bad_references() {
        let upper = HEX.to_uppercase();
        let cases = [
            String::new(),
            "quay.io/openshift/rhcos:4.20".into(),
            format!("quay.io/openshift/rhcos:4.20@sha256:{HEX}"),
            format!("quay.io/openshift/rhcos@sha256:{upper}"),
            format!("quay.io/openshift/rhcos@sha256:{}", &HEX[..63]),
            format!("quay.io/openshift/rhcos@sha512:{HEX}"),
            format!("rhcos@sha256:{HEX}"),
            format!(" quay.io/openshift/rhcos@sha256:{HEX}"),
            format!("quay.io/openshift/rhcos@sha256:{HEX}\n"),
            format!("-quay.io/openshift/rhcos@sha256:{HEX}"),
            format!("quay.io/Openshift/rhcos@sha256:{HEX}"),
            format!("quay.io//rhcos@sha256:{HEX}"),
            format!("quay.io:99999/rhcos/x@sha256:{HEX}"),
            format!("quay..io/rhcos/x@sha256:{HEX}"),
            format!("docker://quay.io/rhcos@sha256:{HEX}"),
            format!("quay.io/{}/x@sha256:{HEX}", "a".repeat(450)),
            format!("quay.io/a--/x@sha256:{HEX}"),
        ];
        for s in cases {
            assert!(s.parse::<ImageRef>().is_err(), "accepted {s:?}");
        }
    }
}
