//! What a move needs from the target's extensions image: the kernel variant and the other
//! packages, read off the node or, for the machine-config operator's move, off the
//! MachineConfig its daemon applied.

use super::{FactError, Input, Mover};
use crate::backend::{Deployment, KernelVariant};
use crate::host::facts::machineconfig::AppliedConfig;
use crate::image::registry::LAYERED_FROM;
use crate::image::rpm::package_name;

/// Whether the move rebuilds the booted on-cluster-layered image from the target's base image
/// (the machine-config operator's move on a node running such an image).
pub(super) fn rebuilt_by_mco(booted: &Deployment, mover: Mover) -> bool {
    mover == Mover::MachineConfigOperator && booted.image_labels.contains_key(LAYERED_FROM)
}

/// The kernel variant the target's extensions image must provide for a node running
/// `running` on `booted`: the variant its package overrides carry; none when the variant comes
/// from the booted image (the target image must then carry it itself), except where the
/// machine-config operator rebuilds an on-cluster-layered image: its build swaps the kernel
/// for the `KernelType` packages from the extensions image (Containerfile.on-cluster-build-
/// template), so that image must provide them exactly as for an override-carried kernel.
pub fn variant_from_extensions(
    booted: &Deployment,
    running: KernelVariant,
    mover: Mover,
) -> KernelVariant {
    if crate::backend::kernel::from_image(booted, running) && !rebuilt_by_mco(booted, mover) {
        KernelVariant::Default
    } else {
        running
    }
}

/// What the target's extensions image must provide for a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromExtensions {
    /// The kernel variant installed from it (`Default`: none).
    pub variant: KernelVariant,
    /// That variant's packages, as the mover installs them.
    pub kernel: &'static [&'static str],
    /// Every other package (names or NEVRAs, as the origin has them).
    pub layered: Vec<String>,
    /// Whether this is what the applied MachineConfig asks for (else it is read off the node).
    pub from_machine_config: bool,
    /// With the MachineConfig: the packages layered on the node beyond what it asks for (by
    /// hand, `rpm-ostree install`), which the daemon's rebase keeps in the origin
    /// ([`kept_by_mcd_rebase`]), so rpm-ostree must find them again (pkg/daemon/update.go
    /// `applyLayeredOSChanges`, OCPBUGS-2269). Without the MachineConfig they are in `layered`.
    pub by_hand: Vec<String>,
    /// With the MachineConfig: the local RPMs on the node (NEVRAs). The daemon's rebase keeps
    /// them as built, whatever the target, so they must fit its major. Without the
    /// MachineConfig they are in `layered` (streamd's own move passes new ones).
    pub local: Vec<String>,
}

impl FromExtensions {
    /// Every package besides the kernel's: `layered`, then `by_hand`.
    pub fn all_layered(&self) -> impl Iterator<Item = &String> {
        self.layered.iter().chain(&self.by_hand)
    }

    /// Whether anything is needed from the extensions image.
    pub(super) fn needed(&self) -> bool {
        self.variant != KernelVariant::Default || self.all_layered().next().is_some()
    }
}

/// What the target's extensions image must provide. For the machine-config operator's move,
/// when the MachineConfig the machine-config daemon applied is known, what it asks for: its
/// `spec.kernelType` packages and its `spec.extensions` packages, which the operator installs
/// from the stream's extensions image whatever runs now (the on-cluster build's `rpm-ostree
/// install` and kernel swap: Containerfile.on-cluster-build-template; the daemon's own
/// pkg/daemon/update.go `applyExtensions`, `switchKernel`). Otherwise it is read off the node:
/// the variant [`variant_from_extensions`] gives and the booted deployment's other package
/// overrides. The kernel packages are those of the MachineConfig's release, which on 4.21
/// depend on the booted OS's major (`booted_major`).
pub fn from_extensions(
    booted: &Deployment,
    kernel: &Result<KernelVariant, FactError>,
    mover: Mover,
    machine_config: Option<&Result<AppliedConfig, FactError>>,
    booted_major: Option<u32>,
) -> FromExtensions {
    if mover == Mover::MachineConfigOperator
        && let Some(Ok(mc)) = machine_config
    {
        let variant = mc.kernel_type.clone().unwrap_or(KernelVariant::Default);
        let asked = mc.extension_packages();
        let by_hand = kept_by_mcd_rebase(booted)
            .filter(|p| !asked.contains(&package_name(p)))
            .cloned()
            .collect();
        let local = booted.requested_local_packages.clone();
        return FromExtensions {
            variant,
            kernel: mc.release.release.kernel_packages(
                variant,
                rebuilt_by_mco(booted, mover),
                booted_major,
            ),
            layered: asked.into_iter().map(str::to_string).collect(),
            from_machine_config: true,
            by_hand,
            local,
        };
    }
    let running = kernel.as_ref().copied().unwrap_or(KernelVariant::Default);
    let variant = variant_from_extensions(booted, running, mover);
    FromExtensions {
        variant,
        kernel: variant.packages(),
        layered: layered_packages_of(booted, variant),
        from_machine_config: false,
        by_hand: Vec::new(),
        local: Vec::new(),
    }
}

/// The layered (repository) packages of the booted deployment that the machine-config
/// daemon's rebase keeps: all of them but the `kernel-rt-*`/`kernel-64k-*` packages its
/// kernel-swap revert uninstalls first, which it does only for a node with both such
/// packages and a `kernel*` base removal (pkg/daemon/update.go `queueRevertKernelSwap`, run
/// before an OS update). Local RPMs it never reverts: [`FromExtensions::local`].
fn kept_by_mcd_rebase(booted: &Deployment) -> impl Iterator<Item = &String> {
    let reverted = mcd_reverts_kernel_swap(booted);
    booted
        .requested_packages
        .iter()
        .filter(move |p| !(reverted && is_swap_layer(p)))
}

/// A `kernel-rt-*`/`kernel-64k-*` package, as `queueRevertKernelSwap` matches them.
fn is_swap_layer(p: &str) -> bool {
    p.starts_with("kernel-rt-") || p.starts_with("kernel-64k-")
}

/// The booted deployment's `kernel`/`kernel-*` base removals, as `queueRevertKernelSwap`
/// matches them.
pub(super) fn kernel_removals(booted: &Deployment) -> Vec<&str> {
    booted
        .requested_base_removals
        .iter()
        .map(String::as_str)
        .filter(|r| *r == "kernel" || r.starts_with("kernel-"))
        .collect()
}

/// Whether the machine-config daemon's kernel-swap revert runs before its OS update: only with
/// both kernel base removals and `kernel-rt-*`/`kernel-64k-*` repository layers (pkg/daemon/
/// update.go `queueRevertKernelSwap`; with one of them alone it logs a notice and leaves both).
pub(super) fn mcd_reverts_kernel_swap(booted: &Deployment) -> bool {
    !kernel_removals(booted).is_empty()
        && booted.requested_packages.iter().any(|p| is_swap_layer(p))
}

/// Layered packages of the booted deployment that are not part of the kernel variant
/// (names or NEVRAs, as the origin has them).
pub fn layered_packages_of(booted: &Deployment, variant: KernelVariant) -> Vec<String> {
    booted
        .requested_packages
        .iter()
        .chain(&booted.requested_local_packages)
        .filter(|p| !variant.owns(p))
        .cloned()
        .collect()
}

/// The variant streamd's own rebase carries as packages: the running one, unless it comes from
/// the image (then none).
pub(super) fn carried(i: &Input) -> KernelVariant {
    match &i.kernel {
        Ok(v) => variant_from_extensions(&i.booted, *v, Mover::Streamd),
        Err(_) => KernelVariant::Default,
    }
}

/// What the target's extensions image must provide ([`from_extensions`]).
pub(super) fn provided(i: &Input) -> FromExtensions {
    from_extensions(
        &i.booted,
        &i.kernel,
        i.mover,
        i.machine_config.as_ref(),
        i.booted_major,
    )
}

/// The applied MachineConfig, where the move is the machine-config operator's.
pub(super) fn machine_config(i: &Input) -> Option<&Result<AppliedConfig, FactError>> {
    i.machine_config
        .as_ref()
        .filter(|_| i.mover == Mover::MachineConfigOperator)
}
