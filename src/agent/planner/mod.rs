//! The planner: a pure function from what the node has and what the cluster asks to what to do.
//!
//! No I/O happens here; the agent gathers an [`Observation`] (`observation.rs`), asks
//! [`decide`] (`decide.rs`), and carries out the [`Decision`] (`decision.rs`). Every rule is
//! covered by the table tests (`tests/`).

mod decide;
mod decision;
mod observation;

pub use decide::{decide, reboot_token};
pub use decision::{Decision, Refusal, TRY_AGAIN};
pub use observation::{Lifecycle, Observation, foreign_staged};

#[cfg(test)]
mod tests;
