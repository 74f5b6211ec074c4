//! The containers signature policy (`policy.json`) as the OS daemons apply it to the OS image,
//! and what streamd makes of it before staging.
//!
//! - Scope: the most specific scope of `transports.docker` wins (the reference, its repository,
//!   each namespace, the host, then `*.domain` wildcards), else that transport's `""`, else
//!   `default` (containers/image: signature/policy_eval.go `requirementsForImageRef`,
//!   docker/docker_transport.go `PolicyConfigurationNamespaces`); every requirement of the
//!   list must accept the image.
//! - Requirement types and fields: signature/policy_config.go and policy_config_sigstore.go
//!   (`keyData` is base64, as Go writes a `[]byte`); the machine-config operator writes
//!   `sigstoreSigned` with `keyData` from a ClusterImagePolicy or ImagePolicy
//!   (openshift/machine-config-operator release-4.21: pkg/controller/container-runtime-config).
//! - The verifying origin: ostree-ext's `ostree-image-signed:` (and bootc's
//!   `--enforce-container-sigpolicy`) is `SignatureSource::ContainerPolicy`, which refuses a
//!   policy whose `default` is exactly `[insecureAcceptAnything]` (bootc-dev/bootc:
//!   crates/ostree-ext/src/container/skopeo.rs `container_policy_is_default_insecure`,
//!   store.rs `prepare_internal`); otherwise it pulls under the same policy as the unverified
//!   transport, whose proxy evaluates the scope's requirements in `OpenImage`
//!   (containers/skopeo: cmd/skopeo/proxy.go `openImageImpl`).
//!
//! What streamd verifies itself is in [`crate::image::sigstore`].

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::image::reference::ImageRef;

/// How a `sigstoreSigned` requirement matches the signature's `docker-reference` to the image
/// (containers/image: signature/policy_reference_match.go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The default: the repository for a digest-pinned image, else the exact reference.
    MatchRepoDigestOrExact,
    /// The exact reference.
    MatchExact,
    /// The repository, whatever the tag or digest.
    MatchRepository,
    /// Exactly this reference, whatever the image's.
    ExactReference(String),
    /// This repository, whatever the image's.
    ExactRepository(String),
    /// The image's reference with `prefix` replaced by `signed_prefix`, then as the default.
    RemapIdentity {
        /// The prefix of the image's reference.
        prefix: String,
        /// What it is signed as.
        signed_prefix: String,
    },
}

/// Where a public key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A PEM file on the host (`keyPath`, `keyPaths`).
    Path(String),
    /// Base64 of PEM (`keyData`, `keyDatas`).
    Data(String),
}

/// A `sigstoreSigned` requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sigstore {
    /// The public keys; one accepted signature by any of them satisfies it.
    pub keys: Vec<KeySource>,
    /// Keyless (`fulcio` or `pki`): a certificate chain instead of keys.
    pub keyless: bool,
    /// A Rekor key is given: the signature must carry a valid Rekor SET too.
    pub rekor: bool,
    /// How the signed identity must match.
    pub identity: Identity,
}

/// One requirement of a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `insecureAcceptAnything`.
    Accept,
    /// `reject`.
    Reject,
    /// `signedBy`: a GPG simple signing signature (`keyType`).
    SignedBy(String),
    /// `sigstoreSigned`.
    Sigstore(Sigstore),
    /// `signedBaseLayer`.
    SignedBaseLayer,
}

impl Requirement {
    /// Whether it wants a signature.
    pub fn needs_signature(&self) -> bool {
        !matches!(self, Requirement::Accept | Requirement::Reject)
    }
}

/// A parsed policy: the default and the `docker` transport's scopes (the other transports are
/// parsed, so a malformed one is refused as containers/image refuses it, but not kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    default: Vec<Requirement>,
    docker: BTreeMap<String, Vec<Requirement>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIdentity {
    #[serde(rename = "type")]
    kind: String,
    docker_reference: Option<String>,
    docker_repository: Option<String>,
    prefix: Option<String>,
    signed_prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequirement {
    #[serde(rename = "type")]
    kind: String,
    key_type: Option<String>,
    key_path: Option<String>,
    #[serde(default)]
    key_paths: Vec<String>,
    key_data: Option<String>,
    #[serde(default)]
    key_datas: Vec<String>,
    fulcio: Option<serde_json::Value>,
    pki: Option<serde_json::Value>,
    rekor_public_key_path: Option<String>,
    rekor_public_key_data: Option<String>,
    #[serde(default)]
    rekor_public_key_paths: Vec<String>,
    #[serde(default)]
    rekor_public_key_datas: Vec<String>,
    signed_identity: Option<RawIdentity>,
}

#[derive(Deserialize)]
struct RawPolicy {
    #[serde(default)]
    default: Vec<RawRequirement>,
    #[serde(default)]
    transports: BTreeMap<String, BTreeMap<String, Vec<RawRequirement>>>,
}

/// Why a policy document, or the requirements that apply, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not JSON of the policy shape (where serde stopped; the text is not quoted).
    #[error("not a policy document (line {line} column {column})")]
    Format {
        /// The line.
        line: usize,
        /// The column.
        column: usize,
    },
    /// The applicable requirements are empty.
    #[error("no requirement applies (an empty default is refused)")]
    Empty,
    /// A requirement type containers/image does not know (quoted).
    #[error("unknown requirement type {0}")]
    UnknownRequirement(String),
    /// A requirement of a known type that containers/image would refuse: what is wrong.
    #[error("{0}")]
    Malformed(String),
}

impl PolicyError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            PolicyError::Format { .. } => "policy-malformed",
            PolicyError::Empty => "policy-empty",
            PolicyError::UnknownRequirement(_) => "policy-unknown-requirement",
            PolicyError::Malformed(_) => "policy-requirement-malformed",
        }
    }
}

fn identity(raw: Option<RawIdentity>) -> Result<Identity, String> {
    let Some(r) = raw else {
        return Ok(Identity::MatchRepoDigestOrExact);
    };
    let field = |v: Option<String>, name: &str| {
        v.filter(|s| !s.is_empty())
            .ok_or_else(|| format!("signedIdentity {} needs {name}", r.kind))
    };
    Ok(match r.kind.as_str() {
        "matchRepoDigestOrExact" => Identity::MatchRepoDigestOrExact,
        "matchExact" => Identity::MatchExact,
        "matchRepository" => Identity::MatchRepository,
        "exactReference" => {
            Identity::ExactReference(field(r.docker_reference.clone(), "dockerReference")?)
        }
        "exactRepository" => {
            Identity::ExactRepository(field(r.docker_repository.clone(), "dockerRepository")?)
        }
        "remapIdentity" => Identity::RemapIdentity {
            prefix: field(r.prefix.clone(), "prefix")?,
            signed_prefix: field(r.signed_prefix.clone(), "signedPrefix")?,
        },
        other => {
            return Err(format!(
                "unknown signedIdentity type {}",
                crate::text::quote(other)
            ));
        }
    })
}

fn requirement(r: RawRequirement) -> Result<Requirement, PolicyError> {
    Ok(match r.kind.as_str() {
        "insecureAcceptAnything" => Requirement::Accept,
        "reject" => Requirement::Reject,
        "signedBy" => Requirement::SignedBy(r.key_type.unwrap_or_default()),
        "signedBaseLayer" => Requirement::SignedBaseLayer,
        "sigstoreSigned" => {
            let keys: Vec<KeySource> = r
                .key_path
                .into_iter()
                .chain(r.key_paths)
                .map(KeySource::Path)
                .chain(
                    r.key_data
                        .into_iter()
                        .chain(r.key_datas)
                        .map(KeySource::Data),
                )
                .collect();
            let keyless = r.fulcio.is_some() || r.pki.is_some();
            if keys.is_empty() != keyless {
                return Err(PolicyError::Malformed(
                    "sigstoreSigned needs exactly one of keyPath(s)/keyData(s), fulcio or pki"
                        .into(),
                ));
            }
            Requirement::Sigstore(Sigstore {
                keys,
                keyless,
                rekor: r.rekor_public_key_path.is_some()
                    || r.rekor_public_key_data.is_some()
                    || !r.rekor_public_key_paths.is_empty()
                    || !r.rekor_public_key_datas.is_empty(),
                identity: identity(r.signed_identity).map_err(PolicyError::Malformed)?,
            })
        }
        other => {
            return Err(PolicyError::UnknownRequirement(crate::text::quote(other)));
        }
    })
}

fn requirements(raw: Vec<RawRequirement>) -> Result<Vec<Requirement>, PolicyError> {
    raw.into_iter().map(requirement).collect()
}

/// The scopes of `image` in `transports.docker`, most specific first, `""` last.
fn scopes(image: &ImageRef) -> Vec<String> {
    let mut scopes = vec![image.to_string()];
    let mut name = format!("{}/{}", image.registry(), image.repository());
    scopes.push(name.clone());
    while let Some(cut) = name.rfind('/') {
        name.truncate(cut);
        scopes.push(name.clone());
    }
    let host = image.registry().split(':').next().unwrap_or_default();
    let mut labels: &str = host;
    while let Some((_, rest)) = labels.split_once('.') {
        scopes.push(format!("*.{rest}"));
        labels = rest;
    }
    scopes.push(String::new());
    scopes
}

impl Policy {
    /// Parses a policy document; every transport's requirements are validated.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let raw: RawPolicy = serde_json::from_str(text).map_err(|e| PolicyError::Format {
            line: e.line(),
            column: e.column(),
        })?;
        let default = requirements(raw.default)?;
        let mut docker = BTreeMap::new();
        for (transport, scopes) in raw.transports {
            for (scope, reqs) in scopes {
                let reqs = requirements(reqs)?;
                if transport == "docker" {
                    docker.insert(scope, reqs);
                }
            }
        }
        Ok(Policy { default, docker })
    }

    /// The scope that applies to `image` (`None`: `default`) and its requirements; an empty
    /// list is refused, as containers/image refuses it.
    pub fn requirements_for(
        &self,
        image: &ImageRef,
    ) -> Result<(Option<String>, &[Requirement]), PolicyError> {
        let (scope, reqs) = scopes(image)
            .into_iter()
            .find_map(|s| self.docker.get(&s).map(|r| (Some(s), r.as_slice())))
            .unwrap_or((None, self.default.as_slice()));
        if reqs.is_empty() {
            return Err(PolicyError::Empty);
        }
        Ok((scope, reqs))
    }

    /// Whether `default` is exactly `[insecureAcceptAnything]`: ostree-ext then refuses a
    /// pull from the verifying origin ("containers-policy.json specifies a default of
    /// `insecureAcceptAnything`; refusing usage").
    pub fn default_is_insecure(&self) -> bool {
        self.default == [Requirement::Accept]
    }
}

/// How a scope is named in a reason.
pub fn scope_name(scope: Option<&str>) -> String {
    match scope {
        None => "default".into(),
        Some("") => "transports.docker[\"\"]".into(),
        Some(s) => format!("transports.docker[{}]", crate::text::quote(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn img(name: &str) -> ImageRef {
        format!("{name}@{D}").parse().expect("ref")
    }

    const OPENSHIFT: &str = r#"{"default":[{"type":"insecureAcceptAnything"}],
        "transports":{"docker":{
          "quay.io/openshift-release-dev/ocp-release":[{"type":"sigstoreSigned",
            "keyData":"LS0tLS1CRUdJTg==","signedIdentity":{"type":"matchRepoDigestOrExact"}}],
          "q.example/keyless":[{"type":"sigstoreSigned","fulcio":{"caData":"eA=="},
            "rekorPublicKeyData":"eA=="}],
          "q.example/gpg":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}],
          "q.example/remap":[{"type":"sigstoreSigned","keyPath":"/etc/pki/k.pub",
            "signedIdentity":{"type":"remapIdentity","prefix":"q.example/remap","signedPrefix":"quay.io/o"}}],
          "blocked.example":[{"type":"reject"}]},
         "docker-daemon":{"":[{"type":"insecureAcceptAnything"}]}}}"#;

    #[test]
    fn the_most_specific_scope_applies_with_its_requirements() {
        let p = Policy::parse(OPENSHIFT).expect("policy");
        assert!(p.default_is_insecure());
        let (scope, reqs) = p
            .requirements_for(&img("quay.io/openshift-release-dev/ocp-release/x"))
            .map(|(s, r)| (s, r.to_vec()))
            .expect("reqs");
        // A namespace scope: the repository below it inherits it.
        assert_eq!(
            scope.as_deref(),
            Some("quay.io/openshift-release-dev/ocp-release")
        );
        assert_eq!(
            reqs,
            vec![Requirement::Sigstore(Sigstore {
                keys: vec![KeySource::Data("LS0tLS1CRUdJTg==".into())],
                keyless: false,
                rekor: false,
                identity: Identity::MatchRepoDigestOrExact,
            })]
        );
        let one = |n: &str| p.requirements_for(&img(n)).expect("reqs").1[0].clone();
        assert_eq!(one("quay.io/other/os"), Requirement::Accept);
        assert_eq!(one("blocked.example/os"), Requirement::Reject);
        assert_eq!(
            one("q.example/gpg"),
            Requirement::SignedBy("GPGKeys".into())
        );
        assert!(
            matches!(one("q.example/keyless"), Requirement::Sigstore(s) if s.keyless && s.rekor)
        );
        assert!(matches!(
            one("q.example/remap"),
            Requirement::Sigstore(Sigstore {
                identity: Identity::RemapIdentity { .. },
                ..
            })
        ));
        assert_eq!(
            scope_name(
                p.requirements_for(&img("quay.io/other/os"))
                    .expect("r")
                    .0
                    .as_deref()
            ),
            "default"
        );
    }

    #[test]
    fn malformed_requirements_are_refused_in_any_transport() {
        for bad in [
            r#"{"default":[{"type":"sigstoreSigned"}]}"#,
            r#"{"default":[{"type":"sigstoreSigned","keyPath":"/k","fulcio":{}}]}"#,
            r#"{"default":[{"type":"sigstoreSigned","keyPath":"/k","signedIdentity":{"type":"exactReference"}}]}"#,
            r#"{"default":[{"type":"accept"}]}"#,
            r#"{"default":[{"type":"reject"}],"transports":{"atomic":{"":[{"type":"nope"}]}}}"#,
            "{",
        ] {
            assert!(Policy::parse(bad).is_err(), "accepted {bad}");
        }
        let empty = Policy::parse(r#"{"default":[]}"#).expect("parses");
        assert!(empty.requirements_for(&img("x.example/os")).is_err());
        let strict = Policy::parse(r#"{"default":[{"type":"reject"}]}"#).expect("parses");
        assert!(!strict.default_is_insecure());
    }
}
