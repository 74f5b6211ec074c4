//! streamd-rollout: the cluster-side half of streamd. It moves the nodes of a `StreamPool`
//! between OS image streams a few at a time through the node annotation protocol
//! (docs/protocol.md): it gives nodes the target, lets staging run ahead, and for each node that
//! asks for a reboot cordons it, drains it through the Eviction API, approves the exact token,
//! waits for `Done` and Ready, and uncordons it.
//!
//! - [`crd`]: the `StreamPool` resource;
//! - [`node`]: what the controller reads of a Node, and its own progress mark;
//! - [`selection`]: which pool a node belongs to (the machine-config operator's rule), pure;
//! - [`planner`]: the reconcile decisions, pure;
//! - [`waves`]: the order nodes are taken in, holds, soak and canary, pure;
//! - [`window`]: maintenance windows, pure;
//! - [`status`]: the pool's status from the planner's summary;
//! - [`drain`]: the Eviction API drain;
//! - [`events`]: the Events an admin follows a rollout by;
//! - [`controller`]: the kube-runtime controller, target resolution and the Node patches;
//! - [`leader`]: leader election on a Lease;
//! - [`metrics`]: Prometheus metrics, `/healthz` and `/readyz`;
//! - [`heartbeat`]: the nodes' streamd heartbeat Leases.

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

pub mod crd;
pub mod node;
pub mod planner;
pub mod selection;
pub mod status;
pub mod waves;
pub mod window;

pub mod drain;
pub mod events;
pub mod heartbeat;

pub mod controller;
pub mod leader;
pub mod metrics;
