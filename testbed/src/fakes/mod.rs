//! The services a node talks to. The fakes own their real counterparts' D-Bus names and paths
//! (or serve the Kubernetes API) with the real signatures and errors, on a private real
//! `dbus-daemon` ([`bus`]); the registry is a real `docker-registry` holding the testbed's
//! images. Each is started on its own and knows nothing of the others except through what a
//! real host shares (the bus, the sysroot, the host root); [`crate::harness`] puts them
//! together.

pub mod apiserver;
pub mod bootc;
pub mod bus;
mod dbus_error;
mod local_thread;
pub mod logind;
pub mod registry;
pub mod rpmostreed;
pub mod systemd;
