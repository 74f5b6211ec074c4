//! Work on libostree objects, which are not `Sync`: it runs on a thread of its own with a
//! single-threaded runtime, as a blocking task of the caller's.

use std::future::Future;

use anyhow::Context as _;

/// Runs the future `make` returns on a blocking thread with a current-thread runtime; `what`
/// names the work in errors.
pub(crate) async fn run<T, Fut>(
    what: &'static str,
    make: impl FnOnce() -> Fut + Send + 'static,
) -> anyhow::Result<T>
where
    T: Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
{
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .with_context(|| format!("starting the runtime of {what}"))?
            .block_on(make())
    })
    .await
    .with_context(|| format!("the task of {what}"))?
}
