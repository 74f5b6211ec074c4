//! Deployments and their side file (`state.json`); refspecs are classified in `super::refspec`.
//!
//! The deployment list itself lives in the real ostree sysroot (`super::ostree`): which
//! deployments exist, their order, checksums, serials and kernel arguments are read from disk.
//! `state.json` holds what ostree cannot: `{"deployments": [Deployment…],
//! "reboot_requested": bool}`, each entry matched to its on-disk deployment by checksum and
//! serial, with the image reference and digest, the image config, the requested packages and
//! overrides, pinning, finalization locking and which deployment the fake considers booted
//! (a test sysroot is never really booted). Every field is plain data so a simulated reboot
//! can edit it; `Reload` picks edits up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use zbus::zvariant::{OwnedValue, Value};

use super::ostree::DiskDeployment;
use crate::fixtures::images::TestImage;
use crate::fixtures::packages::Nevra;

/// File name of the side file inside the state directory.
const STATE_FILE: &str = "state.json";

/// Size of one fake ostree chunk layer; 12 of them make the "1.2 GB" pulls print.
pub(crate) const CHUNK_BYTES: u64 = 100_000_000;
/// Number of ostree chunk layers every image has.
pub(crate) const CHUNK_COUNT: u32 = 12;

/// Package requests and overrides of a deployment's origin (what rpm-ostree layers locally).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Layering {
    /// `requested-packages`: repo packages by name.
    pub(crate) requested_packages: Vec<String>,
    /// `requested-local-packages`: NEVRAs of local RPMs.
    pub(crate) requested_local_packages: Vec<String>,
    /// `requested-base-removals`: names (or NEVRAs) of base packages removed.
    pub(crate) requested_base_removals: Vec<String>,
    /// `requested-base-local-replacements`: NEVRAs of local RPMs replacing base packages.
    pub(crate) requested_base_local_replacements: Vec<String>,
}

impl Layering {
    /// Whether the deployment is more than its base image.
    pub(crate) fn is_layered(&self) -> bool {
        !(self.requested_packages.is_empty()
            && self.requested_local_packages.is_empty()
            && self.requested_base_removals.is_empty()
            && self.requested_base_local_replacements.is_empty())
    }
}

/// One deployment: its on-disk identity plus the side file's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Deployment {
    pub(crate) osname: String,
    pub(crate) serial: i32,
    /// The deployed commit (the layered commit if there is layering).
    pub(crate) checksum: String,
    /// The fake considers this deployment booted (recorded here: the sysroot is not booted).
    pub(crate) booted: bool,
    /// Derived: the not-booted deployment at index 0, unless `unstaged`.
    pub(crate) staged: bool,
    /// Written by `ostree admin deploy` without `--stage`: pending (it boots next), never
    /// staged, never locked.
    #[serde(default)]
    pub(crate) unstaged: bool,
    #[serde(default)]
    pub(crate) pinned: bool,
    #[serde(default)]
    pub(crate) finalization_locked: bool,
    /// The refspec verbatim, e.g. `ostree-unverified-registry:host/repo@sha256:…`.
    pub(crate) container_image_reference: String,
    /// The catalog digest of the image deployed (what the refspec pins: an index or a
    /// manifest): which test image this is, for the fake's own bookkeeping.
    #[serde(default)]
    pub(crate) image_digest: String,
    /// `container-image-reference-digest`: what ostree-ext stored as `ostree.manifest-digest`,
    /// the platform manifest's digest when the refspec pins an index (empty: unreadable).
    pub(crate) container_image_reference_digest: String,
    pub(crate) version: String,
    pub(crate) timestamp: u64,
    /// Kernel release the deployment boots (read back from its bootloader entry).
    pub(crate) kernel: String,
    /// The image config JSON (`ostree.container.image-config`).
    pub(crate) image_config: String,
    /// The base commit's whole metadata as stored (an `a{sv}` GVariant, base64): what the real
    /// daemon passes as `base-commit-meta`; `None` for a deployment the fake did not commit.
    #[serde(default)]
    pub(crate) base_commit_meta: Option<String>,
    /// The image commit, when `checksum` is a layered commit on top of it.
    #[serde(default)]
    pub(crate) base_checksum: Option<String>,
    /// Base packages the layering removed, as NEVRAs of the base image.
    #[serde(default)]
    pub(crate) base_removals: Vec<String>,
    #[serde(default)]
    pub(crate) layering: Layering,
    /// Its bootloader entry, from disk (never saved).
    #[serde(skip)]
    pub(crate) disk: Option<DiskDeployment>,
}

impl Deployment {
    /// A deployment of `image` reached through `refspec`, committed as `checksum`.
    pub(crate) fn new(
        osname: &str,
        refspec: &str,
        image: &TestImage,
        checksum: &str,
        serial: i32,
    ) -> Self {
        Deployment {
            osname: osname.to_string(),
            serial,
            checksum: checksum.to_string(),
            booted: false,
            staged: false,
            unstaged: false,
            pinned: false,
            finalization_locked: false,
            container_image_reference: refspec.to_string(),
            image_digest: image.digest.clone(),
            container_image_reference_digest: image.digest.clone(),
            version: image.version.clone(),
            timestamp: image.created_unix(),
            kernel: image.kernel.clone(),
            image_config: image.config_json(),
            base_commit_meta: None,
            base_checksum: None,
            base_removals: Vec::new(),
            layering: Layering::default(),
            disk: None,
        }
    }

    /// A deployment found on disk that the side file does not know (made by hand).
    fn unknown(d: &DiskDeployment) -> Self {
        Deployment {
            osname: d.osname.clone(),
            serial: d.serial,
            checksum: d.checksum.clone(),
            booted: false,
            staged: false,
            unstaged: false,
            pinned: false,
            finalization_locked: false,
            container_image_reference: String::new(),
            image_digest: String::new(),
            container_image_reference_digest: String::new(),
            version: String::new(),
            timestamp: 0,
            kernel: d.kernel_release(),
            image_config: String::new(),
            base_commit_meta: None,
            base_checksum: None,
            base_removals: Vec::new(),
            layering: Layering::default(),
            disk: Some(d.clone()),
        }
    }

    /// `<osname>-<checksum>.<serial>`.
    pub(crate) fn id(&self) -> String {
        format!("{}-{}.{}", self.osname, self.checksum, self.serial)
    }

    /// The kernel arguments to carry to a new deployment.
    pub(crate) fn kargs(&self) -> Vec<String> {
        self.disk
            .as_ref()
            .map(DiskDeployment::user_kargs)
            .unwrap_or_default()
    }

    /// The deployment dictionary (`a{sv}`) with the keys and types the real daemon produces
    /// for a container deployment, layered or not; `legacy_lock_file`: whether
    /// `/run/ostree/staged-deployment-locked` exists on the host.
    pub(crate) fn to_dict(
        &self,
        legacy_lock_file: bool,
    ) -> zbus::zvariant::Result<HashMap<String, OwnedValue>> {
        let strv = |v: &[String]| OwnedValue::try_from(Value::from(v.to_vec()));
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

        let image_meta = || {
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
            meta
        };
        let base_meta = match &self.base_commit_meta {
            Some(stored) => decode_commit_meta(stored)?,
            None => image_meta(),
        };
        d.insert("base-commit-meta".into(), OwnedValue::from(base_meta));

        let l = &self.layering;
        d.insert("packages".into(), strv(&l.requested_packages)?);
        let mut removals = Vec::new();
        for nevra in &self.base_removals {
            if let Some(n) = Nevra::parse(nevra) {
                removals.push(OwnedValue::try_from(Value::from((
                    nevra.clone(),
                    n.name,
                    n.epoch,
                    n.version,
                    n.release,
                    n.arch,
                )))?);
            }
        }
        d.insert(
            "base-removals".into(),
            OwnedValue::try_from(Value::from(removals))?,
        );
        d.insert(
            "base-local-replacements".into(),
            OwnedValue::try_from(Value::from(Vec::<(OwnedValue, OwnedValue)>::new()))?,
        );
        d.insert(
            "base-remote-replacements".into(),
            OwnedValue::from(HashMap::<String, OwnedValue>::new()),
        );
        d.insert("requested-packages".into(), strv(&l.requested_packages)?);
        d.insert(
            "requested-local-packages".into(),
            strv(&l.requested_local_packages)?,
        );
        d.insert("requested-local-fileoverride-packages".into(), strv(&[])?);
        d.insert(
            "requested-base-removals".into(),
            strv(&l.requested_base_removals)?,
        );
        d.insert(
            "requested-base-local-replacements".into(),
            strv(&l.requested_base_local_replacements)?,
        );
        d.insert("regenerate-initramfs".into(), OwnedValue::from(false));
        d.insert("version".into(), str_value(&self.version));
        d.insert("timestamp".into(), OwnedValue::from(self.timestamp));
        if let Some(base) = &self.base_checksum {
            d.insert("base-checksum".into(), str_value(base));
            d.insert("base-version".into(), str_value(&self.version));
            d.insert("base-timestamp".into(), OwnedValue::from(self.timestamp));
            let mut layered: HashMap<String, OwnedValue> = HashMap::new();
            layered.insert("rpmostree.clientlayer".into(), OwnedValue::from(true));
            layered.insert("version".into(), str_value(&self.version));
            d.insert("layered-commit-meta".into(), OwnedValue::from(layered));
        }
        d.insert(
            "container-image-reference".into(),
            str_value(&self.container_image_reference),
        );
        // Absent when the image's metadata cannot be read back from the repository
        // (rpmostreed-deployment-utils.cxx: "failed to query container image base metadata",
        // coreos/rpm-ostree#4185); the fake models that as an empty digest.
        if !self.container_image_reference_digest.is_empty() {
            d.insert(
                "container-image-reference-digest".into(),
                str_value(&self.container_image_reference_digest),
            );
        }
        // The real daemon only ever adds this key as `true`, only for a staged deployment, and
        // only when the legacy lock file exists, which rpm-ostree >= v2024.6 never creates
        // (coreos/rpm-ostree:rust/src/daemon.rs `deployment_populate_variant`, its "XXX"
        // comment): the lock itself lives in `/run/ostree/staged-deployment` (`runstate`).
        if self.staged && legacy_lock_file {
            d.insert("finalization-locked".into(), OwnedValue::from(true));
        }
        Ok(d)
    }
}

/// The `a{sv}` of [`Deployment::base_commit_meta`] (libostree's bytes, the host's byte order).
fn decode_commit_meta(stored: &str) -> zbus::zvariant::Result<HashMap<String, OwnedValue>> {
    use base64::Engine as _;
    use zbus::zvariant::serialized::{Context, Data, Format};
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(stored)
        .map_err(|e| zbus::zvariant::Error::Message(format!("stored commit metadata: {e}")))?;
    let ctxt = Context::new(Format::GVariant, zbus::zvariant::NATIVE_ENDIAN, 0);
    Data::new(bytes.as_slice(), ctxt)
        .deserialize::<HashMap<String, OwnedValue>>()
        .map(|(meta, _)| meta)
}

fn str_value(s: &str) -> OwnedValue {
    OwnedValue::from(zbus::zvariant::Str::from(s.to_string()))
}

/// The deployments (boot order, as on disk) with their side-file data.
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
    fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    /// The side file saved in `dir`, if there is one.
    fn load_side(dir: &Path) -> anyhow::Result<Option<State>> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing {}", path.display()))
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The on-disk deployments `disk` joined with the side file in `dir`; `None` when the
    /// sysroot has no deployment yet.
    pub(crate) fn load(dir: &Path, disk: &[DiskDeployment]) -> anyhow::Result<Option<State>> {
        if disk.is_empty() {
            return Ok(None);
        }
        let side = Self::load_side(dir)?.unwrap_or_default();
        Ok(Some(Self::join(disk, side)))
    }

    /// Match every on-disk deployment with its side-file entry (by checksum and serial).
    pub(crate) fn join(disk: &[DiskDeployment], side: State) -> State {
        let mut deployments: Vec<Deployment> = disk
            .iter()
            .map(|d| {
                let mut dep = side
                    .deployments
                    .iter()
                    .find(|s| {
                        s.osname == d.osname && s.checksum == d.checksum && s.serial == d.serial
                    })
                    .cloned()
                    .unwrap_or_else(|| Deployment::unknown(d));
                let kernel = d.kernel_release();
                if !kernel.is_empty() {
                    dep.kernel = kernel;
                }
                dep.disk = Some(d.clone());
                dep
            })
            .collect();
        // At most one booted deployment: the first one the side file marks.
        let mut seen = false;
        for d in &mut deployments {
            d.booted = d.booted && !seen;
            seen |= d.booted;
        }
        let booted_at = deployments.iter().position(|d| d.booted);
        for (i, d) in deployments.iter_mut().enumerate() {
            // libostree's record, when it wrote one, says what is staged and whether locked.
            match d.disk.as_ref().and_then(|disk| disk.staged_locked) {
                Some(locked) => {
                    d.staged = true;
                    d.finalization_locked = locked;
                }
                None => d.staged = i == 0 && booted_at.is_some_and(|b| b > 0) && !d.unstaged,
            }
            if !d.staged {
                d.finalization_locked = false;
            }
        }
        State {
            deployments,
            reboot_requested: side.reboot_requested,
        }
    }

    /// Write the side file to `dir` atomically (write a temporary file, then rename).
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

    /// Index of a deployment of `osname` that `Cleanup` removes: pending (staged or not) or
    /// rollback, never a pinned one (`rpmostree_syscore_filter_deployments`).
    pub(crate) fn cleanup_index(&self, osname: &str, pending: bool) -> Option<usize> {
        let booted = self.booted_index();
        self.deployments.iter().enumerate().position(|(i, d)| {
            let before = booted.is_none_or(|b| i < b);
            d.osname == osname && !d.pinned && !d.booted && before == pending
        })
    }

    /// The rollback deployment of `osname` (after the booted one), if any.
    pub(crate) fn rollback(&self, osname: &str) -> Option<&Deployment> {
        self.rollback_index(osname).map(|i| &self.deployments[i])
    }

    /// Index of the rollback deployment of `osname`.
    pub(crate) fn rollback_index(&self, osname: &str) -> Option<usize> {
        let start = self.booted_index().map_or(0, |i| i + 1);
        self.deployments[start..]
            .iter()
            .position(|d| d.osname == osname)
            .map(|i| start + i)
    }

    /// Index of the staged deployment of `osname`.
    pub(crate) fn staged_index(&self, osname: &str) -> Option<usize> {
        self.deployments
            .first()
            .filter(|d| d.staged && d.osname == osname)
            .map(|_| 0)
    }

    /// What `osname` boots next: the pending deployment, else the booted one
    /// (`DefaultDeployment` and the origin merge deployment).
    pub(crate) fn default_for(&self, osname: &str) -> Option<&Deployment> {
        self.pending(osname)
            .or_else(|| self.booted().filter(|d| d.osname == osname))
    }

    /// The staged deployment.
    pub(crate) fn staged(&self) -> Option<&Deployment> {
        self.deployments.first().filter(|d| d.staged)
    }

    /// The staged deployment, mutably.
    pub(crate) fn staged_mut(&mut self) -> Option<&mut Deployment> {
        self.deployments.first_mut().filter(|d| d.staged)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};

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

    fn disk(csum: &str, serial: i32, version: u64) -> DiskDeployment {
        DiskDeployment {
            osname: "rhcos".into(),
            checksum: csum.into(),
            serial,
            options: "rw ostree=/ostree/boot.1/rhcos/x/0".into(),
            title: String::new(),
            linux: "/ostree/rhcos-x/vmlinuz-5.14.0-1.el9.x86_64+rt".into(),
            initrd: String::new(),
            version: version.to_string(),
            staged_locked: None,
        }
    }

    #[test]
    fn joining_disk_and_side_file() {
        let images = catalog(DEFAULT_REGISTRY);
        let mut booted = Deployment::new("rhcos", "r9", &images[0], "a", 0);
        booted.booted = true;
        let mut staged = Deployment::new("rhcos", "r10", &images[1], "b", 0);
        staged.finalization_locked = true;
        let side = State {
            deployments: vec![booted, staged],
            reboot_requested: true,
        };
        // Disk order wins; an unknown deployment still shows up.
        let s = State::join(&[disk("b", 0, 3), disk("a", 0, 2), disk("c", 1, 1)], side);
        assert_eq!(s.deployments.len(), 3);
        assert!(s.deployments[0].staged && s.deployments[0].finalization_locked);
        assert_eq!(s.deployments[0].container_image_reference, "r10");
        assert_eq!(s.deployments[0].kernel, "5.14.0-1.el9.x86_64+rt");
        assert!(s.deployments[1].booted);
        assert_eq!(s.rollback_index("rhcos"), Some(2));
        assert_eq!(s.deployments[2].container_image_reference, "");
        assert_eq!(s.default_for("rhcos").map(|d| d.staged), Some(true));
        assert_eq!(s.deployments[1].kargs(), ["rw"]);
        assert!(s.reboot_requested);
    }
}
