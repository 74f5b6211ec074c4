//! Typed view of rpm-ostree deployment dictionaries (`a{sv}`).
//!
//! Replies from the daemon are input like any other: a missing key or a wrong type is a typed
//! error naming the key, never a panic.

use std::collections::{BTreeMap, HashMap};

use zbus::zvariant::{OwnedValue, Value};

/// A deployment reply that does not have the documented shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rpm-ostree deployment {key}: {problem}")]
pub struct DeploymentError {
    /// The dictionary key.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

impl DeploymentError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "deployment-malformed"
    }
}

/// One entry of `Sysroot.Deployments`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Deployment {
    /// `<osname>-<checksum>.<serial>`.
    pub id: String,
    /// Stateroot.
    pub osname: String,
    /// Deploy serial.
    pub serial: i32,
    /// Deployment commit.
    pub checksum: String,
    /// The base image's commit under layered packages (`base-checksum`; absent when nothing
    /// is layered, the base is then `checksum`).
    #[serde(default)]
    pub base_checksum: Option<String>,
    /// Currently booted.
    pub booted: bool,
    /// Staged for the next boot.
    pub staged: bool,
    /// Pinned.
    pub pinned: bool,
    /// Staged and waiting for `FinalizeDeployment`.
    pub finalization_locked: bool,
    /// Version label or commit version.
    pub version: Option<String>,
    /// Container origin refspec, verbatim (`ostree-unverified-registry:…`).
    pub container_image_reference: Option<String>,
    /// Manifest digest of the container image (best effort in rpm-ostree).
    pub container_image_reference_digest: Option<String>,
    /// Layered packages requested in the origin.
    pub requested_packages: Vec<String>,
    /// Base packages removed by override.
    pub requested_base_removals: Vec<String>,
    /// Local RPMs layered from files (NEVRAs).
    pub requested_local_packages: Vec<String>,
    /// Base packages replaced by local RPMs (NEVRAs).
    pub requested_base_local_replacements: Vec<String>,
    /// Labels of the image config, when the commit metadata carries it.
    pub image_labels: BTreeMap<String, String>,
    /// Why [`Deployment::image_labels`] could not be read (the stored image configuration is
    /// malformed, or on bootc, which does not print them, the libostree helper failed); they
    /// are then empty and say nothing. `None` when they were read, also when there are none.
    #[serde(default)]
    pub image_labels_error: Option<String>,
    /// bootc's `incompatible`: the origin has rpm-ostree package changes bootc cannot show or
    /// carry (their list is then unknown). Never set from rpm-ostree's own dictionaries.
    pub incompatible: bool,
}

/// Container refspec prefixes followed directly by a registry pullspec.
const REGISTRY_PREFIXES: [&str; 6] = [
    "ostree-unverified-registry:",
    "ostree-unverified-image:registry:",
    "ostree-unverified-image:docker://",
    "ostree-image-signed:registry:",
    "ostree-image-signed:docker://",
    "docker://",
];

/// The prefix of the machine-config daemon's rebase onto an image it pulled into local storage
/// first (openshift/machine-config-operator pkg/daemon/rpm-ostree.go
/// `RebaseLayeredFromContainerStorage`, 4.21 to 4.23): the image keeps the registry name it was
/// pulled by, after an optional `[driver@graphroot+runroot]` store specifier
/// (containers/image storage/storage_reference.go).
const CONTAINERS_STORAGE: &str = "ostree-unverified-image:containers-storage:";

/// The registry pullspec inside a container refspec, if it names a registry image (also one
/// the machine-config daemon deployed from local storage, by the name it pulled it with).
pub fn pullspec_of_refspec(refspec: &str) -> Option<&str> {
    if let Some(stored) = refspec.strip_prefix(CONTAINERS_STORAGE) {
        let name = match stored.strip_prefix('[') {
            Some(rest) => rest.split_once(']')?.1,
            None => stored,
        };
        return (!name.is_empty()).then_some(name);
    }
    if let Some(p) = REGISTRY_PREFIXES
        .iter()
        .find_map(|p| refspec.strip_prefix(p))
    {
        return Some(p);
    }
    // ostree-remote-registry:<remote>:<pullspec> / ostree-remote-image:<remote>:docker://<pullspec>
    if let Some(rest) = refspec.strip_prefix("ostree-remote-registry:") {
        return rest.split_once(':').map(|(_, p)| p);
    }
    if let Some(rest) = refspec.strip_prefix("ostree-remote-image:") {
        let (_, t) = rest.split_once(':')?;
        return t
            .strip_prefix("docker://")
            .or_else(|| t.strip_prefix("registry:"));
    }
    None
}

impl Deployment {
    /// The commit of the base image: what rpm-ostreed before v2025.7 compares
    /// `FinalizeDeployment`'s checksum with (`base-checksum`, else `checksum`).
    pub fn base_commit(&self) -> &str {
        self.base_checksum.as_deref().unwrap_or(&self.checksum)
    }

    /// Parses one dictionary.
    pub fn from_dict(d: &HashMap<String, OwnedValue>) -> Result<Self, DeploymentError> {
        let base_meta = opt(d, "base-commit-meta", dict_of)?.unwrap_or_default();
        // A malformed configuration leaves the labels unknown, as on bootc, and the rest of
        // the deployment usable: rpm-ostree lists such a deployment, and one bad rollback
        // commit must not make every status unreadable.
        let (image_labels, image_labels_error) = match base_meta
            .get("ostree.container.image-config")
            .map(|cfg| labels_of(cfg))
        {
            None => (BTreeMap::new(), None),
            Some(Ok(labels)) => (labels, None),
            Some(Err(e)) => (BTreeMap::new(), Some(e.to_string())),
        };
        Ok(Deployment {
            id: req(d, "id", string)?,
            osname: req(d, "osname", string)?,
            serial: req(d, "serial", |v| match v {
                Value::I32(i) => Ok(*i),
                other => Err(type_problem("i", other)),
            })?,
            checksum: req(d, "checksum", string)?,
            base_checksum: opt(d, "base-checksum", string)?,
            booted: opt(d, "booted", boolean)?.unwrap_or(false),
            staged: opt(d, "staged", boolean)?.unwrap_or(false),
            pinned: opt(d, "pinned", boolean)?.unwrap_or(false),
            finalization_locked: opt(d, "finalization-locked", boolean)?.unwrap_or(false),
            version: opt(d, "version", string)?,
            container_image_reference: opt(d, "container-image-reference", string)?,
            container_image_reference_digest: opt(d, "container-image-reference-digest", string)?,
            requested_packages: opt(d, "requested-packages", strings)?.unwrap_or_default(),
            requested_base_removals: opt(d, "requested-base-removals", strings)?
                .unwrap_or_default(),
            requested_local_packages: opt(d, "requested-local-packages", strings)?
                .unwrap_or_default(),
            requested_base_local_replacements: opt(
                d,
                "requested-base-local-replacements",
                strings,
            )?
            .unwrap_or_default(),
            image_labels,
            image_labels_error,
            incompatible: false,
        })
    }

    /// Parses the `Deployments` property.
    pub fn parse_all(list: &[HashMap<String, OwnedValue>]) -> Result<Vec<Self>, DeploymentError> {
        list.iter().map(Deployment::from_dict).collect()
    }

    /// The registry pullspec this deployment was made from, if it is a container deployment.
    pub fn pullspec(&self) -> Option<&str> {
        pullspec_of_refspec(self.container_image_reference.as_deref()?)
    }

    /// The manifest digest: the reported one, else the one pinned in the reference.
    pub fn image_digest(&self) -> Option<&str> {
        self.container_image_reference_digest
            .as_deref()
            .or_else(|| self.pinned_digest())
    }

    /// Whether this deployment carries the image `other` was deployed from (by digest).
    pub fn carries_image_of(&self, other: &Deployment) -> bool {
        other
            .container_image_reference_digest
            .as_deref()
            .or_else(|| other.pinned_digest())
            .is_some_and(|d| self.carries_digest(d))
    }

    /// The digest pinned in the reference (`…@sha256:…`), if any.
    fn pinned_digest(&self) -> Option<&str> {
        self.pullspec()?.split_once('@').map(|(_, d)| d)
    }

    /// Every package this deployment layers or swaps in, by name or NEVRA.
    pub fn added_packages(&self) -> impl Iterator<Item = &str> {
        self.requested_packages
            .iter()
            .chain(&self.requested_local_packages)
            .chain(&self.requested_base_local_replacements)
            .map(String::as_str)
    }

    /// Whether this deployment was made from the image with `digest`.
    pub fn carries_digest(&self, digest: &str) -> bool {
        // The pullspec may pin an index while rpm-ostree reports the platform manifest.
        self.container_image_reference_digest.as_deref() == Some(digest)
            || self.pinned_digest() == Some(digest)
    }
}

/// The deployment that boots next when it is not the booted one: a staged deployment, or one
/// `ostree admin deploy` wrote without `--stage` (pending, but never staged nor locked). It is
/// also the origin rpm-ostree edits for the next deploy, not the booted one
/// (coreos/rpm-ostree:src/daemon/rpmostree-sysroot-core.cxx
/// `rpmostree_syscore_get_origin_merge_deployment`: the first deployment of the stateroot).
pub fn pending(deployments: &[Deployment]) -> Option<&Deployment> {
    // `Deployments` is in boot order: what comes before the booted one boots first.
    match deployments.iter().position(|d| d.booted) {
        Some(b) => deployments
            .get(..b)?
            .iter()
            .find(|d| d.osname == deployments[b].osname),
        None => deployments.iter().find(|d| d.staged),
    }
}

fn err(key: &str, problem: impl Into<String>) -> DeploymentError {
    DeploymentError {
        key: key.to_string(),
        problem: problem.into(),
    }
}

fn type_problem(want: &str, got: &Value<'_>) -> String {
    format!("expected type {want}, got {}", got.value_signature())
}

fn req<T>(
    d: &HashMap<String, OwnedValue>,
    key: &str,
    f: impl Fn(&Value<'_>) -> Result<T, String>,
) -> Result<T, DeploymentError> {
    opt(d, key, f)?.ok_or_else(|| err(key, "missing"))
}

fn opt<T>(
    d: &HashMap<String, OwnedValue>,
    key: &str,
    f: impl Fn(&Value<'_>) -> Result<T, String>,
) -> Result<Option<T>, DeploymentError> {
    d.get(key)
        .map(|v| f(unwrap_variant(v)).map_err(|p| err(key, p)))
        .transpose()
}

fn unwrap_variant<'a>(v: &'a Value<'a>) -> &'a Value<'a> {
    match v {
        Value::Value(inner) => unwrap_variant(inner),
        other => other,
    }
}

fn string(v: &Value<'_>) -> Result<String, String> {
    match v {
        Value::Str(s) => Ok(s.to_string()),
        other => Err(type_problem("s", other)),
    }
}

fn boolean(v: &Value<'_>) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(type_problem("b", other)),
    }
}

fn strings(v: &Value<'_>) -> Result<Vec<String>, String> {
    match v {
        Value::Array(a) => a.iter().map(|e| string(unwrap_variant(e))).collect(),
        other => Err(type_problem("as", other)),
    }
}

fn dict_of(v: &Value<'_>) -> Result<HashMap<String, String>, String> {
    // Only string values are of interest; other metadata types are skipped, not rejected.
    match v {
        Value::Dict(d) => Ok(d
            .iter()
            .filter_map(|(k, v)| match (k, unwrap_variant(v)) {
                (Value::Str(k), Value::Str(s)) => Some((k.to_string(), s.to_string())),
                _ => None,
            })
            .collect()),
        other => Err(type_problem("a{sv}", other)),
    }
}

/// A stored image configuration that is not JSON (serde's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ostree.container.image-config is not JSON: {0}")]
pub struct ImageConfigError(pub String);

impl ImageConfigError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "image-config-not-json"
    }
}

/// The string labels (`config.Labels`) of an image configuration; an error when it is not JSON.
pub(crate) fn labels_of(config_json: &str) -> Result<BTreeMap<String, String>, ImageConfigError> {
    let v: serde_json::Value =
        serde_json::from_str(config_json).map_err(|e| ImageConfigError(e.to_string()))?;
    Ok(v.pointer("/config/Labels")
        .and_then(|l| l.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::zvariant::{Array, Dict, Signature};

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn ov(v: Value<'_>) -> OwnedValue {
        v.try_to_owned().expect("owned")
    }

    fn base() -> HashMap<String, OwnedValue> {
        let mut d = HashMap::new();
        d.insert("id".into(), ov(Value::from("rhcos-abc.0")));
        d.insert("osname".into(), ov(Value::from("rhcos")));
        d.insert("serial".into(), ov(Value::I32(0)));
        d.insert("checksum".into(), ov(Value::from("abc")));
        d.insert("booted".into(), ov(Value::Bool(true)));
        d
    }

    #[test]
    fn parses_container_deployment() {
        let mut d = base();
        let r = format!("ostree-unverified-registry:quay.io/openshift/rhcos@{DIGEST}");
        d.insert(
            "container-image-reference".into(),
            ov(Value::from(r.as_str())),
        );
        d.insert(
            "requested-packages".into(),
            ov(Value::Array(Array::from(vec!["usbguard"]))),
        );
        let mut meta = Dict::new(&Signature::Str, &Signature::Variant);
        meta.append(
            Value::from("ostree.container.image-config"),
            Value::Value(Box::new(Value::from(
                r#"{"config":{"Labels":{"io.openshift.os.streamclass":"rhel-9","n":1}}}"#,
            ))),
        )
        .expect("append");
        d.insert("base-commit-meta".into(), ov(Value::Dict(meta)));
        let dep = Deployment::from_dict(&d).expect("parse");
        assert!(dep.booted && !dep.staged);
        assert_eq!(
            dep.pullspec(),
            Some(&r["ostree-unverified-registry:".len()..])
        );
        assert!(dep.carries_digest(DIGEST));
        assert_eq!(dep.requested_packages, vec!["usbguard".to_string()]);
        assert_eq!(
            dep.image_labels
                .get("io.openshift.os.streamclass")
                .map(String::as_str),
            Some("rhel-9")
        );
        assert_eq!(dep.image_labels.len(), 1, "non-string labels are skipped");
    }

    #[test]
    fn reported_digest_wins() {
        let mut d = base();
        d.insert(
            "container-image-reference".into(),
            ov(Value::from("ostree-unverified-registry:quay.io/x/y:latest")),
        );
        d.insert(
            "container-image-reference-digest".into(),
            ov(Value::from(DIGEST)),
        );
        let dep = Deployment::from_dict(&d).expect("parse");
        assert_eq!(dep.image_digest(), Some(DIGEST));
    }

    #[test]
    fn the_pending_deployment_is_whatever_boots_before_the_booted_one() {
        let dep = |id: &str, osname: &str, booted: bool, staged: bool| Deployment {
            id: id.into(),
            osname: osname.into(),
            booted,
            staged,
            ..Deployment::default()
        };
        let booted = dep("b", "rhcos", true, false);
        let rollback = dep("r", "rhcos", false, false);
        let staged = dep("s", "rhcos", false, true);
        // `ostree admin deploy` without `--stage`: pending, not staged.
        let admin = dep("a", "rhcos", false, false);
        let other = dep("o", "fedora", false, false);
        let id = |list: &[Deployment]| pending(list).map(|d| d.id.clone());
        assert_eq!(id(&[booted.clone(), rollback.clone()]), None);
        assert_eq!(id(&[staged.clone(), booted.clone()]), Some("s".into()));
        assert_eq!(id(&[admin.clone(), booted.clone()]), Some("a".into()));
        assert_eq!(
            id(&[staged.clone(), admin, booted.clone(), rollback]),
            Some("s".into())
        );
        assert_eq!(id(&[other, booted]), None, "another stateroot's");
        assert_eq!(id(&[staged]), Some("s".into()), "nothing booted");
    }

    #[test]
    fn a_missing_digest_falls_back_to_the_pinned_one() {
        let mut d = base();
        let r = format!("ostree-unverified-registry:quay.io/x/y@{DIGEST}");
        d.insert(
            "container-image-reference".into(),
            ov(Value::from(r.as_str())),
        );
        let dep = Deployment::from_dict(&d).expect("parse");
        assert_eq!(dep.container_image_reference_digest, None);
        assert_eq!(dep.image_digest(), Some(DIGEST));
        assert!(dep.carries_digest(DIGEST));
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut missing = base();
        missing.remove("id");
        assert_eq!(
            Deployment::from_dict(&missing).expect_err("missing").key,
            "id"
        );
        let mut wrong = base();
        wrong.insert("serial".into(), ov(Value::from("0")));
        let e = Deployment::from_dict(&wrong).expect_err("type");
        assert_eq!(e.key, "serial");
        assert!(e.problem.contains("expected type i"), "{e}");
        let mut bad_meta = base();
        let mut meta = Dict::new(&Signature::Str, &Signature::Variant);
        meta.append(
            Value::from("ostree.container.image-config"),
            Value::Value(Box::new(Value::from("{not json"))),
        )
        .expect("append");
        bad_meta.insert("base-commit-meta".into(), ov(Value::Dict(meta)));
        let dep = Deployment::from_dict(&bad_meta).expect("the rest of the deployment parses");
        assert!(dep.image_labels.is_empty());
        let why = dep.image_labels_error.expect("labels unknown");
        assert!(
            why.starts_with("ostree.container.image-config is not JSON: key must be a string"),
            "{why}"
        );
        let mut wrong_meta = base();
        wrong_meta.insert("base-commit-meta".into(), ov(Value::from("x")));
        assert_eq!(
            Deployment::from_dict(&wrong_meta).expect_err("type").key,
            "base-commit-meta"
        );
    }

    #[test]
    fn refspec_prefixes() {
        let cases = [
            ("ostree-unverified-registry:q.io/a@x", Some("q.io/a@x")),
            ("ostree-unverified-image:docker://q.io/a", Some("q.io/a")),
            ("ostree-image-signed:registry:q.io/a", Some("q.io/a")),
            ("ostree-remote-registry:fedora:q.io/a", Some("q.io/a")),
            ("ostree-remote-image:fedora:docker://q.io/a", Some("q.io/a")),
            ("ostree-unverified-image:oci:/dir", None),
            (
                "ostree-unverified-image:containers-storage:q.io/a@sha256:1",
                Some("q.io/a@sha256:1"),
            ),
            (
                "ostree-unverified-image:containers-storage:[overlay@/var/lib/containers/storage+/run/containers/storage]q.io/a@sha256:1",
                Some("q.io/a@sha256:1"),
            ),
            (
                "ostree-unverified-image:containers-storage:[overlay@/x",
                None,
            ),
            ("ostree-unverified-image:containers-storage:", None),
            ("fedora:fedora/x86_64/coreos/stable", None),
        ];
        for (r, want) in cases {
            assert_eq!(pullspec_of_refspec(r), want, "{r}");
        }
    }
}
