//! systemd's manager over D-Bus, the part streamd uses: transient units for bootc
//! ([`crate::backend::bootc`]) and `StartUnit` for the bootloader update
//! (`src/host/bootloader.rs`). A job's end comes as `JobRemoved`, broadcast only to
//! subscribed clients (systemd/systemd:src/core/dbus-manager.c, org.freedesktop.systemd1(5)).

use std::time::Duration;

use futures::StreamExt as _;
use zbus::zvariant::OwnedObjectPath;

/// systemd's answer to a second `Subscribe` of the same client.
pub const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";

/// `org.freedesktop.systemd1.Manager`.
// The proxy macro generates the `JobRemoved` signal's argument struct and accessors, which it
// cannot document: the proxy lives in a module of its own that allows that.
#[allow(missing_docs)]
mod manager {
    use zbus::zvariant::{OwnedObjectPath, Value};

    #[zbus::proxy(
        interface = "org.freedesktop.systemd1.Manager",
        default_service = "org.freedesktop.systemd1",
        default_path = "/org/freedesktop/systemd1"
    )]
    pub trait Manager {
        /// Creates and starts a transient unit; returns the start job.
        fn start_transient_unit(
            &self,
            name: &str,
            mode: &str,
            properties: &[(&str, Value<'_>)],
            aux: &[(&str, &[(&str, Value<'_>)])],
        ) -> zbus::Result<OwnedObjectPath>;
        /// Starts a unit from its unit file; returns the start job.
        fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
        /// Asks for the manager's signals.
        fn subscribe(&self) -> zbus::Result<()>;
        /// The object path of a loaded unit.
        fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
        /// A job ended: `done`, `canceled`, `timeout`, `failed`, `dependency` or `skipped`.
        #[zbus(signal)]
        fn job_removed(
            &self,
            id: u32,
            job: OwnedObjectPath,
            unit: String,
            result: String,
        ) -> zbus::Result<()>;
    }
}
pub use manager::{JobRemovedStream, ManagerProxy};

/// `org.freedesktop.systemd1.Unit`.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Unit {
    /// Drops the reference `AddRef` took.
    fn unref(&self) -> zbus::Result<()>;
    /// `active`, `activating`, `inactive`, `failed`, …
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    /// The unit's description.
    #[zbus(property)]
    fn description(&self) -> zbus::Result<String>;
}

/// `org.freedesktop.systemd1.Service`.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Service {
    /// `success`, `exit-code`, `signal`, `timeout`, …
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
    /// The main process's exit status (or signal).
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
}

/// The `JobRemoved` stream, set up (and the client subscribed) before any job is queued, so a
/// job's end cannot be missed.
pub async fn job_watch(
    manager: &ManagerProxy<'_>,
) -> Result<JobRemovedStream, (&'static str, zbus::Error)> {
    let removed = manager
        .receive_job_removed()
        .await
        .map_err(|e| ("AddMatch", e))?;
    match manager.subscribe().await {
        Ok(()) => Ok(removed),
        Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == ALREADY_SUBSCRIBED => {
            Ok(removed)
        }
        Err(e) => Err(("Subscribe", e)),
    }
}

/// How waiting for a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// `JobRemoved` came with this result.
    Removed(String),
    /// The bus connection closed first.
    Closed,
    /// It did not come within the limit.
    TimedOut,
}

/// Waits up to `limit` for `job`'s `JobRemoved`.
pub async fn wait_job(
    removed: &mut JobRemovedStream,
    job: &OwnedObjectPath,
    limit: Duration,
) -> JobEnd {
    let waited = tokio::time::timeout(limit, async {
        while let Some(signal) = removed.next().await {
            let Ok(args) = signal.args() else { continue };
            if args.job.as_str() == job.as_str() {
                return JobEnd::Removed(args.result);
            }
        }
        JobEnd::Closed
    })
    .await;
    waited.unwrap_or(JobEnd::TimedOut)
}
