//! What the planner answers, and why it refuses.

use crate::backend::StagePlan;
use crate::cluster::protocol::{ProtocolError, State};

/// How to try the same image again after streamd gave up on it for a request (a failed
/// staging or on-disk check, reboots that came up on another deployment): the end of every such
/// reason (issue 23 §2).
pub const TRY_AGAIN: &str =
    "to try the same image again once the cause is fixed, run `streamctl reconcile` on the node";

/// Why the planner refuses a request; its text is the reported reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An input annotation is malformed.
    #[error(transparent)]
    Request(#[from] ProtocolError),
    /// The backend lists no booted deployment.
    #[error("rpm-ostree reports no booted deployment; refusing to stage on an unknown host")]
    NoBootedDeployment,
    /// Every allowed reboot into the request came up on another deployment.
    #[error(
        "the node was rebooted into {image} {attempts} time(s) and came up on another deployment \
         each time; not trying again until the request changes; {TRY_AGAIN}"
    )]
    AttemptsExhausted {
        /// The requested OS image.
        image: String,
        /// Reboots into it so far.
        attempts: u32,
    },
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is requested.
    Idle,
    /// The request is invalid or unsafe: report and change nothing.
    Refuse(Refusal),
    /// The booted deployment runs the desired image.
    Done {
        /// A reboot of streamd's got it there: clear the attempt record, post `Applied`.
        applied: bool,
    },
    /// A finalization was started in an earlier boot, but the node came up on something else:
    /// finalization failed or the node rolled back.
    RolledBack {
        /// Reboots into this request so far.
        attempts: u32,
        /// Whether another attempt is allowed.
        retry: bool,
    },
    /// A staged deployment of streamd's no longer matches the request: remove it first.
    CleanupStale,
    /// A staged deployment of streamd's that was never checked on disk (streamd or rpm-ostreed
    /// restarted before the check ended, the check failed and so did the removal, or rpm-ostree
    /// said the target was already staged): check it before anything else.
    Verify,
    /// Staged and locked; waiting for the cluster to approve `token`.
    AwaitApproval {
        /// The `reboot-requested` token.
        token: String,
    },
    /// Approved (or policy `immediate`): finalize the staged deployment and reboot.
    Reboot {
        /// The staged deployment's manifest digest (`FinalizeDeployment`'s checksum).
        digest: String,
        /// The attempt this reboot is (1-based).
        attempt: u32,
    },
    /// Finalization succeeded in this boot; the reboot is on its way.
    RebootPending,
    /// Staged under policy `never`: the next reboot, by whoever, applies it.
    AlreadyStaged,
    /// Stage this.
    Stage(StagePlan),
}

impl Decision {
    /// The state and reason to report for a decision that needs no action (`None` for one
    /// that acts); `staged` is the staged image the reason names.
    pub fn settled(&self, staged: &str) -> Option<(State, String)> {
        match self {
            Decision::Idle => Some((State::Idle, String::new())),
            Decision::Refuse(refusal) => Some((State::Refused, refusal.to_string())),
            Decision::Done { .. } => Some((State::Done, String::new())),
            // Only a locked stage waits for the approval (the planner removes an unlocked one).
            Decision::AwaitApproval { token } => Some((
                State::Staged,
                format!(
                    "staged {staged} (finalization-locked); waiting for reboot approval: set \
                     reboot-approved to {token}"
                ),
            )),
            Decision::AlreadyStaged => Some((
                State::Staged,
                "staged without a finalization lock (reboot = never): the next reboot applies it"
                    .into(),
            )),
            Decision::RebootPending => Some((
                State::Rebooting,
                "the staged deployment is finalized; waiting for the reboot".into(),
            )),
            Decision::RolledBack { .. }
            | Decision::Verify
            | Decision::CleanupStale
            | Decision::Reboot { .. }
            | Decision::Stage(_) => None,
        }
    }
}
