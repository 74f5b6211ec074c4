//! Preflight and staging: the transaction task, its progress and its end, and the on-disk
//! check of what it staged.

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::core::{Event, Retry, StagingEnd, StagingEnded, StagingReady, Step, Verified};
use super::task::{Staging, Task};
use super::work::{Outcome, PreflightRun, StageStart, VerifyFailed};
use super::{Agent, BUSY_BACKOFF, REFS_EQUAL};
use crate::agent::gather::{Holder, Prepared, Purpose, Transient};
use crate::agent::planner::Observation;
use crate::backend::StagePlan;
use crate::backend::rpmostree::{RpmOstreeError, TxnEvent, UpdateDeploymentCall};
use crate::backend::{Backend, BackendError};
use crate::cluster::policy::Verdict;
use crate::cluster::protocol::State;
use crate::config::RebootPolicy;
use crate::host::attempt;

impl Agent {
    /// Starts preflight for `desired` (in a task: it reads registries); [`Self::on_prepared`]
    /// stages it when every check passes (on a backend without a finalization lock: once the
    /// reboot is approved). The image policy judges it first: a refusal reads nothing, and a
    /// verdict that needs the cluster's streams waits for them.
    pub(super) async fn preflight_and_stage(&mut self, obs: &Observation<'_>, base: StagePlan) {
        let (Some(d), Some(booted), Some(facts)) = (
            obs.desired.as_ref().ok().and_then(Option::as_ref),
            obs.booted().cloned(),
            self.report.status().host.clone(),
        ) else {
            return;
        };
        let run = PreflightRun {
            desired: d.clone(),
            foreign: obs.foreign_staged().cloned(),
            approved: obs.lifecycle.approved.map(String::from),
            locks: obs.lifecycle.locks,
            record: obs.lifecycle.record.clone(),
        };
        let allowed = match self.judge_images(d, booted.pullspec()) {
            Verdict::Allowed(why) => why,
            Verdict::Refused(reason) => {
                let refused = Prepared::refused_by_image_policy(reason);
                self.on_prepared(run, Ok(refused)).await;
                return;
            }
            Verdict::Wait(wait) => {
                self.wait_for_streams(wait).await;
                return;
            }
        };
        self.set_state(State::Preflight, "running preflight checks".into())
            .await;
        let gatherer = self.gatherer.clone();
        let lock = self.preflight_lock.clone();
        let request = d.observed_hash();
        self.start(Step::Preflight { request }, async move {
            let _one_at_a_time = lock.lock().await;
            let result = gatherer
                .prepare(
                    &facts,
                    &run.desired,
                    &booted,
                    run.foreign.as_ref(),
                    base,
                    Purpose::Request,
                    None,
                    allowed,
                )
                .await;
            Outcome::Prepared(Box::new(run), result)
        });
    }

    /// Acts on a finished preflight.
    #[tracing::instrument(skip_all, fields(request = %run.desired.observed_hash()))]
    pub(super) async fn on_prepared(
        &mut self,
        run: PreflightRun,
        result: Result<Prepared, Transient>,
    ) {
        let prepared = match result {
            Err(Transient(msg)) => {
                self.fail(Retry::Registry, msg).await;
                return;
            }
            Ok(prepared) => prepared,
        };
        self.core.handle(Event::Recovered(Retry::Registry));
        for c in &prepared.checks {
            debug!(check = %c.id, result = ?c.result, message = %c.message, "preflight");
        }
        match (
            prepared.plan,
            crate::agent::preflight::first_failure(&prepared.checks),
        ) {
            // Approval and finalization need a passed on-disk check: never stage what cannot be
            // checked.
            (Some(_), _) if prepared.expect.is_none() => {
                self.set_state(
                    State::Refused,
                    "preflight could not tell what the staged deployment must look like (image digest or target major unknown); not staging what cannot be checked".into(),
                )
                .await;
            }
            (Some(plan), _) => self.stage_prepared(run, plan, prepared.expect).await,
            (None, Some(f)) => {
                let s = self.report.status();
                crate::logging::log_preflight_failed(
                    f.id,
                    &f.message,
                    s.desired_stream.as_deref().unwrap_or_default(),
                    s.desired_os_image.as_deref().unwrap_or_default(),
                    self.node.name(),
                );
                let reason = f.id.failure_reason(&f.message);
                let failed = crate::agent::preflight::failed_ids(&prepared.checks);
                self.request_reboot(None, None).await;
                self.set_refused_by_checks(failed, reason).await;
            }
            (None, None) => {
                self.set_state(State::Refused, "preflight produced no plan".into())
                    .await;
            }
        }
    }

    /// Stages a plan that passed preflight: at once, after removing a foreign stage, or (a
    /// backend that cannot hold a stage) once the reboot is approved.
    async fn stage_prepared(
        &mut self,
        run: PreflightRun,
        plan: StagePlan,
        expect: Option<crate::host::verify::Expectation>,
    ) {
        let d = &run.desired;
        let mut record = run.record;
        if !run.locks && !self.ask_approval_first(d, &mut record).await {
            return;
        }
        let token = crate::agent::planner::reboot_token(d, &self.boot_id, &record);
        if !run.locks
            && self.reboot.policy == RebootPolicy::OnApproval
            && run.approved.as_deref() != Some(token.as_str())
        {
            self.request_reboot(Some(token.clone()), None).await;
            let reason = self.unheld_stage_reason(&plan, &token);
            self.set_state(State::Staged, reason).await;
            return;
        }
        let expect = expect.map(|e| (e, plan.os_image.digest().to_string()));
        let start = StageStart {
            plan,
            hash: d.observed_hash(),
            expect,
            record,
        };
        // Allowed by replace-foreign-staged: remove it first, because rpm-ostree refuses a
        // rebase onto the refspec the pending deployment already has ("Old and new refs are
        // equal").
        if let Some(f) = &run.foreign {
            info!(staged = %f.id, "replacing a staged deployment streamd did not create");
            let backend = self.backend.clone();
            let booted = self.report.status().current_os_image.clone();
            let request = Some(start.hash.clone());
            self.start(Step::Cleanup { request }, async move {
                let result = backend.cleanup_pending(&booted).await;
                Outcome::ForeignRemoved(Box::new(start), result)
            });
            return;
        }
        self.begin_staging(start).await;
    }

    /// Without a finalization lock, staging waits for the approval, asked for with an id of
    /// its own (kept while the request stays): records the ask. False when the record could not
    /// be saved (reported).
    async fn ask_approval_first(
        &mut self,
        d: &crate::cluster::protocol::Desired,
        record: &mut attempt::Record,
    ) -> bool {
        let hash = d.observed_hash();
        // Nothing of streamd's is staged when the planner says Stage: the record of an earlier
        // staging (one that failed, or was replaced) must not name the staging this approval
        // is for.
        let stale = record.staged.take().is_some();
        let ask = record.approval.as_ref().is_none_or(|a| a.request != hash);
        if ask {
            record.approval = Some(attempt::ApprovalAsk {
                request: hash,
                id: attempt::new_id(),
            });
        }
        if (stale || ask)
            && let Err(e) = self.store.save(record)
        {
            self.set_state(State::Degraded, e.to_string()).await;
            return false;
        }
        true
    }

    /// The reason of a stage that waits for the approval because the backend cannot hold it.
    fn unheld_stage_reason(&self, plan: &StagePlan, token: &str) -> String {
        let why = if self.backend.locks() {
            // bootc >= 1.12 with a stage of another image in place.
            format!(
                "{} cannot hold a stage over the one in place ({})",
                self.backend.kind().as_str(),
                self.report
                    .status()
                    .staged_os_image
                    .as_deref()
                    .unwrap_or_default()
            )
        } else {
            format!(
                "{} cannot lock a staged deployment",
                self.backend.kind().as_str()
            )
        };
        format!(
            "preflight passed; {why}, so {} is staged only after the reboot is approved: set reboot-approved to {token}",
            plan.os_image
        )
    }

    /// Stages once the foreign staged deployment is removed.
    pub(super) async fn on_foreign_removed(
        &mut self,
        start: StageStart,
        result: Result<(), BackendError>,
    ) {
        match result {
            Ok(()) => self.begin_staging(start).await,
            Err(e) => {
                self.transient_failure(format!("removing the foreign staged deployment: {e}"))
                    .await;
            }
        }
    }

    /// Records the staging, then starts the transaction.
    async fn begin_staging(&mut self, start: StageStart) {
        let StageStart {
            plan,
            hash,
            expect,
            mut record,
        } = start;
        if self.report.status().observed_desired.as_deref() != Some(hash.as_str()) {
            // The request changed (or became unresolvable) meanwhile: decide again instead.
            self.core.handle(Event::DecideAgain);
            return;
        }
        // A new id per staging (so no earlier approval fits it), except the staging a bootc
        // approval was asked for: that approval is for it.
        let id = record
            .approval
            .as_ref()
            .filter(|a| a.request == hash)
            .map_or_else(attempt::new_id, |a| a.id.clone());
        record.staged = Some(attempt::Staged {
            request: hash.clone(),
            os_image: plan.os_image.to_string(),
            id: Some(id),
            expect: expect.as_ref().map(|(e, _)| e.clone()),
            pinned: expect.as_ref().map(|(_, p)| p.clone()),
            verified: None,
        });
        if record.attempt.as_ref().is_some_and(|a| a.request != hash) {
            record.attempt = None;
        }
        let effects = self.core.handle(Event::StagingReady(Box::new(StagingReady {
            request: hash,
            plan,
            expect,
            record,
        })));
        self.execute(effects).await;
    }

    /// Forgets staging failures and reboots given up on (`streamctl reconcile` asks to try
    /// again).
    pub(super) fn forget_failure(&mut self) {
        let Ok(mut record) = self.store.load() else {
            return;
        };
        let failed = record.failure.take().is_some();
        // Reboots that all came up elsewhere, finished and reported in an earlier boot: the
        // same image may be tried again, from the first attempt.
        let exhausted = record.attempt.take_if(|a| {
            a.attempts >= self.reboot.max_attempts
                && a.boot_id != self.boot_id
                && a.reported_boot.as_deref() == Some(self.boot_id.as_str())
        });
        if (failed || exhausted.is_some())
            && let Err(e) = self.store.save(&record)
        {
            warn!(error = %e, "forgetting the staging failure failed");
        }
    }

    /// Checks the staged deployment on disk, in a task (the helper may take minutes on a slow
    /// disk); [`Self::on_verified`] records the result.
    pub(super) fn start_verify(
        &mut self,
        hash: String,
        expect: (crate::host::verify::Expectation, String),
    ) {
        let check = verify(
            self.backend.clone(),
            self.host.root().to_path_buf(),
            self.report.status().current_os_image.clone(),
            expect,
        );
        self.start(Step::Verify { request: hash }, async move {
            Outcome::Verified(check.await)
        });
    }

    /// Checks a staged deployment of streamd's that was never checked (the planner's
    /// `Verify`), against what the attempt record says it must look like.
    pub(super) async fn verify_recorded(&mut self, record: &attempt::Record) {
        let Some(staged) = record.staged.as_ref() else {
            return;
        };
        let Some(expect) = staged.expect.clone() else {
            return;
        };
        let pinned = staged
            .pinned
            .clone()
            .unwrap_or_else(|| expect.image_digest.clone());
        info!(staged = %staged.os_image, "checking a staged deployment that was never checked on disk");
        self.set_reason(format!(
            "checking the staged deployment of {} on disk",
            staged.os_image
        ))
        .await;
        self.start_verify(staged.request.clone(), (expect, pinned));
    }

    /// Records a passed check durably (approval and finalization need it), or reports the
    /// failure.
    pub(super) async fn on_verified(&mut self, result: Result<String, VerifyFailed>) {
        let verified = match result {
            Ok(checksum) => match self.store.load() {
                Ok(record) => Verified::Passed {
                    checksum,
                    record: Box::new(record),
                },
                Err(e) => Verified::Unrecorded(e.to_string()),
            },
            Err(e) => {
                warn!(error = %e, label = e.label(), "the staged deployment did not pass its check");
                Verified::Failed {
                    reason: e.to_string(),
                    record: self.store.load().ok().map(Box::new),
                }
            }
        };
        let effects = self.core.handle(Event::Verified(verified));
        self.execute(effects).await;
    }

    pub(super) async fn start_staging(
        &mut self,
        plan: StagePlan,
        hash: String,
        expect: Option<(crate::host::verify::Expectation, String)>,
    ) {
        info!(call = %serde_json::to_string(&UpdateDeploymentCall::for_plan(&plan)).unwrap_or_default(), backend = self.backend.kind().as_str(), "staging");
        let image = plan.os_image.to_string();
        // The RPMs it opens stay until it ends, whatever preflight runs meanwhile.
        self.gatherer.in_use.hold(
            Holder::Staging,
            plan.local_rpms.first().and_then(|p| p.parent()),
        );
        let (tx, rx) = mpsc::channel(64);
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let backend = self.backend.clone();
        let task =
            tokio::spawn(async move { stage_with_busy_retry(backend, plan, tx, cancelled).await });
        // Let the transaction request go out before the status reporting below.
        tokio::task::yield_now().await;
        self.core
            .handle(Event::Started(Step::Staging { request: hash }));
        self.task = Some(Task::Staging(Staging {
            expect,
            task,
            progress: rx,
            cancel,
        }));
        self.report.set_progress(0);
        self.set_state(State::Staging, format!("staging {image}"))
            .await;
    }

    pub(super) async fn on_progress(&mut self, ev: TxnEvent) {
        let text = match ev {
            TxnEvent::Percent(text, pct) => {
                self.report.raise_progress(pct);
                text
            }
            TxnEvent::Message(text) => text,
        };
        self.set_reason(text).await;
    }

    /// Acts on the end of the staging transaction: the core says what follows
    /// ([`super::core::Core`]'s `staging_ended`).
    #[tracing::instrument(skip_all, fields(request = %self.core.staging().unwrap_or_default()))]
    pub(super) async fn on_staged(&mut self, res: Result<(), BackendError>) {
        let Some(hash) = self.core.staging().map(String::from) else {
            return;
        };
        let Some(Task::Staging(done)) = self.task.take() else {
            return;
        };
        self.ended(None).await;
        self.gatherer.in_use.hold(Holder::Staging, None);
        let current = self.report.status().observed_desired.as_deref() == Some(hash.as_str());
        let end = staging_end(res);
        match &end {
            // The request changed while this transaction ran: its result is history, act on
            // the new request (which re-reads the deployments, so a stale stage is seen).
            _ if !current => info!(result = ?end, "superseded transaction ended"),
            StagingEnd::Staged => info!("transaction finished"),
            StagingEnd::RefsEqual(_) => {
                info!(
                    "rpm-ostree says the target is pending already (an earlier transaction may have staged it)"
                );
            }
            _ => {}
        }
        let effects = self.core.handle(Event::StagingEnded(Box::new(StagingEnded {
            now: std::time::Instant::now(),
            request: hash,
            current,
            end,
            record: self.store.load().ok(),
            expect: done.expect,
            pull_retries: self.reboot.pull_retries,
        })));
        self.execute(effects).await;
    }
}

/// How a staging transaction's result counts for what comes next.
fn staging_end(res: Result<(), BackendError>) -> StagingEnd {
    match res {
        Ok(()) => StagingEnd::Staged,
        Err(e) if e.is_transient() => StagingEnd::Transient(e.to_string()),
        Err(e) if matches!(&e, BackendError::RpmOstree(RpmOstreeError::Failed(m)) if m.starts_with(REFS_EQUAL)) => {
            StagingEnd::RefsEqual(e.to_string())
        }
        Err(e) if e.is_network_failure() => StagingEnd::Network(e.to_string()),
        Err(e) => StagingEnd::Failed(e.to_string()),
    }
}

/// Checks the staged deployment on disk (in the `streamd-verify` helper); on a mismatch removes
/// it and says what differed. `root` is the host root, `booted` the booted image (for the
/// removal).
async fn verify(
    backend: Backend,
    root: std::path::PathBuf,
    booted_image: String,
    (mut exp, pinned): (crate::host::verify::Expectation, String),
) -> Result<String, VerifyFailed> {
    let deployments = backend
        .deployments()
        .await
        .map_err(VerifyFailed::Deployments)?;
    let (Some(staged), Some(booted)) = (
        deployments.iter().find(|d| d.staged).cloned(),
        deployments.iter().find(|d| d.booted).cloned(),
    ) else {
        return Err(VerifyFailed::NothingStaged);
    };
    // rpm-ostree reports the platform manifest's digest; a pullspec may pin the index.
    if staged.container_image_reference_digest.as_deref() == Some(pinned.as_str()) {
        exp.image_digest = pinned;
    }
    // libostree finds the staged deployment only through the running root.
    let sysroot = if root == std::path::Path::new("/") {
        root
    } else {
        root.join("sysroot")
    };
    let helper = std::env::current_exe()
        .map_err(VerifyFailed::Helper)?
        .with_file_name(crate::host::verify::HELPER);
    let checksum = staged.checksum.clone();
    let req = crate::host::verify::Request {
        sysroot,
        staged,
        booted,
        expect: exp,
    };
    match crate::host::verify::in_helper(&helper, &req).await {
        Ok(()) => {
            info!(%checksum, "staged deployment verified");
            Ok(checksum)
        }
        Err(e) => {
            warn!(error = %e, "staged deployment failed verification; removing it");
            Err(match backend.cleanup_pending(&booted_image).await {
                Ok(()) => VerifyFailed::Removed(e),
                Err(cleanup) => VerifyFailed::NotRemoved { failed: e, cleanup },
            })
        }
    }
}

async fn stage_with_busy_retry(
    backend: Backend,
    plan: StagePlan,
    progress: mpsc::Sender<TxnEvent>,
    mut cancelled: tokio::sync::watch::Receiver<bool>,
) -> Result<(), BackendError> {
    let mut backoff = BUSY_BACKOFF;
    loop {
        match backend.stage(&plan, &progress, cancelled.clone()).await {
            Err(BackendError::RpmOstree(RpmOstreeError::Busy(msg))) => {
                let delay = backoff.next_delay();
                info!(%msg, retry_in = ?delay, "rpm-ostreed busy; waiting");
                let _ = progress.try_send(TxnEvent::Message(format!(
                    "waiting for another rpm-ostree transaction ({msg}); retrying in {}s",
                    delay.as_secs()
                )));
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                        return Err(RpmOstreeError::Cancelled.into());
                    }
                }
            }
            other => return other,
        }
    }
}
