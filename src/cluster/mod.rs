//! The cluster side: the node annotation protocol, the Node client and its Events, the cluster's
//! OSImageStream and what the machine-config operator makes of it, the image policy that judges what the cluster asks for, the typed status and
//! the patches that report it.

pub mod heartbeat;
pub mod mco;
pub mod node;
pub mod policy;
pub mod protocol;
pub mod report;
pub mod status;
pub mod streams;
