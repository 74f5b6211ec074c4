//! The streamd testbed: a private real `dbus-daemon`, a fake `rpm-ostreed` and a
//! fake Kubernetes API server, started together so that the real `streamd`,
//! `streamctl` and `kubectl` binaries can run against them.
//!
//! The contract every component follows is written down in `docs/testbed.md`.

pub mod apiserver;
pub mod bench;
pub mod bootc;
pub mod bus;
mod dbus_error;
pub mod fixtures;
pub mod fleet;
pub mod host;
pub mod images;
pub mod logind;
pub mod registry;
pub mod rpmostreed;
pub mod systemd;
pub mod testbed;

pub use fleet::{Fleet, FleetOptions};
pub use testbed::{Backend, NODE_NAME, Options, Testbed};
