//! Property tests of the kernel variant check and the preflight package-name parsing.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;

use streamd::agent::preflight::stream_major;
use streamd::backend::Deployment;
use streamd::backend::kernel::{KernelVariant, checked_variant};
use streamd::image::rpm::{el_major, names_package, package_name};

use super::{arch, config, evr, one_line, pkg_name};

fn has_el_tag(s: &str) -> bool {
    s.split(['.', '-', '_', '+']).any(|p| {
        p.strip_prefix("el")
            .is_some_and(|d| d.parse::<u32>().is_ok())
    })
}

fn deployment_with(pkgs: &[String], local: &[String], repl: &[String]) -> Deployment {
    Deployment {
        requested_packages: pkgs.to_vec(),
        requested_local_packages: local.to_vec(),
        requested_base_local_replacements: repl.to_vec(),
        ..Deployment::default()
    }
}

/// Specs for the variant properties, with the variant each one makes the deployment.
const VARIANT_SPECS: [(&str, Option<KernelVariant>); 10] = [
    ("kernel-rt-core", Some(KernelVariant::Realtime)),
    (
        "kernel-rt-core-5.14.0-570.el9_6.x86_64",
        Some(KernelVariant::Realtime),
    ),
    ("kernel-rt-core-debuginfo", None),
    ("kernel-rt-core-debuginfo-5.14.0-1.el9.x86_64", None),
    ("kernel-rt-modules-5.14.0-1.el9.x86_64", None),
    ("kernel-64k-core", Some(KernelVariant::SixtyFourK)),
    (
        "kernel-64k-core-6.12.0-55.el10.aarch64",
        Some(KernelVariant::SixtyFourK),
    ),
    ("kernel-64k-core-debuginfo", None),
    ("usbguard-1.1.3-3.el10.x86_64", None),
    ("usbguard", None),
];

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn names_package_arbitrary(spec in any::<String>(), name in any::<String>()) {
        if names_package(&spec, &name) {
            prop_assert!(spec.starts_with(&name));
        }
    }

    #[test]
    fn names_package_matches_name_and_nevra(name in pkg_name(), evr in evr(), suffix in "[a-z][a-z0-9]{0,8}") {
        prop_assert!(names_package(&name, &name));
        let nevra = format!("{name}-{evr}");
        prop_assert!(names_package(&nevra, &name), "{} does not name {}", nevra, name);
        // `-debuginfo`, `-devel`: a different package.
        let sub = format!("{name}-{suffix}");
        prop_assert!(!names_package(&sub, &name), "{} names {}", sub, name);
        prop_assert!(!names_package(&format!("{sub}-{evr}"), &name), "{}-{} names {}", sub, evr, name);
    }

    #[test]
    fn names_package_never_names_another_package(a in pkg_name(), b in pkg_name(), evr in evr()) {
        prop_assume!(a != b);
        let nevra = format!("{b}-{evr}");
        prop_assert!(!names_package(&nevra, &a), "{} names {}", nevra, a);
    }

    #[test]
    fn package_name_of_nevra_is_the_name(name in pkg_name(), evr in evr()) {
        let nevra = format!("{name}-{evr}");
        prop_assert_eq!(package_name(&nevra), name.as_str());
    }

    #[test]
    fn package_name_of_a_plain_name_is_the_name(name in pkg_name()) {
        prop_assert_eq!(package_name(&name), name.as_str());
    }

    #[test]
    fn preflight_name_parsers_never_panic(s in any::<String>()) {
        let _ = package_name(&s);
        let _ = el_major(&s);
        let _ = stream_major(&s);
        // The name is the spec itself or its leading part.
        prop_assert!(s.starts_with(package_name(&s)));
    }

    #[test]
    fn el_major_reads_the_dist_tag(
        name in pkg_name().prop_filter("no el<N> component", |n| !has_el_tag(n)),
        v in "[0-9]{1,2}(\\.[0-9]{1,3}){0,2}",
        r in "[0-9]{1,4}(\\.[0-9]{1,3})?",
        n in any::<u32>(),
        minor in option::of(0u8..10),
        arch in arch(),
        kernel_suffix in select(vec!["", "+rt", "+64k", "+debug"]),
    ) {
        let minor = minor.map(|m| format!("_{m}")).unwrap_or_default();
        let release = format!("{v}-{r}.el{n}{minor}.{arch}{kernel_suffix}");
        prop_assert_eq!(el_major(&release), Some(n), "{}", release);
        let nevra = format!("{name}-{v}-{r}.el{n}{minor}.{arch}");
        prop_assert_eq!(el_major(&nevra), Some(n), "{}", nevra);
        let untagged = format!("{name}-{v}-{r}.fc41.{arch}");
        prop_assert_eq!(el_major(&untagged), None, "{}", untagged);
    }

    #[test]
    fn stream_major_reads_the_last_component(family in "[a-z]{1,8}(-[a-z]{1,8}){0,2}", n in any::<u32>(), m in any::<u16>()) {
        prop_assert_eq!(stream_major(&format!("{family}-{n}")), Some(n));
        prop_assert_eq!(stream_major(&format!("{family}-{n}.{m}")), Some(n));
        prop_assert_eq!(stream_major(&family), None);
    }

    #[test]
    fn checked_variant_agrees_with_overrides_and_running_kernel(
        pkgs in vec(select(VARIANT_SPECS.to_vec()), 0..3),
        local in vec(select(VARIANT_SPECS.to_vec()), 0..2),
        repl in vec(select(VARIANT_SPECS.to_vec()), 0..2),
        base in "[0-9]\\.[0-9]{1,2}\\.[0-9]-[0-9]{1,3}\\.el(9|10)(_[0-9])?\\.(x86_64|aarch64)",
        suffix in select(vec!["", "+rt", "+64k", "+debug", "+rt\n", " "]),
        sys in option::of(select(vec!["1", "1\n", "0", "", "2"])),
    ) {
        let specs = |v: &[(&str, Option<KernelVariant>)]| v.iter().map(|(s, _)| s.to_string()).collect::<Vec<_>>();
        let dep = deployment_with(&specs(&pkgs), &specs(&local), &specs(&repl));
        let all: Vec<Option<KernelVariant>> = pkgs.iter().chain(&local).chain(&repl).map(|(_, v)| *v).collect();
        let from_overrides = if all.contains(&Some(KernelVariant::Realtime)) {
            KernelVariant::Realtime
        } else if all.contains(&Some(KernelVariant::SixtyFourK)) {
            KernelVariant::SixtyFourK
        } else {
            KernelVariant::Default
        };
        let release = format!("{base}{suffix}");
        let r = release.trim();
        let running = if r.ends_with("+rt") || sys.is_some_and(|s| s.trim() == "1") {
            KernelVariant::Realtime
        } else if r.ends_with("+64k") {
            KernelVariant::SixtyFourK
        } else {
            KernelVariant::Default
        };
        match checked_variant(&dep, &release, sys).map_err(|e| e.to_string()) {
            Ok(v) => {
                // Without variant overrides a running variant comes from the image.
                prop_assert!(v == from_overrides || from_overrides == KernelVariant::Default, "{:?}", v);
                prop_assert_eq!(v, running);
            }
            Err(msg) => {
                prop_assert!(from_overrides != running && from_overrides != KernelVariant::Default, "{}", msg);
                prop_assert!(one_line(&msg), "{:?}", msg);
                prop_assert!(msg.contains(from_overrides.as_str()) && msg.contains(running.as_str()), "{}", msg);
            }
        }
    }

    #[test]
    fn checked_variant_arbitrary_never_panics(
        pkgs in vec(any::<String>(), 0..3),
        release in any::<String>(),
        sys in option::of(any::<String>()),
    ) {
        let dep = deployment_with(&pkgs, &[], &[]);
        if let Err(msg) = checked_variant(&dep, &release, sys.as_deref()).map_err(|e| e.to_string()) {
            prop_assert!(one_line(&msg), "{:?}", msg);
        }
    }
}
