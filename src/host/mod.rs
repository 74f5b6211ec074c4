//! The host side: facts read from the host root, the on-disk verification of a staged
//! deployment, and the attempt record kept across restarts and reboots.

pub mod attempt;
pub mod facts;
pub mod ospull;
pub mod verify;
