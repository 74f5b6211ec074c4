//! Fake systemd-logind: `org.freedesktop.login1` with `ListInhibitors` and `Reboot` of
//! `org.freedesktop.login1.Manager` at `/org/freedesktop/login1`, with the real signatures
//! (`a(ssssuu)`, `b`) and the real refusal when a `block` inhibitor covers `shutdown`
//! (`org.freedesktop.login1.BlockedByInhibitorLock`, systemd ≥ 257; older logind lets root
//! through after polkit, which is why clients check the inhibitors themselves). Inhibitors are
//! added and removed through the control socket; a reboot is recorded in the host model.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use serde_json::{Value as Json, json};
use tracing::info;
use zbus::{Connection, interface};

use crate::control::{InhibitMode, Inhibitor, LogindCmd};
use crate::fakes::dbus_error::NamedError;

/// logind's well-known bus name.
pub const BUS_NAME: &str = "org.freedesktop.login1";
/// The manager object.
pub const MANAGER_PATH: &str = "/org/freedesktop/login1";
const BLOCKED: &str = "org.freedesktop.login1.BlockedByInhibitorLock";

/// Records a requested reboot in the host model.
pub type RebootHook = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

struct Shared {
    inhibitors: Mutex<Vec<Inhibitor>>,
    reboots: Mutex<u32>,
    on_reboot: RebootHook,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake logind. Dropping it closes its bus connection.
pub struct FakeLogind {
    shared: Arc<Shared>,
    conn: Connection,
}

impl std::fmt::Debug for FakeLogind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeLogind").finish_non_exhaustive()
    }
}

impl FakeLogind {
    /// Connects to `bus_address`, exports the manager and owns `org.freedesktop.login1`;
    /// `on_reboot` runs for every accepted `Reboot`.
    pub async fn start(bus_address: &str, on_reboot: RebootHook) -> anyhow::Result<FakeLogind> {
        let shared = Arc::new(Shared {
            inhibitors: Mutex::new(Vec::new()),
            reboots: Mutex::new(0),
            on_reboot,
        });
        let conn = zbus::connection::Builder::address(bus_address)?
            .serve_at(
                MANAGER_PATH,
                ManagerIface {
                    shared: shared.clone(),
                },
            )?
            .name(BUS_NAME)?
            .build()
            .await
            .with_context(|| format!("connecting to {bus_address} as {BUS_NAME}"))?;
        info!("fake logind is on the bus");
        Ok(FakeLogind { shared, conn })
    }

    /// Runs one control command: `inhibit` (replies how many inhibitors there are), `release`
    /// (how many it removed), `inhibitors`, `reboots`.
    pub async fn control(&self, cmd: LogindCmd) -> anyhow::Result<Json> {
        Ok(match cmd {
            LogindCmd::Inhibit(inhibitor) => {
                let mut list = lock(&self.shared.inhibitors);
                list.push(inhibitor);
                json!(list.len())
            }
            LogindCmd::Release { who } => {
                let mut list = lock(&self.shared.inhibitors);
                let before = list.len();
                list.retain(|i| i.who != who);
                json!(before - list.len())
            }
            LogindCmd::Inhibitors => serde_json::to_value(&*lock(&self.shared.inhibitors))?,
            LogindCmd::Reboots => json!(*lock(&self.shared.reboots)),
        })
    }
}

impl Drop for FakeLogind {
    fn drop(&mut self) {
        let conn = self.conn.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = conn.close().await;
            });
        }
    }
}

/// `org.freedesktop.login1.Manager`.
struct ManagerIface {
    shared: Arc<Shared>,
}

#[interface(name = "org.freedesktop.login1.Manager")]
impl ManagerIface {
    /// `(what, who, why, mode, uid, pid)` of every inhibitor.
    async fn list_inhibitors(&self) -> Vec<(String, String, String, String, u32, u32)> {
        lock(&self.shared.inhibitors)
            .iter()
            .map(|i| {
                (
                    i.what.clone(),
                    i.who.clone(),
                    i.why.clone(),
                    i.mode.as_str().to_string(),
                    i.uid,
                    i.pid,
                )
            })
            .collect()
    }

    /// Reboots, unless a `block` inhibitor covers `shutdown`.
    async fn reboot(&self, interactive: bool) -> Result<(), NamedError> {
        let blocked = lock(&self.shared.inhibitors)
            .iter()
            .any(|i| i.mode == InhibitMode::Block && i.what.split(':').any(|w| w == "shutdown"));
        if blocked {
            return Err(NamedError::new(
                BLOCKED,
                "Operation denied due to active block inhibitor",
            ));
        }
        (self.shared.on_reboot)()
            .map_err(|e| NamedError::new(crate::fakes::dbus_error::FAILED, e))?;
        *lock(&self.shared.reboots) += 1;
        info!(interactive, "reboot requested");
        Ok(())
    }
}
