//! Whether the machine-config daemon (MCD) manages this node.
//!
//! On an OpenShift node the MCD owns the OS: it checks after every boot that the booted image is
//! the one its MachineConfig names and degrades the node otherwise, rebases the node back at its
//! next rollout, and runs `rpm-ostree cleanup -p` before applying OS changes (deleting any other
//! stage). streamd therefore never stages or reboots where it finds the MCD (docs/modes.md).
//! The signals, each written only by the MCD or the machine-config server:
//!
//! - node annotations `machineconfiguration.openshift.io/currentConfig` and `desiredConfig`
//!   (openshift/machine-config-operator:pkg/daemon/constants/constants.go
//!   `CurrentMachineConfigAnnotationKey`, `DesiredMachineConfigAnnotationKey`; the MCD sets
//!   `currentConfig` in pkg/daemon/writer.go `SetDone`, the node controller `desiredConfig`);
//! - host files `/etc/machine-config-daemon/currentconfig` (pkg/daemon/daemon.go
//!   `currentConfigPath`, written by `storeCurrentConfigOnDisk`), `/etc/mcd-currentconfig.json`
//!   (`hypershiftCurrentConfigPath`, HyperShift nodes) and
//!   `/etc/ignition-machine-config-encapsulated.json` (constants.go
//!   `MachineConfigEncapsulatedPath`: a node the MCD takes over at first boot,
//!   templates/common/_base/units/machine-config-daemon-firstboot.service.yaml).
//!
//! The host files catch a node whose Node object lost the annotations, or before it has them.

use std::collections::BTreeMap;
use std::fmt;

use super::HostRoot;

/// The MCD's node annotations streamd takes as "the MCD manages this node".
pub const NODE_ANNOTATIONS: [&str; 2] = [
    "machineconfiguration.openshift.io/currentConfig",
    "machineconfiguration.openshift.io/desiredConfig",
];

/// The MCD's host files streamd takes as "the MCD manages this node".
pub const HOST_FILES: [&str; 3] = [
    "/etc/machine-config-daemon/currentconfig",
    "/etc/mcd-currentconfig.json",
    "/etc/ignition-machine-config-encapsulated.json",
];

/// The first signal found that the MCD manages the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McdSignal {
    /// A node annotation (one of [`NODE_ANNOTATIONS`]) is set.
    Annotation(&'static str),
    /// A host file (one of [`HOST_FILES`]) exists.
    HostFile(&'static str),
}

impl fmt::Display for McdSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McdSignal::Annotation(k) => write!(f, "node annotation {k}"),
            McdSignal::HostFile(p) => write!(f, "host file {p}"),
        }
    }
}

/// Looks for the MCD: the node's `annotations` first, then the host files below `root`.
pub fn detect(root: &HostRoot, annotations: &BTreeMap<String, String>) -> Option<McdSignal> {
    NODE_ANNOTATIONS
        .into_iter()
        .find(|k| annotations.get(*k).is_some_and(|v| !v.is_empty()))
        .map(McdSignal::Annotation)
        .or_else(|| {
            HOST_FILES
                .into_iter()
                .find(|p| std::fs::symlink_metadata(root.path(p)).is_ok())
                .map(McdSignal::HostFile)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_then_host_files() {
        let d = testbed::scratch::ScratchDir::new("mcd").expect("scratch dir");
        let root = HostRoot::new(d.path());
        let none = BTreeMap::new();
        assert_eq!(detect(&root, &none), None);
        let empty = BTreeMap::from([(NODE_ANNOTATIONS[0].to_string(), String::new())]);
        assert_eq!(detect(&root, &empty), None, "an empty value is no signal");
        let set = BTreeMap::from([(NODE_ANNOTATIONS[1].to_string(), "rendered-worker-1".into())]);
        assert_eq!(
            detect(&root, &set),
            Some(McdSignal::Annotation(NODE_ANNOTATIONS[1]))
        );
        std::fs::create_dir_all(d.join("etc/machine-config-daemon")).expect("mkdir");
        std::fs::write(d.join("etc/machine-config-daemon/currentconfig"), "{}").expect("write");
        assert_eq!(
            detect(&root, &none),
            Some(McdSignal::HostFile(HOST_FILES[0]))
        );
        assert_eq!(
            detect(&root, &set).map(|s| s.to_string()).as_deref(),
            Some("node annotation machineconfiguration.openshift.io/desiredConfig")
        );
    }
}
