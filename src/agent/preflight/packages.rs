//! The checks of the packages beside the OS image: the extensions image, the layered
//! packages it must re-provide, and the RPMs' dependencies.

use super::needs::{FromExtensions, machine_config, provided, rebuilt_by_mco};
use super::{CheckResult, Input, Mover, fail, pass, target_major};
use crate::backend::KernelVariant;
use crate::cluster::protocol::CheckId;
use crate::host::facts::machineconfig::AppliedConfig;
use crate::host::facts::mco_release::Named;
use crate::image::rpm::{RpmRelease, el_major, names_package, package_name, unreadable};

/// What the applied MachineConfig asks the extensions image for, for a reason.
fn machine_config_asks(p: &FromExtensions, mc: &AppliedConfig) -> String {
    let mut asks = Vec::new();
    if p.variant != KernelVariant::Default {
        asks.push(format!("spec.kernelType {}", p.variant.as_str()));
    }
    if !mc.extensions.is_empty() {
        asks.push(format!("spec.extensions {}", mc.extensions.join(", ")));
    }
    asks.join(" and ")
}

/// How many layered packages a reason names before it counts the rest.
const NAMED_PACKAGES: usize = 8;

/// What the node runs that must come from an extensions image, for a reason: the kernel
/// variant with its packages, and the layered packages (the first [`NAMED_PACKAGES`]).
fn what_is_needed(p: &FromExtensions) -> String {
    let mut parts = Vec::new();
    if p.variant != KernelVariant::Default {
        parts.push(format!(
            "the {} kernel ({})",
            p.variant.as_str(),
            p.kernel.join(", ")
        ));
    }
    let layered: Vec<&str> = p.all_layered().map(String::as_str).collect();
    if !layered.is_empty() {
        let shown = layered[..layered.len().min(NAMED_PACKAGES)].join(", ");
        let more = layered.len().saturating_sub(NAMED_PACKAGES);
        parts.push(if more == 0 {
            format!("the layered packages {shown}")
        } else {
            format!("the layered packages {shown} and {more} more")
        });
    }
    parts.join(" and ")
}

pub(super) fn extensions_image(i: &Input) -> CheckResult {
    let id = CheckId::ExtensionsImage;
    let provided = provided(i);
    match &i.extensions {
        None if provided.needed()
            && let Some(Ok(mc)) = machine_config(i) =>
        {
            fail(
                id,
                format!(
                    "the MachineConfig the machine-config daemon applied asks for {}, which the machine-config operator installs from the stream's extensions image, and the target has none (the OSImageStream's osExtensionsImage, or check-extensions-image)",
                    machine_config_asks(&provided, mc)
                ),
            )
        }
        None if provided.needed() && rebuilt_by_mco(&i.booted, i.mover) => fail(
            id,
            format!(
                "the machine-config operator's on-cluster build takes the {} kernel from the stream's extensions image, and the target has none (the OSImageStream's osExtensionsImage, or check-extensions-image)",
                provided.variant.as_str()
            ),
        ),
        None if provided.needed() => fail(
            id,
            format!(
                "this node runs {}, which the target must get again from an extensions image of the target's stream: in a StreamPool set spec.target.extensionsImage (beside spec.target.osImage); on a node without a pool, the annotation desired-extensions-image",
                what_is_needed(&provided)
            ),
        ),
        None => pass(id, "not needed"),
        Some(Err(e)) => fail(id, e.to_string()),
        Some(Ok(ext)) if !ext.is_extensions => fail(
            id,
            "the extensions image lacks the label io.openshift.os.extensions=true",
        ),
        Some(Ok(ext)) => match &ext.stream_class {
            Some(c) if c != &i.desired.stream => fail(
                id,
                format!(
                    "the extensions image's stream class is {c:?}, not {:?}",
                    i.desired.stream
                ),
            ),
            _ if !ext.listed => pass(
                id,
                "labels read from its config; no package is needed from it, so no layer was read",
            ),
            _ => pass(id, format!("{} RPMs", ext.rpms.len())),
        },
    }
}

/// The layered packages: re-provided by the extensions image for the target, or kept as built
/// where they fit it.
pub(super) fn layered_packages(i: &Input) -> CheckResult {
    let id = CheckId::LayeredPackages;
    if let Some(refused) = machine_config_refusal(i) {
        return refused;
    }
    let provided_by = provided(i);
    let target = target_major(&i.desired, &i.os_image);
    let stale: Vec<&str> = provided_by
        .local
        .iter()
        .filter(|p| el_major(p) != target)
        .map(String::as_str)
        .collect();
    if !stale.is_empty() {
        let target = target.map_or_else(|| "unknown".to_string(), |t| format!("el{t}"));
        return fail(
            id,
            format!(
                "local RPMs stay in the origin as built through the machine-config daemon's rebase, and these are not built for the target ({target}); remove them (rpm-ostree uninstall): {}",
                stale.join(", ")
            ),
        );
    }
    if provided_by.all_layered().next().is_none() {
        return pass(id, "no layered packages");
    }
    // The daemon mounts the extensions image as a repository only for a MachineConfig with
    // extensions or a kernel type (`applyLayeredOSChanges`); without one, packages layered by
    // hand must come from the target image alone, whose package list streamd cannot read.
    if provided_by.from_machine_config
        && !provided_by.by_hand.is_empty()
        && provided_by.layered.is_empty()
        && provided_by.variant == KernelVariant::Default
    {
        return fail(
            id,
            format!(
                "no repository provides the packages layered outside the MachineConfig, which the machine-config daemon's rebase keeps (it adds the extensions image only for spec.extensions or spec.kernelType, and streamd cannot list the target image's own); remove them (rpm-ostree uninstall): {}",
                provided_by.by_hand.join(", ")
            ),
        );
    }
    reprovided(i, &provided_by, target)
}

/// The machine-config operator's move with an applied MachineConfig that cannot be read (what
/// it installs is unknown) or that names extensions the operator rejects: it resolves the
/// names before it installs anything (pkg/controller/common/helpers.go
/// `GetPackagesForSupportedExtensions`).
fn machine_config_refusal(i: &Input) -> Option<CheckResult> {
    let id = CheckId::LayeredPackages;
    match machine_config(i)? {
        Err(e) => Some(fail(
            id,
            format!(
                "cannot read the MachineConfig the machine-config daemon applied ({e}), so what the machine-config operator installs from the extensions image is unknown"
            ),
        )),
        Ok(mc) if !mc.unsupported.is_empty() => Some(fail(
            id,
            format!(
                "the MachineConfig's spec.extensions names extensions the machine-config operator does not support: {}; it rejects them (invalid extensions found, {})",
                mc.unsupported.join(", "),
                mc.release.by()
            ),
        )),
        Ok(_) => None,
    }
}

/// The layered packages (and those layered by hand) must be in the extensions image, built for
/// the `target` major, except where the machine-config operator installs them from the
/// stream's own extensions image: it takes whatever that repository holds, which for rhel-10
/// includes el9 builds on purpose (openshift/os `extensions/rhel-10.2.yaml` adds an el9
/// `server-ose` repository for kata-containers on 4.21, 4.22 and 4.23).
fn reprovided(i: &Input, provided_by: &FromExtensions, target: Option<u32>) -> CheckResult {
    let id = CheckId::LayeredPackages;
    let (provided, any_dist): (Vec<&String>, bool) = match &i.extensions {
        Some(Ok(ext)) => (
            ext.rpms.iter().collect(),
            i.mover == Mover::MachineConfigOperator
                && ext
                    .stream_class
                    .as_ref()
                    .is_none_or(|c| c == &i.desired.stream),
        ),
        _ => (Vec::new(), false),
    };
    let missing_of = |wanted: &[String]| -> Vec<String> {
        wanted
            .iter()
            .map(|p| package_name(p))
            .filter(|name| {
                !provided
                    .iter()
                    .any(|r| names_package(r, name) && (any_dist || el_major(r) == target))
            })
            .map(str::to_string)
            .collect()
    };
    let (missing, missing_by_hand) = (
        missing_of(&provided_by.layered),
        missing_of(&provided_by.by_hand),
    );
    if missing.is_empty() && missing_by_hand.is_empty() {
        let all: Vec<&str> = provided_by.all_layered().map(String::as_str).collect();
        return pass(
            id,
            format!("re-provided from the extensions image: {}", all.join(", ")),
        );
    }
    let mut why = Vec::new();
    match machine_config(i) {
        Some(Ok(mc)) if provided_by.from_machine_config => {
            if !missing.is_empty() {
                why.push(format!(
                    "the MachineConfig's spec.extensions ({}) needs packages the extensions image does not provide for the target: {}",
                    mc.extensions.join(", "),
                    missing.join(", ")
                ));
            }
            if !missing_by_hand.is_empty() {
                why.push(format!(
                    "packages layered on the node outside the MachineConfig stay in its origin through the move, and the extensions image does not provide them for the target: {}",
                    missing_by_hand.join(", ")
                ));
            }
        }
        _ => why.push(format!(
            "layered packages not provided for the target by the extensions image: {}",
            missing.join(", ")
        )),
    }
    if let Some(Ok(mc)) = machine_config(i)
        && provided_by.from_machine_config
        && mc.release.named != Named::Known
    {
        why.push(format!("judged {}", mc.release.by()));
    }
    fail(id, why.join("; "))
}

/// The RPMs passed must be closed under Requires: rpm-ostree adds them to the sack as
/// `@commandline` packages and depsolves against the new base plus them alone (RHCOS enables
/// no repositories), so a dependency the image lacks fails the transaction after the image
/// is pulled. A requirement of the variant kernel's own family is missing for certain (no
/// base carries it); anything else the image does not provide is left to the new base,
/// whose package list cannot be read before it is pulled. Each RPM must also be one the booted
/// OS's rpm-ostree can import (src/image/rpm/reader.rs): it does so before the pull, with the
/// booted rpm, unless the machine-config operator's on-cluster build installs them in the
/// target image instead.
pub(super) fn rpm_dependencies(i: &Input) -> CheckResult {
    let id = CheckId::RpmDependencies;
    let Some(closure) = &i.closure else {
        return pass(id, "no RPMs to pass");
    };
    let rpm = RpmRelease::of_major(i.booted_major);
    let unreadable: Vec<String> = if rebuilt_by_mco(&i.booted, i.mover) {
        Vec::new()
    } else {
        closure
            .packages
            .iter()
            .filter_map(|h| unreadable(h, rpm))
            .map(|u| u.to_string())
            .collect()
    };
    if !unreadable.is_empty() {
        return fail(
            id,
            format!(
                "the booted OS's {rpm}, with which rpm-ostree imports the RPMs passed, cannot read these of the extensions image: {}",
                unreadable.join("; ")
            ),
        );
    }
    if !closure.missing.is_empty() {
        let what: Vec<String> = closure
            .missing
            .iter()
            .map(|u| format!("nothing provides {u}"))
            .collect();
        return fail(
            id,
            format!(
                "the extensions image's RPMs are not dependency-closed: {}; rpm-ostree would fail the depsolve",
                what.join("; ")
            ),
        );
    }
    let left = if closure.from_base.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = closure
            .from_base
            .iter()
            .map(|u| u.requirement.to_string())
            .collect();
        format!("; left to the base: {}", names.join(", "))
    };
    pass(
        id,
        format!(
            "{} RPMs closed under Requires{left}",
            closure.packages.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::image::rpm::Closure;

    /// Each reason extensions-image, layered-packages and rpm-dependencies refuse for.
    #[test]
    fn refusals_by_table() {
        let mut cases: Vec<(&str, Input)> = Vec::new();
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.booted.requested_packages = vec!["usbguard".into()];
        let m = message(&c, "extensions-image");
        assert!(
            m.starts_with("this node runs the realtime kernel (kernel-rt-core, ")
                && m.contains(") and the layered packages usbguard, which")
                && m.contains("spec.target.extensionsImage")
                && m.contains("desired-extensions-image"),
            "{m}"
        );
        cases.push(("extensions-image", c));
        let mut c = base();
        c.extensions = Some(Ok(ExtensionsInfo {
            is_extensions: false,
            ..rt_ext(10)
        }));
        cases.push(("extensions-image", c));
        let mut c = base();
        c.booted.requested_packages = vec!["usbguard".into()];
        c.extensions = Some(Ok(ExtensionsInfo {
            is_extensions: true,
            listed: true,
            stream_class: Some("rhel-10".into()),
            rpms: vec![],
            headers: Vec::new(),
        }));
        cases.push(("layered-packages", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.extensions = Some(Ok(rt_ext(10)));
        c.closure = Some(Closure {
            missing: vec![crate::image::rpm::Unresolved {
                package: "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64".into(),
                requirement: crate::image::rpm::Dep::versioned(
                    "kernel-rt-modules-core-uname-r",
                    crate::image::rpm::Op::Eq,
                    "6.12.0-124.8.1.el10_1.x86_64+rt",
                ),
            }],
            ..Closure::default()
        });
        cases.push(("rpm-dependencies", c));
        assert_refused(cases);
    }

    /// A passed RPM the booted rpm cannot read is refused before any transaction, naming the
    /// file, what it needs and the booted rpm; one it can read passes, and the on-cluster
    /// build (which installs in the target image) is not judged by the booted rpm.
    #[test]
    fn rpms_the_booted_rpm_cannot_read_are_refused() {
        let node = |rpmlib: &str, booted: u32| {
            let mut c = base();
            layer_kernel(&mut c, KernelVariant::Realtime);
            c.extensions = Some(Ok(rt_ext(10)));
            c.booted_major = Some(booted);
            c.closure = Some(Closure {
                packages: vec![crate::image::rpm::el10_rt_core(
                    &[(rpmlib, "5.4.18-1")],
                    Some("zstd"),
                    None,
                )],
                ..Closure::default()
            });
            c
        };
        assert_eq!(
            failed(&node("rpmlib(PayloadIsZstd)", 9)),
            Vec::<&str>::new()
        );
        let c = node("rpmlib(PayloadIsZstd2)", 9);
        assert_eq!(failed(&c), vec!["rpm-dependencies"], "{:#?}", run(&c));
        assert_eq!(
            message(&c, "rpm-dependencies"),
            "the booted OS's rpm 4.16.1.3 (el9), with which rpm-ostree imports the RPMs passed, cannot read these of the extensions image: kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64.rpm: it needs rpmlib(PayloadIsZstd2) <= 5.4.18-1, which rpm 4.16.1.3 (el9) does not provide"
        );
        let m = message(&node("rpmlib(PayloadIsZstd2)", 10), "rpm-dependencies");
        assert!(m.contains("rpm 4.19.1.1 (el10)"), "{m}");
        let mut c = node("rpmlib(PayloadIsZstd2)", 9);
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        assert!(!failed(&c).contains(&"rpm-dependencies"), "{:#?}", run(&c));
    }

    /// The machine-config operator's move installs the extensions the applied MachineConfig
    /// asks for from the extensions image, whatever the node runs now (on an on-cluster-layered
    /// node they are baked into the image, no override).
    #[test]
    fn the_mco_move_needs_the_extensions_the_applied_machine_config_asks_for() {
        let usbguard = r#"{"spec":{"kernelType":"default","extensions":["usbguard"]}}"#;
        let c = ocl_mc(usbguard, &RT);
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", run(&c));
        let m = &message(&c, "layered-packages");
        assert!(
            m.contains("MachineConfig's spec.extensions (usbguard)")
                && m.ends_with("does not provide for the target: usbguard"),
            "{m}"
        );
        assert_eq!(failed(&ocl_mc(usbguard, &["usbguard"])), Vec::<&str>::new());
        // streamd's own move ignores the MachineConfig (and refuses the base image).
        let mut c = ocl_mc(usbguard, &RT);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"]);
        // No extensions image: the operator would have nothing to install usbguard from.
        let mut c = ocl_mc(usbguard, &[]);
        c.extensions = None;
        assert_eq!(failed(&c), vec!["extensions-image", "layered-packages"]);
        let m = &message(&c, "extensions-image");
        assert!(m.contains("asks for spec.extensions usbguard"), "{m}");
    }

    /// On a classic node the daemon's rebase keeps packages layered by hand in the origin: they
    /// are needed from the extensions image beside the MachineConfig's, and without a
    /// MachineConfig that makes the daemon add that repository they cannot be shown to resolve.
    #[test]
    fn packages_layered_by_hand_are_needed_through_the_mco_move() {
        let classic = |json: &str, ext: &[&str]| {
            let mut c = base();
            c.booted.requested_packages = vec!["usbguard".into(), "htop".into()];
            c.mover = Mover::MachineConfigOperator;
            c.machine_config = applied(json);
            c.extensions = Some(Ok(ext_with(ext)));
            c
        };
        let usbguard = r#"{"spec":{"extensions":["usbguard"]}}"#;
        let c = classic(usbguard, &["usbguard"]);
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", run(&c));
        let m = message(&c, "layered-packages");
        assert!(
            m.starts_with(
                "packages layered on the node outside the MachineConfig stay in its origin"
            ) && m.ends_with("does not provide them for the target: htop"),
            "{m}"
        );
        let c = classic(usbguard, &["htop"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.contains("spec.extensions (usbguard) needs packages the extensions image does not provide for the target: usbguard")
                && !m.contains("outside the MachineConfig"),
            "{m}"
        );
        assert_eq!(
            failed(&classic(usbguard, &["usbguard", "htop"])),
            Vec::<&str>::new()
        );
        // Nothing in the MachineConfig: the daemon adds no repository for the rebase.
        let c = classic("{}", &["usbguard", "htop"]);
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.starts_with("no repository provides the packages layered outside the MachineConfig")
                && m.ends_with(": usbguard, htop"),
            "{m}"
        );
        // Local RPMs are kept as built: only those of the target's major pass.
        let mut c = classic(usbguard, &["usbguard", "htop"]);
        c.booted.requested_local_packages = vec!["tool-1.0-1.el9.x86_64".into()];
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.contains("not built for the target (el10)") && m.ends_with(": tool-1.0-1.el9.x86_64"),
            "{m}"
        );
        c.booted.requested_local_packages = vec!["tool-1.0-1.el10.x86_64".into()];
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
        // streamd's own move carries them as before.
        let mut c = classic("{}", &["usbguard", "htop"]);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    }
}
