//! The image policy in the loop (`crate::cluster::policy`): a request is judged before any
//! registry read; a verdict that needs the cluster's OSImageStream waits for it (and has it
//! watched), and a request waiting for it or refused by the policy is judged again when the
//! cluster's streams change.

use tracing::info;

use super::Agent;
use crate::cluster::policy::{self, Verdict, Wait};
use crate::cluster::protocol::{CheckId, Desired, State};

impl Agent {
    /// The image policy's verdict on `desired` on this node, whose booted image is `booted`.
    pub(super) fn judge_images(&self, desired: &Desired, booted: Option<&str>) -> Verdict {
        policy::judge(
            &self.gatherer.images,
            desired,
            booted,
            self.catalog.as_ref(),
        )
    }

    /// The request's verdict needs the cluster's streams (`wait` says why it cannot have them
    /// yet): they are watched, nothing is staged or approved meanwhile, and the node says why.
    pub(super) async fn wait_for_streams(&mut self, wait: Wait) {
        if !self.images_watch {
            info!("the image policy needs the cluster's osimagestream; watching it");
        }
        self.images_watch = true;
        self.images_waiting = true;
        self.request_reboot(None, None).await;
        let state = match wait {
            // The first read is on its way: as resolution waits for it.
            Wait::NotRead => State::Preflight,
            Wait::Unusable(_) => State::Degraded,
        };
        self.set_state(state, wait.to_string()).await;
    }

    /// Has the cluster's streams watched when the image policy needs them to judge one of
    /// `checked` (the readiness checks' requests) on this node.
    pub(super) fn watch_streams_for<'a>(&mut self, mut checked: impl Iterator<Item = &'a Desired>) {
        let booted = Some(self.report.status().current_os_image.as_str()).filter(|b| !b.is_empty());
        if !self.images_watch
            && checked.any(|d| policy::needs_catalog(&self.gatherer.images, d, booted))
        {
            info!("the image policy needs the cluster's osimagestream for a check; watching it");
            self.images_watch = true;
        }
    }

    /// A dry run (`streamctl preflight`) is judged with the cluster's streams as last read: when
    /// the policy may need them, they are watched from now on (a dry run before their first
    /// read says it waits for it).
    pub(super) fn watch_streams_for_dry_runs(&mut self) {
        let images = &self.gatherer.images;
        self.images_watch |= images.allowed_repositories.is_none() || images.resolved_only;
    }

    /// The cluster's streams changed: when the image policy reads them, the readiness checks
    /// run again, and a request waiting for them or refused by the policy is judged again.
    pub(super) async fn rejudge_images(&mut self) {
        if !self.images_watch {
            return;
        }
        self.core.handle(super::core::Event::ReadinessStale);
        let refused = self
            .report
            .status()
            .failed_checks
            .contains(&CheckId::ImagePolicy);
        if std::mem::take(&mut self.images_waiting) || refused {
            self.reconcile().await;
        }
    }
}
