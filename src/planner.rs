//! The planner: a pure function from what the node has and what the cluster asks to what to do.
//!
//! No I/O happens here; the agent gathers an [`Observation`], asks [`decide`], and carries out the
//! [`Decision`]. Every rule is covered by the table tests below.

use std::path::PathBuf;

use crate::hostfacts::KernelVariant;
use crate::hostfacts::kernel::{DEFAULT_KERNEL_PACKAGES, names_package};
use crate::imageref::ImageRef;
use crate::protocol::{Desired, ProtocolError, State};
use crate::rpmostree::Deployment;

/// What the agent knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The validated request (or why it is invalid).
    pub desired: &'a Result<Option<Desired>, ProtocolError>,
    /// The deployments, boot order.
    pub deployments: &'a [Deployment],
}

impl Observation<'_> {
    /// The booted deployment.
    pub fn booted(&self) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.booted)
    }

    /// The staged deployment, if any.
    pub fn staged(&self) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.staged)
    }
}

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
        }
    }

    /// Completes a rebase so one transaction produces the whole target: the booted variant
    /// kernel and layered packages (`carried`, package names) are replaced by the target builds
    /// in `rpms` (extracted from the target's extensions image). A node must never be staged on
    /// the default kernel when it runs a variant, so this is all or nothing.
    pub fn carry(
        mut self,
        booted: &crate::rpmostree::Deployment,
        kernel: KernelVariant,
        carried: &[String],
        rpms: &[PathBuf],
    ) -> Self {
        self.kernel = kernel;
        let replaced = |spec: &str| {
            kernel.packages().iter().any(|p| names_package(spec, p))
                || carried.iter().any(|p| names_package(spec, p))
        };
        self.uninstall = booted
            .requested_packages
            .iter()
            .chain(&booted.requested_local_packages)
            .filter(|p| replaced(p))
            .cloned()
            .collect();
        if kernel != KernelVariant::Default {
            self.override_remove = DEFAULT_KERNEL_PACKAGES
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

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is requested.
    Idle,
    /// The request is invalid or unsafe: report and change nothing.
    Refuse(String),
    /// The booted deployment already runs the desired image.
    Done,
    /// The desired image is already staged; do not stage again.
    AlreadyStaged,
    /// Stage this.
    Stage(StagePlan),
}

impl Decision {
    /// The state to report for decisions that need no transaction.
    pub fn settled_state(&self) -> Option<State> {
        match self {
            Decision::Idle => Some(State::Idle),
            Decision::Refuse(_) => Some(State::Refused),
            Decision::Done => Some(State::Done),
            Decision::AlreadyStaged => Some(State::Staged),
            Decision::Stage(_) => None,
        }
    }
}

/// Decides what to do.
pub fn decide(obs: &Observation<'_>) -> Decision {
    let desired = match obs.desired {
        Err(e) => return Decision::Refuse(e.to_string()),
        Ok(None) => return Decision::Idle,
        Ok(Some(d)) => d,
    };
    let digest = desired.os_image.digest();
    let Some(booted) = obs.booted() else {
        return Decision::Refuse(
            "rpm-ostree reports no booted deployment; refusing to stage on an unknown host".into(),
        );
    };
    if booted.carries_digest(digest) {
        return Decision::Done;
    }
    if obs.staged().is_some_and(|s| s.carries_digest(digest)) {
        return Decision::AlreadyStaged;
    }
    Decision::Stage(StagePlan::rebase(&desired.stream, &desired.os_image, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DESIRED_OS_IMAGE, Inputs};

    const D9: &str = "sha256:9999999999999999999999999999999999999999999999999999999999999999";
    const D10: &str = "sha256:1010101010101010101010101010101010101010101010101010101010101010";
    const DX: &str = "sha256:abababababababababababababababababababababababababababababababab";

    fn dep(digest: &str, booted: bool, staged: bool) -> Deployment {
        Deployment {
            id: format!("rhcos-{digest}.0"),
            osname: "rhcos".into(),
            booted,
            staged,
            container_image_reference: Some(format!(
                "ostree-unverified-registry:quay.io/openshift/rhcos@{digest}"
            )),
            ..Deployment::default()
        }
    }

    fn want(digest: &str) -> Result<Option<Desired>, ProtocolError> {
        Inputs {
            stream: Some("rhel-10".into()),
            os_image: Some(format!("quay.io/openshift/rhcos@{digest}")),
            ..Inputs::default()
        }
        .desired()
    }

    type Case = (
        &'static str,
        Result<Option<Desired>, ProtocolError>,
        Vec<Deployment>,
        Decision,
    );

    #[test]
    fn decisions_by_table() {
        let invalid: Result<Option<Desired>, ProtocolError> = Err(ProtocolError {
            key: DESIRED_OS_IMAGE,
            problem: "bad".into(),
        });
        let stage = |d: &str| {
            let Ok(Some(w)) = want(d) else {
                panic!("valid")
            };
            Decision::Stage(StagePlan::rebase(&w.stream, &w.os_image, false))
        };
        let cases: Vec<Case> = vec![
            (
                "nothing requested",
                Ok(None),
                vec![dep(D9, true, false)],
                Decision::Idle,
            ),
            (
                "invalid request",
                invalid,
                vec![dep(D9, true, false)],
                Decision::Refuse("annotation osstream.openshift.io/desired-os-image: bad".into()),
            ),
            (
                "fresh request",
                want(D10),
                vec![dep(D9, true, false)],
                stage(D10),
            ),
            (
                "booted already",
                want(D10),
                vec![dep(D10, true, false)],
                Decision::Done,
            ),
            (
                "staged already",
                want(D10),
                vec![dep(D10, false, true), dep(D9, true, false)],
                Decision::AlreadyStaged,
            ),
            (
                "other image staged",
                want(D10),
                vec![dep(DX, false, true), dep(D9, true, false)],
                stage(D10),
            ),
        ];
        for (name, desired, deps, expected) in cases {
            let obs = Observation {
                desired: &desired,
                deployments: &deps,
            };
            assert_eq!(decide(&obs), expected, "{name}");
        }
    }

    #[test]
    fn no_booted_deployment_is_refused() {
        let desired = want(D10);
        let deps = vec![dep(D9, false, false)];
        let obs = Observation {
            desired: &desired,
            deployments: &deps,
        };
        assert!(matches!(decide(&obs), Decision::Refuse(r) if r.contains("no booted")));
    }

    #[test]
    fn carry_replaces_old_variant_and_layers() {
        let Ok(Some(w)) = want(D10) else {
            panic!("valid")
        };
        let rt_booted = Deployment {
            requested_base_removals: DEFAULT_KERNEL_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            requested_local_packages: vec![
                "kernel-rt-core-5.14.0-570.el9_6.x86_64".into(),
                "kernel-rt-modules-5.14.0-570.el9_6.x86_64".into(),
                "kernel-rt-modules-extra-5.14.0-570.el9_6.x86_64".into(),
            ],
            requested_packages: vec!["usbguard".into(), "other".into()],
            ..dep(D9, true, false)
        };
        let rpms = vec![
            PathBuf::from("/run/x/usbguard.rpm"),
            PathBuf::from("/run/x/kernel-rt-core.rpm"),
        ];
        let plan = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &rt_booted,
            KernelVariant::Realtime,
            &["usbguard".to_string()],
            &rpms,
        );
        assert_eq!(plan.uninstall.len(), 4, "{:?}", plan.uninstall);
        assert!(!plan.uninstall.contains(&"other".to_string()));
        assert!(
            plan.override_remove.is_empty(),
            "already removed in the origin"
        );
        assert_eq!(
            plan.local_rpms[0],
            PathBuf::from("/run/x/kernel-rt-core.rpm")
        );

        let fresh = Deployment {
            ..dep(D9, true, false)
        };
        let plan = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &fresh,
            KernelVariant::SixtyFourK,
            &[],
            &[],
        );
        assert_eq!(plan.override_remove.len(), 5);
        let plain = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &fresh,
            KernelVariant::Default,
            &[],
            &[],
        );
        assert!(plain.override_remove.is_empty() && plain.uninstall.is_empty());
    }

    #[test]
    fn settled_states() {
        assert_eq!(Decision::Idle.settled_state(), Some(State::Idle));
        assert_eq!(Decision::AlreadyStaged.settled_state(), Some(State::Staged));
        assert_eq!(
            Decision::Refuse(String::new()).settled_state(),
            Some(State::Refused)
        );
    }
}
