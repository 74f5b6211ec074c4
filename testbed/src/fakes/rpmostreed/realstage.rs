//! Staging, locking and finalizing through real libostree 2025.x (`real_libostree`): Debian
//! trixie's `ostree` run by [`BootedHost`] on the fake's sysroot, with the model's booted
//! deployment as the one libostree takes as booted.
//!
//! What rpm-ostree does through libostree's API, and what the fake runs for it:
//! - a deploy transaction stages (`ostree_sysroot_stage_tree_with_options`):
//!   `ostree admin deploy --stage [--lock-finalization] --karg=…` with the merge (booted)
//!   deployment's whole `options`, then `/run/ostree` is made what rpm-ostree leaves
//!   ([`BootedHost::stage_as_rpm_ostree`]: no legacy lock file the CLI made, an empty
//!   `overlay-initrds`); a previous staged deployment is replaced by libostree itself;
//! - `FinalizeDeployment` unlocks (`ostree_sysroot_change_finalization`):
//!   `ostree admin lock-finalization --unlock`;
//! - `Cleanup` and every other removal write the deployment list without it
//!   (`ostree_sysroot_write_deployments`): `ostree admin undeploy INDEX`, whose indices are the
//!   model's (the staged deployment first);
//! - the shutdown's `ostree-finalize-staged.service`: `ostree admin finalize-staged`, which
//!   skips a locked deployment; what libostree did decides what boots.
//!
//! The model is read back from what libostree wrote: the bootloader entries, and before them
//! the deployment libostree's record names, with its `locked` key ([`disk_deployments`]).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tracing::info;

use super::deploy::{NewDeployment, commit_deployment, new_deployment, origin_file};
use super::libostree::{self, BootedHost, DeploymentName, HostPaths, Trixie};
use super::model::Deployment;
use super::ostree::{self, DiskDeployment};
use super::{Daemon, lock};

/// The real libostree a fake stages with, and where.
#[derive(Debug, Clone)]
pub(crate) struct RealStage {
    trixie: Trixie,
    paths: HostPaths,
}

impl RealStage {
    /// Real libostree for the sysroot `sysroot` of the host root `host_root`; `state_dir`
    /// holds its scratch files. Fails when there is no trixie root.
    pub(crate) fn new(
        sysroot: &Path,
        host_root: &Path,
        state_dir: &Path,
    ) -> anyhow::Result<RealStage> {
        let trixie = Trixie::locate()?;
        Ok(RealStage {
            trixie,
            paths: HostPaths {
                sysroot: sysroot.to_path_buf(),
                run_ostree: host_root.join("run/ostree"),
                work: state_dir.join("real-ostree"),
            },
        })
    }

    /// libostree's version, e.g. `2025.2`.
    pub(crate) fn version(&self) -> &str {
        self.trixie.version()
    }

    fn record(&self) -> PathBuf {
        self.paths.run_ostree.join(libostree::RECORD)
    }

    /// Whether libostree's record of a staged deployment exists.
    pub(crate) fn has_record(&self) -> bool {
        self.record().exists()
    }

    /// What a boot does to `/run/ostree` (a tmpfs): libostree's record goes.
    pub(crate) fn boot(&self) -> anyhow::Result<()> {
        let path = self.record();
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }

    /// The staged deployment libostree's record names, as a deployment of `sysroot`: its
    /// kernel arguments as staged, its kernel from the deployment's tree, no bootloader entry.
    fn staged(&self, sysroot: &Path) -> anyhow::Result<Option<DiskDeployment>> {
        let Some(record) = libostree::read_record(&self.paths.run_ostree)? else {
            return Ok(None);
        };
        let modules = sysroot.join(format!(
            "ostree/deploy/{}/deploy/{}/usr/lib/modules",
            record.osname, record.name
        ));
        let release = std::fs::read_dir(&modules)
            .with_context(|| format!("reading {}", modules.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .next()
            .with_context(|| format!("no kernel in {}", modules.display()))?;
        let dir = format!("/ostree/{}-{}", record.osname, record.bootcsum);
        Ok(Some(DiskDeployment {
            osname: record.osname,
            checksum: record.name.checksum,
            serial: record.name.serial,
            options: record.kargs.join(" "),
            title: String::new(),
            linux: format!("{dir}/vmlinuz-{release}"),
            initrd: format!("{dir}/initramfs-{release}.img"),
            version: String::new(),
            staged_locked: Some(record.locked.unwrap_or(false)),
        }))
    }

    fn host(&self, osname: &str, booted: DeploymentName) -> BootedHost {
        BootedHost::attach(self.paths.clone(), osname, booted)
    }
}

/// The deployments of `sysroot` in boot order: with `real`, the one libostree's record names
/// first (it has no bootloader entry until it is finalized), then the bootloader's.
pub(crate) fn disk_deployments(
    sysroot: &Path,
    real: Option<&RealStage>,
) -> anyhow::Result<Vec<DiskDeployment>> {
    let mut disk = ostree::read_deployments(sysroot)?;
    if let Some(staged) = real.map(|r| r.staged(sysroot)).transpose()?.flatten() {
        disk.insert(0, staged);
    }
    Ok(disk)
}

/// What real libostree is to do.
pub(crate) enum RealOp<'a> {
    /// Stage `checksum` with origin `origin`, kernel arguments `kargs`, locked or not.
    Stage {
        checksum: &'a str,
        origin: &'a str,
        kargs: &'a [String],
        locked: bool,
    },
    /// Unlock the staged deployment's finalization.
    Unlock,
    /// Remove deployment `index` (in the model's order).
    Undeploy(usize),
    /// Finalize the staged deployment, as at shutdown.
    FinalizeStaged,
}

impl Daemon {
    /// Runs `op` with real libostree, the model's booted deployment taken as booted; the serial
    /// of a staged deployment. Call only when [`Daemon::real`] is set.
    pub(crate) async fn real_op(&self, op: RealOp<'_>) -> Result<Option<i32>, String> {
        let real = self
            .real
            .as_ref()
            .ok_or_else(|| "real libostree is not in use".to_string())?;
        let booted = lock(&self.state)
            .booted()
            .map(|d| DeploymentName {
                checksum: d.checksum.clone(),
                serial: d.serial,
            })
            .ok_or_else(|| "No booted deployment".to_string())?;
        // libostree's `/run/ostree` is bound there.
        std::fs::create_dir_all(&real.paths.run_ostree)
            .map_err(|e| format!("creating {}: {e}", real.paths.run_ostree.display()))?;
        let host = real.host(&self.osname, booted);
        let err = |e: anyhow::Error| format!("{e:#}");
        let began = std::time::Instant::now();
        let (what, serial) = match op {
            RealOp::Stage {
                checksum,
                origin,
                kargs,
                locked,
            } => {
                let (name, _) = host
                    .stage_as_rpm_ostree(&real.trixie, checksum, origin, kargs, locked)
                    .await
                    .map_err(err)?;
                ("stage", Some(name.serial))
            }
            RealOp::Unlock => {
                host.change_finalization(&real.trixie, true)
                    .await
                    .map_err(err)?;
                ("unlock", None)
            }
            RealOp::Undeploy(index) => {
                host.undeploy(&real.trixie, index).await.map_err(err)?;
                ("undeploy", None)
            }
            RealOp::FinalizeStaged => {
                host.finalize_staged(&real.trixie).await.map_err(err)?;
                ("finalize-staged", None)
            }
        };
        info!(
            op = what,
            libostree = real.version(),
            elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
            "real libostree done"
        );
        Ok(serial)
    }

    /// Commits what `new` deploys (as the testbed's deploys do) and stages it with real
    /// libostree as rpm-ostree does: the merge (booted) deployment's whole `options` as the
    /// kernel arguments, rpm-ostree's origin, `locked` as asked.
    pub(crate) async fn stage_real(
        &self,
        new: NewDeployment<'_>,
        locked: bool,
    ) -> Result<Deployment, String> {
        let commit = commit_deployment(&self.sysroot, &self.state_dir.join("scratch"), &new)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let checksum = commit.checksum.clone();
        let kargs: Vec<String> = lock(&self.state)
            .booted()
            .and_then(|d| d.disk.as_ref())
            .map(|d| d.options.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let origin = origin_file(new.refspec, &new.layering);
        let serial = self
            .real_op(RealOp::Stage {
                checksum: &checksum,
                origin: &origin,
                kargs: &kargs,
                locked,
            })
            .await?
            .ok_or_else(|| "staging named no deployment".to_string())?;
        Ok(new_deployment(new, serial, commit))
    }

    /// Removes deployment `index` (the model's order) as libostree does: through real
    /// libostree when in use, else the testbed's `ostree admin undeploy` (the fake's staged
    /// deployment is then a bootloader entry, so the indices agree).
    pub(crate) async fn undeploy(&self, index: usize) -> Result<(), String> {
        if self.real.is_some() {
            self.real_op(RealOp::Undeploy(index)).await.map(drop)
        } else {
            ostree::undeploy(&self.sysroot, index)
                .await
                .map_err(|e| format!("{e:#}"))
        }
    }
}
