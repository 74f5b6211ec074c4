//! streamd: moves an image-based Linux node between OS image streams.
//!
//! The crate is grouped by concern, and each group uses only the groups listed before it:
//!
//! - [`text`], [`backoff`], [`config`] and [`notify`]: bounded text from outside, the one retry
//!   backoff, the configuration, systemd's notifications;
//! - [`image`]: image references, the registry, the extensions image, the pull secret, RPM names;
//! - [`backend`]: the backend-neutral deployment model and plan, and the rpm-ostree and bootc
//!   clients that read and stage deployments;
//! - [`host`]: host facts, the on-disk verification of a staged deployment, the attempt record;
//! - [`cluster`]: the annotation protocol, the Node client, OSImageStream, the typed status and
//!   its reporting;
//! - [`dbus_api`] and [`logging`]: what the host's admin sees (streamctl, the journal);
//! - [`agent`]: the loop, the planner (pure decisions), preflight, staging and the reboot.
//!
//! `tests/layout.rs` keeps the dependencies pointing that one way.

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

pub mod backoff;
pub mod text;

pub mod config;
pub mod notify;

pub mod image;

pub mod backend;

pub mod host;

pub mod cluster;

pub mod dbus_api;
pub mod logging;

pub mod agent;
