//! Verifying a `sigstoreSigned` requirement with public keys before staging, as
//! containers/image verifies it when the OS daemon pulls:
//!
//! - the signatures of the manifest `sha256:<hex>` are the layers of the OCI manifest tagged
//!   `sha256-<hex>.sig` in the repository the image is pulled from (a mirror's, when a mirror
//!   serves it), of media type [`SIMPLE_SIGNING`], each with its base64 signature in the
//!   [`SIGNATURE_ANNOTATION`] (containers/image: docker/docker_image_src.go
//!   `getSigstoreSignatures`, docker/docker_client.go `sigstoreAttachmentTag`);
//! - a signature is ECDSA P-256 (ASN.1 DER) over the SHA-256 of the layer, the simple signing
//!   payload; its `critical.type` is "cosign container image signature", its
//!   `critical.image.docker-manifest-digest` the image's digest and its
//!   `critical.identity.docker-reference` must match as the requirement's `signedIdentity`
//!   says (signature/internal/sigstore_payload.go `VerifySigstorePayload`,
//!   signature/policy_eval_sigstore.go `isSignatureAccepted`, policy_reference_match.go);
//! - one accepted signature is enough (`isRunningImageAllowed`).
//!
//! Keyless (Fulcio) requirements and Rekor SETs are not verified here: such a requirement is
//! refused before staging with that reason (see [`crate::image::signature`]).

use base64::Engine as _;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey as _;

use crate::image::reference::ImageRef;
use crate::image::registry::{InspectError, Inspector};
use crate::image::signature::{Identity, KeySource};

/// The media type of a sigstore signature layer.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The payload type containers/image and cosign write.
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Largest attachment manifest read.
const MAX_MANIFEST: u64 = 4 << 20;
/// Largest payload read (containers/image: internal/iolimits `MaxSignatureBodySize`).
const MAX_PAYLOAD: u64 = 4 << 20;
/// Most signatures read for one image (an attacker's registry could list thousands).
const MAX_SIGNATURES: usize = 16;

/// One signature attachment layer, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The layer's bytes (the simple signing payload).
    pub payload: Vec<u8>,
    /// Its [`SIGNATURE_ANNOTATION`], if any.
    pub signature: Option<String>,
}

/// The tag of the signature attachment of `digest` (`sha256:<hex>` → `sha256-<hex>.sig`).
pub fn attachment_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// Why a public key of a `sigstoreSigned` requirement cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not a PEM ECDSA P-256 public key (the parser's words).
    #[error("not a PEM ECDSA P-256 public key ({0}); streamd verifies P-256 keys only")]
    NotP256(String),
    /// A key file could not be read (the reader's words, which name the file).
    #[error("{0}")]
    Unreadable(String),
    /// A key file that holds no usable key.
    #[error("{path}: {key}")]
    InFile {
        /// The file.
        path: String,
        /// What is wrong with its key.
        key: Box<KeyError>,
    },
    /// `keyData` is not base64.
    #[error("keyData is not base64")]
    DataNotBase64,
    /// `keyData` decodes to something that is not text.
    #[error("keyData is not PEM")]
    DataNotPem,
    /// `keyData` that holds no usable key.
    #[error("keyData: {0}")]
    InData(Box<KeyError>),
}

impl KeyError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            KeyError::NotP256(_) => "key-not-p256",
            KeyError::Unreadable(_) => "key-unreadable",
            KeyError::InFile { key, .. } | KeyError::InData(key) => key.label(),
            KeyError::DataNotBase64 => "key-data-not-base64",
            KeyError::DataNotPem => "key-data-not-pem",
        }
    }
}

/// Parses a PEM public key: ECDSA P-256 only (what cosign generates); anything else is named.
pub fn parse_key(pem: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_public_key_pem(pem.trim()).map_err(|e| KeyError::NotP256(e.to_string()))
}

/// The keys of `sources`: files read with `read` (host paths; its error names the file), data
/// base64 of PEM.
pub fn load_keys<E: std::fmt::Display>(
    sources: &[KeySource],
    read: impl Fn(&str) -> Result<String, E>,
) -> Result<Vec<VerifyingKey>, KeyError> {
    sources
        .iter()
        .map(|s| match s {
            KeySource::Path(p) => read(p)
                .map_err(|e| KeyError::Unreadable(e.to_string()))
                .and_then(|pem| {
                    parse_key(&pem).map_err(|e| KeyError::InFile {
                        path: p.clone(),
                        key: Box::new(e),
                    })
                }),
            KeySource::Data(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| KeyError::DataNotBase64)
                .and_then(|pem| String::from_utf8(pem).map_err(|_| KeyError::DataNotPem))
                .and_then(|pem| parse_key(&pem).map_err(|e| KeyError::InData(Box::new(e)))),
        })
        .collect()
}

/// Reads the signature attachments of `digest` from `source`'s repository. `Ok(None)`: there
/// is no attachment (the registry does not know the tag).
pub async fn fetch(
    inspector: &Inspector,
    source: &ImageRef,
    digest: &str,
) -> Result<Option<Vec<Attachment>>, InspectError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Layer {
        #[serde(default)]
        media_type: String,
        digest: String,
        size: i64,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize)]
    struct Manifest {
        #[serde(default)]
        layers: Vec<Layer>,
    }
    let path = format!("manifests/{}", attachment_tag(digest));
    let accept = [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ];
    let raw = match inspector
        .fetch(source, &path, &accept, MAX_MANIFEST, None)
        .await
    {
        Ok(raw) => raw,
        // The registry's 404 (manifest unknown): no signature at all.
        Err(InspectError::Invalid(m)) if m.contains(" unknown to ") => return Ok(None),
        Err(e) => return Err(e),
    };
    let m: Manifest = serde_json::from_slice(&raw).map_err(|e| {
        InspectError::Invalid(format!(
            "{source}: the signature attachment {} is not a manifest: {e}",
            attachment_tag(digest)
        ))
    })?;
    let mut out = Vec::new();
    for l in m
        .layers
        .into_iter()
        .filter(|l| l.media_type == SIMPLE_SIGNING)
        .take(MAX_SIGNATURES)
    {
        let size = u64::try_from(l.size)
            .ok()
            .filter(|s| *s <= MAX_PAYLOAD)
            .ok_or_else(|| {
                InspectError::Invalid(format!(
                    "{source}: signature layer {} declares size {} (allowed: 0..={MAX_PAYLOAD})",
                    l.digest, l.size
                ))
            })?;
        let payload = inspector
            .fetch(
                source,
                &format!("blobs/{}", l.digest),
                &[],
                size,
                Some(&l.digest),
            )
            .await?;
        out.push(Attachment {
            payload,
            signature: l.annotations.get(SIGNATURE_ANNOTATION).cloned(),
        });
    }
    Ok(Some(out))
}

/// A docker reference split into its name and its tag and digest.
#[derive(Debug, PartialEq, Eq)]
struct DockerRef<'a> {
    name: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

fn docker_ref(s: &str) -> Option<DockerRef<'_>> {
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    let last = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last..].find(':') {
        Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
        None => (rest, None),
    };
    (!name.is_empty() && name.contains('/')).then_some(DockerRef { name, tag, digest })
}

/// Whether the signed `docker-reference` is accepted for `image` under `identity`.
fn identity_matches(identity: &Identity, image: &ImageRef, signed: &str) -> bool {
    let Some(sig) = docker_ref(signed) else {
        return false;
    };
    let name = format!("{}/{}", image.registry(), image.repository());
    // Every image streamd stages is digest-pinned: matchRepoDigestOrExact matches the
    // repository then.
    let repo_or_exact = |name: &str| sig.name == name;
    match identity {
        Identity::MatchRepoDigestOrExact => repo_or_exact(&name),
        Identity::MatchRepository => sig.name == name,
        Identity::MatchExact => {
            sig.name == name && sig.tag.is_none() && sig.digest == Some(image.digest())
        }
        Identity::ExactReference(r) => docker_ref(r).is_some_and(|want| want == sig),
        Identity::ExactRepository(r) => sig.name == r,
        Identity::RemapIdentity {
            prefix,
            signed_prefix,
        } => {
            let remapped = match name.strip_prefix(prefix.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/') => {
                    format!("{signed_prefix}{rest}")
                }
                _ => name.clone(),
            };
            repo_or_exact(&remapped)
        }
    }
}

/// Why one attachment is not an accepted signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The layer has no signature annotation.
    #[error("missing {} annotation", SIGNATURE_ANNOTATION)]
    NoAnnotation,
    /// The annotation is not base64.
    #[error("the signature is not base64")]
    NotBase64,
    /// The decoded annotation is not a DER ECDSA signature.
    #[error("the signature is not ASN.1 ECDSA")]
    NotEcdsa,
    /// No key of the requirement made it.
    #[error("cryptographic signature verification failed (no key accepts it)")]
    NoKeyAccepts,
    /// The signed payload is not JSON.
    #[error("the signed payload is not JSON")]
    PayloadNotJson,
    /// The payload's `critical.type` (quoted, cut).
    #[error("the signed payload's type is {0}, not {t:?}", t = PAYLOAD_TYPE)]
    WrongType(String),
    /// The payload signs another digest.
    #[error("the signature is for digest {signed}, not {wanted}")]
    WrongDigest {
        /// The signed digest (quoted).
        signed: String,
        /// The image's digest.
        wanted: String,
    },
    /// The signed identity is not one the requirement accepts for the image.
    #[error("the signature's identity {signed} is not accepted for {image} ({identity})")]
    WrongIdentity {
        /// The signed reference (quoted).
        signed: String,
        /// The image as requested.
        image: String,
        /// The requirement's `signedIdentity`.
        identity: String,
    },
}

impl Rejection {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::NoAnnotation => "signature-annotation-missing",
            Rejection::NotBase64 => "signature-not-base64",
            Rejection::NotEcdsa => "signature-not-ecdsa",
            Rejection::NoKeyAccepts => "signature-key-mismatch",
            Rejection::PayloadNotJson => "signature-payload-not-json",
            Rejection::WrongType(_) => "signature-payload-type",
            Rejection::WrongDigest { .. } => "signature-digest-mismatch",
            Rejection::WrongIdentity { .. } => "signature-identity-mismatch",
        }
    }
}

/// Why no attachment holds an accepted signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// There is no signature at all.
    #[error("a signature was required, but no signature exists")]
    NoSignature,
    /// The one signature there is was rejected.
    #[error("{0}")]
    Rejected(Rejection),
    /// Every one of several signatures was rejected.
    #[error("none of the signatures was accepted: {}", join(.0))]
    NoneAccepted(Vec<Rejection>),
}

impl VerifyError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            VerifyError::NoSignature => "signature-missing",
            VerifyError::Rejected(r) => r.label(),
            VerifyError::NoneAccepted(_) => "signatures-rejected",
        }
    }
}

fn join(rejections: &[Rejection]) -> String {
    rejections
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why one attachment is not an accepted signature of `image` at `digest`, else `Ok`.
fn accept_one(
    a: &Attachment,
    keys: &[VerifyingKey],
    identity: &Identity,
    image: &ImageRef,
    digest: &str,
) -> Result<(), Rejection> {
    let b64 = a.signature.as_deref().ok_or(Rejection::NoAnnotation)?;
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| Rejection::NotBase64)?;
    let sig = Signature::from_der(&der).map_err(|_| Rejection::NotEcdsa)?;
    if !keys.iter().any(|k| k.verify(&a.payload, &sig).is_ok()) {
        return Err(Rejection::NoKeyAccepts);
    }
    let p: serde_json::Value =
        serde_json::from_slice(&a.payload).map_err(|_| Rejection::PayloadNotJson)?;
    let critical = &p["critical"];
    let kind = critical["type"].as_str().unwrap_or_default();
    if kind != PAYLOAD_TYPE {
        return Err(Rejection::WrongType(crate::text::quote(kind)));
    }
    let signed_digest = critical["image"]["docker-manifest-digest"]
        .as_str()
        .unwrap_or_default();
    if signed_digest != digest {
        return Err(Rejection::WrongDigest {
            signed: crate::text::quote(signed_digest),
            wanted: digest.to_string(),
        });
    }
    let signed_ref = critical["identity"]["docker-reference"]
        .as_str()
        .unwrap_or_default();
    if !identity_matches(identity, image, signed_ref) {
        return Err(Rejection::WrongIdentity {
            signed: crate::text::quote(signed_ref),
            image: image.to_string(),
            identity: format!("{identity:?}"),
        });
    }
    Ok(())
}

/// Whether `attachments` hold a signature of `image` (the logical reference, as requested) at
/// `digest` that one of `keys` made and `identity` accepts: `Ok` names nothing, `Err` says
/// why none is accepted.
pub fn verify(
    attachments: &[Attachment],
    keys: &[VerifyingKey],
    identity: &Identity,
    image: &ImageRef,
    digest: &str,
) -> Result<(), VerifyError> {
    let mut reasons: Vec<Rejection> = Vec::new();
    for a in attachments {
        match accept_one(a, keys, identity, image, digest) {
            Ok(()) => return Ok(()),
            Err(r) => reasons.push(r),
        }
    }
    Err(match reasons.len() {
        0 => VerifyError::NoSignature,
        1 => VerifyError::Rejected(reasons.remove(0)),
        _ => VerifyError::NoneAccepted(reasons),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use p256::ecdsa::SigningKey;
    use p256::ecdsa::signature::Signer as _;
    use p256::pkcs8::EncodePublicKey as _;

    const HEX: &str = "1111111111111111111111111111111111111111111111111111111111111111";

    /// A P-256 key from a fixed seed (no RNG needed; distinct seeds, distinct keys).
    pub(crate) fn key(seed: u8) -> SigningKey {
        let mut bytes = [seed; 32];
        bytes[0] = 1;
        SigningKey::from_bytes(&bytes.into()).expect("valid scalar")
    }

    /// The PEM public key of `k`.
    pub(crate) fn pem(k: &SigningKey) -> String {
        k.verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .expect("pem")
    }

    /// A signed attachment for `reference` at `digest`.
    pub(crate) fn signed(k: &SigningKey, reference: &str, digest: &str) -> Attachment {
        let payload = serde_json::json!({
            "critical": {"identity": {"docker-reference": reference},
                         "image": {"docker-manifest-digest": digest},
                         "type": PAYLOAD_TYPE},
            "optional": null
        })
        .to_string()
        .into_bytes();
        let sig: Signature = k.sign(&payload);
        Attachment {
            signature: Some(
                base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()),
            ),
            payload,
        }
    }

    fn image() -> ImageRef {
        format!("quay.io/o/os@sha256:{HEX}").parse().expect("ref")
    }

    fn check(a: &[Attachment], k: &SigningKey, id: &Identity) -> Result<(), String> {
        let keys = load_keys(
            &[KeySource::Data(
                base64::engine::general_purpose::STANDARD.encode(pem(k)),
            )],
            |_| Err("no files"),
        )
        .expect("key");
        verify(a, &keys, id, &image(), &format!("sha256:{HEX}")).map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_signature_is_accepted_and_every_fault_is_named() {
        let k = key(7);
        let d = format!("sha256:{HEX}");
        let id = Identity::MatchRepoDigestOrExact;
        assert_eq!(
            check(&[signed(&k, "quay.io/o/os:4.21", &d)], &k, &id),
            Ok(())
        );
        // Another key's signature.
        let e = check(&[signed(&key(8), "quay.io/o/os", &d)], &k, &id).expect_err("other key");
        assert!(e.contains("verification failed"), "{e}");
        // The right key, another image's digest.
        let other = format!("sha256:{}", "2".repeat(64));
        let e = check(&[signed(&k, "quay.io/o/os", &other)], &k, &id).expect_err("digest");
        assert!(e.contains("not sha256:1111"), "{e}");
        // Signed for another repository.
        let e = check(&[signed(&k, "quay.io/o/evil", &d)], &k, &id).expect_err("identity");
        assert!(e.contains("identity \"quay.io/o/evil\""), "{e}");
        // No attachment layers; a layer without the annotation; a tampered payload.
        assert_eq!(
            check(&[], &k, &id),
            Err("a signature was required, but no signature exists".into())
        );
        let mut bare = signed(&k, "quay.io/o/os", &d);
        bare.signature = None;
        assert!(
            check(&[bare], &k, &id)
                .expect_err("bare")
                .contains("missing")
        );
        let mut tampered = signed(&k, "quay.io/o/os", &d);
        tampered.payload.push(b' ');
        assert!(check(std::slice::from_ref(&tampered), &k, &id).is_err());
        // One good signature among bad ones is enough.
        assert_eq!(
            check(&[tampered, signed(&k, "quay.io/o/os", &d)], &k, &id),
            Ok(())
        );
    }

    #[test]
    fn signed_identities_match_as_containers_image_matches_them() {
        let img = image();
        let d = format!("sha256:{HEX}");
        let m = |id: &Identity, r: &str| identity_matches(id, &img, r);
        assert!(m(
            &Identity::MatchRepoDigestOrExact,
            "quay.io/o/os@sha256:00"
        ));
        assert!(!m(&Identity::MatchRepoDigestOrExact, "quay.io/o/os2:1"));
        assert!(m(&Identity::MatchRepository, "quay.io/o/os:latest"));
        assert!(m(&Identity::MatchExact, &format!("quay.io/o/os@{d}")));
        assert!(!m(&Identity::MatchExact, "quay.io/o/os:latest"));
        assert!(m(
            &Identity::ExactRepository("quay.io/o/os".into()),
            "quay.io/o/os:x"
        ));
        assert!(m(
            &Identity::ExactReference("r.example/a/b:1".into()),
            "r.example/a/b:1"
        ));
        assert!(!m(
            &Identity::ExactReference("r.example/a/b:1".into()),
            "r.example/a/b:2"
        ));
        let remap = Identity::RemapIdentity {
            prefix: "quay.io/o".into(),
            signed_prefix: "registry.redhat.io/p".into(),
        };
        assert!(m(&remap, "registry.redhat.io/p/os:4.21"));
        assert!(!m(&remap, "quay.io/o/os:4.21"));
        assert!(!m(&Identity::MatchRepository, "not a reference"));
        assert_eq!(attachment_tag(&d), format!("sha256-{HEX}.sig"));
    }

    #[test]
    fn keys_other_than_p256_pem_are_refused_by_name() {
        assert!(parse_key("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----").is_err());
        let e = load_keys(&[KeySource::Data("%%".into())], |_| {
            Ok::<_, String>(String::new())
        })
        .expect_err("b64");
        assert_eq!(
            (e.to_string().as_str(), e.label()),
            ("keyData is not base64", "key-data-not-base64")
        );
        let e = load_keys(&[KeySource::Path("/etc/pki/k.pub".into())], |p| {
            Err(format!("{p}: no such file"))
        })
        .expect_err("missing");
        assert_eq!(e.to_string(), "/etc/pki/k.pub: no such file");
        let e = load_keys(&[KeySource::Path("/k".into())], |_| {
            Ok::<_, String>("x".into())
        })
        .expect_err("not a key");
        assert!(
            e.to_string().starts_with("/k: not a PEM ECDSA P-256"),
            "{e}"
        );
        assert_eq!(e.label(), "key-not-p256");
        let k = key(3);
        let ok = load_keys(&[KeySource::Path("/k".into())], |_| {
            Ok::<_, String>(pem(&k))
        })
        .expect("pem");
        assert_eq!(ok, vec![*k.verifying_key()]);
    }
}
