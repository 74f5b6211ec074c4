//! What the planner looks at: the request, the deployments and the reboot handshake's inputs,
//! and which pending deployment is someone else's.

use crate::backend::{BackendKind, Deployment};
use crate::cluster::protocol::{Desired, ProtocolError};
use crate::config::RebootPolicy;
use crate::host::attempt::Record;

/// What the agent knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The validated request (or why it is invalid).
    pub desired: &'a Result<Option<Desired>, ProtocolError>,
    /// The deployments, boot order.
    pub deployments: &'a [Deployment],
    /// The admin allows moving to an older major (`allow-downgrade`).
    pub allow_downgrade: bool,
    /// The backend that stages.
    pub backend: BackendKind,
    /// The reboot side of the request.
    pub lifecycle: Lifecycle<'a>,
}

/// The reboot handshake's inputs.
#[derive(Debug, Clone, Copy)]
pub struct Lifecycle<'a> {
    /// When the staged OS is applied.
    pub policy: RebootPolicy,
    /// Reboots into one request before it is refused.
    pub max_attempts: u32,
    /// This boot's id.
    pub boot_id: &'a str,
    /// What streamd remembers across reboots.
    pub record: &'a Record,
    /// `reboot-approved`, if set.
    pub approved: Option<&'a str>,
    /// Whether a stage for this request is finalization-locked from the moment it exists
    /// (`Backend::locks_for`): on rpm-ostree always; on bootc only from v1.12 and when nothing
    /// else is staged. Without it a stage waits for the approval, as any reboot applies it.
    pub locks: bool,
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

    /// Whether the staged deployment is one streamd created.
    pub fn staged_is_ours(&self) -> bool {
        self.staged()
            .is_some_and(|s| is_ours(s, self.lifecycle.record))
    }

    /// A staged deployment streamd did not create (for the `pending-deployment` check).
    pub fn foreign_staged(&self) -> Option<&Deployment> {
        foreign_staged(self.deployments, self.lifecycle.record, self.backend)
    }
}

/// Whether `staged` is the deployment streamd recorded it was staging.
fn is_ours(staged: &Deployment, record: &Record) -> bool {
    record
        .staged
        .as_ref()
        .is_some_and(|ours| staged.pullspec() == Some(ours.os_image.as_str()))
}

/// The pending deployment among `deployments` if streamd did not create it: a staged one of
/// someone else's, or any written by `ostree admin deploy` (streamd only stages). rpm-ostree
/// would edit its origin instead of the booted one's, so it must go before streamd stages.
/// On bootc a stage of the booted image is not foreign: the next boot runs what runs now,
/// streamd's own cleanup leaves one (bootc cannot remove a stage; the booted image is staged
/// again in its place) and `bootc switch` replaces it.
pub fn foreign_staged<'a>(
    deployments: &'a [Deployment],
    record: &Record,
    backend: BackendKind,
) -> Option<&'a Deployment> {
    let booted = deployments.iter().find(|d| d.booted);
    crate::backend::pending(deployments)
        .filter(|p| !p.staged || !is_ours(p, record))
        .filter(|p| {
            !(backend == BackendKind::Bootc
                && p.staged
                && booted.is_some_and(|b| p.carries_image_of(b)))
        })
}
