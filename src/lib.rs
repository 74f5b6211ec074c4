//! streamd: moves an image-based Linux node between OS image streams.
//!
//! Modules by concern: [`protocol`] (node annotations), [`imageref`] (pinned image references),
//! [`config`], [`hostfacts`], [`planner`] (pure decisions), [`rpmostree`] (the D-Bus client),
//! [`kubeclient`] (the Node and its Events), [`report`] (annotation patches), [`status`] (the
//! typed status), [`dbus_api`] (streamd's own D-Bus API) and [`agent`] (the loop).

pub mod agent;
pub mod attempt;
pub mod backend;
pub mod bootc;
pub mod config;
pub mod dbus_api;
pub mod extensions;
pub mod gather;
pub mod hostfacts;
pub mod imageref;
pub mod kubeclient;
pub mod logging;
pub mod planner;
pub mod preflight;
pub mod protocol;
pub mod pullsecret;
pub mod registry;
pub mod report;
pub mod rpmostree;
pub mod status;
pub mod streams;
pub mod verify;
