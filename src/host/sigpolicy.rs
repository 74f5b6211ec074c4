//! The OS image's signature before staging: what the host's `policy.json` requires for it,
//! whether streamd could verify that, and whether the stage uses the verifying origin
//! (`ostree-image-signed:docker://…` on rpm-ostree, `--enforce-container-sigpolicy` on bootc).
//!
//! - The verifying origin is used when the image's scope requires a signature, and always when
//!   the booted deployment came from it: a signed origin is never replaced by an unverified
//!   one. ostree-ext refuses the verifying origin while the policy's `default` is
//!   `[insecureAcceptAnything]` ([`crate::image::signature`]): then a required signature is
//!   staged from the unverified transport (the daemon's proxy still enforces the scope's
//!   requirement), and a booted signed origin is refused.
//! - A `sigstoreSigned` requirement with keys is verified against the registry's cosign
//!   attachment ([`crate::image::sigstore`]) where the daemon pulls from (the mirror that
//!   serves it), with the daemon's credentials; a failure refuses the move.
//! - `reject`, GPG `signedBy`, `signedBaseLayer`, keyless (Fulcio) and Rekor requirements
//!   refuse the move: streamd stages nothing it has not verified, and never only warns.

use crate::host::facts::HostRoot;
use crate::host::ospull::{self, OsPull};
use crate::image::reference::{ImageRef, SIGNED_PREFIX};
use crate::image::registry::{Access, InspectError, Inspector};
use crate::image::signature::{Policy, Requirement, Sigstore, scope_name};
use crate::image::sigstore;

/// What preflight found about the OS image's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// Stage from the verifying origin.
    pub verifying: bool,
    /// Why the signature side is fine, or why the move is refused.
    pub verdict: Result<String, Refused>,
}

/// Why the signature side refuses the move: what the policy requires and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl Refused {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "signature-refused"
    }
}

/// Where and how the image is read for its signatures.
struct Pull<'a> {
    root: &'a HostRoot,
    image: &'a ImageRef,
    os_pull: &'a OsPull,
    /// The platform manifest's digest, when the image is an index (either may be signed, as
    /// skopeo's proxy accepts either).
    platform_digest: Option<&'a str>,
    access: &'a Access,
}

/// Judges `image` for a host whose booted deployment's refspec is `booted_ref`. `Err` only
/// for a transient registry failure (retried).
pub async fn judge(
    root: &HostRoot,
    image: &ImageRef,
    booted_ref: Option<&str>,
    os_pull: &OsPull,
    platform_digest: Option<&str>,
    access: &Access,
) -> Result<Judgement, InspectError> {
    let booted_signed = booted_ref.is_some_and(|r| r.starts_with(SIGNED_PREFIX));
    let refuse = |why: String| {
        Ok(Judgement {
            verifying: booted_signed,
            verdict: Err(Refused(why)),
        })
    };
    let (file, policy) = match ospull::policy_file(root)
        .map_err(|e| e.to_string())
        .and_then(|(f, t)| {
            Policy::parse(&t)
                .map(|p| (f, p))
                .map_err(|e| format!("{f}: {e}"))
        }) {
        Ok(p) => p,
        Err(e) => return refuse(format!("the signature policy cannot be read: {e}")),
    };
    let (scope, reqs) = match policy.requirements_for(image) {
        Ok(r) => r,
        Err(e) => return refuse(format!("{file}: {e}")),
    };
    let scope = scope_name(scope.as_deref());
    if reqs.contains(&Requirement::Reject) {
        return refuse(format!("{file} rejects {image} ({scope} is reject)"));
    }
    let needs = reqs.iter().any(Requirement::needs_signature);
    let insecure_default = policy.default_is_insecure();
    if booted_signed && insecure_default {
        return refuse(format!(
            "the booted deployment was staged from a verifying origin ({SIGNED_PREFIX}) and is never moved to an unverified one, but ostree-ext refuses that origin while the default of {file} is insecureAcceptAnything; set a default that is not insecureAcceptAnything (e.g. reject, with the needed scopes listed)"
        ));
    }
    let verifying = booted_signed || (needs && !insecure_default);
    let origin = if verifying {
        format!("staged from the verifying origin ({SIGNED_PREFIX}docker://…)")
    } else if needs {
        format!(
            "staged from the unverified transport, under which the OS daemon still enforces {scope}, because ostree-ext refuses the verifying origin while the default of {file} is insecureAcceptAnything"
        )
    } else {
        "staged from the unverified transport, as the booted deployment was".into()
    };
    if !needs {
        return Ok(Judgement {
            verifying,
            verdict: Ok(format!(
                "{file} requires no signature for {image} ({scope}); {origin}"
            )),
        });
    }
    let pull = Pull {
        root,
        image,
        os_pull,
        platform_digest,
        access,
    };
    let mut verified = Vec::new();
    for r in reqs.iter().filter(|r| r.needs_signature()) {
        match satisfy(&pull, r).await? {
            Ok(how) => verified.push(how),
            Err(why) => {
                return Ok(Judgement {
                    verifying,
                    verdict: Err(Refused(format!(
                        "{file} requires a signature for {image} ({scope}): {why}"
                    ))),
                });
            }
        }
    }
    Ok(Judgement {
        verifying,
        verdict: Ok(format!(
            "{file} requires a signature for {image} ({scope}): {}; {origin}",
            verified.join("; ")
        )),
    })
}

/// Whether one requirement that wants a signature is met: `Ok(Ok(how))`, `Ok(Err(why not))`.
async fn satisfy(pull: &Pull<'_>, r: &Requirement) -> Result<Result<String, String>, InspectError> {
    let cannot = |what: &str| {
        Ok(Err(format!(
            "it is {what}, which streamd cannot verify before staging, so it refuses rather than stage an image it has not verified"
        )))
    };
    match r {
        Requirement::SignedBy(key_type) => cannot(&format!(
            "a GPG simple signing requirement (signedBy, keyType {})",
            crate::text::quote(key_type)
        )),
        Requirement::SignedBaseLayer => cannot("a signedBaseLayer requirement"),
        Requirement::Sigstore(s) if s.keyless => {
            cannot("a keyless sigstoreSigned requirement (fulcio or pki)")
        }
        Requirement::Sigstore(s) if s.rekor => {
            cannot("a sigstoreSigned requirement with a Rekor key (the signature's Rekor SET)")
        }
        Requirement::Sigstore(s) => verify_sigstore(pull, s).await,
        Requirement::Accept | Requirement::Reject => Ok(Ok(String::new())),
    }
}

/// Verifies a key-based `sigstoreSigned` requirement at the endpoint the daemon pulls from.
async fn verify_sigstore(
    pull: &Pull<'_>,
    s: &Sigstore,
) -> Result<Result<String, String>, InspectError> {
    let read = |p: &str| match ospull::read_host_file(pull.root, p) {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err(format!("{p}: no such file")),
        Err(e) => Err(format!("{p}: {e}")),
    };
    let keys = match sigstore::load_keys(&s.keys, read) {
        Ok(k) => k,
        Err(e) => return Ok(Err(format!("its public key cannot be used: {e}"))),
    };
    let Some(attempt) = pull.os_pull.pulled() else {
        return Ok(Err(
            "not verified: the OS daemon cannot read the image (see os-pull-credentials and os-image)"
                .into(),
        ));
    };
    let Ok(source) = format!("{}@{}", attempt.source, pull.image.digest()).parse::<ImageRef>()
    else {
        return Ok(Err(format!("{} is not a valid source", attempt.source)));
    };
    let inspector = match inspector(pull, &source) {
        Ok(i) => i,
        Err(e) => return Ok(Err(e)),
    };
    let mut digests = vec![pull.image.digest()];
    digests.extend(pull.platform_digest.filter(|d| *d != pull.image.digest()));
    let mut reasons = Vec::new();
    for digest in digests {
        let tag = sigstore::attachment_tag(digest);
        match sigstore::fetch(&inspector, &source, digest).await {
            Err(e @ InspectError::Transient { .. }) => return Err(e),
            Err(e) => reasons.push(format!("{tag} at {}: {e}", attempt.source)),
            Ok(None) => reasons.push(format!(
                "a signature was required, but no signature exists ({} has no {tag})",
                attempt.source
            )),
            Ok(Some(found)) => {
                match sigstore::verify(&found, &keys, &s.identity, pull.image, digest) {
                    Ok(()) => {
                        return Ok(Ok(format!(
                            "the sigstore signature of {digest} at {} is verified ({} key(s), identity {:?})",
                            attempt.source,
                            keys.len(),
                            s.identity
                        )));
                    }
                    Err(e) => reasons.push(format!("{tag} at {}: {e}", attempt.source)),
                }
            }
        }
    }
    Ok(Err(reasons.join("; ")))
}

/// A client for `source` as the daemon reads it: the ostree auth file's credentials, certs.d,
/// plain HTTP where streamd's configuration says so and registries.conf's `insecure` rules.
fn inspector(pull: &Pull<'_>, source: &ImageRef) -> Result<Inspector, String> {
    let secret = ospull::auth_file(pull.root)
        .map_err(|e| e.to_string())?
        .map(|a| a.secret)
        .unwrap_or_default();
    let sources = ospull::registries_conf(pull.root)
        .map_err(|e| e.to_string())?
        .pull_sources(pull.image)
        .map_err(|e| e.to_string())?;
    let inspector = Inspector::configured(secret, pull.access, &pull.root.path("/"))
        .map_err(|e| e.to_string())?;
    Ok(
        match sources
            .iter()
            .find(|s| s.image.registry() == source.registry())
        {
            Some(s) => inspector.for_source(s, &sources),
            None => inspector,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn root_with(name: &str, policy: &str) -> (testbed::scratch::ScratchDir, HostRoot) {
        let dir =
            testbed::scratch::ScratchDir::new(&format!("sigpolicy-{name}")).expect("scratch dir");
        std::fs::create_dir_all(dir.join("etc/containers")).expect("dir");
        std::fs::write(dir.join("etc/containers/policy.json"), policy).expect("policy");
        let root = HostRoot::new(dir.path());
        (dir, root)
    }

    /// What `policy` makes of `q.example/os@D` on a host booted from `booted` (nothing is
    /// pulled: the OS daemon's view has no endpoint that served the image).
    async fn judged(name: &str, policy: &str, booted: &str) -> Judgement {
        let (_dir, root) = root_with(name, policy);
        let image: ImageRef = format!("q.example/os@{D}").parse().expect("ref");
        let view = OsPull {
            auth_file: None,
            problem: None,
            policy: None,
            attempts: Vec::new(),
        };
        judge(&root, &image, Some(booted), &view, None, &Access::default())
            .await
            .expect("not transient")
    }

    fn policy(default: &str, scope: &str) -> String {
        format!(r#"{{"default":[{default}],"transports":{{"docker":{{"q.example":[{scope}]}}}}}}"#)
    }

    const ACCEPT: &str = r#"{"type":"insecureAcceptAnything"}"#;
    const REJECT: &str = r#"{"type":"reject"}"#;
    const UNSIGNED: &str = "ostree-unverified-registry:q.example/os@sha256:00";
    const SIGNED: &str = "ostree-image-signed:docker://q.example/os@sha256:00";

    #[tokio::test]
    async fn requirements_streamd_cannot_verify_refuse() {
        for (name, scope, want) in [
            ("reject", REJECT, "rejects q.example/os"),
            (
                "gpg",
                r#"{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k.gpg"}"#,
                "GPG simple signing requirement",
            ),
            ("base", r#"{"type":"signedBaseLayer"}"#, "signedBaseLayer"),
            (
                "keyless",
                r#"{"type":"sigstoreSigned","fulcio":{"caData":"eA=="},"rekorPublicKeyData":"eA=="}"#,
                "keyless",
            ),
            (
                "rekor",
                r#"{"type":"sigstoreSigned","keyData":"eA==","rekorPublicKeyData":"eA=="}"#,
                "Rekor",
            ),
            (
                "nokey",
                r#"{"type":"sigstoreSigned","keyPath":"/etc/pki/none.pub"}"#,
                "/etc/pki/none.pub: no such file",
            ),
        ] {
            let j = judged(name, &policy(REJECT, scope), UNSIGNED).await;
            let why = j.verdict.expect_err(name);
            assert!(why.0.contains(want), "{name}: {why}");
            assert!(
                why.0.contains("q.example"),
                "{name}: the scope is named: {why}"
            );
            // A requirement for a signature means the verifying origin (the default is not
            // insecureAcceptAnything here).
            assert_eq!(j.verifying, name != "reject", "{name}");
        }
    }

    #[tokio::test]
    async fn the_verifying_origin_is_kept_and_never_downgraded() {
        // Nothing required, booted unsigned: as before.
        let j = judged("plain", &policy(ACCEPT, ACCEPT), UNSIGNED).await;
        assert!(!j.verifying && j.verdict.is_ok(), "{j:?}");
        // Booted signed: staged signed, where ostree-ext takes it.
        let j = judged("kept", &policy(REJECT, ACCEPT), SIGNED).await;
        assert!(j.verifying && j.verdict.is_ok(), "{j:?}");
        // Booted signed, default insecureAcceptAnything: refused, not staged unverified.
        let j = judged("never", &policy(ACCEPT, ACCEPT), SIGNED).await;
        assert!(j.verifying, "{j:?}");
        let why = j.verdict.expect_err("refused");
        assert!(why.0.contains("never moved to an unverified one"), "{why}");
        // A required signature under an insecure default: the unverified transport (the
        // daemon would refuse the verifying one), and still verified by streamd first.
        let j = judged(
            "insecure-default",
            &policy(ACCEPT, r#"{"type":"sigstoreSigned","keyData":"eA=="}"#),
            UNSIGNED,
        )
        .await;
        assert!(!j.verifying, "{j:?}");
        assert!(j.verdict.is_err(), "{j:?}");
    }
}
