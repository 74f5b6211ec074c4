//! The host side: facts read from the host root, the on-disk verification of a staged
//! deployment, the attempt record kept across restarts and reboots, and the bootloader update
//! before a major move.

pub mod attempt;
pub mod bootloader;
pub mod facts;
pub mod ospull;
pub mod sigpolicy;
pub mod verify;
