//! The handle of the running step (the one the core's `Activity::Running` names): work in a
//! task, or the staging transaction with its progress and cancel channels.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::work::Outcome;
use crate::backend::BackendError;
use crate::backend::rpmostree::{RpmOstreeError, TxnEvent};

/// The task or transaction of the running step: what the core's `Activity::Running` says
/// runs, as a handle.
pub(super) enum Task {
    /// Work in a task (see `work.rs`).
    Work(JoinHandle<Outcome>),
    /// The staging transaction.
    Staging(Staging),
}

impl Task {
    /// Starts `work` in a task.
    pub(super) fn spawn(work: impl std::future::Future<Output = Outcome> + Send + 'static) -> Task {
        Task::Work(tokio::spawn(work))
    }

    /// Stops work that changes nothing (reading, preflight, readiness).
    pub(super) fn abort(self) {
        if let Task::Work(handle) = self {
            handle.abort();
        }
    }

    /// Asks the staging transaction to stop; rpm-ostreed reports its end.
    pub(super) fn cancel(&self) {
        if let Task::Staging(s) = self {
            let _ = s.cancel.send(true);
        }
    }
}

/// Waits for the running step's next event: the transaction's progress or end, or the work's
/// end (then `task` is cleared); pending when nothing runs. `step` names the work in the error
/// of a task that panicked.
pub(super) async fn next(task: &mut Option<Task>, step: &'static str) -> TaskEvent {
    match task {
        None => std::future::pending().await,
        Some(Task::Staging(s)) => TaskEvent::Staging(staging_event(s).await),
        Some(Task::Work(handle)) => {
            let done = handle.await.map_err(|source| TaskFailed { step, source });
            *task = None;
            TaskEvent::Work(done)
        }
    }
}

/// What the running step did.
pub(super) enum TaskEvent {
    /// The staging transaction progressed or ended.
    Staging(StagingEvent),
    /// Work ended (`Err`: its task failed).
    Work(Result<Outcome, TaskFailed>),
}

/// The running staging transaction.
pub(super) struct Staging {
    /// What the staged deployment must look like, and the digest the request pins.
    pub(super) expect: Option<(crate::host::verify::Expectation, String)>,
    pub(super) task: JoinHandle<Result<(), BackendError>>,
    pub(super) progress: mpsc::Receiver<TxnEvent>,
    /// Set to true to cancel the transaction.
    pub(super) cancel: tokio::sync::watch::Sender<bool>,
}

/// Something the staging transaction did.
pub(super) enum StagingEvent {
    /// Progress to report.
    Progress(TxnEvent),
    /// The transaction ended.
    Finished(Result<(), BackendError>),
}

/// Waits for the running transaction's next progress event or its end; progress queued before
/// the end is delivered first.
pub(super) async fn staging_event(s: &mut Staging) -> StagingEvent {
    tokio::select! {
        biased;
        Some(ev) = s.progress.recv() => StagingEvent::Progress(ev),
        res = &mut s.task => StagingEvent::Finished(match res {
            Ok(r) => r,
            Err(e) => Err(RpmOstreeError::Protocol(format!("staging task failed: {e}")).into()),
        }),
    }
}

/// A task of work that panicked (or was aborted).
#[derive(Debug, thiserror::Error)]
#[error("{step} task failed: {source}")]
pub(super) struct TaskFailed {
    /// The step it ran (`core::Step::label`).
    pub(super) step: &'static str,
    pub(super) source: tokio::task::JoinError,
}

impl TaskFailed {
    /// A stable name for logs.
    pub(super) fn label(&self) -> &'static str {
        "task_failed"
    }
}
