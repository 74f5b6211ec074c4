//! The reboot handshake: the request and its approval, the attempt record, finalization and
//! what the next boot shows.

use tracing::{info, warn};

use super::Agent;
use super::core::{Event, Finalizing, MIN_BACKOFF, Retry, RolledBack, Step};
use super::work::{Applying, Outcome};
use crate::agent::planner::Decision;
use crate::backend::BackendError;
use crate::backend::rpmostree::RpmOstreeError;
use crate::cluster::protocol::State;
use crate::config::RebootPolicy;
use crate::host::attempt::{Attempt, Record};

impl Agent {
    /// The target booted: check what had to come along, then report `Done`.
    pub(super) async fn done(&mut self, applied: bool, record: Record) {
        // The target booted; what the node was (variant kernel, FIPS) must have come
        // along. A mismatch is reported and nothing is done: never a reboot loop.
        let checked = record.attempt.as_ref().filter(|_| applied).map(|a| {
            self.report
                .status()
                .host
                .as_ref()
                .map_or(Ok(()), |facts| crate::host::attempt::after_boot(a, facts))
        });
        if let Some(Err(problem)) = checked {
            warn!(%problem, "the new boot does not match the node before the update");
            self.set_state(
                State::Degraded,
                format!(
                    "booted {} but {problem}; not rebooting again: inspect the node",
                    self.report.status().current_os_image
                ),
            )
            .await;
            return;
        }
        if applied {
            self.report.set_attempts(0);
            let image = self.report.status().current_os_image.clone();
            let effects = self.core.handle(Event::Booted {
                record: Box::new(record),
                image,
            });
            self.execute(effects).await;
        } else {
            self.set_state(State::Done, String::new()).await;
        }
    }

    /// Publishes the reboot request the decision implies; posts `RebootRequested` once per token.
    /// `locks`: whether a stage for this request is locked from the start (the planner's).
    pub(super) async fn observe_handshake(
        &mut self,
        decision: &Decision,
        desired: Option<&crate::cluster::protocol::Desired>,
        record: &Record,
        approved: Option<&str>,
        locks: bool,
    ) {
        self.report.set_attempts(
            record
                .attempt
                .as_ref()
                .filter(|a| desired.is_some_and(|d| d.observed_hash() == a.request))
                .map_or(0, |a| a.attempts),
        );
        let token = match (decision, desired, self.reboot.policy) {
            (
                Decision::AwaitApproval { .. } | Decision::Reboot { .. } | Decision::RebootPending,
                Some(d),
                RebootPolicy::OnApproval,
            ) => Some(crate::agent::planner::reboot_token(
                d,
                &self.boot_id,
                record,
            )),
            // Without a lock the request is made after preflight, before staging (see Stage).
            (Decision::Stage(_), _, _) if !locks => return,
            _ => None,
        };
        self.request_reboot(token, approved).await;
    }

    /// Publishes `token` as `reboot-requested` (posting `RebootRequested` when it is new).
    pub(super) async fn request_reboot(&mut self, token: Option<String>, approved: Option<&str>) {
        let changed = self.report.set_reboot_request(token.clone(), approved);
        if let Some(t) = token.as_ref().filter(|_| changed) {
            info!(token = %t, "requesting reboot approval");
        }
        let effects = self.core.handle(Event::RebootToken { token, changed });
        // Boxed: executing an effect can ask for a reboot again.
        Box::pin(self.execute(effects)).await;
    }

    /// Removes a staged deployment of streamd's that no longer matches the request (in a task:
    /// an rpm-ostree transaction or a bootc unit).
    pub(super) async fn cleanup_stale(&mut self, record: Record) {
        info!(
            staged = self
                .report
                .status()
                .staged_os_image
                .as_deref()
                .unwrap_or_default(),
            "removing a staged deployment that no longer matches the request"
        );
        let backend = self.backend.clone();
        let booted = self.report.status().current_os_image.clone();
        self.start(Step::Cleanup { request: None }, async move {
            let result = backend.cleanup_pending(&booted).await;
            Outcome::CleanedUp(Box::new(record), result)
        });
    }

    /// Carries on once a stale staged deployment is removed (or could not be).
    pub(super) async fn on_cleaned_up(&mut self, record: Record, result: Result<(), BackendError>) {
        match result {
            Ok(()) => {
                let effects = self.core.handle(Event::StaleRemoved {
                    now: std::time::Instant::now(),
                    record: Box::new(record),
                });
                self.execute(effects).await;
            }
            Err(e) => {
                self.transient_failure(format!("removing the stale staged deployment: {e}"))
                    .await;
            }
        }
    }

    /// Reports a finalization that did not end on the target and decides whether to retry.
    pub(super) async fn rolled_back(&mut self, record: Record, attempts: u32, retry: bool) {
        let image = self
            .report
            .status()
            .desired_os_image
            .clone()
            .unwrap_or_default();
        let booted = self.report.status().current_os_image.clone();
        let journal = crate::host::facts::finalize_failure(&self.host).await;
        let mut reason = format!(
            "rebooted to apply {image} (attempt {attempts} of {}) but the node came up on {booted}: finalization failed or the node rolled back",
            self.reboot.max_attempts
        );
        if let Some(j) = journal {
            reason.push_str(&format!("; ostree-finalize-staged: {j}"));
        }
        let effects = self.core.handle(Event::RolledBack(Box::new(RolledBack {
            now: std::time::Instant::now(),
            record,
            boot_id: self.boot_id.clone(),
            reason,
            retry,
        })));
        self.execute(effects).await;
    }

    /// Whether finalizing the staged deployment must wait for a bootloader update: Secure Boot
    /// on (or unknown) on x86_64/aarch64 and a move to another major (or one of unknown major),
    /// as the machine-config daemon decides (openshift/machine-config-operator:
    /// pkg/daemon/bootupd.go `runBootloaderUpdate`, architectures and `isSecureBootEnabled`).
    fn bootloader_update_needed(&self, record: &Record) -> bool {
        let arch = self.report.status().host.as_ref().map(|h| h.arch.as_str());
        if !matches!(arch, Some("x86_64" | "aarch64")) {
            return false;
        }
        match crate::host::facts::secureboot::secure_boot(&self.host) {
            Ok(false) => return false,
            Ok(true) => {}
            Err(e) => warn!(error = %e, "cannot read the Secure Boot state; taking it as on"),
        }
        let booted = self.host.os_release().ok().and_then(|r| r.major());
        let target = record
            .staged
            .as_ref()
            .and_then(|s| s.expect.as_ref())
            .map(|e| e.target_major);
        !matches!((booted, target), (Some(b), Some(t)) if b == t)
    }

    /// Updates the bootloader through systemd (in a task) before `digest` is finalized; the
    /// decision after it finalizes, or the failure is reported and not retried until the
    /// request, the approval or `streamctl reconcile` asks again.
    fn update_bootloader(&mut self, digest: String) {
        let conn = self.backend.connection().clone();
        self.start(Step::Bootloader, async move {
            let result = crate::host::bootloader::update(&conn).await;
            Outcome::BootloaderUpdated(digest, result)
        });
    }

    /// Carries on after the bootloader update.
    pub(super) async fn on_bootloader_updated(
        &mut self,
        digest: String,
        result: Result<(), crate::host::bootloader::BootloaderError>,
    ) {
        match result {
            Ok(()) => {
                self.bootloader = Some((digest, None));
                self.reconcile().await;
            }
            Err(e) => {
                let reason = format!(
                    "not applying the staged deployment: the bootloader update before a move to another RHEL major failed: {e}; with Secure Boot on, the old shim may not trust the new kernel's signing keys"
                );
                warn!(%reason, "bootloader update failed");
                self.bootloader = Some((digest, Some(reason.clone())));
                self.set_state(State::Degraded, reason).await;
            }
        }
    }

    /// Records the attempt, reports `Rebooting` and asks rpm-ostreed to finalize and reboot.
    #[tracing::instrument(skip_all, fields(request = %desired.observed_hash(), attempt = attempt))]
    pub(super) async fn finalize(
        &mut self,
        desired: &crate::cluster::protocol::Desired,
        record: Record,
        digest: String,
        attempt: u32,
    ) {
        if self.bootloader_update_needed(&record) {
            match &self.bootloader {
                Some((d, None)) if *d == digest => {}
                Some((d, Some(reason))) if *d == digest => {
                    let reason = reason.clone();
                    self.set_state(State::Degraded, reason).await;
                    return;
                }
                _ => {
                    self.set_state(
                        State::Rebooting,
                        format!(
                            "updating the bootloader ({}) before applying {}: Secure Boot is on and the move changes the RHEL major",
                            crate::host::bootloader::UNIT,
                            desired.os_image
                        ),
                    )
                    .await;
                    self.update_bootloader(digest);
                    return;
                }
            }
        }
        let mut attempted = record.clone();
        let facts = self.report.status().host.as_ref();
        attempted.attempt = Some(Attempt {
            request: desired.observed_hash(),
            os_image: desired.os_image.to_string(),
            digest: digest.clone(),
            boot_id: self.boot_id.clone(),
            attempts: attempt,
            reported_boot: None,
            kernel: facts.and_then(|f| f.kernel),
            fips: facts.and_then(|f| f.fips.enabled()),
        });
        let reason = format!(
            "applying {} (attempt {attempt} of {}): finalizing the staged deployment and rebooting",
            desired.os_image, self.reboot.max_attempts
        );
        let effects = self.core.handle(Event::Finalizing(Box::new(Finalizing {
            request: desired.observed_hash(),
            before: record,
            attempted,
            digest,
            attempt,
            reason,
        })));
        self.execute(effects).await;
    }

    /// Asks for finalization and the reboot: FinalizeDeployment, or `bootc switch` in a unit
    /// (up to an hour), in a task; [`Self::on_applied`] acts on its end.
    pub(super) fn start_apply(&mut self, request: String, applying: Applying) {
        let backend = self.backend.clone();
        self.start(Step::Apply { request }, async move {
            let result = backend.apply(&applying.digest).await;
            Outcome::Applied(Box::new(applying), result)
        });
    }

    /// Carries on once finalization was asked for (or refused).
    pub(super) async fn on_applied(
        &mut self,
        applying: Applying,
        result: Result<(), BackendError>,
    ) {
        let Applying {
            record,
            digest,
            attempt,
        } = applying;
        match result {
            Ok(()) => {
                info!(%digest, attempt, "reboot initiated");
                self.core.handle(Event::Recovered(Retry::Finalize));
            }
            Err(e) if e.possibly_applied() => {
                // rpm-ostreed unlocks, says Finished and queues the reboot; the connection can
                // drop in between. Keep the attempt (the after-boot check and the attempts
                // bound) and re-read the deployments: unlocked, the reboot is pending; still
                // locked, the planner finalizes again as this same attempt.
                warn!(error = %e, %digest, attempt, "finalization interrupted; it may have been applied");
                let reason = format!(
                    "applying {} (attempt {attempt} of {}): rpm-ostreed closed the finalization without a result, re-reading the deployments",
                    self.report
                        .status()
                        .desired_os_image
                        .as_deref()
                        .unwrap_or_default(),
                    self.reboot.max_attempts
                );
                self.set_reason(reason).await;
                self.retry_after(MIN_BACKOFF);
            }
            Err(e) => {
                // Nothing was applied: this boot's attempt did not happen. rpm-ostreed
                // finalizes only the deployment it has staged: what is staged now is checked on
                // disk again before anything is approved or finalized.
                let recheck = matches!(
                    e,
                    BackendError::RpmOstree(RpmOstreeError::StagedMismatch(_))
                );
                self.report.set_attempts(attempt.saturating_sub(1));
                let what = match &e {
                    BackendError::RpmOstree(RpmOstreeError::Inhibited(m)) => {
                        format!("the reboot is blocked: {m}")
                    }
                    BackendError::Bootc(
                        b @ crate::backend::bootc::BootcError::Inhibited { .. },
                    ) => b.to_string(),
                    other => format!("applying the staged deployment failed: {other}"),
                };
                let effects = self.core.handle(Event::FinalizeFailed {
                    now: std::time::Instant::now(),
                    record: Box::new(record),
                    recheck,
                    // An inhibitor (transient to bootc's own retries) is a refusal here.
                    transient: e.is_transient()
                        && !matches!(
                            e,
                            BackendError::Bootc(
                                crate::backend::bootc::BootcError::Inhibited { .. }
                            )
                        ),
                    reason: what,
                });
                self.execute(effects).await;
            }
        }
    }
}
