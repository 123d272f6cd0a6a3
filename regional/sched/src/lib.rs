//! Gangway's scheduler core: a pure function from a [`Snapshot`] of one
//! region (nodes, free GPUs, queue, quotas, usage) to a [`Plan`] (which units
//! start where, and why the others wait).
//!
//! No async, no I/O, no clock, no randomness: the same snapshot always gives
//! the same plan, so the regional service and the trace simulator share it
//! and a bug reproduces from a saved snapshot.
//!
//! # Layout
//! - [`types`]: the input and output data ([`Snapshot`], [`Request`],
//!   [`Plan`], [`Placement`], [`WaitReason`], [`Level`]).
//! - `plan.rs`: [`plan`], one greedy pass in queue order (priority, then age):
//!   quota check, then the lowest topology level with a domain that fits,
//!   best fit within it.
//! - `index.rs`: the per-pass indexes `plan` builds once: per GPU type a
//!   spine → leaf → NVLink domain → node tree whose free counts and
//!   free-count histograms placements update incrementally.
//! - `apply.rs`: [`apply`], the snapshot a plan leaves behind (simulator, tests).
//!
//! # Placement rules
//! 1. Units go in queue order: priority descending, then `seq`, job id, first rank.
//! 2. A unit is placed whole or not at all; every worker is one process on one
//!    node with `gpus_per_worker` GPUs, the lowest free indices of that node.
//! 3. Level: the lowest of NVLink domain, leaf, spine, region (not above
//!    `required`) where one domain can hold every worker. Among those domains,
//!    the best fit: fewest free GPUs of the type, then lowest id, so large
//!    free blocks stay whole.
//! 4. Inside the domain, recursively per child: if a child can take all the
//!    remaining workers, the smallest such child takes them; otherwise the
//!    largest child (lowest id on ties) is filled and the rest goes on.
//! 5. Ranks follow topology order, so ranks on one node are contiguous.
//! 6. A unit that does not fit waits (with a [`WaitReason`]) and the pass goes
//!    on; reservations and backfill are not part of this version.

mod apply;
mod index;
mod plan;
pub mod types;

pub use apply::apply;
pub use plan::plan;
pub use types::{
    Level, Node, ParseLevelError, Placement, Plan, Policy, PolicyKind, Request, Reservation,
    Running, Snapshot, WaitReason, Waiting, WorkerPlacement,
};
