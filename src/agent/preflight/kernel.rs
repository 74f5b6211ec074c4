//! The checks of the CPU and the kernel: the CPU level the target needs, FIPS, and the
//! kernel variant (from the booted image, or from the target's extensions image).

use super::needs::{
    self, FromExtensions, kernel_removals, mcd_reverts_kernel_swap, rebuilt_by_mco,
};
use super::{CheckResult, Input, fail, pass, target_major};
use crate::backend::KernelVariant;
use crate::cluster::protocol::CheckId;
use crate::host::facts::Fips;
use crate::image::registry::ExtensionsInfo;
use crate::image::rpm::{el_major, names_package};

pub(super) fn cpu_level(i: &Input) -> CheckResult {
    let id = CheckId::CpuLevel;
    let needs_v3 =
        i.arch == "x86_64" && target_major(&i.desired, &i.os_image).is_some_and(|m| m >= 10);
    if !needs_v3 {
        return pass(id, "no CPU level requirement for this target");
    }
    match i.x86_64_level {
        Some(l) if l >= 3 => pass(id, format!("x86-64-v{l}")),
        Some(l) => fail(
            id,
            format!(
                "this CPU is x86-64-v{l}; RHEL 10 needs x86-64-v3 (AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE) and would not boot"
            ),
        ),
        None => fail(id, "cannot read the CPU flags from /proc/cpuinfo"),
    }
}

pub(super) fn fips(i: &Input) -> CheckResult {
    let id = CheckId::Fips;
    match i.fips {
        Fips::Inconsistent => fail(
            id,
            format!(
                "FIPS state is inconsistent: {}; streamd never changes FIPS mode: make the two agree on the host (the fips=1 kernel argument and a FIPS-enabled boot, or neither) before moving it",
                i.fips_sources
            ),
        ),
        Fips::Enabled => pass(
            id,
            "FIPS enabled; it is carried in the kernel arguments and verified on the staged tree",
        ),
        Fips::Disabled => pass(id, "FIPS disabled"),
    }
}

fn variant_rpms<'e>(ext: &'e ExtensionsInfo, packages: &[&str]) -> Vec<&'e str> {
    packages
        .iter()
        .filter_map(|p| {
            ext.rpms
                .iter()
                .find(|r| names_package(r, p))
                .map(String::as_str)
        })
        .collect()
}

/// The kernel variant: the running one must be consistent, and kept by the move (by the
/// target image, or from the target's extensions image).
pub(super) fn kernel_variant(i: &Input) -> CheckResult {
    let id = CheckId::KernelVariant;
    let running = match &i.kernel {
        Ok(v) => *v,
        Err(e) => return fail(id, e.to_string()),
    };
    let provided = needs::provided(i);
    if let Some(settled) = machine_config_kernel(i, running, &provided) {
        return settled;
    }
    if provided.variant != KernelVariant::Default {
        return kernel_from_extensions(i, &provided);
    }
    if running == KernelVariant::Default {
        pass(id, "default kernel")
    } else if running == KernelVariant::SixtyFourK && i.arch != "aarch64" {
        fail(id, "a 64k-pages kernel exists only on aarch64")
    } else {
        kernel_from_image(i, running)
    }
}

/// What the applied MachineConfig settles for the machine-config operator's move, if anything:
/// the operator's own checks (pkg/controller/common/helpers.go `ValidateMachineConfig`;
/// `switchKernel` and the build's `getKernelPackages` for 64k-pages off aarch64), and that a
/// default `spec.kernelType` needs no kernel from anywhere unless the booted image carries one.
fn machine_config_kernel(
    i: &Input,
    running: KernelVariant,
    provided: &FromExtensions,
) -> Option<CheckResult> {
    let id = CheckId::KernelVariant;
    let Some(Ok(mc)) = needs::machine_config(i) else {
        return None;
    };
    let want = provided.variant;
    if let Err(t) = &mc.kernel_type {
        return Some(fail(
            id,
            format!(
                "the MachineConfig's spec.kernelType {t} is none of default, realtime, 64k-pages: the machine-config operator rejects it (kernelType=… is invalid)"
            ),
        ));
    }
    // The daemon's `switchKernel` removes the default kernel again (`override remove`);
    // removals its revert left in place (a kernel carried as local RPMs, streamd's own
    // way) make that fail with "Override already exists".
    let removals = kernel_removals(&i.booted);
    if want != KernelVariant::Default
        && !rebuilt_by_mco(&i.booted, i.mover)
        && !removals.is_empty()
        && !mcd_reverts_kernel_swap(&i.booted)
    {
        return Some(fail(
            id,
            format!(
                "the machine-config daemon's switch to the {} kernel would fail (Override already exists): its rebase keeps the node's kernel base removals, which it reverts only with kernel-rt or kernel-64k packages from a repository; reset them (rpm-ostree override reset) before the move: {}",
                want.as_str(),
                removals.join(", ")
            ),
        ));
    }
    // A variant the booted image carries (no override, no on-cluster build) is kept only
    // by the target image itself, whatever the MachineConfig says.
    let image_keeps = crate::backend::kernel::from_image(&i.booted, running)
        && !rebuilt_by_mco(&i.booted, i.mover);
    (want == KernelVariant::Default && !image_keeps).then(|| {
        pass(
            id,
            "the MachineConfig's spec.kernelType is default: the machine-config operator installs no kernel from the extensions image",
        )
    })
}

/// A variant kernel installed from the target's extensions image: the image must hold all of
/// the variant's packages, built for the target major.
fn kernel_from_extensions(i: &Input, provided: &FromExtensions) -> CheckResult {
    let id = CheckId::KernelVariant;
    let want = provided.variant;
    let asked = if let Some(Ok(mc)) = needs::machine_config(i)
        && provided.from_machine_config
    {
        format!(
            " the MachineConfig's spec.kernelType asks for (as {}, {})",
            provided.kernel.join(", "),
            mc.release.by()
        )
    } else {
        String::new()
    };
    if want == KernelVariant::SixtyFourK && i.arch != "aarch64" {
        return fail(
            id,
            format!("a 64k-pages kernel{asked} exists only on aarch64"),
        );
    }
    // Where the machine-config operator rebuilds the layered image, its build installs the
    // variant from the extensions image (Containerfile.on-cluster-build-template).
    let by = if rebuilt_by_mco(&i.booted, i.mover) {
        "; the machine-config operator's on-cluster build installs it from there"
    } else if provided.from_machine_config {
        "; the machine-config daemon installs it from there"
    } else {
        ""
    };
    let Some(Ok(ext)) = &i.extensions else {
        return fail(
            id,
            format!(
                "the {} kernel{asked} must come from the target's extensions image, which is missing or unreadable{by}",
                want.as_str()
            ),
        );
    };
    let target = target_major(&i.desired, &i.os_image);
    let found = variant_rpms(ext, provided.kernel);
    let missing: Vec<&str> = provided
        .kernel
        .iter()
        .copied()
        .filter(|p| !found.iter().any(|r| names_package(r, p)))
        .collect();
    if !missing.is_empty() {
        return fail(
            id,
            format!(
                "the extensions image lacks {} for the {} kernel{asked}{by}",
                missing.join(", "),
                want.as_str()
            ),
        );
    }
    let wrong: Vec<&str> = found
        .iter()
        .copied()
        .filter(|r| el_major(r) != target)
        .collect();
    if !wrong.is_empty() {
        return fail(
            id,
            format!(
                "the extensions image's {} packages are not built for the target major: {}{by}",
                want.as_str(),
                wrong.join(", ")
            ),
        );
    }
    pass(
        id,
        format!("{} kernel: {}", want.as_str(), found.join(", ")),
    )
}

/// A variant kernel that comes from the booted image: the target image must be of the same
/// variant, as its `ostree.linux` label (the kernel release ostree-ext copies from the commit:
/// bootc-dev/bootc:crates/ostree-ext/src/container/encapsulate.rs) shows. A base stream image
/// carries the default kernel and is refused: it would silently drop the variant.
fn kernel_from_image(i: &Input, variant: KernelVariant) -> CheckResult {
    let id = CheckId::KernelVariant;
    let what = format!(
        "the node's {} kernel comes from the booted image (no package override)",
        variant.as_str()
    );
    match &i.os_image {
        Ok(info) => match (&info.kernel_release, &info.layered_from) {
            (Some(r), _) if r.ends_with(variant.release_suffix()) => pass(
                id,
                format!("{what}; the target image's kernel {r} is one too"),
            ),
            // A layered image keeps its base's labels: a kernel swapped in by its build is
            // invisible there, and streamd does not guess it from the layers.
            (Some(r), Some(base)) => fail(
                id,
                format!(
                    "{what}, but the target is a layered image (built from {base}) whose ostree.linux label ({r}) is its base's, so it cannot be shown to carry a {} kernel: build it from the {} variant of the base image",
                    variant.as_str(),
                    variant.as_str()
                ),
            ),
            (Some(r), None) => fail(
                id,
                format!(
                    "{what}, but the target image's kernel {r} (ostree.linux) is not {}: request the {} variant of the target image",
                    variant.as_str(),
                    variant.as_str()
                ),
            ),
            (None, _) => fail(
                id,
                format!(
                    "{what}; the target image does not say which kernel it carries (no ostree.linux label), so it cannot be shown to keep it"
                ),
            ),
        },
        Err(_) => fail(
            id,
            format!("{what}; the target image is unreadable, so it cannot be shown to keep it"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::host::facts::Fips;
    use crate::image::registry::LAYERED_FROM;

    /// Each reason kernel-variant, cpu-level and fips refuse for.
    #[test]
    fn refusals_by_table() {
        let mut cases: Vec<(&str, Input)> = Vec::new();
        // A real-time kernel from the booted image, and a target with the default kernel.
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        cases.push(("kernel-variant", c));
        // … or a target that does not say its kernel.
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        if let Ok(o) = &mut c.os_image {
            o.kernel_release = None;
        }
        cases.push(("kernel-variant", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.extensions = Some(Ok(ExtensionsInfo {
            rpms: vec!["usbguard-1.1.3-3.el10.x86_64".into()],
            ..rt_ext(10)
        }));
        cases.push(("kernel-variant", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.extensions = Some(Ok(ExtensionsInfo {
            stream_class: Some("rhel-10".into()),
            ..rt_ext(9)
        }));
        cases.push(("kernel-variant", c));
        let mut c = base();
        c.kernel = Err(FactError::Kernel(Cause::new(
            "overrides and running kernel disagree",
        )));
        cases.push(("kernel-variant", c));
        let mut c = base();
        c.x86_64_level = Some(2);
        cases.push(("cpu-level", c));
        let mut c = base();
        c.fips = Fips::Inconsistent;
        c.fips_sources = crate::host::facts::FipsSources::read(Some("1\n"), "ro fips=0");
        let m = message(&c, "fips");
        assert!(
            m.contains("fips_enabled is 1 and the kernel command line has fips=0"),
            "{m}"
        );
        cases.push(("fips", c));
        assert_refused(cases);
    }

    /// A variant kernel from the image needs the same variant in the target and nothing from
    /// an extensions image; a layered image may move to a layered image.
    #[test]
    fn variants_and_layers_from_the_image_pass_onto_the_same() {
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        if let Ok(o) = &mut c.os_image {
            o.kernel_release = Some("6.12.0-124.8.1.el10_1.x86_64+rt".into());
        }
        assert_eq!(failed(&c), Vec::<&str>::new());
        let mut c = base();
        c.booted.image_labels.insert(
            LAYERED_FROM.into(),
            "quay.io/openshift/rhcos@sha256:9".into(),
        );
        if let Ok(o) = &mut c.os_image {
            o.layered_from = Some("quay.io/openshift/rhcos@sha256:10".into());
        }
        assert_eq!(failed(&c), Vec::<&str>::new());
    }

    #[test]
    fn variants_pass_with_the_right_extensions() {
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.fips = Fips::Enabled;
        c.booted.requested_packages = vec!["usbguard".into()];
        c.booted.requested_local_packages =
            vec!["kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64".into()];
        c.extensions = Some(Ok(rt_ext(10)));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    }

    /// A real-time node whose kernel comes from its image, asked for a layered target: the
    /// label is the base's, so only a layered image built from the real-time variant passes.
    #[test]
    fn a_layered_target_keeps_a_variant_only_when_built_from_the_variant() {
        let layered_target = |release: &str| {
            let mut c = base();
            c.kernel = Ok(KernelVariant::Realtime);
            if let Ok(o) = &mut c.os_image {
                o.layered_from = Some("quay.io/openshift/rhcos@sha256:10".into());
                o.kernel_release = Some(release.into());
            }
            c
        };
        let c = layered_target("6.12.0-124.8.1.el10_1.x86_64");
        assert_eq!(failed(&c), vec!["kernel-variant"], "{:#?}", run(&c));
        let r = run(&c);
        let k = result(&r, "kernel-variant");
        assert!(
            k.message.contains("is its base's")
                && k.message.contains("build it from the realtime variant"),
            "{}",
            k.message
        );
        let c = layered_target("6.12.0-124.8.1.el10_1.x86_64+rt");
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    }

    /// An on-cluster-layered real-time node (kernel from the image, no override): the machine-
    /// config operator's build swaps the kernel from the target stream's extensions image, so
    /// that image must provide kernel-rt for the target major, as for an override-carried one.
    #[test]
    fn a_layered_realtime_node_needs_kernel_rt_in_the_extensions_image_for_the_mco() {
        let rt_ocl = |ext: Option<ExtensionsInfo>| {
            let mut c = base();
            ocl(&mut c);
            c.mover = Mover::MachineConfigOperator;
            c.kernel = Ok(KernelVariant::Realtime);
            c.extensions = ext.map(Ok);
            c
        };
        let c = rt_ocl(Some(rt_ext(10)));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
        // Without kernel-rt in the extensions image.
        let c = rt_ocl(Some(ExtensionsInfo {
            rpms: vec!["usbguard-1.1.3-3.el10.x86_64".into()],
            ..rt_ext(10)
        }));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let r = run(&c);
        let k = result(&r, "kernel-variant");
        assert!(
            k.message.contains("lacks kernel-rt-core")
                && k.message.contains("machine-config operator"),
            "{}",
            k.message
        );
        // kernel-rt built for the booted major only.
        let c = rt_ocl(Some(ExtensionsInfo {
            stream_class: Some("rhel-10".into()),
            ..rt_ext(9)
        }));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        // No extensions image at all: the build would keep the base's default kernel.
        let c = rt_ocl(None);
        assert_eq!(failed(&c), vec!["extensions-image", "kernel-variant"]);
        let r = run(&c);
        let e = result(&r, "extensions-image");
        assert!(
            e.message.contains("osExtensionsImage") && !e.message.contains("desired-"),
            "{}",
            e.message
        );
        // A request (streamd's own move) for the base image is still refused.
        let mut c = rt_ocl(Some(rt_ext(10)));
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image", "kernel-variant"]);
    }

    /// Where no layered image is rebuilt, the machine-config operator's move is judged as
    /// streamd's: a variant image's real-time kernel still needs a real-time target image.
    #[test]
    fn a_variant_image_node_is_judged_the_same_for_the_mco() {
        let mut c = base();
        c.mover = Mover::MachineConfigOperator;
        c.kernel = Ok(KernelVariant::Realtime);
        c.extensions = Some(Ok(rt_ext(10)));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["kernel-variant"]);
    }

    /// spec.kernelType realtime on a node running the default kernel: the on-cluster build
    /// installs GetPackagesForSupportedKernelType's list, kernel-rt-kvm included; the daemon's
    /// own switchKernel (no on-cluster build) installs no kernel-rt-kvm.
    #[test]
    fn the_mco_move_needs_the_kernel_type_the_applied_machine_config_asks_for() {
        let realtime = r#"{"spec":{"kernelType":"realtime"}}"#;
        let c = ocl_mc(realtime, &RT);
        assert_eq!(failed(&c), vec!["kernel-variant"], "{:#?}", run(&c));
        let m = &message(&c, "kernel-variant");
        assert!(
            m.contains("lacks kernel-rt-kvm for the realtime kernel the MachineConfig's spec.kernelType asks for")
                && m.contains("on-cluster build"),
            "{m}"
        );
        assert_eq!(failed(&ocl_mc(realtime, &RT_BUILD)), Vec::<&str>::new());
        // The daemon's own switchKernel (no on-cluster build) installs no kernel-rt-kvm.
        let mut c = ocl_mc(realtime, &RT);
        c.booted.image_labels.clear();
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
        c.extensions = Some(Ok(ext_with(&["usbguard"])));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
    }

    /// spec.kernelType default on a node whose real-time kernel the daemon layered from the
    /// extensions repository (`switchKernel`: override remove, --install): the revert before
    /// the OS update uninstalls it and the operator installs no kernel, so none is needed from
    /// the image.
    #[test]
    fn a_kernel_the_mcd_layered_is_reverted_for_a_default_kernel_type() {
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.booted.requested_packages = std::mem::take(&mut c.booted.requested_local_packages);
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied("{}");
        c.extensions = Some(Ok(ext_with(&[])));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
        c.machine_config = None;
        assert_eq!(
            failed(&c),
            vec!["kernel-variant"],
            "unknown: read off the node"
        );
    }

    /// As local RPMs (streamd's own carry) the daemon's revert leaves a kernel: the el9 kernel
    /// would stay in the origin through the move, and a switch to realtime meets the removals
    /// the revert left (the issue's "Override already exists").
    #[test]
    fn a_kernel_carried_as_local_rpms_stays_through_the_mco_move() {
        let realtime = r#"{"spec":{"kernelType":"realtime"}}"#;
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied("{}");
        c.extensions = Some(Ok(ext_with(&[])));
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", run(&c));
        let m = &message(&c, "layered-packages");
        assert!(
            m.starts_with("local RPMs stay in the origin as built")
                && m.contains("(el10)")
                && m.ends_with("kernel-rt-modules-extra-5.14.0-570.60.1.el9_6.x86_64"),
            "{m}"
        );
        // The MachineConfig asks for realtime: the daemon's override remove meets the
        // removals its revert left (the issue's "Override already exists").
        c.machine_config = applied(realtime);
        c.extensions = Some(Ok(ext_with(&RT_BUILD)));
        assert_eq!(
            failed(&c),
            vec!["kernel-variant", "layered-packages"],
            "{:#?}",
            run(&c)
        );
        let m = &message(&c, "kernel-variant");
        assert!(
            m.starts_with("the machine-config daemon's switch to the realtime kernel would fail (Override already exists)")
                && m.ends_with("before the move: kernel, kernel-core, kernel-modules, kernel-modules-core, kernel-modules-extra"),
            "{m}"
        );
        // Its own layering from the repository is reverted first: nothing to fail.
        c.booted.requested_packages = std::mem::take(&mut c.booted.requested_local_packages);
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    }

    /// What the operator itself rejects is refused with the MachineConfig's field; an
    /// unreadable MachineConfig leaves what the operator installs unknown.
    #[test]
    fn an_applied_machine_config_the_operator_rejects_is_refused() {
        let mc = |json: &str| ocl_mc(json, &["usbguard"]);
        let c = mc(r#"{"spec":{"kernelType":"rt"}}"#);
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let m = message(&c, "kernel-variant");
        assert!(m.contains(r#"spec.kernelType "rt" is none of"#), "{m}");
        let c = mc(r#"{"spec":{"extensions":["usbguard","bogus"]}}"#);
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(m.contains(r#"does not support: "bogus""#), "{m}");
        let c = mc(r#"{"spec":{"kernelType":"64k-pages"}}"#);
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let m = message(&c, "kernel-variant");
        assert!(m.contains("exists only on aarch64"), "{m}");
        let mut c = mc("{}");
        c.machine_config = Some(Err(FactError::MachineConfig(Cause::new(
            "/etc/machine-config-daemon/currentconfig: not JSON",
        ))));
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(m.starts_with("cannot read the MachineConfig"), "{m}");
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"], "streamd's move ignores it");
    }
}
