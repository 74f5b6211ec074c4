//! How the OS daemons (rpm-ostreed, bootc) pull the OS image: with the host's ostree auth file,
//! the host's containers `registries.conf` (mirrors, `blocked`, `insecure`) and `policy.json`,
//! never with streamd's own pull secret.
//!
//! - Auth file: the first of [`AUTH_FILES`] that exists (bootc-dev/bootc:
//!   crates/ostree-ext/src/globals.rs `ConfigPaths::open_file` for uid 0); none at all means an
//!   anonymous pull (crates/ostree-ext/src/container/mod.rs `merge_default_container_proxy_opts`
//!   sets `auth_anonymous`). The machine-config daemon links the kubelet's pull secret to
//!   `/run/ostree/auth.json` (rpm-ostree) and `/etc/ostree/auth.json` (bootc)
//!   (openshift/machine-config-operator:pkg/daemon/image_manager_helper.go `linkAuthFile`).
//!   An absolute symlink resolves below the host root, as cap-std's `RootDir` does there.
//! - `registries.conf`: see [`crate::image::registries`]; every endpoint is tried in order and
//!   the first that serves the manifest is used.
//! - `policy.json`: [`POLICY_FILES`]; a `reject` requirement for the image refuses the pull.
//!   skopeo's containers/image (≤ v5.36, what RHEL 9.6/10 ship) reads `/etc/containers/policy.json`
//!   only, and ostree-ext falls back to `/usr/share/containers/policy.json` only since bootc
//!   v1.16.3 (1dc4dcc5): a node without the `/etc` file refuses every pull, whatever `/usr/share` says.
//!
//! streamd never writes any of these files (see docs/protocol.md, "Pull credentials").

use std::io::ErrorKind;
use std::path::PathBuf;

use crate::host::facts::HostRoot;
use crate::image::pullsecret::PullSecret;
use crate::image::pullsecret::PullSecretError;
use crate::image::reference::ImageRef;
use crate::image::registries::{CONF, CONF_D, ConfError, MappingError, RegistriesConf};
use crate::image::registry::{Access, InspectError, Inspector, OsImageInfo};

/// The ostree auth files, in the order ostree-ext looks (uid 0).
pub const AUTH_FILES: [&str; 3] = [
    "/run/ostree/auth.json",
    "/etc/ostree/auth.json",
    "/usr/lib/ostree/auth.json",
];

/// The containers policy files the daemon's pull reads (no user config for root here; no
/// `/usr/share` fallback on shipped releases, see the module doc).
pub const POLICY_FILES: [&str; 1] = ["/etc/containers/policy.json"];

/// Symlink hops followed before a file counts as unreadable (the kernel's own limit is 40).
const MAX_LINKS: usize = 8;
/// Largest configuration file read (auth files and policies are a few KiB).
const MAX_FILE: u64 = 1 << 20;

/// The auth file the daemon reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFile {
    /// Its host path (one of [`AUTH_FILES`]).
    pub path: &'static str,
    /// Its credentials.
    pub secret: PullSecret,
}

/// Reads `host_path` below `root`, following symlinks with absolute targets below `root` too.
/// `Ok(None)`: it does not exist (or dangles).
pub(crate) fn read_host_file(root: &HostRoot, host_path: &str) -> std::io::Result<Option<String>> {
    let mut path = root.path(host_path);
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = if target.is_absolute() {
                    root.path(&target.to_string_lossy())
                } else {
                    path.parent().map(|p| p.join(&target)).unwrap_or(target)
                };
            }
            Ok(m) if m.len() > MAX_FILE => {
                return Err(std::io::Error::other(format!(
                    "larger than {MAX_FILE} bytes"
                )));
            }
            Ok(_) => return std::fs::read_to_string(&path).map(Some),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

/// A host configuration file of the OS daemon's pull that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullConfigError {
    /// A file (or directory) could not be read.
    #[error("{path}: {message}")]
    Unreadable {
        /// Its host path.
        path: String,
        /// Why.
        message: String,
    },
    /// The auth file is no docker config.
    #[error("{path}: {source}")]
    AuthFile {
        /// Its host path.
        path: &'static str,
        /// What is wrong.
        source: PullSecretError,
    },
    /// `registries.conf` or a drop-in is malformed.
    #[error(transparent)]
    Registries(#[from] ConfError),
    /// A `[[registry]]` entry maps the image to no valid reference.
    #[error(transparent)]
    Mapping(#[from] MappingError),
    /// The policy file cannot be evaluated.
    #[error("{path}: {source}")]
    Policy {
        /// Its host path.
        path: &'static str,
        /// What is wrong.
        source: PolicyError,
    },
    /// No policy file exists.
    #[error(
        "no containers policy ({}); the daemon refuses every pull without one",
        POLICY_FILES.join(", ")
    )]
    NoPolicy,
}

impl PullConfigError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            PullConfigError::Unreadable { .. } => "pull-config-unreadable",
            PullConfigError::AuthFile { .. } => "auth-file-invalid",
            PullConfigError::Registries(e) => e.label(),
            PullConfigError::Mapping(e) => e.label(),
            PullConfigError::Policy { source, .. } => source.label(),
            PullConfigError::NoPolicy => "policy-missing",
        }
    }
}

fn unreadable(path: &str, e: impl std::fmt::Display) -> PullConfigError {
    PullConfigError::Unreadable {
        path: path.to_string(),
        message: e.to_string(),
    }
}

pub use crate::image::signature::PolicyError;

/// Why the OS daemon would not get the OS image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// A configuration problem stops every pull ([`OsPull::problem`]).
    #[error("the OS daemon cannot pull: {0}")]
    Stopped(String),
    /// No pull source served the image: what the last one said.
    #[error("{0}")]
    NotServed(String),
}

impl PullError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            PullError::Stopped(_) => "os-pull-stopped",
            PullError::NotServed(_) => "os-image-not-served",
        }
    }
}

/// The auth file the daemon would use: `Ok(None)` when there is none (an anonymous pull).
pub fn auth_file(root: &HostRoot) -> Result<Option<AuthFile>, PullConfigError> {
    for path in AUTH_FILES {
        match read_host_file(root, path) {
            Ok(None) => continue,
            Ok(Some(text)) => {
                let secret = PullSecret::parse(&text)
                    .map_err(|source| PullConfigError::AuthFile { path, source })?;
                return Ok(Some(AuthFile { path, secret }));
            }
            Err(e) => return Err(unreadable(path, e)),
        }
    }
    Ok(None)
}

/// `registries.conf` merged with its drop-ins (`*.conf`, lexical order); none is an empty
/// configuration.
pub fn registries_conf(root: &HostRoot) -> Result<RegistriesConf, PullConfigError> {
    let mut conf = RegistriesConf::default();
    let read = |p: &str| read_host_file(root, p).map_err(|e| unreadable(p, e));
    if let Some(text) = read(CONF)? {
        conf.merge(CONF, &text)?;
    }
    let mut drop_ins: Vec<PathBuf> = match std::fs::read_dir(root.path(CONF_D)) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(unreadable(CONF_D, e)),
    };
    drop_ins.sort();
    for p in drop_ins {
        let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let host_path = format!("{CONF_D}/{name}");
        if let Some(text) = read(&host_path)? {
            conf.merge(&host_path, &text)?;
        }
    }
    Ok(conf)
}

/// What `policy.json` says about an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyVerdict {
    /// `insecureAcceptAnything`.
    Accept,
    /// `signedBy` / `sigstoreSigned`: the pull needs a valid signature.
    NeedsSignature,
    /// `reject`.
    Reject,
}

/// What the policy requirements for `image` over the docker transport say
/// ([`crate::image::signature::Policy::requirements_for`]).
pub fn policy_verdict(policy_json: &str, image: &ImageRef) -> Result<PolicyVerdict, PolicyError> {
    use crate::image::signature::{Policy, Requirement};
    let policy = Policy::parse(policy_json)?;
    let (_, reqs) = policy.requirements_for(image)?;
    Ok(if reqs.contains(&Requirement::Reject) {
        PolicyVerdict::Reject
    } else if reqs.iter().any(Requirement::needs_signature) {
        PolicyVerdict::NeedsSignature
    } else {
        PolicyVerdict::Accept
    })
}

/// The policy file the daemon reads (the first of [`POLICY_FILES`]) and its text.
pub fn policy_file(root: &HostRoot) -> Result<(&'static str, String), PullConfigError> {
    for path in POLICY_FILES {
        match read_host_file(root, path) {
            Ok(None) => continue,
            Ok(Some(text)) => return Ok((path, text)),
            Err(e) => return Err(unreadable(path, e)),
        }
    }
    Err(PullConfigError::NoPolicy)
}

/// The policy file the daemon reads and its verdict for `image`.
pub fn policy(
    root: &HostRoot,
    image: &ImageRef,
) -> Result<(&'static str, PolicyVerdict), PullConfigError> {
    let (path, text) = policy_file(root)?;
    policy_verdict(&text, image)
        .map(|v| (path, v))
        .map_err(|source| PullConfigError::Policy { path, source })
}

/// What happened at one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The manifest and config were read there: the daemon pulls from here.
    Pulled,
    /// Refused by a `blocked = true` entry with this prefix.
    Blocked(String),
    /// The registry wants a credential the auth file does not have (or rejected the one it has).
    Unauthorized,
    /// Anything else (manifest unknown, a malformed answer, unreachable).
    Failed(String),
}

/// One endpoint the daemon tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// `host/repository` at this endpoint.
    pub source: String,
    /// A mirror (else the primary location).
    pub mirror: bool,
    /// Whether the auth file has a credential for it.
    pub credential: bool,
    /// What happened.
    pub outcome: AttemptOutcome,
}

/// The OS daemon's view of one OS image pull, as preflight evaluated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsPull {
    /// The auth file used (`None`: anonymous).
    pub auth_file: Option<&'static str>,
    /// A configuration problem that stops every pull (unreadable auth file, bad
    /// registries.conf, a policy that rejects the image).
    pub problem: Option<String>,
    /// The policy file and its verdict, when readable.
    pub policy: Option<(&'static str, PolicyVerdict)>,
    /// The endpoints in the order the daemon tries them (empty with a `problem`).
    pub attempts: Vec<Attempt>,
}

impl OsPull {
    /// The endpoint the daemon pulls from, if any.
    pub fn pulled(&self) -> Option<&Attempt> {
        self.attempts
            .iter()
            .find(|a| a.outcome == AttemptOutcome::Pulled)
    }
}

/// Reads `image` for `arch` where the OS daemon would, with its credentials: each pull source
/// in order until one serves it. Returns the view and the image (or why not). A transient
/// failure at an endpoint nothing later served ends it as transient (retried).
///
/// `access` is what streamd's own configuration says (plain-HTTP registries, trusted hosts); an
/// endpoint `registries.conf` marks `insecure` is spoken to over TLS without verification,
/// then plain HTTP, and certs.d below `root` is read, as containers/image does
/// ([`Inspector::for_source`], [`Inspector::configured`]).
pub async fn inspect(
    root: &HostRoot,
    image: &ImageRef,
    arch: &str,
    access: &Access,
) -> Result<(OsPull, Result<OsImageInfo, PullError>), InspectError> {
    let mut view = OsPull {
        auth_file: None,
        problem: None,
        policy: None,
        attempts: Vec::new(),
    };
    let stop = |mut view: OsPull, problem: String| {
        view.problem = Some(problem.clone());
        Ok((view, Err(PullError::Stopped(problem))))
    };
    let auth = match auth_file(root) {
        Ok(a) => a,
        Err(e) => return stop(view, format!("auth file unusable: {e}")),
    };
    view.auth_file = auth.as_ref().map(|a| a.path);
    match policy(root, image) {
        Ok((path, PolicyVerdict::Reject)) => {
            view.policy = Some((path, PolicyVerdict::Reject));
            return stop(view, format!("{path} rejects {image}"));
        }
        Ok(p) => view.policy = Some(p),
        Err(e) => return stop(view, e.to_string()),
    }
    let sources = match registries_conf(root).and_then(|c| Ok(c.pull_sources(image)?)) {
        Ok(s) => s,
        Err(e) => return stop(view, e.to_string()),
    };
    let secret = auth.map(|a| a.secret).unwrap_or_default();
    let inspector = match Inspector::configured(secret.clone(), access, &root.path("/")) {
        Ok(i) => i,
        Err(e) => return stop(view, e.to_string()),
    };
    let mut last = String::new();
    let mut transient = None;
    for s in &sources {
        let mut attempt = Attempt {
            source: format!("{}/{}", s.image.registry(), s.image.repository()),
            mirror: s.mirror,
            credential: secret
                .for_repository(s.image.registry(), s.image.repository())
                .is_some(),
            outcome: AttemptOutcome::Pulled,
        };
        if let Some(prefix) = &s.blocked_by {
            attempt.outcome = AttemptOutcome::Blocked(prefix.clone());
            last = format!("{}: blocked in {CONF} or {CONF_D}", attempt.source);
            view.attempts.push(attempt);
            continue;
        }
        match inspector
            .for_source(s, &sources)
            .os_image(&s.image, arch)
            .await
        {
            Ok(info) => {
                view.attempts.push(attempt);
                return Ok((view, Ok(info)));
            }
            Err(e @ InspectError::Transient { .. }) => {
                attempt.outcome = AttemptOutcome::Failed(e.to_string());
                last = e.to_string();
                transient = Some(e);
            }
            Err(InspectError::Unauthorized(_)) => {
                attempt.outcome = AttemptOutcome::Unauthorized;
                last = format!(
                    "{}: unauthorized ({})",
                    attempt.source,
                    match (view.auth_file, attempt.credential) {
                        (None, _) => "no auth file: anonymous pull".to_string(),
                        (Some(f), false) => format!("no credential for it in {f}"),
                        (Some(f), true) => format!("the credential in {f} was rejected"),
                    }
                );
            }
            Err(e) => {
                last = e.to_string();
                attempt.outcome = AttemptOutcome::Failed(e.to_string());
            }
        }
        view.attempts.push(attempt);
    }
    if let Some(e) = transient {
        return Err(e);
    }
    Ok((view, Err(PullError::NotServed(last))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn img(name: &str) -> ImageRef {
        format!("{name}@{D}").parse().expect("ref")
    }

    fn scratch(name: &str) -> (testbed::scratch::ScratchDir, HostRoot) {
        let dir =
            testbed::scratch::ScratchDir::new(&format!("ospull-{name}")).expect("scratch dir");
        let root = HostRoot::new(dir.path());
        (dir, root)
    }

    fn put(root: &HostRoot, path: &str, text: &str) {
        let p = root.path(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn auth_files_are_looked_up_in_ostree_ext_order() {
        let (_dir, root) = scratch("order");
        assert_eq!(auth_file(&root), Ok(None));
        let used = |root: &HostRoot| auth_file(root).expect("ok").expect("some").path;
        let entry = r#"{"auths":{"u.example":{"auth":"dTpw"}}}"#;
        put(&root, "/usr/lib/ostree/auth.json", entry);
        assert_eq!(used(&root), AUTH_FILES[2]);
        put(&root, "/etc/ostree/auth.json", entry);
        assert_eq!(used(&root), AUTH_FILES[1]);
        // The MCD's link: absolute, resolved below the host root; dangling means "not there".
        std::fs::create_dir_all(root.path("/run/ostree")).expect("mkdir");
        std::os::unix::fs::symlink("/var/lib/kubelet/config.json", root.path(AUTH_FILES[0]))
            .expect("link");
        assert_eq!(used(&root), AUTH_FILES[1]);
        put(
            &root,
            "/var/lib/kubelet/config.json",
            r#"{"auths":{"k.example":{"auth":"dTpw"}}}"#,
        );
        let a = auth_file(&root).expect("ok").expect("some");
        assert_eq!(a.path, AUTH_FILES[0]);
        assert!(a.secret.for_registry("k.example").is_some());
        // An invalid file stops the lookup (ostree-ext passes it on, and the pull fails), and
        // the error never shows its content.
        put(
            &root,
            "/var/lib/kubelet/config.json",
            r#"{"auths":{"k":{"auth":"hunter2!!"}}}"#,
        );
        let e = auth_file(&root).expect_err("invalid").to_string();
        assert!(e.starts_with("/run/ostree/auth.json: "), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
    }

    /// Only `/etc/containers/policy.json` counts: the daemons' containers/image on shipped
    /// releases has no `/usr/share` fallback, so a node with only that file refuses every pull.
    #[test]
    fn the_policy_is_read_from_etc_only() {
        let (_dir, root) = scratch("policy-etc");
        let accept = r#"{"default":[{"type":"insecureAcceptAnything"}]}"#;
        put(&root, "/usr/share/containers/policy.json", accept);
        assert_eq!(policy_file(&root), Err(PullConfigError::NoPolicy));
        put(&root, "/etc/containers/policy.json", accept);
        assert_eq!(
            policy_file(&root).expect("policy").0,
            "/etc/containers/policy.json"
        );
    }

    #[test]
    fn policy_scopes_go_from_specific_to_default() {
        let p = r#"{"default":[{"type":"insecureAcceptAnything"}],
            "transports":{"docker":{
              "blocked.example":[{"type":"reject"}],
              "q.example/team":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}],
              "q.example/team/open":[{"type":"insecureAcceptAnything"}],
              "*.corp.example":[{"type":"reject"}]
            }}}"#;
        let v = |n: &str| policy_verdict(p, &img(n)).expect("verdict");
        assert_eq!(v("blocked.example/os"), PolicyVerdict::Reject);
        assert_eq!(v("q.example/team/os"), PolicyVerdict::NeedsSignature);
        assert_eq!(v("q.example/team/open"), PolicyVerdict::Accept);
        assert_eq!(v("a.corp.example:5000/os"), PolicyVerdict::Reject);
        assert_eq!(v("other.example/os"), PolicyVerdict::Accept);
        let reject_all = r#"{"default":[{"type":"reject"}],"transports":{"docker":{"ok.example":[{"type":"insecureAcceptAnything"}]}}}"#;
        assert_eq!(
            policy_verdict(reject_all, &img("x.example/os")),
            Ok(PolicyVerdict::Reject)
        );
        assert_eq!(
            policy_verdict(reject_all, &img("ok.example/os")),
            Ok(PolicyVerdict::Accept)
        );
        assert!(matches!(
            policy_verdict("{", &img("x.example/os")),
            Err(PolicyError::Format { line: 1, .. })
        ));
        assert_eq!(
            policy_verdict(r#"{"default":[]}"#, &img("x.example/os")),
            Err(PolicyError::Empty)
        );
        let unknown = policy_verdict(r#"{"default":[{"type":"x"}]}"#, &img("x.example/os"))
            .expect_err("unknown requirement");
        assert_eq!(unknown.to_string(), "unknown requirement type \"x\"");
        assert_eq!(unknown.label(), "policy-unknown-requirement");
    }

    /// Every configuration error has a label of its own, in kebab case, and the text the
    /// reasons carried before the errors were typed.
    #[test]
    fn configuration_errors_are_labelled() {
        let errors = [
            unreadable("/etc/ostree/auth.json", "denied"),
            PullConfigError::AuthFile {
                path: AUTH_FILES[0],
                source: PullSecretError::Format("line 1 column 1".into()),
            },
            PullConfigError::Registries(ConfError {
                file: CONF.into(),
                problem: "bad".into(),
            }),
            PullConfigError::Policy {
                path: POLICY_FILES[0],
                source: PolicyError::Empty,
            },
            PullConfigError::NoPolicy,
        ];
        let labels: std::collections::BTreeSet<&str> = errors.iter().map(|e| e.label()).collect();
        assert_eq!(labels.len(), errors.len(), "{labels:?}");
        for l in &labels {
            assert!(
                l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{l}"
            );
        }
        assert_eq!(errors[0].to_string(), "/etc/ostree/auth.json: denied");
        assert_eq!(
            errors[4].to_string(),
            "no containers policy (/etc/containers/policy.json); \
             the daemon refuses every pull without one"
        );
        assert_eq!(
            PullError::Stopped("x".into()).to_string(),
            "the OS daemon cannot pull: x"
        );
    }

    #[test]
    fn drop_ins_are_read_in_order() {
        let (_dir, root) = scratch("dropins");
        put(
            &root,
            CONF,
            "[[registry]]\nlocation = \"r.example\"\nblocked = true\n",
        );
        put(
            &root,
            &format!("{CONF_D}/90-unblock.conf"),
            "[[registry]]\nlocation = \"r.example\"\n",
        );
        put(
            &root,
            &format!("{CONF_D}/10-x.conf"),
            "[[registry]]\nlocation = \"r.example\"\nblocked = true\n",
        );
        put(&root, &format!("{CONF_D}/README"), "not a drop-in [");
        let c = registries_conf(&root).expect("conf");
        assert_eq!(c.find("r.example/os").map(|r| r.blocked), Some(false));
        put(
            &root,
            &format!("{CONF_D}/95-bad.conf"),
            "[[registry]]\nprefix = 3\n",
        );
        let e = registries_conf(&root).expect_err("bad").to_string();
        assert!(
            e.starts_with("/etc/containers/registries.conf.d/95-bad.conf: "),
            "{e}"
        );
    }
}
