//! The agent's sans-I/O core: what it is doing now ([`Activity`]), its retry and readiness
//! timers and their back-offs, and how each [`Event`] changes them.
//!
//! [`Core::handle`] takes an event and returns the [`Effect`]s the loop (`event_loop.rs`) then
//! executes: spawning the deployments read, aborting read-only work, cancelling the staging
//! transaction, publishing, reporting a retry, running a reconcile. Time is an input (every
//! event that arms a timer carries `now`), and so is randomness (the jitter of a registry
//! back-off), so a sequence of events gives the same effects every time: `core/tests.rs`
//! checks them as a table, without D-Bus, HTTP or files. What a step found (deployments,
//! preflight results) is acted on by the agent's handlers, which start the next step through
//! [`Event::Started`].

#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use crate::backoff::{Backoff, stretch};

/// First delay after a transient failure, and the short fixed waits.
pub(super) const MIN_BACKOFF: Duration = Duration::from_secs(1);
/// After a transient failure: 1 s doubling to 60 s.
const TRANSIENT_BACKOFF: Backoff = Backoff::new(MIN_BACKOFF, Duration::from_secs(60));
/// After a registry or DNS failure during preflight or readiness: 10 s doubling to 5 min.
pub(super) const REGISTRY_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
/// Checks whose input did not change are run again after this long.
pub(super) const READINESS_INTERVAL: Duration = Duration::from_secs(3600);

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
}

/// What the loop does for the core.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// The agent's activity, timers and back-offs.
#[derive(Debug)]
pub(super) struct Core {
    activity: Activity,
    retry_at: Option<Instant>,
    backoff: Backoff,
    registry_backoff: Backoff,
    spread_until: Option<(Instant, String)>,
    readiness_at: Option<Instant>,
    readiness_stale: bool,
    readiness_backoff: Backoff,
}

impl Default for Core {
    fn default() -> Self {
        Core {
            activity: Activity::Idle,
            retry_at: None,
            backoff: TRANSIENT_BACKOFF,
            registry_backoff: REGISTRY_BACKOFF,
            spread_until: None,
            readiness_at: None,
            readiness_stale: false,
            readiness_backoff: REGISTRY_BACKOFF,
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
            Event::Started(step) => {
                // A transaction starts from a decision on the latest request, and its end
                // decides again or reports: a reconcile asked for before it is not carried.
                let again = match self.activity {
                    _ if matches!(step, Step::Staging { .. }) => false,
                    Activity::Running { again, .. } | Activity::Settling { again } => again,
                    Activity::Idle => false,
                };
                self.activity = Activity::Running { step, again };
                Vec::new()
            }
            Event::Ended { now, failed } => {
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
            Event::Settled => match self.activity {
                Activity::Settling { again } => {
                    self.activity = Activity::Idle;
                    if again {
                        vec![Effect::Reconcile]
                    } else {
                        Vec::new()
                    }
                }
                _ => Vec::new(),
            },
            Event::Failed {
                now,
                retry,
                reason,
                jitter,
            } => self.fail(now, retry, reason, jitter),
            Event::Recovered(Retry::Transient) => {
                self.backoff.reset();
                Vec::new()
            }
            Event::Recovered(Retry::Registry) => {
                self.registry_backoff.reset();
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
            } => {
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
            Event::ReadinessDue => {
                self.readiness_at = None;
                self.readiness_stale = true;
                Vec::new()
            }
            Event::ReadinessStale => {
                self.readiness_stale = true;
                Vec::new()
            }
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

    /// Arms the retry timer after the back-off `retry`'s next delay.
    fn fail(&mut self, now: Instant, retry: Retry, reason: String, jitter: f64) -> Vec<Effect> {
        let delay = match retry {
            Retry::Transient => self.backoff.next_delay(),
            Retry::Registry => stretch(self.registry_backoff.next_delay(), jitter),
        };
        self.retry_at = Some(now + delay);
        vec![Effect::Retry {
            retry,
            reason,
            delay,
        }]
    }
}
