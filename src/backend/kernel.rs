//! The kernel variant of the booted deployment: default, real-time or 64k pages.
//!
//! The variant is read from the deployment's package overrides (what the next rebase must carry)
//! and cross-checked with the running kernel, so a host whose overrides and running kernel
//! disagree is refused instead of guessed about. A variant kernel without overrides comes from
//! the booted image itself (a variant image, or an on-cluster-layered one whose build swapped
//! the kernel: openshift/machine-config-operator's Containerfile.on-cluster-build-template):
//! nothing is carried then, and the target image must provide the same variant.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::backend::Deployment;
use crate::image::rpm::{Dep, names_package, package_name};

/// Kernel variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelVariant {
    /// The image's own kernel.
    Default,
    /// kernel-rt.
    Realtime,
    /// kernel-64k (aarch64).
    #[serde(rename = "64k-pages")]
    SixtyFourK,
}

impl KernelVariant {
    /// Name as published in the `host` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelVariant::Default => "default",
            KernelVariant::Realtime => "realtime",
            KernelVariant::SixtyFourK => "64k-pages",
        }
    }

    /// The suffix of this variant's kernel release (`uname -r`).
    pub fn release_suffix(self) -> &'static str {
        match self {
            KernelVariant::Default => "",
            KernelVariant::Realtime => "+rt",
            KernelVariant::SixtyFourK => "+64k",
        }
    }

    /// The packages requested for the variant, as the MCO requests them from the extensions
    /// repository (openshift/machine-config-operator:pkg/daemon/update.go): never the
    /// `kernel-rt` meta-package, nor `kernel-rt-kvm`, which RHEL 9.7+ and 10 no longer ship.
    /// What they require (`-modules-core`, split out for every variant since RHEL 9.2 and in
    /// RHEL 10) is added from the RPM headers by [`crate::image::rpm::close`].
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            KernelVariant::Default => &[],
            KernelVariant::Realtime => &[
                "kernel-rt-core",
                "kernel-rt-modules",
                "kernel-rt-modules-extra",
            ],
            KernelVariant::SixtyFourK => &[
                "kernel-64k-core",
                "kernel-64k-modules",
                "kernel-64k-modules-extra",
            ],
        }
    }

    /// The name every package of the variant's kernel starts with (`kernel-rt-…`), as the MCO
    /// recognises a variant's layered packages (`queueRevertKernelSwap`).
    fn family(self) -> Option<&'static str> {
        match self {
            KernelVariant::Default => None,
            KernelVariant::Realtime => Some("kernel-rt-"),
            KernelVariant::SixtyFourK => Some("kernel-64k-"),
        }
    }

    /// Whether `spec` (a name or a NEVRA) is one of the variant kernel's packages, whichever
    /// subpackage it is (`kernel-rt-modules-core`, an old `kernel-rt-kvm`).
    pub fn owns(self, spec: &str) -> bool {
        self.family()
            .is_some_and(|f| package_name(spec).starts_with(f))
    }

    /// Whether requirement `dep` can only be met by the variant kernel's own packages: a
    /// capability of its family (`kernel-rt-modules-core-uname-r`) or of its release
    /// (`kernel-uname-r = 6.12.0-….x86_64+rt`). No base image carries those (it carries the
    /// default kernel, which the variant removes), so an extensions image that lacks them
    /// cannot be installed.
    pub fn owns_requirement(self, dep: &Dep) -> bool {
        let Some(family) = self.family() else {
            return false;
        };
        dep.name.starts_with(family)
            || dep
                .version
                .as_ref()
                .is_some_and(|(_, evr)| evr.ends_with(self.release_suffix()))
    }
}

/// The default-kernel packages a variant removes from the base: the machine-config daemon's
/// list, the same for RHEL 9 and 10 (openshift/machine-config-operator release-4.21 to 4.23,
/// pkg/daemon/update.go `getKernelPackagesForRelease`/`getKernelPackagesForTargetRelease`);
/// RHCOS 10's base carries all five (openshift/os extensions/rhel-10.2.yaml). A name requested
/// for removal that the new base lacks fails rpm-ostree's transaction after the pull
/// (`Package "X" not found`), one the origin already removes is dropped ("Inactive base
/// removals"), so the plan requests only the names the origin does not remove yet.
pub const DEFAULT_KERNEL_PACKAGES: [&str; 5] = [
    "kernel",
    "kernel-core",
    "kernel-modules",
    "kernel-modules-core",
    "kernel-modules-extra",
];

/// The [`DEFAULT_KERNEL_PACKAGES`] a target base holds, when its package list is known
/// (`base`, from the image's layer annotations: `crate::image::registry::components`) and
/// names `kernel-core`, which every RHEL 9 and 10 kernel has; otherwise all five, the
/// machine-config daemon's list (a base that is not chunked, or whose list is unknown, is
/// taken to be RHEL CoreOS, which carries all five). `kernel` itself is a meta-package without
/// files, which no layer's list names (a chunk lists the packages whose files it holds): it is
/// taken to be there with `kernel-core`, which it requires — left out, rpm-ostree fails the
/// stage "Could not depsolve transaction … kernel requires kernel-core" (seen on rpm-ostree
/// v2025.5 run beside the project).
pub fn default_kernel_packages_in(base: Option<&BTreeSet<String>>) -> Vec<&'static str> {
    match base {
        Some(names) if names.contains("kernel-core") => DEFAULT_KERNEL_PACKAGES
            .into_iter()
            .filter(|p| *p == "kernel" || names.contains(*p))
            .collect(),
        _ => DEFAULT_KERNEL_PACKAGES.to_vec(),
    }
}

/// The booted deployment's overrides and the running kernel disagree on the variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the booted deployment's overrides describe a {} kernel but the running kernel {release:?} is {}",
    overrides.as_str(),
    running.as_str()
)]
pub struct KernelMismatch {
    /// The variant the overrides describe.
    pub overrides: KernelVariant,
    /// The variant running.
    pub running: KernelVariant,
    /// The running kernel release (trimmed).
    pub release: String,
}

impl KernelMismatch {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "kernel-mismatch"
    }
}

/// The variant the deployment's overrides describe.
pub fn variant_of(dep: &Deployment) -> KernelVariant {
    let has = |name: &str| dep.added_packages().any(|p| names_package(p, name));
    if has("kernel-rt-core") {
        KernelVariant::Realtime
    } else if has("kernel-64k-core") {
        KernelVariant::SixtyFourK
    } else {
        KernelVariant::Default
    }
}

/// The running variant, cross-checked with the deployment's overrides, the running kernel
/// release and `/sys/kernel/realtime`: overrides of a variant need that variant running; a
/// variant running without overrides comes from the image ([`from_image`]). `Err` explains a
/// disagreement.
pub fn checked_variant(
    dep: &Deployment,
    running_release: &str,
    sys_realtime: Option<&str>,
) -> Result<KernelVariant, KernelMismatch> {
    let from_overrides = variant_of(dep);
    let release = running_release.trim();
    let running = if release.ends_with("+rt") || sys_realtime.is_some_and(|v| v.trim() == "1") {
        KernelVariant::Realtime
    } else if release.ends_with("+64k") {
        KernelVariant::SixtyFourK
    } else {
        KernelVariant::Default
    };
    if from_overrides == running || from_overrides == KernelVariant::Default {
        Ok(running)
    } else {
        Err(KernelMismatch {
            overrides: from_overrides,
            running,
            release: release.to_string(),
        })
    }
}

/// Whether the running variant `running` of `dep` comes from its image rather than from
/// package overrides (then the rebase carries no kernel packages).
pub fn from_image(dep: &Deployment, running: KernelVariant) -> bool {
    running != KernelVariant::Default && variant_of(dep) == KernelVariant::Default
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::rpm::Op;

    fn dep(removals: &[&str], packages: &[&str], local: &[&str]) -> Deployment {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Deployment {
            requested_base_removals: v(removals),
            requested_packages: v(packages),
            requested_local_packages: v(local),
            ..Deployment::default()
        }
    }

    #[test]
    fn package_names() {
        assert!(names_package("kernel-rt-core", "kernel-rt-core"));
        assert!(names_package(
            "kernel-rt-core-5.14.0-570.el9.x86_64",
            "kernel-rt-core"
        ));
        assert!(!names_package("kernel-rt-core-debuginfo", "kernel-rt-core"));
        assert!(!names_package("kernel-rt-modules", "kernel-rt-core"));
        assert!(!names_package(
            "kernel-64k-core-6.12.0-1.el10.aarch64",
            "kernel"
        ));
        assert!(names_package("kernel-6.12.0-1.el10.aarch64", "kernel"));
    }

    #[test]
    fn the_removals_follow_the_target_base_when_it_is_known() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let all = DEFAULT_KERNEL_PACKAGES.to_vec();
        type Row<'a> = (&'a str, Option<BTreeSet<String>>, Vec<&'a str>);
        let table: &[Row] = &[
            ("unknown base: the MCD's list", None, all.clone()),
            (
                "a base without kernel-modules-extra",
                Some(set(&[
                    "bash",
                    "kernel",
                    "kernel-core",
                    "kernel-modules",
                    "kernel-modules-core",
                ])),
                vec![
                    "kernel",
                    "kernel-core",
                    "kernel-modules",
                    "kernel-modules-core",
                ],
            ),
            (
                "the file-less kernel meta-package is in no layer's list",
                Some(set(&[
                    "bash",
                    "kernel-core",
                    "kernel-modules",
                    "kernel-modules-core",
                    "kernel-modules-extra",
                ])),
                all.clone(),
            ),
            (
                "a list without kernel-core says nothing of the kernel",
                Some(set(&["bash", "kernel"])),
                all.clone(),
            ),
            (
                "a base with all five",
                Some(set(&DEFAULT_KERNEL_PACKAGES)),
                all.clone(),
            ),
        ];
        for (what, base, want) in table {
            assert_eq!(&default_kernel_packages_in(base.as_ref()), want, "{what}");
        }
    }

    #[test]
    fn variants_by_table() {
        let rt = dep(
            &DEFAULT_KERNEL_PACKAGES,
            &[],
            &["kernel-rt-core-5.14.0-570.el9_6.x86_64"],
        );
        let k64 = dep(&DEFAULT_KERNEL_PACKAGES, &["kernel-64k-core"], &[]);
        let plain = dep(&[], &["usbguard"], &[]);
        let cases = [
            (
                &rt,
                "5.14.0-570.el9_6.x86_64+rt",
                None,
                Ok(KernelVariant::Realtime),
            ),
            (
                &rt,
                "5.14.0-570.el9_6.x86_64",
                Some("1"),
                Ok(KernelVariant::Realtime),
            ),
            (
                &k64,
                "5.14.0-570.el9_6.aarch64+64k",
                None,
                Ok(KernelVariant::SixtyFourK),
            ),
            (
                &plain,
                "5.14.0-570.el9_6.x86_64",
                Some("0"),
                Ok(KernelVariant::Default),
            ),
            // The kernel of a real-time image: nothing to carry.
            (
                &plain,
                "5.14.0-570.el9_6.x86_64+rt",
                None,
                Ok(KernelVariant::Realtime),
            ),
            (&rt, "5.14.0-570.el9_6.x86_64", None, Err(())),
            (&k64, "5.14.0-570.el9_6.x86_64+rt", None, Err(())),
        ];
        for (d, release, rtflag, want) in cases {
            let got = checked_variant(d, release, rtflag).map_err(|_| ());
            assert_eq!(got, want, "{release} {rtflag:?}");
        }
        assert!(from_image(&plain, KernelVariant::Realtime));
        assert!(!from_image(&rt, KernelVariant::Realtime));
        assert!(!from_image(&plain, KernelVariant::Default));
        assert_eq!(KernelVariant::Realtime.packages().len(), 3);
        assert!(
            !KernelVariant::Realtime
                .packages()
                .contains(&"kernel-rt-kvm")
        );
    }

    #[test]
    fn a_variant_owns_its_family_and_its_release() {
        let rt = KernelVariant::Realtime;
        assert!(rt.owns("kernel-rt-modules-core-6.12.0-124.8.1.el10_1.x86_64"));
        assert!(rt.owns("kernel-rt-kvm"));
        assert!(!rt.owns("kernel-core"));
        assert!(!rt.owns("kernel-64k-core"));
        assert!(!KernelVariant::Default.owns("kernel-rt-core"));
        let rel = "6.12.0-124.8.1.el10_1.x86_64";
        for (dep, want) in [
            (
                Dep::versioned(
                    "kernel-rt-modules-core-uname-r",
                    Op::Eq,
                    format!("{rel}+rt"),
                ),
                true,
            ),
            (
                Dep::versioned("kernel-uname-r", Op::Eq, format!("{rel}+rt")),
                true,
            ),
            (Dep::versioned("kernel-uname-r", Op::Eq, rel), false),
            (Dep::any("/bin/sh"), false),
            (Dep::versioned("systemd", Op::Ge, "200"), false),
        ] {
            assert_eq!(rt.owns_requirement(&dep), want, "{dep}");
            assert!(!KernelVariant::Default.owns_requirement(&dep));
        }
        assert!(KernelVariant::SixtyFourK.owns_requirement(&Dep::versioned(
            "kernel-uname-r",
            Op::Eq,
            "6.12.0-124.8.1.el10_1.aarch64+64k"
        )));
    }
}
