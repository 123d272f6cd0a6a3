//! Scheduling over the database: one pass ([`pass`]) and the read-only
//! questions asked of the same planner ([`explain`]). The policy itself is
//! the pure `gangway-sched` crate; what runs passes on a timer is
//! `loops/scheduler.rs`.

pub mod explain;
pub mod pass;

pub use explain::{dry_run, explain};
pub use pass::{run_partition_pass, run_pass, run_pass_with, PassOutcome, Phases};
