//! What to stage, backend-neutral: the planner decides it, `streamctl plan` shows it, and each
//! backend turns it into its own call.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::backend::Deployment;
use crate::backend::kernel::{KernelVariant, default_kernel_packages_in};
use crate::image::reference::ImageRef;
use crate::image::rpm::names_package;

/// Everything needed to stage a target: backend-neutral, shown by `streamctl plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Target stream.
    pub stream: String,
    /// Target OS image.
    pub os_image: ImageRef,
    /// Whether an older base may be deployed.
    pub allow_downgrade: bool,
    /// Kernel variant carried to the target.
    pub kernel: KernelVariant,
    /// Packages of the booted origin that are replaced by target builds (uninstalled in the
    /// same transaction): old-major variant kernels and layered packages.
    pub uninstall: Vec<String>,
    /// Default-kernel packages to remove from the new base (those not yet removed in the origin).
    pub override_remove: Vec<String>,
    /// Target RPMs installed from files (passed as file descriptors).
    pub local_rpms: Vec<PathBuf>,
    /// Stage finalization-locked, so only an approved `FinalizeDeployment` applies it.
    pub lock_finalization: bool,
    /// Stage from the verifying origin (`ostree-image-signed:docker://…`, bootc's
    /// `--enforce-container-sigpolicy`): the policy requires a signature, or the booted
    /// deployment came from it (decided by the host's signature policy, src/host/sigpolicy.rs).
    pub signed: bool,
}

impl StagePlan {
    /// A plain rebase: nothing carried.
    pub fn rebase(stream: &str, os_image: &ImageRef, allow_downgrade: bool) -> Self {
        StagePlan {
            stream: stream.to_string(),
            os_image: os_image.clone(),
            allow_downgrade,
            kernel: KernelVariant::Default,
            uninstall: Vec::new(),
            override_remove: Vec::new(),
            local_rpms: Vec::new(),
            lock_finalization: true,
            signed: false,
        }
    }

    /// Completes a rebase so one transaction produces the whole target: the booted variant
    /// kernel and layered packages (`carried`, package names) are replaced by the target builds
    /// in `rpms` (extracted from the target's extensions image). A node must never be staged on
    /// the default kernel when it runs a variant, so this is all or nothing. The default-kernel
    /// packages removed are those the target base holds (`base_packages`, when known): a name
    /// it lacks would fail the transaction after the pull (`Package "X" not found`).
    pub fn carry(
        mut self,
        booted: &Deployment,
        kernel: KernelVariant,
        carried: &[String],
        rpms: &[PathBuf],
        base_packages: Option<&BTreeSet<String>>,
    ) -> Self {
        self.kernel = kernel;
        let replaced =
            |spec: &str| kernel.owns(spec) || carried.iter().any(|p| names_package(spec, p));
        self.uninstall = booted
            .requested_packages
            .iter()
            .chain(&booted.requested_local_packages)
            .filter(|p| replaced(p))
            .cloned()
            .collect();
        if kernel != KernelVariant::Default {
            self.override_remove = default_kernel_packages_in(base_packages)
                .iter()
                .filter(|p| !booted.requested_base_removals.iter().any(|r| r == *p))
                .map(|p| p.to_string())
                .collect();
        }
        self.local_rpms = rpms.to_vec();
        self.local_rpms.sort();
        self
    }
}
