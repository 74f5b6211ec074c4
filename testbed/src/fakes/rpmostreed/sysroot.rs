//! `org.projectatomic.rpmostree1.Sysroot` at `/org/projectatomic/rpmostree1/Sysroot`.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::info;
use zbus::fdo;
use zbus::interface;
use zbus::message::Header;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

use super::errors::DaemonError;
use super::vardict::VarDict;
use super::{Daemon, lock, model};

/// The Sysroot object.
pub(crate) struct SysrootIface {
    daemon: Arc<Daemon>,
}

impl SysrootIface {
    pub(crate) fn new(daemon: Arc<Daemon>) -> Self {
        SysrootIface { daemon }
    }
}

fn sender_of(hdr: &Header<'_>) -> String {
    hdr.sender().map(|s| s.to_string()).unwrap_or_default()
}

fn object_path(path: String) -> Result<OwnedObjectPath, DaemonError> {
    OwnedObjectPath::try_from(path).map_err(|e| DaemonError::GioFailed(e.to_string()))
}

#[interface(name = "org.projectatomic.rpmostree1.Sysroot")]
impl SysrootIface {
    /// Register the caller (option `id`, `s`); it is forgotten when it leaves the bus.
    async fn register_client(
        &self,
        options: VarDict,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<(), DaemonError> {
        let id = options.str("id")?;
        let sender = sender_of(&hdr);
        info!(sender = %sender, id = ?id, "client registered");
        lock(&self.daemon.clients).insert(sender, id);
        Ok(())
    }

    /// Forget the caller's registration.
    async fn unregister_client(
        &self,
        options: VarDict,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<(), DaemonError> {
        // No options are defined; the argument is only type-checked by the signature.
        drop(options);
        lock(&self.daemon.clients).remove(&sender_of(&hdr));
        Ok(())
    }

    /// Reload the deployments if `state.json` changed behind the daemon's back.
    async fn reload(&self) -> Result<(), DaemonError> {
        self.reload_state().await
    }

    /// Like `Reload`; the fake has no configuration files to re-read.
    async fn reload_config(&self) -> Result<(), DaemonError> {
        self.reload_state().await
    }

    /// The object path of an OS. `""` (meant as the booted one) kills the real daemon:
    /// v2025.5 … v2026.2 `handle_get_os` completes the call and returns FALSE, so the generated
    /// code answers the freed invocation again (SIGSEGV, seen on the real daemon); the caller
    /// gets the bus's `NoReply` and a restarted daemon knows no clients.
    #[zbus(name = "GetOS", out_args("object_path"))]
    async fn get_os(&self, name: &str) -> Result<OwnedObjectPath, DaemonError> {
        if name.is_empty() {
            tracing::warn!("GetOS(\"\") crashes rpm-ostreed (SIGSEGV in handle_get_os)");
            lock(&self.daemon.clients).clear();
            return Err(DaemonError::NoReply(
                "Message recipient disconnected from message bus without replying".into(),
            ));
        }
        if name == self.daemon.osname {
            return object_path(self.daemon.os_path.clone());
        }
        Err(DaemonError::GioNotFound(format!(
            "OS name \"{name}\" not found"
        )))
    }

    /// Path of the booted OS object, or `/`.
    #[zbus(property)]
    fn booted(&self) -> fdo::Result<OwnedObjectPath> {
        OwnedObjectPath::try_from(self.booted_path()).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// The sysroot path.
    #[zbus(property)]
    fn path(&self) -> String {
        "/".into()
    }

    /// (method-name, sender-name, object path) of the active transaction.
    #[zbus(property)]
    fn active_transaction(&self) -> (String, String, String) {
        match lock(&self.daemon.active).as_ref() {
            Some(txn) => (txn.method.clone(), txn.sender.clone(), txn.os_path.clone()),
            None => (String::new(), String::new(), String::new()),
        }
    }

    /// The D-Bus address of the active transaction.
    #[zbus(property)]
    fn active_transaction_path(&self) -> String {
        lock(&self.daemon.active)
            .as_ref()
            .map(|t| t.address.clone())
            .unwrap_or_default()
    }

    /// Automatic updates are off, as on an OpenShift node.
    #[zbus(property)]
    fn automatic_update_policy(&self) -> String {
        "none".into()
    }

    /// All deployments in boot order.
    #[zbus(property)]
    fn deployments(&self) -> fdo::Result<Vec<HashMap<String, OwnedValue>>> {
        lock(&self.daemon.state)
            .deployments
            .iter()
            .map(|d| self.daemon.dict_of(d))
            .collect::<Result<_, _>>()
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }
}

impl SysrootIface {
    fn booted_path(&self) -> String {
        match lock(&self.daemon.state).booted() {
            Some(d) => model::os_object_path(&d.osname),
            None => "/".into(),
        }
    }

    async fn reload_state(&self) -> Result<(), DaemonError> {
        let changed = self
            .daemon
            .reload_state()
            .map_err(|e| DaemonError::GioFailed(format!("Handling reload: {e:#}")))?;
        if changed {
            info!("deployment state changed on disk; reloaded");
            self.daemon.notify_deployments().await;
        }
        Ok(())
    }
}
