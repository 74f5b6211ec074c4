//! The D-Bus errors the fake returns, under the names the real daemon puts on the wire.
//!
//! Most method errors of the real daemon are plain `G_IO_ERROR` codes. GIO is not a
//! registered D-Bus error domain, so GDBus sends them as `UnmappedGError` names.

use zbus::message::{Header, Message};
use zbus::names::ErrorName;

const GIO_FAILED: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code0";
const GIO_NOT_FOUND: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code1";
const GIO_BUSY: &str = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code26";
const RPMOSTREED_FAILED: &str = "org.projectatomic.rpmostreed.Error.Failed";
const INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";
const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";

/// An error reply of a daemon method.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DaemonError {
    /// `G_IO_ERROR_FAILED`: what `glnx_throw` produces in the daemon.
    #[error("{0}")]
    GioFailed(String),
    /// `G_IO_ERROR_NOT_FOUND`, e.g. `GetOS` with an unknown name.
    #[error("{0}")]
    GioNotFound(String),
    /// `G_IO_ERROR_BUSY`: another transaction is active.
    #[error("{0}")]
    GioBusy(String),
    /// `org.projectatomic.rpmostreed.Error.Failed`, the daemon's own registered error.
    #[error("{0}")]
    Failed(String),
    /// `org.freedesktop.DBus.Error.InvalidArgs`: an argument has the wrong variant type.
    #[error("{0}")]
    InvalidArgs(String),
    /// `org.freedesktop.DBus.Error.AccessDenied`: polkit refused the method.
    #[error("{0}")]
    AccessDenied(String),
    /// `org.freedesktop.DBus.Error.NoReply`: what the bus tells a caller whose call killed the
    /// daemon.
    #[error("{0}")]
    NoReply(String),
}

impl DaemonError {
    fn static_name(&self) -> &'static str {
        match self {
            DaemonError::GioFailed(_) => GIO_FAILED,
            DaemonError::GioNotFound(_) => GIO_NOT_FOUND,
            DaemonError::GioBusy(_) => GIO_BUSY,
            DaemonError::Failed(_) => RPMOSTREED_FAILED,
            DaemonError::InvalidArgs(_) => INVALID_ARGS,
            DaemonError::AccessDenied(_) => ACCESS_DENIED,
            DaemonError::NoReply(_) => "org.freedesktop.DBus.Error.NoReply",
        }
    }

    fn message(&self) -> &str {
        match self {
            DaemonError::GioFailed(m)
            | DaemonError::GioNotFound(m)
            | DaemonError::GioBusy(m)
            | DaemonError::Failed(m)
            | DaemonError::InvalidArgs(m)
            | DaemonError::AccessDenied(m)
            | DaemonError::NoReply(m) => m,
        }
    }

    /// `name: message`, the form the transaction records keep.
    pub(crate) fn describe(&self) -> String {
        format!("{}: {}", self.static_name(), self.message())
    }
}

impl zbus::DBusError for DaemonError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name())?.build(&(self.message(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(self.static_name())
    }

    fn description(&self) -> Option<&str> {
        Some(self.message())
    }
}
