//! The machine-config operator's package tables, per release: which packages each
//! `spec.extensions` name installs and which kernel packages each `spec.kernelType` swaps in
//! differ between OpenShift releases, and a node is judged by the tables of the release that
//! rendered its MachineConfig (the [`RELEASE_ANNOTATION`] the render controller puts on every
//! rendered MachineConfig, which the machine-config daemon stores with it on disk).
//!
//! Read from openshift/machine-config-operator at `release-4.21` (db84d8368), `release-4.22`
//! (9027c94cd) and `release-4.23` (d20efd9b9, the same commit as `release-5.0`); the notes are
//! docs/upstream/mco-releases.md §2–3, the rows docs/fidelity.md "Machine-config operator
//! releases".

use crate::backend::KernelVariant;
use crate::text;

/// The annotation naming the OpenShift release that rendered a MachineConfig
/// (pkg/controller/common/constants.go `ReleaseImageVersionAnnotationKey`, copied from the
/// ControllerConfig by pkg/controller/render/render_controller.go
/// `generateRenderedMachineConfig` on every release).
pub const RELEASE_ANNOTATION: &str = "machineconfiguration.openshift.io/release-image-version";

/// A machine-config operator release whose tables streamd has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum McoRelease {
    /// OpenShift 4.21 (`release-4.21`).
    V4_21,
    /// OpenShift 4.22 (`release-4.22`).
    V4_22,
    /// OpenShift 4.23, which the operator's branches also call 5.0 (`release-4.23` =
    /// `release-5.0`).
    V4_23,
}

/// One row of an extension table: the `spec.extensions` name and the packages it installs.
pub type Extension = (&'static str, &'static [&'static str]);

/// release-4.21 pkg/controller/common/helpers.go `SupportedExtensions` (l. 524): eight
/// extensions, `wasm` among them; `ipsec` without openvswitch.
const EXTENSIONS_4_21: [Extension; 8] = [
    ("two-node-ha", &["pacemaker", "pcs", "fence-agents-all"]),
    ("wasm", &["crun-wasm"]),
    ("ipsec", &["NetworkManager-libreswan", "libreswan"]),
    ("usbguard", &["usbguard"]),
    ("kerberos", &["krb5-workstation", "libkadm5"]),
    ("kernel-devel", &["kernel-devel", "kernel-headers"]),
    ("sandboxed-containers", &["kata-containers"]),
    ("sysstat", &["sysstat"]),
];

/// release-4.22 pkg/controller/common/helpers.go `SupportedExtensions` (l. 561): 4.21's
/// without `wasm` (commit 28f9c7246 "MCO-2088: Remove wasm extension").
const EXTENSIONS_4_22: [Extension; 7] = [
    ("two-node-ha", &["pacemaker", "pcs", "fence-agents-all"]),
    ("ipsec", &["NetworkManager-libreswan", "libreswan"]),
    ("usbguard", &["usbguard"]),
    ("kerberos", &["krb5-workstation", "libkadm5"]),
    ("kernel-devel", &["kernel-devel", "kernel-headers"]),
    ("sandboxed-containers", &["kata-containers"]),
    ("sysstat", &["sysstat"]),
];

/// release-4.23 pkg/controller/common/helpers.go `SupportedExtensions` (l. 560): `ipsec`
/// gains openvswitch3.5-ipsec (commit 098552cd5). The old two-package set
/// (`LegacyExtensionPackages`) is only accepted when verifying a node, not installed.
const EXTENSIONS_4_23: [Extension; 7] = [
    ("two-node-ha", &["pacemaker", "pcs", "fence-agents-all"]),
    (
        "ipsec",
        &[
            "NetworkManager-libreswan",
            "libreswan",
            "openvswitch3.5-ipsec",
        ],
    ),
    ("usbguard", &["usbguard"]),
    ("kerberos", &["krb5-workstation", "libkadm5"]),
    ("kernel-devel", &["kernel-devel", "kernel-headers"]),
    ("sandboxed-containers", &["kata-containers"]),
    ("sysstat", &["sysstat"]),
];

/// The on-cluster build's real-time list, the same on every release
/// (pkg/controller/common/helpers.go `GetPackagesForSupportedKernelType`: 4.21 l. 491, 4.22
/// l. 528, 4.23 l. 527; used by pkg/controller/build/buildrequest/buildrequestopts.go
/// `getKernelPackages`).
const REALTIME_BUILD: [&str; 4] = [
    "kernel-rt-core",
    "kernel-rt-modules",
    "kernel-rt-modules-extra",
    "kernel-rt-kvm",
];

/// The daemon's own real-time list (pkg/daemon/update.go, used by `switchKernel`): on
/// release-4.22 (`getKernelPackagesForTargetRelease`, l. 2016) and release-4.23 (l. 2057)
/// always, on release-4.21 (`getKernelPackagesForRelease`, l. 1884) when the booted OS is EL10.
const REALTIME_MCD: [&str; 3] = [
    "kernel-rt-core",
    "kernel-rt-modules",
    "kernel-rt-modules-extra",
];

/// The 64k-pages list, the same in the build's and the daemon's tables on every release
/// (`GetPackagesForSupportedKernelType`; pkg/daemon/update.go `hugePagesKernel`).
const SIXTY_FOUR_K: [&str; 4] = [
    "kernel-64k-core",
    "kernel-64k-modules",
    "kernel-64k-modules-core",
    "kernel-64k-modules-extra",
];

impl McoRelease {
    /// Every release streamd has tables for, oldest first.
    pub const ALL: [McoRelease; 3] = [McoRelease::V4_21, McoRelease::V4_22, McoRelease::V4_23];

    /// The newest: the tables used when a MachineConfig names no release streamd knows.
    pub const NEWEST: McoRelease = McoRelease::V4_23;

    /// `4.21`, `4.22`, `4.23`.
    pub fn as_str(self) -> &'static str {
        match self {
            McoRelease::V4_21 => "4.21",
            McoRelease::V4_22 => "4.22",
            McoRelease::V4_23 => "4.23",
        }
    }

    /// The release of an OpenShift release version (`4.21.5`, `4.22.0-ec.2`,
    /// `4.23.0-0.nightly-…`; `5.0.…`, the name the operator's branches give 4.23), if it is
    /// one streamd has tables for.
    pub fn from_version(version: &str) -> Option<McoRelease> {
        let mut parts = version.trim().split(['.', '-']);
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next()?.parse().ok()?;
        match (major, minor) {
            (4, 21) => Some(McoRelease::V4_21),
            (4, 22) => Some(McoRelease::V4_22),
            (4, 23) | (5, 0) => Some(McoRelease::V4_23),
            _ => None,
        }
    }

    /// The extensions this release supports and the packages each installs
    /// (`SupportedExtensions`, resolved by `GetPackagesForSupportedExtensions`).
    pub fn extensions(self) -> &'static [Extension] {
        match self {
            McoRelease::V4_21 => &EXTENSIONS_4_21,
            McoRelease::V4_22 => &EXTENSIONS_4_22,
            McoRelease::V4_23 => &EXTENSIONS_4_23,
        }
    }

    /// The row of extension `name`, if this release supports it.
    pub fn extension(self, name: &str) -> Option<Extension> {
        self.extensions().iter().find(|(n, _)| *n == name).copied()
    }

    /// The kernel packages this release's operator installs for `variant` from the extensions
    /// image: the on-cluster build's list (`on_cluster_build`), else the daemon's own, which
    /// on 4.21 depends on the OS the daemon runs on (`booted_major`: 4.21's
    /// `if !dn.os.IsEL10()` adds kernel-rt-kvm, "RHEL10 doesn't ship with kernel-rt-kvm").
    /// None for the default kernel: the image's own stays.
    pub fn kernel_packages(
        self,
        variant: KernelVariant,
        on_cluster_build: bool,
        booted_major: Option<u32>,
    ) -> &'static [&'static str] {
        match variant {
            KernelVariant::Default => &[],
            KernelVariant::SixtyFourK => &SIXTY_FOUR_K,
            KernelVariant::Realtime if on_cluster_build => &REALTIME_BUILD,
            KernelVariant::Realtime if self == McoRelease::V4_21 && booted_major != Some(10) => {
                &REALTIME_BUILD
            }
            KernelVariant::Realtime => &REALTIME_MCD,
        }
    }
}

/// The release a MachineConfig was rendered by, as streamd takes it: the one it names, or the
/// newest when it names none streamd has tables for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseOf {
    /// The release whose tables are used.
    pub release: McoRelease,
    /// What the MachineConfig names.
    pub named: Named,
}

/// What a MachineConfig's [`RELEASE_ANNOTATION`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A release streamd has tables for.
    Known,
    /// Another release: the value, quoted.
    Unknown(String),
    /// Nothing: no such annotation.
    Absent,
}

impl ReleaseOf {
    /// A known release.
    pub fn known(release: McoRelease) -> ReleaseOf {
        ReleaseOf {
            release,
            named: Named::Known,
        }
    }

    /// The release [`RELEASE_ANNOTATION`]'s `value` names (`None`: no such annotation).
    pub fn from_annotation(value: Option<&str>) -> ReleaseOf {
        match value.map(|v| (McoRelease::from_version(v), v)) {
            Some((Some(release), _)) => ReleaseOf::known(release),
            Some((None, v)) => ReleaseOf {
                release: McoRelease::NEWEST,
                named: Named::Unknown(text::quote(v)),
            },
            None => ReleaseOf {
                release: McoRelease::NEWEST,
                named: Named::Absent,
            },
        }
    }

    /// For a reason: which release's tables judged the node, and why when it is not the one
    /// the MachineConfig names (`by release 4.21's machine-config operator`).
    pub fn by(&self) -> String {
        let r = self.release.as_str();
        match &self.named {
            Named::Known => format!("by release {r}'s machine-config operator"),
            Named::Unknown(v) => format!(
                "by release {r}'s machine-config operator, the newest streamd knows: the MachineConfig's {RELEASE_ANNOTATION} {v} is none it has the operator's tables for"
            ),
            Named::Absent => format!(
                "by release {r}'s machine-config operator, the newest streamd knows: the MachineConfig has no {RELEASE_ANNOTATION} annotation"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_versions_name_their_tables() {
        let v = McoRelease::from_version;
        assert_eq!(v("4.21.5"), Some(McoRelease::V4_21));
        assert_eq!(v("4.22.0-ec.2"), Some(McoRelease::V4_22));
        assert_eq!(
            v("4.23.0-0.nightly-2026-11-02-101010"),
            Some(McoRelease::V4_23)
        );
        assert_eq!(
            v("5.0.1"),
            Some(McoRelease::V4_23),
            "release-4.23 = release-5.0"
        );
        for other in ["4.20.9", "5.1.0", "4", "", "4.x", "latest"] {
            assert_eq!(v(other), None, "{other}");
        }
        let r = ReleaseOf::from_annotation(Some("4.20.9"));
        assert_eq!(r.release, McoRelease::NEWEST);
        assert!(
            r.by().contains(r#"release-image-version "4.20.9" is none"#),
            "{}",
            r.by()
        );
        let r = ReleaseOf::from_annotation(None);
        assert!(r.by().ends_with(
            "has no machineconfiguration.openshift.io/release-image-version annotation"
        ));
        assert_eq!(
            ReleaseOf::from_annotation(Some("4.21.0")).by(),
            "by release 4.21's machine-config operator"
        );
    }

    /// The differences between the releases' `SupportedExtensions`.
    #[test]
    fn extension_tables_by_release() {
        let packages = |r: McoRelease, name: &str| r.extension(name).map(|(_, p)| p.to_vec());
        assert_eq!(packages(McoRelease::V4_21, "wasm"), Some(vec!["crun-wasm"]));
        assert_eq!(packages(McoRelease::V4_22, "wasm"), None);
        assert_eq!(packages(McoRelease::V4_23, "wasm"), None);
        let ipsec2 = vec!["NetworkManager-libreswan", "libreswan"];
        assert_eq!(packages(McoRelease::V4_21, "ipsec"), Some(ipsec2.clone()));
        assert_eq!(packages(McoRelease::V4_22, "ipsec"), Some(ipsec2));
        assert_eq!(
            packages(McoRelease::V4_23, "ipsec"),
            Some(vec![
                "NetworkManager-libreswan",
                "libreswan",
                "openvswitch3.5-ipsec"
            ])
        );
        let names = |r: McoRelease| r.extensions().iter().map(|(n, _)| *n).collect::<Vec<_>>();
        assert_eq!(names(McoRelease::V4_22), names(McoRelease::V4_23));
        assert_eq!(names(McoRelease::V4_21).len(), 8);
    }

    /// 4.21's daemon asks for kernel-rt-kvm unless it runs on EL10; later ones never do; the
    /// on-cluster build always does.
    #[test]
    fn realtime_lists_by_release_and_booted_os() {
        let rt = |r: McoRelease, ocl: bool, booted: Option<u32>| {
            r.kernel_packages(KernelVariant::Realtime, ocl, booted)
                .contains(&"kernel-rt-kvm")
        };
        assert!(rt(McoRelease::V4_21, false, Some(9)));
        assert!(
            rt(McoRelease::V4_21, false, None),
            "IsEL10 is false when unknown"
        );
        assert!(!rt(McoRelease::V4_21, false, Some(10)));
        for r in [McoRelease::V4_22, McoRelease::V4_23] {
            assert!(!rt(r, false, Some(9)), "{r:?}");
        }
        for r in McoRelease::ALL {
            assert!(rt(r, true, Some(10)), "{r:?}");
            assert_eq!(
                r.kernel_packages(KernelVariant::Default, true, Some(9)),
                &[] as &[&str]
            );
            assert_eq!(
                r.kernel_packages(KernelVariant::SixtyFourK, false, Some(9))
                    .len(),
                4
            );
        }
    }
}
