//! Cosign signatures in the testbed registry: a P-256 key made from a seed, the simple signing
//! payload it signs and the attachment cosign pushes for a manifest digest (the OCI manifest
//! tagged `sha256-<hex>.sig` whose layers are the payloads, each with its signature in the
//! `dev.cosignproject.cosign/signature` annotation; sigstore/cosign pkg/oci/static,
//! containers/image docker/docker_client.go `sigstoreAttachmentTag`).

use base64::Engine as _;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::EncodePublicKey as _;
use serde_json::json;

use super::REPOSITORY;
use super::client::Client;
use super::oci::{Blob, MEDIA_CONFIG, MEDIA_MANIFEST, canonical_json};

/// The media type of a signature layer.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation of a layer's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// A signing key: P-256 from `seed` (distinct seeds give distinct keys; no RNG involved).
pub fn key(seed: u8) -> anyhow::Result<SigningKey> {
    let mut bytes = [seed; 32];
    // A scalar below the curve order: the first byte keeps it there.
    bytes[0] = 0x42;
    Ok(SigningKey::from_bytes(&bytes.into())?)
}

/// The PEM public key of `k` (what `cosign generate-key-pair` writes to `cosign.pub`).
pub fn public_pem(k: &SigningKey) -> anyhow::Result<String> {
    Ok(k.verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)?)
}

/// The simple signing payload cosign signs for `reference` at `digest`.
pub fn payload(reference: &str, digest: &str) -> Vec<u8> {
    json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}

/// Base64 of the ASN.1 DER ECDSA signature of `data` by `k`.
pub fn sign(k: &SigningKey, data: &[u8]) -> String {
    let sig: Signature = k.sign(data);
    base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes())
}

/// Pushes the attachment of `digest` holding `layers` (payload, base64 signature) to the
/// testbed repository, as `cosign sign` does.
pub async fn push_attachment(
    client: &Client,
    digest: &str,
    layers: &[(Vec<u8>, String)],
) -> anyhow::Result<()> {
    let config = Blob::new(
        MEDIA_CONFIG,
        canonical_json(
            &json!({"architecture": "", "os": "", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}}),
        ),
    );
    client.push_blob(REPOSITORY, &config).await?;
    let mut descriptors = Vec::new();
    for (data, signature) in layers {
        let blob = Blob::new(SIMPLE_SIGNING, data.clone());
        client.push_blob(REPOSITORY, &blob).await?;
        descriptors.push(json!({
            "mediaType": SIMPLE_SIGNING,
            "digest": blob.digest,
            "size": blob.data.len(),
            "annotations": {SIGNATURE_ANNOTATION: signature},
        }));
    }
    let manifest = Blob::new(
        MEDIA_MANIFEST,
        canonical_json(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config.digest, "size": config.data.len()},
            "layers": descriptors,
        })),
    );
    let tag = format!("{}.sig", digest.replacen(':', "-", 1));
    client.push_manifest(REPOSITORY, &tag, &manifest).await
}
