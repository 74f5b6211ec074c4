//! The agent's sans-I/O core: what it is doing now ([`Activity`]), its timers (retry,
//! readiness, the status patch's retry, the look at the credential files) and their
//! back-offs, and how each [`Event`] changes them.
//!
//! [`Core::handle`] takes an event and returns the [`Effect`]s the loop (`event_loop.rs`) then
//! executes: spawning the deployments read or the on-disk check, aborting read-only work,
//! cancelling the staging transaction, writing the attempt record, reporting a state or a
//! retry, posting a Kubernetes Event, publishing and flushing the status, running a reconcile.
//! Time is an input (every event that arms a timer carries `now`), and so is randomness (the
//! jitter of a back-off), and so is what the handlers read (the attempt record, how a
//! transaction ended), so a sequence of events gives the same effects every time:
//! `core/tests.rs` and `core/tests_effects.rs` check them as tables, without D-Bus, HTTP or
//! files. What the other steps found (deployments, preflight results) is still acted on by the
//! agent's handlers, which start the next step through [`Event::Started`].

mod inputs;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_effects;

use std::time::{Duration, Instant};

use crate::backend::StagePlan;
use crate::backoff::{Backoff, stretch};
use crate::cluster::node::{CREDENTIALS_CHECK, EventType};
use crate::cluster::protocol::State;
use crate::cluster::report::{PATCH_MAX_BACKOFF, PatchFailure, patch_retry_delay};
use crate::host::attempt::{Failure, Record};
use crate::host::verify::Expectation;

use super::planner::TRY_AGAIN;

pub(super) use inputs::{
    Finalizing, Notice, OnSaveError, RolledBack, StagingEnd, StagingEnded, StagingReady, Verified,
};

/// First delay after a transient failure, and the short fixed waits.
pub(super) const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// After a transient failure: 1 s doubling to 60 s.
const TRANSIENT_BACKOFF: Backoff = Backoff::new(MIN_BACKOFF, Duration::from_secs(60));
/// After a finalization the OS daemon refused: 1 min doubling to 30 min.
const FINALIZE_BACKOFF: Backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(1800));
/// After a registry or DNS failure during preflight or readiness: 10 s doubling to 5 min.
pub(super) const REGISTRY_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
/// Checks whose input did not change are run again after this long.
pub(super) const READINESS_INTERVAL: Duration = Duration::from_secs(3600);
/// After a failed node patch: 1 s doubling to the reporter's cap.
const PATCH_BACKOFF: Backoff = Backoff::new(MIN_BACKOFF, PATCH_MAX_BACKOFF);
/// How often the credential files are looked for while there are none.
const CREDENTIALS_WAIT: Duration = Duration::from_secs(5);

/// One step of serving a request, run beside the loop (work in a task, or the staging
/// transaction), with the request it serves (its observed-desired hash) where it serves one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Reading the deployments for a decision.
    Observe,
    /// Preflight of a request.
    Preflight { request: String },
    /// Removing a staged deployment: a foreign one before staging `request`, or a stale one.
    Cleanup { request: Option<String> },
    /// The staging transaction.
    Staging { request: String },
    /// The on-disk check of what a transaction staged.
    Verify { request: String },
    /// The bootloader update before finalizing a major move (Secure Boot).
    Bootloader,
    /// Finalizing and rebooting.
    Apply { request: String },
    /// Readiness checks (preflight only, nothing staged).
    Readiness,
}

impl Step {
    /// A short name for logs.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Step::Observe => "observe",
            Step::Preflight { .. } => "preflight",
            Step::Cleanup { .. } => "cleanup",
            Step::Staging { .. } => "staging",
            Step::Verify { .. } => "verify",
            Step::Bootloader => "bootloader",
            Step::Apply { .. } => "apply",
            Step::Readiness => "readiness",
        }
    }

    /// The request (observed-desired hash) it runs for, if it runs for one.
    pub(super) fn request(&self) -> Option<&str> {
        match self {
            Step::Preflight { request }
            | Step::Staging { request }
            | Step::Verify { request }
            | Step::Apply { request } => Some(request),
            Step::Cleanup { request } => request.as_deref(),
            Step::Observe | Step::Bootloader | Step::Readiness => None,
        }
    }

    /// Whether stopping it changes nothing on the node, so a new request may drop it.
    fn droppable_for(&self, request: Option<&str>) -> bool {
        match self {
            Step::Readiness => true,
            Step::Preflight { request: r } => Some(r.as_str()) != request,
            _ => false,
        }
    }
}

/// What the agent is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Activity {
    /// Nothing runs.
    Idle,
    /// `step` runs; `again`: a reconcile was asked for meanwhile and runs once it is done.
    Running { step: Step, again: bool },
    /// A step ended and its result is being acted on (which may start the next step); `again`
    /// carries a reconcile asked for while it ran.
    Settling { again: bool },
}

/// Which back-off a failure advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Reading deployments, a failed transaction, a task that failed: 1 s to 60 s.
    Transient,
    /// A registry or DNS failure during preflight: 10 s to 5 min, jittered.
    Registry,
    /// A finalization the OS daemon refused with nothing applied (an inhibitor, a daemon
    /// error): 1 min doubling to 30 min, so a lasting refusal is not asked again every minute;
    /// `streamctl reconcile` asks at once.
    Finalize,
}

/// Something the core reacts to.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
    /// Decide again on `request` (the observed-desired hash; `None`: no request).
    Reconcile {
        now: Instant,
        request: Option<String>,
    },
    /// The agent started `step` (a decision's next step).
    Started(Step),
    /// The running step ended; `failed`: its task failed (it panicked or was aborted), and why.
    Ended {
        now: Instant,
        failed: Option<String>,
    },
    /// The ended step's result was acted on.
    Settled,
    /// A step failed and is retried after the back-off `retry`'s next delay; `jitter` (in
    /// `[0, 1)`) stretches a registry delay by up to a quarter.
    Failed {
        now: Instant,
        retry: Retry,
        reason: String,
        jitter: f64,
    },
    /// A step that could fail transiently succeeded: its back-off starts from the floor again.
    Recovered(Retry),
    /// Decide again at `at` (a fixed wait, not a back-off).
    RetryAt(Instant),
    /// The retry timer fired.
    RetryDue,
    /// A request that is not acted on now (readiness mode, unresolvable): stop its staging.
    Hold,
    /// After a digest refresh of the node's stream: no staging before the instant, and why
    /// (`None`: a request that need not wait).
    Spread(Option<(Instant, String)>),
    /// The step's result needs a decision on the latest request once it is done.
    DecideAgain,
    /// The readiness checks finished; `transient`: some could not run and are retried soon.
    Checked {
        now: Instant,
        transient: bool,
        jitter: f64,
    },
    /// The readiness timer fired.
    ReadinessDue,
    /// The readiness checks are to run again although their input is unchanged.
    ReadinessStale,
    /// The status patch went out: the next failure waits the floor again.
    Patched,
    /// The status patch failed; `jitter` (in `[0, 1)`) spreads the retry.
    PatchFailed {
        now: Instant,
        failure: PatchFailure,
        jitter: f64,
    },
    /// The credential files were looked at: `client`: a client is loaded (maybe an older one);
    /// `new`: this look built a new one.
    CredentialsLoaded {
        now: Instant,
        client: bool,
        new: bool,
    },
    /// The API server answered 401 (the kubelet may have rotated the client certificate):
    /// the credential files are looked at at once.
    Unauthorized,
    /// The report's state and reason were set; `entered`: the state changed; `notice`: the
    /// Event to post instead of the state's own.
    Reported {
        state: State,
        reason: String,
        entered: bool,
        notice: Option<Notice>,
    },
    /// The reboot request is now `token`; `changed`: it was another before.
    RebootToken {
        token: Option<String>,
        changed: bool,
    },
    /// The staging transaction ended (after [`Event::Ended`]).
    StagingEnded(Box<StagingEnded>),
    /// The on-disk check of the staged deployment ended.
    Verified(Verified),
    /// A stale staged deployment of streamd's was removed; `record` as the decision read it.
    StaleRemoved { now: Instant, record: Box<Record> },
    /// The node came up on another deployment than the one finalized.
    RolledBack(Box<RolledBack>),
    /// The request's target booted and passed the after-boot check; `record` as the decision
    /// read it, `image` the booted one.
    Booted { record: Box<Record>, image: String },
    /// The decision is to finalize and reboot (any bootloader update before it is done).
    Finalizing(Box<Finalizing>),
    /// A plan that passed preflight is to be staged.
    StagingReady(Box<StagingReady>),
    /// Finalization was refused and nothing was applied: `record` is the one before this
    /// attempt; `recheck`: what is staged must be checked on disk again (rpm-ostreed has
    /// another deployment staged than the one checked); `transient`: the daemon did not
    /// refuse, it could not be asked (busy, unreachable).
    FinalizeFailed {
        now: Instant,
        record: Box<Record>,
        recheck: bool,
        transient: bool,
        reason: String,
    },
}

/// What the loop does for the core.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Effect {
    /// Spawn the deployments read ([`Step::Observe`]).
    Observe,
    /// Abort the running read-only work.
    Abort,
    /// Cancel the staging transaction.
    CancelStaging,
    /// Publish the status (the request changed).
    Publish,
    /// Report a failure of the kind `retry` that is retried after `delay`.
    Retry {
        retry: Retry,
        reason: String,
        delay: Duration,
    },
    /// Report a request that waits for its spread delay (and withdraw a reboot request).
    Spreading { reason: String },
    /// Run a reconcile (the agent works out the request first).
    Reconcile,
    /// Post a Kubernetes Event (through the rate-limited queue).
    PostEvent(Notice),
    /// Send the pending status patch now, not when the flush timer fires.
    Flush,
    /// Write the attempt record; `on_error` says what a failed write means.
    SaveAttempt {
        record: Box<Record>,
        on_error: OnSaveError,
    },
    /// Report `state` with `reason`, posting `notice` instead of the state's own Event.
    SetState {
        state: State,
        reason: String,
        notice: Option<Notice>,
    },
    /// Check what the transaction for `request` staged on disk, against `expect` (in a task).
    Verify {
        request: String,
        expect: Box<(Expectation, String)>,
    },
    /// Report `attempts` reboots into the request so far.
    SetAttempts(u32),
    /// Start the staging transaction of `plan` for `request`; `expect`: what the staged
    /// deployment must look like, and the digest the request pins.
    Stage {
        request: String,
        plan: Box<StagePlan>,
        expect: Option<Box<(Expectation, String)>>,
    },
    /// Finalize `digest` and reboot (in a task), attempt `attempt` of `request`; `before` is
    /// the record to restore when it is refused.
    Apply {
        request: String,
        digest: String,
        attempt: u32,
        before: Box<Record>,
    },
    /// Hand this event to the core once the effects before it ran: what must follow a record
    /// write only when it succeeded (an [`OnSaveError::Degrade`] write that fails drops it).
    Then(Box<Event>),
}

/// The agent's activity, timers and back-offs.
#[derive(Debug)]
pub(super) struct Core {
    activity: Activity,
    retry_at: Option<Instant>,
    backoff: Backoff,
    registry_backoff: Backoff,
    finalize_backoff: Backoff,
    spread_until: Option<(Instant, String)>,
    readiness_at: Option<Instant>,
    readiness_stale: bool,
    readiness_backoff: Backoff,
    /// When a failed status patch is sent again.
    patch_retry_at: Option<Instant>,
    patch_backoff: Backoff,
    /// When the credential files are looked at next (`None`: at once).
    credentials_at: Option<Instant>,
    /// The request for which "Old and new refs are equal" was already taken as "staged
    /// meanwhile".
    refs_equal_seen: Option<String>,
}

impl Default for Core {
    fn default() -> Self {
        Core {
            activity: Activity::Idle,
            retry_at: None,
            backoff: TRANSIENT_BACKOFF,
            registry_backoff: REGISTRY_BACKOFF,
            finalize_backoff: FINALIZE_BACKOFF,
            spread_until: None,
            readiness_at: None,
            readiness_stale: false,
            readiness_backoff: REGISTRY_BACKOFF,
            patch_retry_at: None,
            patch_backoff: PATCH_BACKOFF,
            credentials_at: None,
            refs_equal_seen: None,
        }
    }
}

impl Core {
    /// What the agent is doing.
    pub(super) fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Nothing runs and no result waits to be acted on.
    pub(super) fn idle(&self) -> bool {
        self.activity == Activity::Idle
    }

    /// When the retry timer fires.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// When the readiness checks run again.
    pub(super) fn readiness_at(&self) -> Option<Instant> {
        self.readiness_at
    }

    /// The readiness checks are due although their input is unchanged.
    pub(super) fn readiness_stale(&self) -> bool {
        self.readiness_stale
    }

    /// When the status patch goes out, given when the reporter wants it out (`due`): not
    /// before a failed patch's retry.
    pub(super) fn flush_at(&self, due: Option<Instant>) -> Option<Instant> {
        let due = due?;
        Some(self.patch_retry_at.map_or(due, |r| r.max(due)))
    }

    /// When a failed status patch is sent again (`None`: none failed).
    pub(super) fn patch_retry_at(&self) -> Option<Instant> {
        self.patch_retry_at
    }

    /// When the credential files are looked at next (`None`: at once).
    pub(super) fn credentials_at(&self) -> Option<Instant> {
        self.credentials_at
    }

    /// The request the running staging transaction stages.
    pub(super) fn staging(&self) -> Option<&str> {
        match &self.activity {
            Activity::Running {
                step: Step::Staging { request },
                ..
            } => Some(request),
            _ => None,
        }
    }

    /// The one place the activity and the timers change.
    pub(super) fn handle(&mut self, event: Event) -> Vec<Effect> {
        match event {
            Event::Reconcile { now, request } => self.reconcile(now, request),
            Event::Started(step) => self.started(step),
            Event::Ended { now, failed } => self.ended(now, failed),
            Event::Settled => self.settled(),
            Event::Failed {
                now,
                retry,
                reason,
                jitter,
            } => self.fail(now, retry, reason, jitter),
            Event::Recovered(retry) => {
                match retry {
                    Retry::Transient => self.backoff.reset(),
                    Retry::Registry => self.registry_backoff.reset(),
                    Retry::Finalize => self.finalize_backoff.reset(),
                }
                Vec::new()
            }
            Event::RetryAt(at) => {
                self.retry_at = Some(at);
                Vec::new()
            }
            Event::RetryDue => {
                self.retry_at = None;
                vec![Effect::Reconcile]
            }
            Event::Hold => match self.staging() {
                Some(_) => vec![Effect::CancelStaging],
                None => Vec::new(),
            },
            Event::Spread(until) => {
                self.spread_until = until;
                Vec::new()
            }
            Event::DecideAgain => {
                if let Activity::Running { again, .. } | Activity::Settling { again } =
                    &mut self.activity
                {
                    *again = true;
                }
                Vec::new()
            }
            Event::Checked {
                now,
                transient,
                jitter,
            } => self.checked(now, transient, jitter),
            Event::ReadinessDue => {
                self.readiness_at = None;
                self.readiness_stale = true;
                Vec::new()
            }
            Event::ReadinessStale => {
                self.readiness_stale = true;
                Vec::new()
            }
            Event::Patched => {
                self.patch_retry_at = None;
                self.patch_backoff.reset();
                Vec::new()
            }
            Event::PatchFailed {
                now,
                failure,
                jitter,
            } => self.patch_failed(now, failure, jitter),
            Event::CredentialsLoaded { now, client, new } => {
                self.credentials_loaded(now, client, new)
            }
            Event::Unauthorized => {
                self.credentials_at = None;
                Vec::new()
            }
            Event::Reported {
                state,
                reason,
                entered,
                notice,
            } => reported(state, reason, entered, notice),
            Event::RebootToken { token, changed } => reboot_token(token, changed),
            Event::StagingEnded(ended) => self.staging_ended(*ended),
            Event::Verified(verified) => verified_effects(verified),
            Event::StaleRemoved { now, record } => stale_removed(now, *record),
            Event::RolledBack(r) => rolled_back(*r),
            Event::Booted { record, image } => booted(*record, &image),
            Event::Finalizing(f) => finalizing(*f),
            Event::StagingReady(r) => staging_ready(*r),
            Event::FinalizeFailed {
                now,
                record,
                recheck,
                transient,
                reason,
            } => self.finalize_failed(now, *record, (recheck, transient), reason),
        }
    }

    /// The ended step's result was acted on: idle, or the reconcile asked for meanwhile.
    fn settled(&mut self) -> Vec<Effect> {
        let Activity::Settling { again } = self.activity else {
            return Vec::new();
        };
        self.activity = Activity::Idle;
        if again {
            vec![Effect::Reconcile]
        } else {
            Vec::new()
        }
    }

    /// `step` runs now.
    fn started(&mut self, step: Step) -> Vec<Effect> {
        // A transaction starts from a decision on the latest request, and its end decides
        // again or reports: a reconcile asked for before it is not carried.
        let again = match self.activity {
            _ if matches!(step, Step::Staging { .. }) => false,
            Activity::Running { again, .. } | Activity::Settling { again } => again,
            Activity::Idle => false,
        };
        self.activity = Activity::Running { step, again };
        Vec::new()
    }

    /// The running step ended: its result is acted on next; a failed task is retried.
    fn ended(&mut self, now: Instant, failed: Option<String>) -> Vec<Effect> {
        let again = match self.activity {
            Activity::Running { again, .. } | Activity::Settling { again } => again,
            Activity::Idle => false,
        };
        self.activity = Activity::Settling { again };
        match failed {
            Some(reason) => self.fail(now, Retry::Transient, reason, 0.0),
            None => Vec::new(),
        }
    }

    /// A new decision on `request`: none while a transaction for it runs, a cancel when the
    /// transaction is for another, a wait for the spread delay, and else a read of the
    /// deployments, at once or once the running step is done.
    fn reconcile(&mut self, now: Instant, request: Option<String>) -> Vec<Effect> {
        if let Some(staged) = self.staging() {
            if request.as_deref() == Some(staged) {
                return Vec::new();
            }
            // rpm-ostreed reports the end as Finished, and the reconcile after it acts on the
            // new request.
            return vec![Effect::CancelStaging, Effect::Publish];
        }
        if let Some((until, reason)) = self.spread_until.clone() {
            if now < until {
                self.retry_at = Some(until);
                return vec![Effect::Spreading { reason }];
            }
            self.spread_until = None;
        }
        match &mut self.activity {
            Activity::Running { step, again } => {
                // A preflight for a request no longer wanted changes nothing: drop it, as
                // readiness checks, which run again once the slot is free. Other work ends
                // first; this reconcile runs after it.
                if step.droppable_for(request.as_deref()) {
                    *step = Step::Observe;
                    vec![Effect::Abort, Effect::Observe]
                } else {
                    *again = true;
                    Vec::new()
                }
            }
            Activity::Idle | Activity::Settling { .. } => {
                let again = matches!(self.activity, Activity::Settling { again: true });
                self.activity = Activity::Running {
                    step: Step::Observe,
                    again,
                };
                vec![Effect::Observe]
            }
        }
    }

    /// Arms the readiness timer: after the registry back-off when some check could not run,
    /// else after the interval.
    fn checked(&mut self, now: Instant, transient: bool, jitter: f64) -> Vec<Effect> {
        let delay = if transient {
            stretch(self.readiness_backoff.next_delay(), jitter)
        } else {
            self.readiness_backoff.reset();
            READINESS_INTERVAL
        };
        self.readiness_at = Some(now + delay);
        self.readiness_stale = false;
        Vec::new()
    }

    /// Arms the patch retry timer (whatever is pending then goes out, not the failed patch:
    /// the latest status wins); after a 401 the credential files are looked at at once.
    fn patch_failed(&mut self, now: Instant, failure: PatchFailure, jitter: f64) -> Vec<Effect> {
        let delay = patch_retry_delay(self.patch_backoff.next_delay(), failure, jitter);
        self.patch_retry_at = Some(now + delay);
        if failure.unauthorized {
            self.credentials_at = None;
        }
        Vec::new()
    }

    /// Arms the credentials timer: soon while there is no client, else at the check interval.
    fn credentials_loaded(&mut self, now: Instant, client: bool, new: bool) -> Vec<Effect> {
        let wait = if client {
            CREDENTIALS_CHECK
        } else {
            CREDENTIALS_WAIT
        };
        self.credentials_at = Some(now + wait);
        if new {
            // A patch refused with the old credentials need not wait for its slow retry.
            self.patch_retry_at = None;
        }
        Vec::new()
    }

    /// What the end of a staging transaction leads to: a result for a request no longer wanted
    /// is history (decide again); a staged target is checked on disk (or decided on) and its
    /// earlier failures forgotten; a transient failure is retried on the back-off; a network
    /// failure is retried `pull_retries` times, spaced; "refs equal" is taken once per request
    /// as "staged meanwhile" (a transaction from before a restart staged it); any other failure
    /// is remembered in the attempt record and not retried for that request.
    fn staging_ended(&mut self, e: StagingEnded) -> Vec<Effect> {
        if !e.current {
            self.backoff.reset();
            return vec![Effect::Reconcile];
        }
        let degraded = |record, reason: String| vec![remembered(record), degraded(reason)];
        let failed = matches!(e.end, StagingEnd::Failed(_));
        match e.end {
            StagingEnd::Staged => {
                self.backoff.reset();
                let forget = e.record.and_then(|mut r| {
                    r.failure.take()?;
                    Some(Effect::SaveAttempt {
                        record: Box::new(r),
                        on_error: OnSaveError::Log("forgetting the staging failure failed"),
                    })
                });
                let next = match e.expect {
                    Some(expect) => Effect::Verify {
                        request: e.request,
                        expect: Box::new(expect),
                    },
                    None => Effect::Reconcile,
                };
                forget.into_iter().chain([next]).collect()
            }
            StagingEnd::Transient(error) => self.fail(e.now, Retry::Transient, error, 0.0),
            StagingEnd::RefsEqual(_) if self.refs_equal_seen.as_ref() != Some(&e.request) => {
                self.refs_equal_seen = Some(e.request);
                vec![Effect::Reconcile]
            }
            StagingEnd::RefsEqual(error) | StagingEnd::Failed(error) => {
                let reason = format!("staging failed: {error}; {TRY_AGAIN}");
                let record = failure(e.record, &e.request, |f| f.gave_up = Some(reason.clone()));
                let mut effects = degraded(record, reason);
                // A failed transaction can leave its deployment staged (rpm-ostree stages a
                // plain rebase before its sanity check): decided again at once, the decision
                // removes it; with nothing staged it only reports the failure again.
                if failed {
                    effects.push(Effect::Reconcile);
                }
                effects
            }
            StagingEnd::Network(error) => {
                let mut record = failure(e.record, &e.request, |f| {
                    f.pull_failures = f.pull_failures.saturating_add(1);
                });
                let failures = record.failure.as_ref().map_or(0, |f| f.pull_failures);
                let retries = e.pull_retries;
                if failures <= retries {
                    let delay = pull_retry_delay(failures);
                    self.retry_at = Some(e.now + delay);
                    let reason = format!(
                        "staging failed on the network (retry {failures} of {retries}): {error}"
                    );
                    vec![
                        remembered(record),
                        Effect::Retry {
                            retry: Retry::Transient,
                            reason,
                            delay,
                        },
                    ]
                } else {
                    let reason = format!(
                        "staging failed on the network {failures} time(s), no retries left: {error}; {TRY_AGAIN}"
                    );
                    if let Some(f) = record.failure.as_mut() {
                        f.gave_up = Some(reason.clone());
                    }
                    degraded(record, reason)
                }
            }
        }
    }

    /// A failed finalization restores the record from before the attempt. Refused for
    /// another staged deployment, the stage is checked again unverified and finalized again on
    /// the transient back-off, as is one the daemon could not be asked for; refused otherwise,
    /// the same finalization is asked again on the finalization back-off (1 to 30 minutes).
    fn finalize_failed(
        &mut self,
        now: Instant,
        mut record: Record,
        (recheck, transient): (bool, bool),
        reason: String,
    ) -> Vec<Effect> {
        if let Some(staged) = record.staged.as_mut().filter(|_| recheck) {
            staged.verified = None;
        }
        let backoff = if recheck || transient {
            Retry::Transient
        } else {
            Retry::Finalize
        };
        let restore = Effect::SaveAttempt {
            record: Box::new(record),
            on_error: OnSaveError::Log("restoring the attempt record failed"),
        };
        let retry = self.fail(now, backoff, reason, 0.0);
        [restore].into_iter().chain(retry).collect()
    }

    /// Arms the retry timer after the back-off `retry`'s next delay.
    fn fail(&mut self, now: Instant, retry: Retry, reason: String, jitter: f64) -> Vec<Effect> {
        let delay = match retry {
            Retry::Transient => self.backoff.next_delay(),
            Retry::Registry => stretch(self.registry_backoff.next_delay(), jitter),
            Retry::Finalize => self.finalize_backoff.next_delay(),
        };
        self.retry_at = Some(now + delay);
        vec![Effect::Retry {
            retry,
            reason,
            delay,
        }]
    }
}

/// What a set state means for the outside: its Event (the one given, else the state's own when
/// it was entered), the publication, and for `Rebooting` the patch at once: the cluster must see
/// it before the node goes down.
fn reported(state: State, reason: String, entered: bool, notice: Option<Notice>) -> Vec<Effect> {
    let notice = notice.or_else(|| {
        let (kind, name) = event_for(state).filter(|_| entered)?;
        Some(Notice {
            kind,
            reason: name,
            message: reason,
        })
    });
    let mut effects: Vec<Effect> = notice.map(Effect::PostEvent).into_iter().collect();
    effects.push(Effect::Publish);
    if state == State::Rebooting {
        effects.push(Effect::Flush);
    }
    effects
}

/// A changed reboot request is published, and a new token asked for with `RebootRequested`.
fn reboot_token(token: Option<String>, changed: bool) -> Vec<Effect> {
    if !changed {
        return Vec::new();
    }
    let ask = token.map(|t| {
        Effect::PostEvent(Notice::normal(
            "RebootRequested",
            format!("set reboot-approved to {t} to let the node reboot into the staged OS"),
        ))
    });
    ask.into_iter().chain([Effect::Publish]).collect()
}

/// The Event posted when entering `state`, if any.
fn event_for(state: State) -> Option<(EventType, &'static str)> {
    match state {
        State::Staging => Some((EventType::Normal, "StagingStarted")),
        State::Staged => Some((EventType::Normal, "Staged")),
        State::Refused => Some((EventType::Warning, "PreflightFailed")),
        State::Degraded => Some((EventType::Warning, "Failed")),
        State::Idle | State::Preflight | State::Rebooting | State::Done => None,
    }
}

/// `record` (a default one when it could not be read) with its failure of `request` updated
/// (a failure of another request is started afresh).
fn failure(record: Option<Record>, request: &str, update: impl FnOnce(&mut Failure)) -> Record {
    let mut record = record.unwrap_or_default();
    let mut failure = record
        .failure
        .take()
        .filter(|f| f.request == request)
        .unwrap_or_else(|| Failure {
            request: request.to_string(),
            ..Failure::default()
        });
    update(&mut failure);
    record.failure = Some(failure);
    record
}

/// Saves a record that remembers a staging failure.
fn remembered(record: Record) -> Effect {
    Effect::SaveAttempt {
        record: Box::new(record),
        on_error: OnSaveError::Log("remembering the staging failure failed"),
    }
}

/// A passed check is recorded durably (approval and finalization need it) before deciding
/// again; a failed one is remembered in the record (as a failed staging is) and reported
/// `Degraded`, as is a record that cannot be read or written.
fn verified_effects(verified: Verified) -> Vec<Effect> {
    match verified {
        Verified::Passed {
            checksum,
            mut record,
        } => {
            if let Some(staged) = record.staged.as_mut() {
                staged.verified = Some(checksum);
            }
            vec![
                Effect::SaveAttempt {
                    record,
                    on_error: OnSaveError::Degrade,
                },
                Effect::Reconcile,
            ]
        }
        Verified::Failed {
            reason,
            record: Some(record),
        } => match record.staged.as_ref().map(|s| s.request.clone()) {
            // Remembered like a failed staging: not checked again until the request changes
            // or `streamctl reconcile` asks.
            Some(request) => {
                let reason = format!("{reason}; {TRY_AGAIN}");
                vec![
                    remembered(failure(Some(*record), &request, |f| {
                        f.gave_up = Some(reason.clone());
                    })),
                    degraded(reason),
                ]
            }
            None => vec![degraded(reason)],
        },
        Verified::Unrecorded(reason)
        | Verified::Failed {
            reason,
            record: None,
        } => {
            vec![degraded(reason)]
        }
    }
}

/// Reports `Degraded` with `reason` (and the state's own Event).
fn degraded(reason: String) -> Effect {
    Effect::SetState {
        state: State::Degraded,
        reason,
        notice: None,
    }
}

/// The removed stage leaves the record before anything decides on the deployments again (at
/// once, the transient back-off from its floor).
fn stale_removed(now: Instant, record: Record) -> Vec<Effect> {
    vec![
        Effect::SaveAttempt {
            record: Box::new(Record {
                staged: None,
                ..record
            }),
            on_error: OnSaveError::Degrade,
        },
        Effect::Then(Box::new(Event::Recovered(Retry::Transient))),
        Effect::Then(Box::new(Event::RetryAt(now))),
    ]
}

/// The attempt is written before the reboot can happen (so the next boot knows what was
/// tried; nothing is finalized when it cannot be), then counted and reported `Rebooting` with
/// its Event (which patches the status at once), then finalization starts.
fn finalizing(f: Finalizing) -> Vec<Effect> {
    vec![
        Effect::SaveAttempt {
            record: Box::new(f.attempted),
            on_error: OnSaveError::Degrade,
        },
        Effect::SetAttempts(f.attempt),
        Effect::SetState {
            state: State::Rebooting,
            reason: f.reason.clone(),
            notice: Some(Notice::normal("Rebooting", f.reason)),
        },
        Effect::Apply {
            request: f.request,
            digest: f.digest,
            attempt: f.attempt,
            before: Box::new(f.before),
        },
    ]
}

/// The staging is remembered before it starts: a staged deployment found after a crash is then
/// known to be ours, and nothing is staged when that cannot be written.
fn staging_ready(r: StagingReady) -> Vec<Effect> {
    vec![
        Effect::SaveAttempt {
            record: Box::new(r.record),
            on_error: OnSaveError::Degrade,
        },
        Effect::Stage {
            request: r.request,
            plan: Box::new(r.plan),
            expect: r.expect.map(Box::new),
        },
    ]
}

/// The update is done: the record forgets the attempt, the stage and the approval ask, and
/// `Done` is reported with `Applied`.
fn booted(record: Record, image: &str) -> Vec<Effect> {
    vec![
        Effect::SaveAttempt {
            record: Box::new(Record {
                attempt: None,
                staged: None,
                approval: None,
                ..record
            }),
            on_error: OnSaveError::Log("clearing the attempt record failed"),
        },
        Effect::SetState {
            state: State::Done,
            reason: String::new(),
            notice: Some(Notice::normal("Applied", format!("booted {image}"))),
        },
    ]
}

/// A rolled-back finalization is recorded as reported for this boot (so it is counted once),
/// then reported with `RolledBack`: tried again after a short wait while the attempts bound
/// allows, else refused until the request changes.
fn rolled_back(r: RolledBack) -> Vec<Effect> {
    let mut record = r.record;
    if let Some(a) = record.attempt.as_mut() {
        a.reported_boot = Some(r.boot_id);
    }
    let notice = Some(Notice::warning("RolledBack", r.reason.clone()));
    let save = Effect::SaveAttempt {
        record: Box::new(record),
        on_error: OnSaveError::Degrade,
    };
    if r.retry {
        vec![
            save,
            Effect::SetState {
                state: State::Degraded,
                reason: format!("{}; trying again", r.reason),
                notice,
            },
            Effect::Then(Box::new(Event::RetryAt(r.now + MIN_BACKOFF))),
        ]
    } else {
        vec![
            save,
            Effect::SetState {
                state: State::Refused,
                reason: format!(
                    "{}; giving up until the request changes; {TRY_AGAIN}",
                    r.reason
                ),
                notice,
            },
        ]
    }
}

/// The wait before retry `n` (from 1) of a staging that failed on the network: 10 s, doubling,
/// at most 5 minutes — long enough for a registry or DNS blip to pass.
pub(super) fn pull_retry_delay(n: u32) -> Duration {
    REGISTRY_BACKOFF.nth(n)
}
