//! The streamd testbed: a private real `dbus-daemon`, a fake `rpm-ostreed` and a
//! fake Kubernetes API server, started together so that the real `streamd`,
//! `streamctl` and `kubectl` binaries can run against them.
//!
//! The crate is grouped by what a part is:
//!
//! - [`fakes`]: the services a node talks to, each standing in for the real one (rpm-ostreed,
//!   kube-apiserver, systemd, logind, bootc), and the real ones the testbed runs privately (the
//!   system bus, the registry with the testbed's images);
//! - [`harness`]: what starts, wires and stops them: the single-node [`Testbed`], the
//!   [`Fleet`], the host root, the control socket;
//! - [`fixtures`]: plain data: the host fixtures, the image catalog, the packages;
//! - [`control`]: the control commands (`testbed ctl`, [`Testbed::control`]) as types;
//! - [`scratch`]: scratch directories for tests, short enough for the sockets inside;
//! - [`bench`]: `testbed bench`.
//!
//! The contract every component follows is written down in `docs/testbed.md`.

#![forbid(unsafe_code)]

pub mod bench;
pub mod control;
pub mod fakes;
pub mod fixtures;
pub mod harness;
pub mod loopback;
pub mod scratch;

pub use harness::fleet::{Fleet, FleetOptions};
pub use harness::testbed::{
    Backend, FeatureSet, NODE_NAME, OpenShift, Options, RpmOstreeVersion, Testbed,
};
