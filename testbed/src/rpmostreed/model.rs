//! Deployments, their persisted state (`state.json`), refspecs and the image catalog lookup.
//!
//! `state.json` is `{"deployments": [Deployment…], "reboot_requested": bool}` with the
//! deployments in boot order (staged first, then booted, then rollback). The simulated
//! reboot edits this file while the testbed is down; every field of [`Deployment`] is
//! plain data so it can.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zbus::zvariant::{OwnedValue, Value};

use crate::images::TestImage;

/// File name of the persisted state inside the state directory.
const STATE_FILE: &str = "state.json";

/// Size of one fake ostree chunk layer; 12 of them make the "1.2 GB" pulls print.
pub(crate) const CHUNK_BYTES: u64 = 100_000_000;
/// Number of ostree chunk layers every image has.
pub(crate) const CHUNK_COUNT: u32 = 12;

/// One deployment of the fake sysroot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Deployment {
    pub(crate) osname: String,
    pub(crate) serial: i32,
    pub(crate) checksum: String,
    pub(crate) booted: bool,
    pub(crate) staged: bool,
    #[serde(default)]
    pub(crate) pinned: bool,
    #[serde(default)]
    pub(crate) finalization_locked: bool,
    /// The refspec verbatim, e.g. `ostree-unverified-registry:host/repo@sha256:…`.
    pub(crate) container_image_reference: String,
    /// `sha256:…` manifest digest.
    pub(crate) container_image_reference_digest: String,
    pub(crate) version: String,
    pub(crate) timestamp: u64,
    /// Kernel release, for the boot config.
    pub(crate) kernel: String,
    /// The image config JSON (`ostree.container.image-config`).
    pub(crate) image_config: String,
}

impl Deployment {
    /// A deployment of `image` reached through `refspec`.
    pub(crate) fn new(
        osname: &str,
        refspec: &str,
        image: &TestImage,
        serial: i32,
        booted: bool,
        staged: bool,
    ) -> Self {
        Deployment {
            osname: osname.to_string(),
            serial,
            checksum: commit_checksum(&image.digest),
            booted,
            staged,
            pinned: false,
            finalization_locked: false,
            container_image_reference: refspec.to_string(),
            container_image_reference_digest: image.digest.clone(),
            version: image.version.clone(),
            timestamp: version_timestamp(&image.version),
            kernel: image.kernel.clone(),
            image_config: image.config_json(),
        }
    }

    /// `<osname>-<checksum>.<serial>`.
    pub(crate) fn id(&self) -> String {
        format!("{}-{}.{}", self.osname, self.checksum, self.serial)
    }

    /// The deployment dictionary (`a{sv}`) with the keys and types the real daemon produces
    /// for an unlayered container deployment.
    pub(crate) fn to_dict(&self) -> zbus::zvariant::Result<HashMap<String, OwnedValue>> {
        let empty_strv = || OwnedValue::try_from(Value::from(Vec::<String>::new()));
        let mut d: HashMap<String, OwnedValue> = HashMap::new();
        d.insert(
            "id".into(),
            OwnedValue::from(zbus::zvariant::Str::from(self.id())),
        );
        d.insert("osname".into(), str_value(&self.osname));
        d.insert("serial".into(), OwnedValue::from(self.serial));
        d.insert("checksum".into(), str_value(&self.checksum));
        d.insert("booted".into(), OwnedValue::from(self.booted));
        d.insert("staged".into(), OwnedValue::from(self.staged));
        d.insert("pinned".into(), OwnedValue::from(self.pinned));
        d.insert("unlocked".into(), str_value("none"));

        let mut meta: HashMap<String, OwnedValue> = HashMap::new();
        meta.insert(
            "ostree.manifest-digest".into(),
            str_value(&self.container_image_reference_digest),
        );
        meta.insert(
            "ostree.container.image-config".into(),
            str_value(&self.image_config),
        );
        meta.insert("version".into(), str_value(&self.version));
        d.insert("base-commit-meta".into(), OwnedValue::from(meta));

        d.insert("packages".into(), empty_strv()?);
        d.insert(
            "base-removals".into(),
            OwnedValue::try_from(Value::from(Vec::<OwnedValue>::new()))?,
        );
        d.insert(
            "base-local-replacements".into(),
            OwnedValue::try_from(Value::from(Vec::<(OwnedValue, OwnedValue)>::new()))?,
        );
        d.insert(
            "base-remote-replacements".into(),
            OwnedValue::from(HashMap::<String, OwnedValue>::new()),
        );
        for key in [
            "requested-packages",
            "requested-local-packages",
            "requested-local-fileoverride-packages",
            "requested-base-removals",
            "requested-base-local-replacements",
        ] {
            d.insert(key.into(), empty_strv()?);
        }
        d.insert("regenerate-initramfs".into(), OwnedValue::from(false));
        d.insert("version".into(), str_value(&self.version));
        d.insert("timestamp".into(), OwnedValue::from(self.timestamp));
        d.insert(
            "container-image-reference".into(),
            str_value(&self.container_image_reference),
        );
        d.insert(
            "container-image-reference-digest".into(),
            str_value(&self.container_image_reference_digest),
        );
        // The real daemon only ever adds this key as `true`, and only for a staged deployment.
        if self.staged && self.finalization_locked {
            d.insert("finalization-locked".into(), OwnedValue::from(true));
        }
        Ok(d)
    }
}

fn str_value(s: &str) -> OwnedValue {
    OwnedValue::from(zbus::zvariant::Str::from(s.to_string()))
}

/// The ostree commit an image imports to: stable per manifest digest, like a real import.
fn commit_checksum(digest: &str) -> String {
    format!("{:x}", Sha256::digest(format!("ostree-commit:{digest}")))
}

/// Commit timestamp from a version like `9.6.20261101-0` (midnight UTC of that day).
fn version_timestamp(version: &str) -> u64 {
    let date = version
        .split('.')
        .find(|part| part.len() >= 8 && part.as_bytes()[..8].iter().all(u8::is_ascii_digit))
        .map(|part| &part[..8]);
    let Some(date) = date else {
        return 1;
    };
    let num = |r: std::ops::Range<usize>| date[r].parse::<i64>().unwrap_or(1);
    let days = days_from_civil(num(0..4), num(4..6), num(6..8));
    u64::try_from(days * 86_400).unwrap_or(1)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The persisted sysroot state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    /// Boot order: staged first, then booted, then rollback.
    pub(crate) deployments: Vec<Deployment>,
    /// Set by a successful `FinalizeDeployment` (or a deploy with `reboot`); the simulated
    /// reboot consumes it.
    #[serde(default)]
    pub(crate) reboot_requested: bool,
}

impl State {
    /// A fresh sysroot booted into `image`.
    pub(crate) fn initial(osname: &str, image: &TestImage) -> Self {
        let refspec = format!("ostree-unverified-registry:{}", image.pullspec);
        State {
            deployments: vec![Deployment::new(osname, &refspec, image, 0, true, false)],
            reboot_requested: false,
        }
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// The state saved in `dir`, if there is one.
    pub(crate) fn load(dir: &Path) -> anyhow::Result<Option<State>> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing {}", path.display()))
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The modification time of the saved state, to notice edits by other tools.
    pub(crate) fn mtime(dir: &Path) -> Option<std::time::SystemTime> {
        std::fs::metadata(Self::path(dir))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Write the state to `dir` atomically (write a temporary file, then rename).
    pub(crate) fn save(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = Self::path(dir);
        let tmp = dir.join(format!("{STATE_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(self)?;
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))
    }

    fn booted_index(&self) -> Option<usize> {
        self.deployments.iter().position(|d| d.booted)
    }

    /// The booted deployment.
    pub(crate) fn booted(&self) -> Option<&Deployment> {
        self.booted_index().map(|i| &self.deployments[i])
    }

    /// The pending deployment of `osname` (before the booted one in boot order), if any.
    pub(crate) fn pending(&self, osname: &str) -> Option<&Deployment> {
        let end = self.booted_index().unwrap_or(0);
        self.deployments[..end].iter().find(|d| d.osname == osname)
    }

    /// The rollback deployment of `osname` (after the booted one), if any.
    pub(crate) fn rollback(&self, osname: &str) -> Option<&Deployment> {
        let start = self.booted_index().map_or(0, |i| i + 1);
        self.deployments[start..]
            .iter()
            .find(|d| d.osname == osname)
    }

    /// What `osname` boots next: the pending deployment, else the booted one
    /// (`DefaultDeployment` and the origin merge deployment).
    pub(crate) fn default_for(&self, osname: &str) -> Option<&Deployment> {
        self.pending(osname)
            .or_else(|| self.booted().filter(|d| d.osname == osname))
    }

    /// The staged deployment, mutably.
    pub(crate) fn staged_mut(&mut self) -> Option<&mut Deployment> {
        self.deployments.first_mut().filter(|d| d.staged)
    }

    /// Stage a deployment of `image` for `osname`, replacing a previously staged one.
    pub(crate) fn stage(&mut self, osname: &str, refspec: &str, image: &TestImage, locked: bool) {
        self.remove_staged(osname);
        let checksum = commit_checksum(&image.digest);
        // ostree numbers deployments of the same commit per stateroot.
        let serial = self
            .deployments
            .iter()
            .filter(|d| d.osname == osname && d.checksum == checksum)
            .map(|d| d.serial + 1)
            .max()
            .unwrap_or(0);
        let mut d = Deployment::new(osname, refspec, image, serial, false, true);
        d.finalization_locked = locked;
        self.deployments.insert(0, d);
    }

    /// Drop the staged deployment of `osname`; whether there was one.
    pub(crate) fn remove_staged(&mut self, osname: &str) -> bool {
        let before = self.deployments.len();
        self.deployments
            .retain(|d| !(d.staged && d.osname == osname));
        self.deployments.len() != before
    }

    /// Drop the rollback deployment of `osname`; whether there was one.
    pub(crate) fn remove_rollback(&mut self, osname: &str) -> bool {
        let start = self.booted_index().map_or(0, |i| i + 1);
        let found = self.deployments[start..]
            .iter()
            .position(|d| d.osname == osname);
        match found {
            Some(i) => {
                self.deployments.remove(start + i);
                true
            }
            None => false,
        }
    }
}

/// The object path of an osname's OS object, escaped like the real daemon does it:
/// `[A-Za-z0-9_]` kept, `-` and `/` become `_`, any other byte `_XX` (uppercase hex).
pub(crate) fn os_object_path(osname: &str) -> String {
    let mut path = String::from("/org/projectatomic/rpmostree1/");
    for b in osname.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' => path.push(char::from(b)),
            b'-' | b'/' => path.push('_'),
            other => path.push_str(&format!("_{other:02X}")),
        }
    }
    path
}

/// Where a container image comes from (containers-image transports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Registry,
    OciDir,
    OciArchive,
    DockerArchive,
    ContainerStorage,
    Dir,
}

impl Transport {
    fn parse(s: &str) -> Option<Transport> {
        Some(match s {
            "registry" => Transport::Registry,
            "oci" => Transport::OciDir,
            "oci-archive" => Transport::OciArchive,
            "docker-archive" => Transport::DockerArchive,
            "containers-storage" => Transport::ContainerStorage,
            "dir" => Transport::Dir,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Transport::Registry => "registry",
            Transport::OciDir => "oci",
            Transport::OciArchive => "oci-archive",
            Transport::DockerArchive => "docker-archive",
            Transport::ContainerStorage => "containers-storage",
            Transport::Dir => "dir",
        }
    }
}

/// How the image signature is checked (the ostree-ext refspec prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
enum SigVerify {
    Unverified,
    Signed,
    Remote(String),
}

/// A container image refspec (`ostree_ext::container::OstreeImageReference`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageRef {
    sig: SigVerify,
    transport: Transport,
    name: String,
}

/// What `set-refspec` names, classified like `refspec_classify()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refspec {
    Container(ImageRef),
    Checksum(String),
    Ostree {
        remote: Option<String>,
        branch: String,
    },
}

impl Refspec {
    /// Classify a refspec; a leading `ostree://` is stripped first.
    pub(crate) fn classify(refspec: &str) -> Refspec {
        let refspec = refspec.strip_prefix("ostree://").unwrap_or(refspec);
        if let Some(img) = ImageRef::parse(refspec) {
            return Refspec::Container(img);
        }
        if refspec.len() == 64 && refspec.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Refspec::Checksum(refspec.to_string());
        }
        match refspec.split_once(':') {
            Some((remote, branch)) => Refspec::Ostree {
                remote: Some(remote.to_string()),
                branch: branch.to_string(),
            },
            None => Refspec::Ostree {
                remote: None,
                branch: refspec.to_string(),
            },
        }
    }
}

impl ImageRef {
    fn parse(s: &str) -> Option<ImageRef> {
        let (sig, transport, name) =
            if let Some(rest) = s.strip_prefix("ostree-unverified-registry:") {
                (SigVerify::Unverified, Transport::Registry, rest)
            } else if let Some(rest) = s.strip_prefix("ostree-unverified-image:") {
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Unverified, t, n)
            } else if let Some(rest) = s.strip_prefix("ostree-image-signed:") {
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Signed, t, n)
            } else if let Some(rest) = s.strip_prefix("ostree-remote-registry:") {
                let (remote, n) = rest.split_once(':')?;
                (
                    SigVerify::Remote(remote.to_string()),
                    Transport::Registry,
                    n,
                )
            } else if let Some(rest) = s.strip_prefix("ostree-remote-image:") {
                let (remote, rest) = rest.split_once(':')?;
                let (t, n) = Self::parse_transport(rest)?;
                (SigVerify::Remote(remote.to_string()), t, n)
            } else {
                return None;
            };
        if name.is_empty() {
            return None;
        }
        Some(ImageRef {
            sig,
            transport,
            name: name.to_string(),
        })
    }

    /// `docker://NAME` or `TRANSPORT:NAME`; `docker:NAME` (no `//`) is invalid.
    fn parse_transport(s: &str) -> Option<(Transport, &str)> {
        if let Some(name) = s.strip_prefix("docker://") {
            return Some((Transport::Registry, name));
        }
        let (t, name) = s.split_once(':')?;
        Some((Transport::parse(t)?, name))
    }

    /// Find the image this reference names; `revision` overrides the manifest digest like
    /// `set-revision` does for container origins. The error is the pull error the real
    /// daemon reports.
    pub(crate) fn resolve<'a>(
        &self,
        images: &'a [TestImage],
        revision: Option<&str>,
    ) -> Result<&'a TestImage, String> {
        const OPEN_IMAGE: &str = "Creating importer: failed to invoke method OpenImage: \
                                  failed to invoke method OpenImage";
        if self.transport != Transport::Registry {
            return Err(format!(
                "{OPEN_IMAGE}: opening {}:{}: no such file or directory",
                self.transport.as_str(),
                self.name
            ));
        }
        let (repo, pinned) = match self.name.split_once('@') {
            Some((repo, digest)) => (repo, digest),
            None => {
                // A tag is what follows the last ':' after the last '/'.
                let slash = self.name.rfind('/').map_or(0, |i| i + 1);
                match self.name[slash..].rfind(':') {
                    Some(i) => (&self.name[..slash + i], &self.name[slash + i + 1..]),
                    None => (self.name.as_str(), "latest"),
                }
            }
        };
        let reference = revision.unwrap_or(pinned);
        let wanted = format!("{repo}@{reference}");
        images
            .iter()
            .find(|img| img.pullspec == wanted)
            .ok_or_else(|| {
                format!("{OPEN_IMAGE}: reading manifest {reference} in {repo}: manifest unknown")
            })
    }
}

impl fmt::Display for ImageRef {
    /// The form ostree-ext prints in "Pulling manifest: …".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let imgref = match self.transport {
            Transport::Registry => format!("docker://{}", self.name),
            t => format!("{}:{}", t.as_str(), self.name),
        };
        match (&self.sig, self.transport) {
            (SigVerify::Unverified, Transport::Registry) => {
                write!(f, "ostree-unverified-registry:{}", self.name)
            }
            (SigVerify::Unverified, _) => write!(f, "ostree-unverified-image:{imgref}"),
            (SigVerify::Signed, _) => write!(f, "ostree-image-signed:{imgref}"),
            (SigVerify::Remote(r), Transport::Registry) => {
                write!(f, "ostree-remote-registry:{r}:{}", self.name)
            }
            (SigVerify::Remote(r), _) => write!(f, "ostree-remote-image:{r}:{imgref}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::{DEFAULT_REGISTRY, catalog};

    #[test]
    fn object_path_escaping_follows_the_daemon() {
        assert_eq!(
            os_object_path("rhcos"),
            "/org/projectatomic/rpmostree1/rhcos"
        );
        assert_eq!(
            os_object_path("fedora-coreos"),
            "/org/projectatomic/rpmostree1/fedora_coreos"
        );
        assert_eq!(
            os_object_path("first!"),
            "/org/projectatomic/rpmostree1/first_21"
        );
        assert_eq!(os_object_path("a.b"), "/org/projectatomic/rpmostree1/a_2Eb");
    }

    #[test]
    fn refspecs_classify_and_resolve() {
        let images = catalog(DEFAULT_REGISTRY);
        let rhel10 = &images[1];
        for prefix in [
            "ostree-unverified-registry:",
            "ostree-unverified-image:registry:",
            "ostree-unverified-image:docker://",
            "ostree-image-signed:docker://",
            "ostree-remote-registry:fedora:",
        ] {
            let spec = format!("{prefix}{}", rhel10.pullspec);
            let Refspec::Container(img) = Refspec::classify(&spec) else {
                panic!("{spec} is a container refspec");
            };
            assert_eq!(img.resolve(&images, None), Ok(rhel10), "{spec}");
        }
        assert!(matches!(
            Refspec::classify("docker://quay.io/x/y:1"),
            Refspec::Ostree { remote: Some(r), .. } if r == "docker"
        ));
        assert!(matches!(
            Refspec::classify("ostree-unverified-image:docker:blah"),
            Refspec::Ostree { .. }
        ));
        let Refspec::Container(tagged) =
            Refspec::classify("ostree-unverified-registry:127.0.0.1:5000/openshift/rhcos:4.19")
        else {
            panic!("tagged refspec");
        };
        let err = tagged.resolve(&images, None).expect_err("no tags");
        assert!(
            err.ends_with(
                "reading manifest 4.19 in 127.0.0.1:5000/openshift/rhcos: manifest unknown"
            ),
            "{err}"
        );
        assert_eq!(tagged.resolve(&images, Some(&rhel10.digest)), Ok(rhel10));
    }

    #[test]
    fn staging_replaces_and_orders() {
        let images = catalog(DEFAULT_REGISTRY);
        let mut s = State::initial("rhcos", &images[0]);
        s.stage("rhcos", "r1", &images[1], true);
        s.stage("rhcos", "r2", &images[1], false);
        assert_eq!(s.deployments.len(), 2);
        assert!(s.deployments[0].staged && !s.deployments[0].finalization_locked);
        assert_eq!(s.deployments[0].container_image_reference, "r2");
        assert_eq!(s.default_for("rhcos").map(|d| d.staged), Some(true));
        assert!(s.remove_staged("rhcos"));
        assert_eq!(s.default_for("rhcos").map(|d| d.booted), Some(true));
        assert_eq!(version_timestamp("9.6.20261101-0"), 1_793_491_200);
    }
}
