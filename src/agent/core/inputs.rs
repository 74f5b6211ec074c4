//! What the core's events and effects carry beside the core's own types: the Kubernetes Event
//! to post, how a staging transaction or the on-disk check ended, and the facts a finalization,
//! a rollback or a staging hands the core. Plain data, no behaviour but constructors.

use std::time::Instant;

use crate::backend::StagePlan;
use crate::cluster::node::EventType;
use crate::host::attempt::Record;
use crate::host::verify::Expectation;

/// A Kubernetes Event to post on the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Notice {
    pub(in crate::agent) kind: EventType,
    /// The Event's reason (`StagingStarted`, `RolledBack`, …).
    pub(in crate::agent) reason: &'static str,
    pub(in crate::agent) message: String,
}

impl Notice {
    /// A `Normal` Event.
    pub(in crate::agent) fn normal(reason: &'static str, message: String) -> Self {
        Notice {
            kind: EventType::Normal,
            reason,
            message,
        }
    }

    /// A `Warning` Event.
    pub(in crate::agent) fn warning(reason: &'static str, message: String) -> Self {
        Notice {
            kind: EventType::Warning,
            reason,
            message,
        }
    }
}

/// How the staging transaction ended, as far as what comes next is concerned; each failure
/// with its error's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) enum StagingEnd {
    /// It staged the target.
    Staged,
    /// It could not run now: retried on the transient back-off.
    Transient(String),
    /// rpm-ostree refused a rebase onto the refspec the pending deployment has ("Old and new
    /// refs are equal").
    RefsEqual(String),
    /// The fetch broke on the network.
    Network(String),
    /// Any other failure.
    Failed(String),
}

/// The end of a staging transaction, with what acting on it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct StagingEnded {
    pub(in crate::agent) now: Instant,
    /// The request it staged (observed-desired hash).
    pub(in crate::agent) request: String,
    /// That request is still the one wanted (else the result is history).
    pub(in crate::agent) current: bool,
    pub(in crate::agent) end: StagingEnd,
    /// The attempt record as read now (`None`: it could not be read).
    pub(in crate::agent) record: Option<Record>,
    /// What the staged deployment must look like and the digest the request pins: checked on
    /// disk next.
    pub(in crate::agent) expect: Option<(Expectation, String)>,
    /// New stagings of one request after a network failure (`pull-retries`).
    pub(in crate::agent) pull_retries: u32,
}

/// How the on-disk check of a staged deployment ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) enum Verified {
    /// It passed: the staged deployment's checksum, and the attempt record as read then.
    Passed {
        checksum: String,
        record: Box<Record>,
    },
    /// It passed, but the attempt record could not be read to note it: why, as reported.
    Unrecorded(String),
    /// It did not pass: why, and the attempt record as read then (`None`: it could not be
    /// read), where the failure is remembered.
    Failed {
        reason: String,
        record: Option<Box<Record>>,
    },
}

/// A finalization that did not end on the target, with what reporting it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct RolledBack {
    pub(in crate::agent) now: Instant,
    /// The attempt record as the decision read it.
    pub(in crate::agent) record: Record,
    /// This boot, now reported for the attempt.
    pub(in crate::agent) boot_id: String,
    /// What happened (the attempt, the image, the boot, the finalization's journal).
    pub(in crate::agent) reason: String,
    /// The attempts bound allows another.
    pub(in crate::agent) retry: bool,
}

/// A finalization about to be asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct Finalizing {
    /// The request (observed-desired hash).
    pub(in crate::agent) request: String,
    /// The attempt record before this attempt (restored when finalization is refused).
    pub(in crate::agent) before: Record,
    /// The record with this attempt in it.
    pub(in crate::agent) attempted: Record,
    /// The staged digest to finalize.
    pub(in crate::agent) digest: String,
    /// This attempt's number (from 1).
    pub(in crate::agent) attempt: u32,
    /// What is reported while it runs.
    pub(in crate::agent) reason: String,
}

/// A plan that passed preflight, about to be staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::agent) struct StagingReady {
    /// The request (observed-desired hash).
    pub(in crate::agent) request: String,
    pub(in crate::agent) plan: StagePlan,
    /// What the staged deployment must look like, and the digest the request pins.
    pub(in crate::agent) expect: Option<(Expectation, String)>,
    /// The attempt record naming this staging.
    pub(in crate::agent) record: Record,
}

/// What the loop does when the attempt record cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::agent) enum OnSaveError {
    /// Log it with this message and go on: what the record holds is then remembered until the
    /// next restart only.
    Log(&'static str),
    /// Report `Degraded` with the error and drop the effects after it: nothing may act on a
    /// record that was not written.
    Degrade,
}
