//! The host model behind the fake rpm-ostreed, for the other tools of a testbed host: the fake
//! `bootc` stages through it and the fake logind records reboots in it, so every backend shares
//! one sysroot and one `state.json`.

use tracing::info;

use super::deploy::{NewDeployment, low_disk, write_deployment};
use super::model::Layering;
use super::refspec::Refspec;
use std::sync::{Arc, Weak};

use super::{Daemon, FakeRpmOstreed, lock, ostree};
use crate::fixtures::images::TestImage;

pub(crate) use super::refspec::{ImageRef, SigVerify, Transport};

/// One deployment as the host's other tools see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostDeployment {
    pub(crate) osname: String,
    pub(crate) checksum: String,
    pub(crate) serial: i32,
    pub(crate) booted: bool,
    pub(crate) staged: bool,
    pub(crate) pinned: bool,
    pub(crate) finalization_locked: bool,
    /// The origin's `container-image-reference`, verbatim.
    pub(crate) refspec: String,
    /// The catalog digest of the image (what the refspec pins).
    pub(crate) image_digest: String,
    /// The digest ostree-ext stored: the platform manifest's when the refspec pins an index.
    pub(crate) digest: String,
    pub(crate) version: String,
    /// Commit timestamp, seconds since the epoch.
    pub(crate) timestamp: u64,
    /// The origin carries rpm-ostree package requests or overrides.
    pub(crate) layered: bool,
}

/// Why staging failed, split the way bootc's error context splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StageError {
    /// The image could not be pulled (ostree-ext's message).
    Pull(String),
    /// The pulled image could not be deployed.
    Deploy(String),
}

/// What a staging request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Staged {
    pub(crate) version: String,
    pub(crate) digest: String,
}

impl FakeRpmOstreed {
    /// Takes the daemon's name off the bus, as on a host without rpm-ostreed: the host model
    /// stays for the other tools.
    pub(crate) async fn leave_bus(&self) -> anyhow::Result<()> {
        self.daemon.set_on_bus(false).await
    }

    /// A handle on the host model for the other tools; it does not keep the fake alive.
    pub(crate) fn host(&self) -> Host {
        Host {
            daemon: Arc::downgrade(&self.daemon),
        }
    }
}

/// The host model as the host's other tools reach it.
#[derive(Clone)]
pub(crate) struct Host {
    daemon: Weak<Daemon>,
}

impl Host {
    fn daemon(&self) -> Result<Arc<Daemon>, String> {
        self.daemon
            .upgrade()
            .ok_or_else(|| "the testbed host is stopping".to_string())
    }

    /// Every deployment in boot order, re-read from disk and `state.json` first (a simulated
    /// reboot may have edited either).
    pub(crate) fn deployments(&self) -> Result<Vec<HostDeployment>, String> {
        let daemon = self.daemon()?;
        daemon
            .reload_state()
            .map_err(|e| format!("reading the sysroot: {e:#}"))?;
        let state = lock(&daemon.state);
        Ok(state
            .deployments
            .iter()
            .map(|d| HostDeployment {
                osname: d.osname.clone(),
                checksum: d.checksum.clone(),
                serial: d.serial,
                booted: d.booted,
                staged: d.staged,
                pinned: d.pinned,
                finalization_locked: d.finalization_locked,
                refspec: d.container_image_reference.clone(),
                image_digest: d.image_digest.clone(),
                digest: d.container_image_reference_digest.clone(),
                version: d.version.clone(),
                timestamp: d.timestamp,
                layered: d.layering.is_layered(),
            })
            .collect())
    }

    /// The RPM architecture of the host (`x86_64`, `aarch64`).
    pub(crate) fn arch(&self) -> Result<String, String> {
        Ok(self.daemon()?.arch.clone())
    }

    /// Stages `refspec` the way `bootc switch` does: a fresh origin holding only the image
    /// reference (no package layering is carried), the booted deployment's kernel arguments,
    /// replacing a staged deployment, and never finalization-locked (bootc has no lock). There
    /// is no rootfs sanity check: unlike rpm-ostree, bootc stages an image the CPU cannot run.
    pub(crate) async fn stage_unlocked(&self, refspec: &str) -> Result<Staged, StageError> {
        let d = &self.daemon().map_err(StageError::Deploy)?;
        // bootc waits for the sysroot lock; here that is the gate transactions and the
        // simulated reboot take.
        let _gate = d.txn_gate.lock().await;
        let Refspec::Container(imgref) = Refspec::classify(refspec) else {
            return Err(StageError::Pull(format!(
                "not a container image reference: {refspec}"
            )));
        };
        let image = imgref
            .resolve(&d.images, None)
            .map_err(StageError::Pull)?
            .clone();
        // bootc's pull reads the registry as the node's container
        // stack does (the host root's ostree auth file, registries.conf), as rpm-ostreed's.
        if let Some(root) = d.host_root.as_deref() {
            if imgref.sig == SigVerify::Signed {
                crate::fakes::registry::node::verifying_origin_check(root)
                    .map_err(StageError::Pull)?;
            }
            crate::fakes::registry::node::pull_check(root, &image.pullspec)
                .await
                .map_err(StageError::Pull)?;
        }
        if low_disk(d.host_root.as_deref()) {
            return Err(StageError::Pull(
                "Writing content object: min-free-space-percent '3%' would be exceeded, at least \
                 20.5 kB requested"
                    .into(),
            ));
        }
        write_unlocked(d, refspec, &image)
            .await
            .map_err(StageError::Deploy)
    }

    /// For the fake bootc's `upgrade --download-only` / `--from-downloaded`:
    /// `ostree_sysroot_change_finalization` on the staged deployment, setting
    /// its finalization lock to `locked` (ostreedev/ostree:src/libostree/ostree-sysroot-deploy.c).
    /// Returns whether it changed; an error when nothing is staged.
    pub(crate) async fn set_finalization_lock(&self, locked: bool) -> Result<bool, String> {
        let d = &self.daemon()?;
        let _gate = d.txn_gate.lock().await;
        d.reload_state()
            .map_err(|e| format!("reading the sysroot: {e:#}"))?;
        let changed = {
            let mut state = lock(&d.state);
            let staged = state
                .staged_mut()
                .ok_or_else(|| "No staged deployment found".to_string())?;
            let changed = staged.finalization_locked != locked;
            staged.finalization_locked = locked;
            d.save_state(&state)?;
            changed
        };
        d.notify_deployments().await;
        Ok(changed)
    }

    /// Records that a reboot was initiated (what `FinalizeDeployment` records), for logind.
    pub(crate) fn record_reboot(&self) -> Result<(), String> {
        // A reboot through logind: the daemon did not start it, so it keeps accepting
        // transactions until the host really goes down, as the real one does.
        self.daemon()?.record_reboot_request()
    }
}

async fn write_unlocked(d: &Daemon, refspec: &str, image: &TestImage) -> Result<Staged, String> {
    let (kargs, staged) = {
        let state = lock(&d.state);
        (
            state.booted().map(|b| b.kargs()).unwrap_or_default(),
            state.staged_index(&d.osname),
        )
    };
    if let Some(index) = staged {
        ostree::undeploy(&d.sysroot, index)
            .await
            .map_err(|e| format!("{e:#}"))?;
        d.resync(None)?;
    }
    let dep = write_deployment(
        &d.sysroot,
        &d.state_dir.join("scratch"),
        NewDeployment {
            osname: &d.osname,
            refspec,
            image,
            arch: &d.arch,
            layering: Layering::default(),
            base_removals: Vec::new(),
            kargs,
            drop_variant: false,
            image_kernel: image.variant,
            host_root: d.host_root.as_deref(),
        },
    )
    .await
    .map_err(|e| format!("{e:#}"))?;
    let (checksum, serial) = (dep.checksum.clone(), dep.serial);
    let digest = dep.container_image_reference_digest.clone();
    d.resync(Some(dep))?;
    info!(digest = %image.digest, checksum = %checksum, serial, "staged a deployment without a finalization lock");
    d.notify_deployments().await;
    Ok(Staged {
        version: image.version.clone(),
        digest,
    })
}
