//! A D-Bus error reply with any name, for the fakes of services whose errors live in several
//! namespaces (`org.freedesktop.DBus.Error.*`, `org.freedesktop.systemd1.*`, `System.Error.*`).

use zbus::message::{Header, Message};
use zbus::names::ErrorName;

/// `org.freedesktop.DBus.Error.InvalidArgs`.
pub(crate) const INVALID_ARGS: &str = "org.freedesktop.DBus.Error.InvalidArgs";
/// `org.freedesktop.DBus.Error.NotSupported`.
pub(crate) const NOT_SUPPORTED: &str = "org.freedesktop.DBus.Error.NotSupported";
/// `org.freedesktop.DBus.Error.Failed`.
pub(crate) const FAILED: &str = "org.freedesktop.DBus.Error.Failed";

/// An error reply: a D-Bus error name and its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub(crate) struct NamedError {
    /// The error name on the wire.
    pub(crate) name: &'static str,
    /// The message (the reply's single string argument).
    pub(crate) message: String,
}

impl NamedError {
    /// An error named `name` with `message`.
    pub(crate) fn new(name: &'static str, message: impl Into<String>) -> Self {
        NamedError {
            name,
            message: message.into(),
        }
    }
}

impl zbus::DBusError for NamedError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name())?.build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_static_str_unchecked(self.name)
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}
