//! The machine-config operator's move judged by the tables of the release that rendered the
//! node's MachineConfig (`crate::host::facts::mco_release`), and the packages the stream's
//! own extensions image ships whatever their dist tag.

use super::fixtures::*;

/// A classic (not on-cluster-layered) node booted on rhel-9, judged for the machine-config
/// operator's move with the MachineConfig `spec` rendered by `release` (`None`: without the
/// annotation) and a rhel-10 extensions image holding `ext` (el10 builds).
fn mco(release: Option<&str>, spec: &str, ext: &[&str]) -> Input {
    let annotations = release.map_or_else(String::new, |r| {
        format!(
            r#","annotations":{{"machineconfiguration.openshift.io/release-image-version":"{r}"}}"#
        )
    });
    let json =
        format!(r#"{{"metadata":{{"name":"rendered-worker-1"{annotations}}},"spec":{spec}}}"#);
    let mut c = base();
    c.mover = Mover::MachineConfigOperator;
    c.machine_config = Some(super::FactError::of_machine_config(
        &crate::host::facts::machineconfig::parse(&json),
    ));
    c.extensions = Some(Ok(ext_with(ext)));
    c
}

const REALTIME: &str = r#"{"kernelType":"realtime"}"#;

/// 4.21's daemon adds kernel-rt-kvm while the node runs an OS that is not EL10, and the
/// rhel-10 extensions image has none: the move would fail. 4.22 and 4.23 never ask for it.
#[test]
fn a_4_21_realtime_node_on_el9_needs_kernel_rt_kvm() {
    let c = mco(Some("4.21.9"), REALTIME, &RT);
    assert_eq!(failed(&c), vec!["kernel-variant"], "{:#?}", run(&c));
    let m = message(&c, "kernel-variant");
    assert!(
        m.contains("lacks kernel-rt-kvm for the realtime kernel")
            && m.contains("by release 4.21's machine-config operator"),
        "{m}"
    );
    assert_eq!(
        failed(&mco(Some("4.21.9"), REALTIME, &RT_BUILD)),
        Vec::<&str>::new()
    );
    // Booted on EL10 already, 4.21's daemon leaves kernel-rt-kvm out.
    let mut c = mco(Some("4.21.9"), REALTIME, &RT);
    c.booted_major = Some(10);
    assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    for release in ["4.22.3", "4.23.0", "5.0.1"] {
        let c = mco(Some(release), REALTIME, &RT);
        assert_eq!(failed(&c), Vec::<&str>::new(), "{release}: {:#?}", run(&c));
    }
}

/// `wasm` is an extension on 4.21 (crun-wasm); 4.22 and 4.23 reject it.
#[test]
fn wasm_is_an_extension_on_4_21_only() {
    let wasm = r#"{"extensions":["wasm"]}"#;
    let c = mco(Some("4.21.9"), wasm, &["usbguard"]);
    assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", run(&c));
    let m = message(&c, "layered-packages");
    assert!(
        m.contains("spec.extensions (wasm) needs packages")
            && m.ends_with("for the target: crun-wasm")
            && !m.contains("rejects"),
        "{m}"
    );
    assert_eq!(
        failed(&mco(Some("4.21.9"), wasm, &["crun-wasm"])),
        Vec::<&str>::new()
    );
    for release in ["4.22.3", "4.23.0"] {
        let c = mco(Some(release), wasm, &["crun-wasm"]);
        assert_eq!(failed(&c), vec!["layered-packages"], "{release}");
        let m = message(&c, "layered-packages");
        assert!(
            m.contains(r#"does not support: "wasm"; it rejects them"#)
                && m.contains(&format!("by release {}'s", &release[..4])),
            "{m}"
        );
    }
}

/// `ipsec` installs openvswitch3.5-ipsec only from 4.23 on.
#[test]
fn ipsec_packages_by_release() {
    let ipsec = r#"{"extensions":["ipsec"]}"#;
    let two = ["NetworkManager-libreswan", "libreswan"];
    for release in ["4.21.9", "4.22.3"] {
        let c = mco(Some(release), ipsec, &two);
        assert_eq!(failed(&c), Vec::<&str>::new(), "{release}: {:#?}", run(&c));
    }
    let c = mco(Some("4.23.0"), ipsec, &two);
    assert_eq!(failed(&c), vec!["layered-packages"]);
    let m = message(&c, "layered-packages");
    assert!(m.ends_with("for the target: openvswitch3.5-ipsec"), "{m}");
}

/// A release streamd has no tables for is judged by the newest's, and the reason says so.
#[test]
fn an_unknown_release_is_judged_by_the_newest_and_says_so() {
    let c = mco(Some("4.20.4"), r#"{"extensions":["ipsec"]}"#, &[]);
    let m = message(&c, "layered-packages");
    assert!(
        m.contains("openvswitch3.5-ipsec")
            && m.ends_with(r#"judged by release 4.23's machine-config operator, the newest streamd knows: the MachineConfig's machineconfiguration.openshift.io/release-image-version "4.20.4" is none it has the operator's tables for"#),
        "{m}"
    );
    let c = mco(None, r#"{"extensions":["wasm"]}"#, &[]);
    let m = message(&c, "layered-packages");
    assert!(
        m.contains("rejects them")
            && m.contains(
                "has no machineconfiguration.openshift.io/release-image-version annotation"
            ),
        "{m}"
    );
}

/// The rhel-10 extensions image carries el9 builds on purpose (kata-containers from the el9
/// `server-ose` repository): the operator installs them from there, so they are provided.
/// Local RPMs of another major are still refused: the daemon's rebase keeps them as built.
#[test]
fn the_streams_own_extensions_are_accepted_whatever_their_dist_tag() {
    let kata = r#"{"extensions":["sandboxed-containers"]}"#;
    let mut c = mco(Some("4.22.3"), kata, &[]);
    let el9_kata = ExtensionsInfo {
        rpms: vec!["kata-containers-3.17.0-3.el9.x86_64".into()],
        ..rt_ext(10)
    };
    c.extensions = Some(Ok(el9_kata.clone()));
    assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    // Packages layered by hand resolve from the same repository.
    c.booted.requested_packages = vec!["kata-containers".into()];
    assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    // Fast Datapath's dist tag parses: an el9fdp local RPM is of el9, refused for rhel-10.
    c.booted.requested_local_packages = vec!["openvswitch3.5-3.5.0-71.el9fdp.x86_64".into()];
    assert_eq!(failed(&c), vec!["layered-packages"]);
    let m = message(&c, "layered-packages");
    assert!(
        m.starts_with("local RPMs stay in the origin as built") && m.contains("(el10)"),
        "{m}"
    );
    c.booted.requested_local_packages = vec!["openvswitch3.5-3.5.0-71.el10fdp.x86_64".into()];
    assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", run(&c));
    // streamd's own move passes the RPMs itself: they must be built for the target.
    let mut c = base();
    c.booted.requested_packages = vec!["kata-containers".into()];
    c.extensions = Some(Ok(el9_kata));
    assert_eq!(failed(&c), vec!["layered-packages"]);
}
