//! What starts, wires and stops the fakes: a node's host (`node_host`: its private bus,
//! the D-Bus fakes, the host root and streamd's config), the single-node [`testbed`] and the
//! [`fleet`] around one API server and registry, the control socket, scratch directories.

mod cluster;
pub mod control_socket;
#[cfg(test)]
mod fixture_tests;
pub mod fleet;
pub mod host_root;
mod node_host;
pub mod testbed;
