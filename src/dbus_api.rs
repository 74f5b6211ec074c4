//! streamd's own D-Bus API: `io.openshift.OSStream1` at `/io/openshift/OSStream1`.
//!
//! Read-only properties mirror [`Status`]; `PropertiesChanged` is emitted for what changed.
//! `streamctl` reads the `Status` property (the JSON document of `streamctl status --json`).

use std::collections::HashMap;

use tokio::sync::mpsc;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::Value;

use crate::cluster::status::{SCHEMA_VERSION, Status, StatusDocument};
use crate::text::one_line_reason;

/// Well-known bus name.
pub const BUS_NAME: &str = "io.openshift.OSStream1";
/// Object path.
pub const OBJECT_PATH: &str = "/io/openshift/OSStream1";
/// Interface name.
pub const INTERFACE: &str = "io.openshift.OSStream1";

/// Requests the daemon receives over D-Bus.
#[derive(Debug)]
pub enum Request {
    /// Re-evaluate now.
    Reconcile,
    /// Run the preflight checks (and build the plan) for a request without acting on it.
    Preflight {
        /// The request's input annotations (`desired-stream`, `desired-os-image`,
        /// `desired-extensions-image` keys without prefix); empty: the node's current request.
        inputs: HashMap<String, String>,
        /// Where the JSON answer goes.
        reply: tokio::sync::oneshot::Sender<String>,
    },
}

/// Longest a `Preflight`/`Plan` call waits for the daemon (registry inspection included).
const PREFLIGHT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The exported object.
#[derive(Debug)]
pub struct OSStream1 {
    /// Behind its own lock, never held across an await: the agent publishes with the
    /// interface's shared lock, so a method call that awaits (`Preflight`, up to 120 s) never
    /// holds up the loop, and with it the watchdog.
    status: std::sync::Mutex<Status>,
    requests: mpsc::Sender<Request>,
}

impl OSStream1 {
    /// The status published last.
    fn current(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Property name → value, for diffing and `PropertiesChanged`.
fn properties(s: &Status) -> Vec<(&'static str, Value<'static>)> {
    let opt = |v: &Option<String>| Value::from(v.clone().unwrap_or_default());
    vec![
        ("Node", Value::from(s.node.clone())),
        ("State", Value::from(s.state.to_string())),
        ("Reason", Value::from(one_line_reason(&s.reason))),
        ("Progress", Value::U32(s.progress_value())),
        ("CurrentStream", Value::from(s.current_stream.clone())),
        ("CurrentOsImage", Value::from(s.current_os_image.clone())),
        ("StagedOsImage", opt(&s.staged_os_image)),
        ("DesiredStream", opt(&s.desired_stream)),
        ("DesiredOsImage", opt(&s.desired_os_image)),
        ("DesiredExtensionsImage", opt(&s.desired_extensions_image)),
        ("ObservedDesired", opt(&s.observed_desired)),
        ("Host", Value::from(s.host_json())),
        ("Backend", Value::from(s.backend_name())),
        ("LastChange", Value::U64(s.last_change)),
        ("Status", Value::from(status_json(s))),
    ]
}

/// The `streamctl status --json` document for `s`.
///
/// The reason and last error come from outside (registries, rpm-ostreed, bootc): they go out
/// as one inert line, as everywhere else ([`crate::text::one_line`]).
pub fn status_json(s: &Status) -> String {
    let mut status = s.clone();
    status.reason = one_line_reason(&s.reason);
    status.last_error = s.last_error.as_deref().map(one_line_reason);
    serde_json::to_string(&StatusDocument {
        schema_version: SCHEMA_VERSION,
        status,
    })
    .unwrap_or_default()
}

#[zbus::interface(name = "io.openshift.OSStream1")]
impl OSStream1 {
    /// Asks the daemon to re-read the node, rpm-ostree and the host and act on them now.
    async fn reconcile(&self) -> zbus::fdo::Result<()> {
        self.requests
            .try_send(Request::Reconcile)
            .map_err(|_| zbus::fdo::Error::LimitsExceeded("a reconcile is already queued".into()))
    }

    /// Runs every preflight check for a request (keys `stream`, `os-image`, `extensions-image`;
    /// an empty dictionary checks the node's current request) without changing anything.
    /// Returns JSON: `{"checks":[{"id","result","message"}…],"plan":{"modifiers","options"}|null}`
    /// or `{"error": "…"}`.
    async fn preflight(&self, inputs: HashMap<String, String>) -> zbus::fdo::Result<String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.requests
            .send(Request::Preflight { inputs, reply })
            .await
            .map_err(|_| zbus::fdo::Error::Failed("the daemon is stopping".into()))?;
        match tokio::time::timeout(PREFLIGHT_TIMEOUT, rx).await {
            Ok(Ok(json)) => Ok(json),
            Ok(Err(_)) => Err(zbus::fdo::Error::Failed(
                "the daemon dropped the request".into(),
            )),
            Err(_) => Err(zbus::fdo::Error::TimedOut(
                "preflight did not finish within 120 s".into(),
            )),
        }
    }

    /// Node name.
    #[zbus(property)]
    fn node(&self) -> String {
        self.current().node.clone()
    }
    /// Agent state (`Idle`, `Staging`, …).
    #[zbus(property)]
    fn state(&self) -> String {
        self.current().state.to_string()
    }
    /// One-line reason.
    #[zbus(property)]
    fn reason(&self) -> String {
        one_line_reason(&self.current().reason)
    }
    /// Staging progress, 0 unless `Staging`.
    #[zbus(property)]
    fn progress(&self) -> u32 {
        self.current().progress_value()
    }
    /// Booted stream.
    #[zbus(property)]
    fn current_stream(&self) -> String {
        self.current().current_stream.clone()
    }
    /// Booted image.
    #[zbus(property)]
    fn current_os_image(&self) -> String {
        self.current().current_os_image.clone()
    }
    /// Staged image, empty if none.
    #[zbus(property)]
    fn staged_os_image(&self) -> String {
        self.current().staged_os_image.clone().unwrap_or_default()
    }
    /// Requested stream.
    #[zbus(property)]
    fn desired_stream(&self) -> String {
        self.current().desired_stream.clone().unwrap_or_default()
    }
    /// Requested OS image.
    #[zbus(property)]
    fn desired_os_image(&self) -> String {
        self.current().desired_os_image.clone().unwrap_or_default()
    }
    /// Requested extensions image.
    #[zbus(property)]
    fn desired_extensions_image(&self) -> String {
        self.current()
            .desired_extensions_image
            .clone()
            .unwrap_or_default()
    }
    /// Hash of the request the state refers to.
    #[zbus(property)]
    fn observed_desired(&self) -> String {
        self.current().observed_desired.clone().unwrap_or_default()
    }
    /// Host facts as compact JSON.
    #[zbus(property)]
    fn host(&self) -> String {
        self.current().host_json()
    }
    /// Staging backend.
    #[zbus(property)]
    fn backend(&self) -> String {
        self.current().backend_name().to_string()
    }
    /// Unix time of the last state change.
    #[zbus(property)]
    fn last_change(&self) -> u64 {
        self.current().last_change
    }
    /// The whole status as the JSON document `streamctl status --json` prints.
    #[zbus(property)]
    fn status(&self) -> String {
        status_json(&self.current())
    }
}

/// Handle the agent uses to publish status.
pub struct Api {
    iface: zbus::object_server::InterfaceRef<OSStream1>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

impl Api {
    /// Exports the object on `conn` and takes the well-known name.
    pub async fn export(
        conn: &zbus::Connection,
        initial: Status,
        requests: mpsc::Sender<Request>,
    ) -> zbus::Result<Self> {
        let obj = OSStream1 {
            status: std::sync::Mutex::new(initial),
            requests,
        };
        conn.object_server().at(OBJECT_PATH, obj).await?;
        conn.request_name(BUS_NAME).await?;
        let iface = conn
            .object_server()
            .interface::<_, OSStream1>(OBJECT_PATH)
            .await?;
        Ok(Api { iface })
    }

    /// Publishes a new status, emitting `PropertiesChanged` for the properties that changed.
    pub async fn publish(&self, status: &Status) -> zbus::Result<()> {
        // The shared lock: a method call holding it across an await does not block this.
        let obj = self.iface.get().await;
        let before = std::mem::replace(&mut *obj.current(), status.clone());
        drop(obj);
        let before: HashMap<_, _> = properties(&before).into_iter().collect();
        let changed: HashMap<&str, Value<'_>> = properties(status)
            .into_iter()
            .filter(|(k, v)| before.get(k) != Some(v))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let emitter: &SignalEmitter<'_> = self.iface.signal_emitter();
        zbus::fdo::Properties::properties_changed(
            emitter,
            INTERFACE.try_into()?,
            changed,
            Default::default(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_and_status_go_out_as_one_inert_line() {
        let s = Status {
            reason: "refused: HTTP 400\nWATCHDOG=trigger\n\u{1b}[31mred\u{1b}[0m".into(),
            last_error: Some("x\r\nREADY=1".into()),
            ..Status::default()
        };
        let reason = properties(&s)
            .into_iter()
            .find(|(k, _)| *k == "Reason")
            .map(|(_, v)| v);
        assert_eq!(
            reason,
            Some(Value::from("refused: HTTP 400; WATCHDOG=trigger; red"))
        );
        let doc: serde_json::Value = serde_json::from_str(&status_json(&s)).expect("json");
        assert_eq!(doc["reason"], "refused: HTTP 400; WATCHDOG=trigger; red");
        assert_eq!(doc["lastError"], "x; READY=1");
    }
}
