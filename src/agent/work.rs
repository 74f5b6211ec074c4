//! Long work beside the loop.
//!
//! Reading the deployments (with bootc a `bootc status` unit, up to 120 s), preflight (registry
//! reads), the on-disk check of a staged deployment (the helper, up to 120 s), removing a staged
//! deployment and finalizing (rpm-ostree transactions, `bootc switch`) each run in a task whose
//! result comes back to the loop as an event, as the staging transaction does. Meanwhile the loop
//! keeps taking node updates, patching the status, answering D-Bus and pinging the watchdog, so
//! `WATCHDOG=1` measures the loop, not the network. One piece of work runs at a time; a
//! reconcile asked for meanwhile runs once it is done.

use std::collections::BTreeMap;

use crate::agent::gather::{Prepared, Transient};
use crate::backend::{BackendError, Deployment, StagePlan};
use crate::cluster::protocol::{Desired, Readiness};
use crate::host::attempt::Record;
use crate::host::verify::{Expectation, VerifyError};

/// A preflight's request and what acting on its result needs.
pub(super) struct PreflightRun {
    pub(super) desired: Desired,
    /// A staged deployment streamd did not create.
    pub(super) foreign: Option<Deployment>,
    /// `reboot-approved` when the preflight started.
    pub(super) approved: Option<String>,
    /// Whether the stage will be locked from the start (else it waits for the approval).
    pub(super) locks: bool,
    pub(super) record: Record,
}

/// A staging about to start once a foreign staged deployment is gone.
pub(super) struct StageStart {
    pub(super) plan: StagePlan,
    pub(super) hash: String,
    pub(super) expect: Option<(Expectation, String)>,
    pub(super) record: Record,
}

/// A finalization on its way: what to restore when it fails.
pub(super) struct Applying {
    /// The record before this attempt was written.
    pub(super) record: Record,
    pub(super) digest: String,
    pub(super) attempt: u32,
}

/// A finished readiness run.
pub(super) struct ReadinessRun {
    /// The key of the plan it ran (readiness's `Plan::key`): its results are dropped when the
    /// plan changed meanwhile.
    pub(super) key: String,
    /// The deployments it read (they also update the reported current stream and image).
    pub(super) deployments: Result<Vec<Deployment>, BackendError>,
    pub(super) entries: BTreeMap<String, Readiness>,
    /// Some check could not run and is to be retried soon.
    pub(super) transient: bool,
    /// Whether `bootloader-update.service` ran this boot, as systemd said for the run.
    pub(super) bootloader_updated: Option<bool>,
}

/// How a piece of work ended.
pub(super) enum Outcome {
    Observed(Result<Vec<Deployment>, BackendError>),
    Prepared(Box<PreflightRun>, Result<Prepared, Transient>),
    ForeignRemoved(Box<StageStart>, Result<(), BackendError>),
    /// The checksum of the staged deployment that passed the on-disk check, or why not.
    Verified(Result<String, VerifyFailed>),
    CleanedUp(Box<Record>, Result<(), BackendError>),
    Applied(Box<Applying>, Result<(), BackendError>),
    /// What the readiness checks found.
    Checked(Box<ReadinessRun>),
    /// The bootloader update before finalizing this digest ended.
    BootloaderUpdated(String, Result<(), crate::host::bootloader::BootloaderError>),
}

/// Why the on-disk check of what a transaction staged did not pass.
#[derive(Debug, thiserror::Error)]
pub(super) enum VerifyFailed {
    /// The deployments could not be read after the transaction.
    #[error("reading deployments after staging: {0}")]
    Deployments(#[source] BackendError),
    /// The transaction succeeded but nothing is staged.
    #[error("the transaction succeeded but nothing is staged")]
    NothingStaged,
    /// The helper binary is not where streamd is.
    #[error("locating the verification helper: {0}")]
    Helper(#[source] std::io::Error),
    /// The check failed; the pending deployment was removed.
    #[error("{0}; the pending deployment was removed")]
    Removed(#[source] VerifyError),
    /// The check failed, and so did removing the pending deployment.
    #[error("{failed}; removing the pending deployment failed too: {cleanup}")]
    NotRemoved {
        failed: VerifyError,
        cleanup: BackendError,
    },
}

impl VerifyFailed {
    /// A stable name for logs.
    pub(super) fn label(&self) -> &'static str {
        match self {
            VerifyFailed::Deployments(_) => "verify_deployments",
            VerifyFailed::NothingStaged => "verify_nothing_staged",
            VerifyFailed::Helper(_) => "verify_helper",
            VerifyFailed::Removed(_) => "verify_mismatch",
            VerifyFailed::NotRemoved { .. } => "verify_mismatch_not_removed",
        }
    }
}
