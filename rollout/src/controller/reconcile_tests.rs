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
    let (ctx, server) = Context::fenced(scenario.others(), fence);
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
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(PoolSpans(seen.clone()));
    let _default = tracing::subscriber::set_default(subscriber);
    let name = Scenario::Create.pool().name_any();
    reconciled(Scenario::Create).await.expect("reconcile");
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

#[tokio::test]
async fn status_conflict() {
    let e = reconciled(Scenario::StatusConflict)
        .await
        .expect_err("a 409 on the status");
    match e {
        Error::Api {
            what,
            source: kube::Error::Api(s),
        } => {
            assert_eq!(what, "writing the status of pool worker");
            assert_eq!(s.code, 409);
        }
        other => panic!("not the status write's 409: {other}"),
    }
}

#[tokio::test]
async fn not_leader() {
    // A proof that ran out a moment ago.
    let (_tx, rx) = watch::channel(Some(tokio::time::Instant::now()));
    let e = reconciled_with(Scenario::NotLeader, Fence::from_channel(rx))
        .await
        .expect_err("no write without the lease");
    assert!(matches!(e, Error::NotLeader(_)), "{e}");
}
