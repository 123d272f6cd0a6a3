//! Gangway's trace simulator: replays a workload trace (the Philly format)
//! on a fleet file in virtual time, through the same scheduler core
//! ([`gangway_sched::plan`]) the regional service runs, once per policy, and
//! reports how well each kept the fleet busy, placed gangs and served tenants.
//!
//! Pure and deterministic: no clock, no I/O beyond the loaders, randomness
//! only from [`SimConfig::seed`]; the same inputs give identical
//! [`Metrics`]. The model (time, jobs, locality, failures, metrics) is
//! written up in `docs/simulator.md`.
//!
//! ```no_run
//! use gangway_sim::{SimConfig, Simulation, Trace};
//! use gangway_sched::PolicyKind;
//! use gangway_shared::fleet::FleetFile;
//!
//! let trace = Trace::load("philly.csv").unwrap();
//! let fleet = FleetFile::load("deploy/fleets/philly.toml").unwrap();
//! let nodes = fleet.expand(fleet.region_or("sim"));
//! let sim = Simulation::new(&trace, &nodes, SimConfig::default()).unwrap();
//! let outcome = sim.run(PolicyKind::Gangway);
//! println!("{}", outcome.metrics.jct_s.mean);
//! ```
//!
//! # Layout
//! - `trace.rs`: [`Trace`], the Philly-format CSV reader.
//! - `tenants.rs`: [`Entitlements`], tenant shares from a `vc,node num` CSV.
//! - `locality.rs`: [`LocalityModel`], the slowdown of a gang spread wider
//!   than it needs, and its calibration from Gavel's measurements.
//! - `config.rs`: [`SimConfig`], every option.
//! - `workload.rs`: [`Simulation::new`], turning trace rows into units
//!   (workers of whole nodes) and the fleet into scheduler nodes.
//! - `engine.rs`: the event loop ([`Simulation::run`]): arrivals,
//!   completions, failures, repairs, planning passes, preemptions (victims
//!   checkpoint, stop and requeue).
//! - `queue.rs`: the waiting units and the window of them each pass sees
//!   (the first units overall plus each tenant's first).
//! - `metrics.rs`: [`Metrics`] and the time-weighted accumulators.
//! - `report.rs`: [`render_table`], policies side by side.
//! - `rng.rs`: [`SimRng`], the seeded PRNG.
//! - `csv.rs`: a minimal CSV line splitter.

mod config;
mod csv;
mod engine;
mod locality;
mod metrics;
mod queue;
mod report;
mod rng;
mod tenants;
mod trace;
mod workload;

pub use config::{SimConfig, SpareMode};
pub use engine::{JobOutcome, PlacementEnd, PlacementRecord, Planner, Progress, SimOutcome};
pub use locality::{LocalityError, LocalityModel, V100_SPREAD_RATIO};
pub use metrics::{GangStats, Metrics, ReservedStats, Summary, TenantShare};
pub use report::{human_duration, policy_label, render_table};
pub use rng::SimRng;
pub use tenants::{Entitlements, EntitlementsError};
pub use trace::{parse_timestamp, SkippedRows, Trace, TraceError, TraceJob};
pub use workload::{SimError, SimReservation, Simulation, WorkloadSummary};

/// The policies a run compares, in column order.
pub const POLICIES: [gangway_sched::PolicyKind; 3] = [
    gangway_sched::PolicyKind::Gangway,
    gangway_sched::PolicyKind::FifoFirstFit,
    gangway_sched::PolicyKind::SlurmBackfill,
];
