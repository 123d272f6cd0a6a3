//! Gangway's scheduler core: a pure function from a [`Snapshot`] of one
//! region (nodes, free GPUs, queue, quotas, usage, running units and their
//! expected ends) to a [`Plan`] (which units start where, which waiting
//! units hold reservations, and why the others wait).
//!
//! No async, no I/O, no clock, no randomness: the same snapshot always gives
//! the same plan, so the regional service and the trace simulator share it
//! and a bug reproduces from a saved snapshot. Time comes in as
//! [`Snapshot::now`].
//!
//! # Layout
//! - [`types`]: the input and output data ([`Snapshot`], [`Request`],
//!   [`Running`], [`Policy`], [`PolicyKind`], [`Plan`], [`Placement`],
//!   [`Reservation`], [`WaitReason`], [`Level`]).
//! - `plan.rs`: [`plan`]: queue order, quotas, the rounds of a pass, and
//!   FIFO's first fit.
//! - `partition.rs`: scheduling partitions, one per GPU type
//!   ([`Snapshot::partition`], [`plan_partitioned`]: every type's pool
//!   planned at once, one thread each).
//! - [`capacity`]: capacity reservations' admission: whether N GPUs in one
//!   domain of a level can be promised for a window, where, or the
//!   earliest window that could.
//! - `power.rs`: rack power budgets: only the free GPUs a rack's
//!   remaining budget can feed are visible to a pass.
//! - `fair.rs`: Gangway's fair queue order (guarantees, weighted dominant
//!   share with decayed history).
//! - `preempt.rs`: which running units to preempt for waiting ones.
//! - `backfill.rs`: the per-GPU-type state of a pass and the Slurm-like and
//!   Gangway decisions: start, reserve, or wait (held GPUs, views, holds).
//! - `timeline.rs`: when a unit that does not fit now could start, replayed
//!   from expected ends, and on which GPUs.
//! - `place.rs`: where a unit goes now: best fit (lowest level, tightest
//!   domain) and first fit in node-id order.
//! - `index.rs`: the per-pass indexes: per GPU type a spine → leaf → NVLink
//!   domain → node tree whose free counts and free-count histograms update
//!   incrementally, in both directions; and, for placing by end, the busy
//!   nodes by free count and horizon.
//! - `apply.rs`: [`apply`], the snapshot a plan leaves behind (simulator, tests).
//!
//! # Placement rules
//! Common to every discipline:
//! 1. A unit is placed whole or not at all; every worker is one process on one
//!    node with `gpus_per_worker` GPUs, the lowest free indices of that node.
//! 2. A unit that would take its tenant past its quota for the type waits
//!    ([`WaitReason::OverQuota`]); quotas count what the pass has started,
//!    and (Slurm-like, Gangway) what it has reserved.
//! 3. Units that cannot start wait with a [`WaitReason`]; the pass goes on.
//!    A placement's `level` is the lowest level one domain of which holds
//!    every worker.
//!
//! **Best fit** (Slurm-like and Gangway starts, and where a reservation sits):
//! the lowest of NVLink domain, leaf, spine, region (not above `required`)
//! where one domain can hold every worker; among those domains the fewest
//! free GPUs of the type, then the lowest id, so large free blocks stay
//! whole. Inside the domain, recursively per child: if a child can take all
//! the remaining workers, the smallest such child takes them; otherwise the
//! largest child (lowest id on ties) is filled and the rest goes on. Ranks
//! follow topology order.
//!
//! [`PolicyKind::FifoFirstFit`] (a plain Kubernetes setup):
//! - Queue order: `seq` (arrival), then job id and ranks; priority ignored.
//! - First fit, blind to topology: walk the schedulable nodes of the type in
//!   node-id order, taking as many workers from each as fit, until the unit
//!   is complete; ranks follow that order. `required` is ignored (waits say
//!   `required: region`). No reservations: what does not fit is skipped.
//!
//! [`PolicyKind::SlurmBackfill`] (Slurm-like, EASY backfill, each GPU type
//! its own partition):
//! - Queue order: priority descending, then `seq`, job id, first rank.
//! - A unit that fits now starts (best fit). The first unit of its type that
//!   does not gets a reservation ([`Plan::reservations`],
//!   [`WaitReason::Reserved`]): the earliest time it fits, replaying the
//!   future (running units free their GPUs at `max(expected_end, now)`;
//!   units this pass starts at now + estimate; an estimate of 0 or an
//!   `expected_end` of `u64::MAX` never frees), and the best-fit GPUs at
//!   that time. A unit whose start no known end allows gets none and does
//!   not use up the type's reservation.
//! - The reservation's GPUs that are free now are held back. A later unit
//!   may use them only if it is expected to end by the reservation's start
//!   (now + estimate ≤ start; estimate 0 = unknown = never); otherwise it
//!   starts only where it uses none of them. A unit that would fit but for
//!   them waits as [`WaitReason::BlockedByReservation`]; otherwise
//!   [`WaitReason::NoCapacity`]. So a reservation is never delayed by
//!   backfill.
//!
//! [`PolicyKind::Gangway`] (the default): as Slurm-like, but
//! - queue order is fair (`fair.rs`): priority classes first; within a
//!   class the next unit comes from the tenant fair sharing favours now:
//!   tenants holding less than their guarantee of the unit's type
//!   ([`Share::guaranteed`]) first, then the lowest weighted dominant share
//!   (largest share of any type's capacity, held now plus decayed
//!   [`Share::history`], over [`Share::weight`]), then the oldest unit;
//!   re-evaluated after every start or reservation, so one pass interleaves
//!   tenants; `quotas` stay hard caps (borrowing limits);
//! - within one tenant and class, smaller work first
//!   ([`Policy::size_aging_s`]): units rank by the power of two of their
//!   estimated GPU-seconds (unknown last), each `size_aging_s` of waiting
//!   lifts a unit one rank, equal ranks keep submission order;
//! - reservations for the first four units of each type that cannot start
//!   (conservative backfill for the head of the queue), each computed on
//!   what the earlier ones leave: their GPUs count as busy until they are
//!   expected to end (start + estimate);
//! - a reservation waits for the level the unit prefers: the earliest time
//!   one domain of `min(preferred, required)` holds it, or of the lowest
//!   level one domain of which could ever hold it if that is higher (so a
//!   gang that prefers a leaf waits for a leaf rather than reserving a
//!   scattered set that frees sooner), but only while that start is within
//!   [`Policy::locality_patience_pct`] of its estimated run time after the
//!   first start at any level it allows; beyond, it reserves that first
//!   start. Slurm-like reserves at the earliest time at any level up to
//!   `required`.
//!
//! - a unit of one worker with a known end is placed by its end
//!   ([`Policy::pack_by_end`]): each node has a horizon, when the last unit
//!   on it (running, or started this pass) is expected to end; among the
//!   nodes with something on them and room for the worker, one whose
//!   horizon is at or after the unit's end (the fewest free GPUs, then the
//!   earliest such horizon), else the latest horizon (the node whose
//!   finish it delays least); an idle node only when no busy one has room.
//!   So units that end together share nodes and nodes come free whole for
//!   whole-node work, instead of the last GPUs of a node about to empty
//!   going to a long unit. Gangs, and units with no estimate, keep best fit.
//!
//! - after the rounds, waiting units may preempt (`preempt.rs`,
//!   [`Plan::preemptions`], [`WaitReason::Preempting`]): `normal` and
//!   `high` units preempt `low` ones of their own tenant or of one beyond
//!   its guarantee ([`PreemptCause::Priority`]); a tenant
//!   under its guarantee takes lent GPUs back from tenants above theirs
//!   ([`PreemptCause::Reclaim`]); a reserved gang moves small units of its
//!   class or lower, low or borrowed, that fragment the nodes it needs,
//!   when they fit elsewhere at once ([`PreemptCause::Defrag`]). Victims have run
//!   [`PreemptionPolicy::min_run_s`] since they last started, doubled per
//!   earlier preemption ([`PreemptionPolicy::min_run_for`]), priority and
//!   defragmentation victims have been preempted fewer than
//!   [`PreemptionPolicy::max_preemptions`] times; a unit with victims in
//!   flight takes no more, comes before every class in the next passes (the
//!   GPUs its victims free are its own), and one whose reservation starts
//!   within the checkpoint deadline takes none. Victims are chosen per
//!   domain, tightest level first: topology-tight before anything, then the
//!   least GPU-seconds since checkpoint, then the fewest victims; the freed
//!   GPUs plus free ones (and those of units expected to end by the
//!   deadline) must hold the whole unit. Running units being preempted
//!   count as ending by the checkpoint deadline in reservations.
//!
//! - elastic units ([`Request::min_workers`]) start with all their
//!   workers if they fit, else the most that fit now (at least
//!   `min_workers`; a prefix of `ranks`), else reserve or wait for
//!   `min_workers`; a quota may cap how many start. A running elastic unit
//!   below its maximum ([`Running::elastic`]) that has run its minimum time
//!   restarts larger ([`PreemptCause::Grow`]: checkpoint, requeue, start
//!   again with what fits) when idle GPUs of its type, which no waiting
//!   unit wants, let one domain of its required level hold at least half as
//!   many workers again (or its maximum). A preempted elastic unit restarts
//!   with what fits then, which may be fewer: it shrinks.
//!
//! **Rounds.** Backfill can change where (never when) a reservation would be
//! computed: a long unit started beside it can make another domain the
//! tightest at its start. So after a round in which some unit started
//! around a reservation, the pass forgets its reservations and runs again on
//! the units still waiting, with what it started counted as running; it
//! stops after a round that starts nothing around a reservation. Its
//! reservations and waits are then those of a pass over the resulting
//! state, and that pass starts nothing. Usually the second round is the last.
//! [`Plan::placements`] lists the units in the order they were decided.

mod apply;
mod backfill;
pub mod capacity;
mod fair;
mod index;
mod partition;
mod place;
mod plan;
mod power;
mod preempt;
mod reserved;
mod timeline;
pub mod types;

pub use apply::apply;
pub use partition::plan_partitioned;
pub use plan::plan;
pub use types::{
    Elastic, Level, Node, ParseLevelError, Placement, Plan, Policy, PolicyKind, PreemptCause,
    Preemption, PreemptionPolicy, QueueWindow, Request, Reservation, ReservedCapacity, Running,
    Share, Snapshot, WaitReason, Waiting, WorkerPlacement, PREEMPTIBLE_PRIORITY,
};
