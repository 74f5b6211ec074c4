//! `reconcile` against the mock API server of [`fixtures`](super::fixtures): each test runs one
//! named [`Scenario`] and checks what the reconcile returned; the verifier checks every request.

use super::fixtures::Scenario;
use super::*;

/// Reconciles the pool of `scenario` against it; panics where the requests differ.
async fn reconciled(scenario: Scenario) -> Result<Requeue, Error> {
    reconciled_with(scenario, Fence::none()).await
}

/// [`reconciled`], with the writes fenced by `fence`.
async fn reconciled_with(scenario: Scenario, fence: Fence) -> Result<Requeue, Error> {
    reconciled_after(scenario, fence, |_| {}).await
}

/// Held shared by every reconcile of these tests, and alone by [`the_span_names_the_pool`]: the
/// first reconcile on any test thread registers the span's callsite, and tracing-core computes
/// its interest from the dispatchers it saw when it began, so a registration racing that test's
/// `set_default` can leave the span disabled for good (seen on CI although the test rebuilds the
/// interest cache). No reconcile runs on another thread while that test does.
static RECONCILES: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// [`reconciled_with`], the context first given what `before` records (earlier passes).
async fn reconciled_after(
    scenario: Scenario,
    fence: Fence,
    before: impl FnOnce(&Context),
) -> Result<Requeue, Error> {
    let _shared = RECONCILES.read().await;
    reconcile_scenario(scenario, fence, before).await
}

/// [`reconciled_after`] without taking [`RECONCILES`].
async fn reconcile_scenario(
    scenario: Scenario,
    fence: Fence,
    before: impl FnOnce(&Context),
) -> Result<Requeue, Error> {
    let (ctx, server) =
        Context::fenced(scenario.others(), scenario.nodes(), scenario.pods(), fence);
    before(&ctx);
    let pool = Arc::new(scenario.pool());
    let verified = server.run(scenario);
    // `ctx` goes with the reconcile: the client's last clone dropped ends the scenario.
    let result = reconcile(pool, ctx).await;
    if let Err(e) = verified.await {
        std::panic::resume_unwind(e.into_panic());
    }
    result
}

#[tokio::test]
async fn create() {
    let r = reconciled(Scenario::Create).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

/// The `pool` field of every `reconcile` span opened while it is the default subscriber.
struct PoolSpans(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PoolSpans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Pool(Option<String>);
        impl tracing::field::Visit for Pool {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "pool" {
                    self.0 = Some(format!("{v:?}"));
                }
            }
        }
        if attrs.metadata().name() == "reconcile" {
            let mut pool = Pool(None);
            attrs.record(&mut pool);
            let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
            seen.push(pool.0.unwrap_or_default());
        }
    }
}

/// The reconcile's span carries the pool's name, so every line of the pass says which pool
/// (issue 22 §5).
#[tokio::test]
async fn the_span_names_the_pool() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let _alone = RECONCILES.write().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(PoolSpans(seen.clone()));
    let _default = tracing::subscriber::set_default(subscriber);
    // Another test's reconcile, run without a subscriber, may have cached the span's callsite as
    // never enabled: look again now that one is set and no reconcile is under way.
    tracing::callsite::rebuild_interest_cache();
    let name = Scenario::Create.pool().name_any();
    reconcile_scenario(Scenario::Create, Fence::none(), |_| {})
        .await
        .expect("reconcile");
    assert_eq!(*seen.lock().expect("spans"), [name]);
}

#[tokio::test]
async fn drain_blocked() {
    let r = reconciled(Scenario::DrainBlocked).await.expect("reconcile");
    assert_eq!(r, Requeue::requeue(DRAIN_RETRY));
}

#[tokio::test]
async fn drain_settings() {
    let r = reconciled(Scenario::DrainSettings)
        .await
        .expect("reconcile");
    // Evicted pods terminating: their deletion wakes the pool; the backstop bounds the wait.
    assert_eq!(
        r,
        Requeue::requeue(Duration::from_secs(drain::BACKSTOP_SECONDS))
    );
}

#[tokio::test]
async fn approval_conflict() {
    let r = reconciled(Scenario::ApprovalConflict)
        .await
        .expect("reconcile");
    // The node's change wakes the pool (the Node watch); nothing is due before the drain's
    // timeout (600 s from the draining mark, made within the last second).
    let timeout = |s| Requeue::requeue(Duration::from_secs(s));
    assert!(r == timeout(601) || r == timeout(600), "{r:?}");
}

#[tokio::test]
async fn overlap() {
    let r = reconciled(Scenario::Overlap).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

#[tokio::test]
async fn empty_selector() {
    let r = reconciled(Scenario::EmptySelector)
        .await
        .expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

#[tokio::test]
async fn release() {
    let r = reconciled(Scenario::Release).await.expect("reconcile");
    // w4 is still rebooting.
    assert_eq!(r, Requeue::requeue(DRAIN_RETRY));
}

#[tokio::test]
async fn release_conflict() {
    let r = reconciled(Scenario::ReleaseConflict)
        .await
        .expect("reconcile");
    assert_eq!(r, Requeue::requeue(DRAIN_RETRY));
}

#[tokio::test]
async fn deletion() {
    let r = reconciled(Scenario::Deletion).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

#[tokio::test]
async fn deletion_waits() {
    let r = reconciled(Scenario::DeletionWaits)
        .await
        .expect("reconcile");
    assert_eq!(r, Requeue::requeue(DRAIN_RETRY));
}

#[tokio::test]
async fn finalizer_conflict() {
    let r = reconciled(Scenario::FinalizerConflict)
        .await
        .expect("reconcile");
    assert_eq!(r, Requeue::requeue(CONFLICT_RETRY));
}

#[tokio::test]
async fn agent_silent() {
    let r = reconciled(Scenario::AgentSilent).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

#[tokio::test]
async fn mco_takeover() {
    let r = reconciled(Scenario::McoTakeover).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

/// The status write is conditional on the pool as cached: a 409 is looked at again soon,
/// from the cache the watch brings up to date, not failed and backed off.
#[tokio::test]
async fn status_conflict() {
    let r = reconciled(Scenario::StatusConflict)
        .await
        .expect("a 409 on the status is no failure");
    assert_eq!(r, Requeue::requeue(CONFLICT_RETRY));
}

/// Nothing to do: no request at all (the nodes come from the store, the status is as built).
#[tokio::test]
async fn idle() {
    let r = reconciled(Scenario::Idle).await.expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

/// A change of per-node progress only, a moment after the last status write: held back (no
/// request), looked at again once the interval is over.
#[tokio::test]
async fn progress_is_held_back() {
    let r = reconciled_after(Scenario::Progress, Fence::none(), |ctx| {
        let mut written = ctx.status_written.lock().expect("lock");
        written.insert("worker".into(), std::time::Instant::now());
    })
    .await
    .expect("reconcile");
    // The wait left of the interval (kube's `Action` does not show it).
    assert_ne!(r, Requeue::await_change(), "not looked at again");
}

/// The same change with no recent write is written at once (the verifier expects it once).
#[tokio::test]
async fn progress_is_written_once_the_interval_is_over() {
    let long_ago = std::time::Instant::now()
        .checked_sub(STATUS_INTERVAL)
        .expect("an instant");
    let r = reconciled_after(Scenario::ProgressWritten, Fence::none(), |ctx| {
        let mut written = ctx.status_written.lock().expect("lock");
        written.insert("worker".into(), long_ago);
    })
    .await
    .expect("reconcile");
    assert_eq!(r, Requeue::await_change());
}

/// A node whose stored copy predates the controller's own last write of it is not acted on
/// again: the pool is looked at again once the watch brings the write (here: no request).
#[tokio::test]
async fn a_stale_copy_is_not_acted_on() {
    let r = reconciled_after(Scenario::Stale, Fence::none(), |ctx| {
        // w1 is stored at resourceVersion 11; the controller's write returned 21.
        ctx.node_writes.wrote("w1", "21".into());
    })
    .await
    .expect("reconcile");
    assert_eq!(r, Requeue::requeue(STALE_RETRY));
}
