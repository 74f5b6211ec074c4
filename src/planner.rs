//! The planner: a pure function from what the node has and what the cluster asks to what to do.
//!
//! No I/O happens here; the agent gathers an [`Observation`], asks [`decide`], and carries out the
//! [`Decision`]. Every rule is covered by the table tests below.

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
    Decision::Stage(StagePlan {
        stream: desired.stream.clone(),
        os_image: desired.os_image.clone(),
        allow_downgrade: false,
    })
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
            Decision::Stage(StagePlan {
                stream: w.stream,
                os_image: w.os_image,
                allow_downgrade: false,
            })
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
    fn settled_states() {
        assert_eq!(Decision::Idle.settled_state(), Some(State::Idle));
        assert_eq!(Decision::AlreadyStaged.settled_state(), Some(State::Staged));
        assert_eq!(
            Decision::Refuse(String::new()).settled_state(),
            Some(State::Refused)
        );
    }
}
