//! The status the agent reports (annotations, D-Bus, `STATUS=`), with its one writer.
//!
//! Every change of the reported [`Status`] goes through a method here, so the rules that tie
//! its fields together (progress only while staging, `last-error` kept by a failure and cleared
//! by `Done`, `last-change` only when the state changes) hold in one place. Nothing here does
//! I/O: what a change means for the outside (a log line, an Event, `STATUS=`) is returned, and
//! the agent publishes.

use crate::cluster::protocol::{CheckId, Inputs, Mode, Readiness, State};
use crate::cluster::status::Status;
use std::collections::BTreeMap;

/// The reported status and its one writer.
#[derive(Debug, Clone)]
pub(super) struct Report {
    status: Status,
}

/// What a [`Report::set_state`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Change {
    /// The state or the reason changed (`STATUS=` is sent again).
    pub(super) text: bool,
    /// The state changed (logged, and the state's Event posted).
    pub(super) state: bool,
}

impl Report {
    /// Starts from `status` (the node name and host facts known at start).
    pub(super) fn new(status: Status) -> Self {
        Report { status }
    }

    /// The status as reported now.
    pub(super) fn status(&self) -> &Status {
        &self.status
    }

    /// Sets the state, its reason and the checks that failed; `now` is the wall-clock time in
    /// seconds since the epoch (for `last-change`).
    pub(super) fn set_state(
        &mut self,
        state: State,
        reason: String,
        failed_checks: Vec<CheckId>,
        now: u64,
    ) -> Change {
        let s = &mut self.status;
        let change = Change {
            text: s.state != state || s.reason != reason,
            state: s.state != state,
        };
        if change.state {
            s.last_change = now;
        }
        if state != State::Staging {
            s.progress = None;
        }
        match state {
            State::Degraded | State::Refused => s.last_error = Some(reason.clone()),
            State::Done => s.last_error = None,
            _ => {}
        }
        s.state = state;
        s.reason = reason;
        s.failed_checks = failed_checks;
        change
    }

    /// Says what happens now, in the state the agent is in (progress, a retry's wait).
    pub(super) fn set_reason(&mut self, reason: String) {
        self.status.reason = reason;
    }

    /// The staging transaction's progress in percent (a new staging starts it).
    pub(super) fn set_progress(&mut self, percent: u8) {
        self.status.progress = Some(percent);
    }

    /// Raises the staging's progress to `percent`, never lowers it: after a layered pull's layer
    /// tasks rpm-ostree reports its own percentages from 0 again ("Processing packages", seen on
    /// rpm-ostree v2026.2 run beside the project), which must not read as work undone.
    pub(super) fn raise_progress(&mut self, percent: u8) {
        let now = self.status.progress.unwrap_or(0);
        self.status.progress = Some(now.max(percent));
    }

    /// The request as reported: `inputs`, and `observed` (its hash), when it is acted on.
    pub(super) fn set_desired(&mut self, inputs: &Inputs, observed: Option<String>) {
        let s = &mut self.status;
        s.desired_stream = inputs.stream.clone();
        s.desired_os_image = inputs.os_image.clone();
        s.desired_extensions_image = inputs.extensions_image.clone();
        s.observed_desired = observed;
    }

    /// A request that cannot be resolved: only its stream is reported.
    pub(super) fn set_unresolved(&mut self, stream: Option<String>) {
        let s = &mut self.status;
        s.desired_stream = stream;
        s.desired_os_image = None;
        s.desired_extensions_image = None;
        s.observed_desired = None;
    }

    /// What the deployments show: the booted image and stream, the booted kernel variant, the
    /// staged image.
    pub(super) fn set_deployments(
        &mut self,
        current_os_image: String,
        current_stream: String,
        kernel: Option<crate::backend::KernelVariant>,
        staged_os_image: Option<String>,
    ) {
        let s = &mut self.status;
        s.current_os_image = current_os_image;
        s.current_stream = current_stream;
        if let Some(host) = s.host.as_mut() {
            host.kernel = kernel;
        }
        s.staged_os_image = staged_os_image;
    }

    /// The mode the node is in.
    pub(super) fn set_mode(&mut self, mode: Mode) {
        self.status.mode = mode;
    }

    /// What the readiness checks found (empty: nothing is checked).
    pub(super) fn set_readiness(&mut self, readiness: BTreeMap<String, Readiness>) {
        self.status.readiness = readiness;
    }

    /// Whether `bootloader-update.service` ran this boot, as the readiness checks last found.
    pub(super) fn set_bootloader_updated(&mut self, updated: Option<bool>) {
        if let Some(host) = self.status.host.as_mut() {
            host.bootloader_updated = updated;
        }
    }

    /// Reboots into the request so far.
    pub(super) fn set_attempts(&mut self, attempts: u32) {
        self.status.attempts = attempts;
    }

    /// The reboot request (`token`) and whether `approved` matches it; true when the token
    /// changed.
    pub(super) fn set_reboot_request(
        &mut self,
        token: Option<String>,
        approved: Option<&str>,
    ) -> bool {
        let s = &mut self.status;
        s.reboot_approved = token.is_some() && token.as_deref() == approved;
        let changed = token != s.reboot_requested;
        s.reboot_requested = token;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report::new(Status::default())
    }

    #[test]
    fn a_failure_is_kept_as_last_error_until_done() {
        let mut r = report();
        let c = r.set_state(State::Degraded, "broken".into(), Vec::new(), 7);
        assert_eq!(
            c,
            Change {
                text: true,
                state: true
            }
        );
        assert_eq!(r.status().last_error.as_deref(), Some("broken"));
        assert_eq!(r.status().last_change, 7);
        r.set_state(State::Preflight, "checking".into(), Vec::new(), 8);
        assert_eq!(r.status().last_error.as_deref(), Some("broken"));
        r.set_state(State::Done, String::new(), Vec::new(), 9);
        assert_eq!(r.status().last_error, None);
    }

    #[test]
    fn progress_lives_only_while_staging_and_last_change_only_moves_with_the_state() {
        let mut r = report();
        r.set_state(State::Staging, "staging".into(), Vec::new(), 1);
        r.set_progress(40);
        let c = r.set_state(State::Staging, "staging: 40%".into(), Vec::new(), 2);
        assert_eq!(
            c,
            Change {
                text: true,
                state: false
            }
        );
        assert_eq!((r.status().progress, r.status().last_change), (Some(40), 1));
        // Within one staging a later task's percentages from 0 do not move it back.
        r.raise_progress(85);
        r.raise_progress(3);
        assert_eq!(r.status().progress, Some(85));
        r.raise_progress(100);
        assert_eq!(r.status().progress, Some(100));
        r.set_state(State::Staged, String::new(), Vec::new(), 3);
        assert_eq!(r.status().progress, None);
        // The next staging starts from 0 again.
        r.set_progress(0);
        assert_eq!(r.status().progress, Some(0));
    }

    #[test]
    fn the_reboot_request_says_when_it_changed() {
        let mut r = report();
        assert!(r.set_reboot_request(Some("t1".into()), Some("t1")));
        assert!(r.status().reboot_approved);
        assert!(!r.set_reboot_request(Some("t1".into()), None));
        assert!(!r.status().reboot_approved);
        assert!(r.set_reboot_request(None, None));
    }
}
