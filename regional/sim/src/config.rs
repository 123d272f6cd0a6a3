//! The simulator's options.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::PreemptionPolicy;
use serde::Serialize;

use crate::locality::LocalityModel;
use crate::tenants::Entitlements;

/// How a run is set up; the same config and seed give the same metrics.
#[derive(Clone, Debug, Serialize)]
pub struct SimConfig {
    /// Load scaling: inter-arrival times are divided by this factor
    /// (1.0 = as recorded, 4.0 = four times as many arrivals per hour).
    pub load: f64,
    /// Replay only the first N jobs by submit time.
    pub max_jobs: Option<usize>,
    /// Jobs checkpoint every this many seconds of run time since their
    /// (re)start; a failure loses the work since the last one. 0 = jobs never
    /// checkpoint and restart from the beginning.
    pub checkpoint_interval_s: u64,
    /// Node failures per node per day (exponential inter-failure times over
    /// the whole fleet, the node drawn uniformly). 0 = none.
    pub node_failure_rate: f64,
    /// How long a failed node stays unschedulable, in seconds.
    pub repair_time_s: u64,
    /// Seeds the failure stream and the estimate noise.
    pub seed: u64,
    /// Guaranteed shares per tenant: each named tenant is guaranteed
    /// `floor(share × schedulable GPUs)` GPUs (`Share::guaranteed` in the
    /// snapshot; capacity it leaves idle is lent to others and taken back by
    /// preemption), and the share-against-entitlement metric uses them.
    pub entitlements: Option<Entitlements>,
    /// Also give each tenant named in `entitlements` a hard quota equal to
    /// its guarantee (no borrowing); tenants not named stay uncapped.
    pub quota_caps: bool,
    /// Fair-share weights per tenant (1.0 when not named).
    pub weights: BTreeMap<String, f64>,
    /// Half-life of the decayed past usage fair sharing weighs, in seconds of
    /// virtual time: each tenant's history is the exponentially weighted
    /// average of the GPUs it held. 0 = no history.
    pub history_half_life_s: u64,
    /// When Gangway's policy preempts (`enabled: false` = never), the
    /// minimum run time, the cap per job, the victims per pass and the
    /// checkpoint deadline.
    pub preemption: PreemptionPolicy,
    /// Gangway's discipline: seconds of waiting that lift a unit one rank in
    /// smaller-work-first (`Policy::size_aging_s`; 0 = submission order
    /// within a tenant).
    pub size_aging_s: u64,
    /// Gangway's discipline: how long, in % of its run time, a gang waits
    /// for its preferred level before it reserves wider
    /// (`Policy::locality_patience_pct`).
    pub locality_patience_pct: u32,
    /// Gangway's discipline: one-worker units go where they extend a node's
    /// busy horizon least (`Policy::pack_by_end`).
    pub pack_by_end: bool,
    /// Seconds a victim takes to write its checkpoint on demand (GPU time
    /// lost); a write longer than the policy's deadline does not finish, and
    /// the victim is stopped at the deadline keeping only its last periodic
    /// checkpoint.
    pub checkpoint_write_s: u64,
    pub locality: LocalityModel,
    /// Runtime estimates are `duration × exp(σ·Z)`, Z standard normal; 0 =
    /// perfect estimates.
    pub estimate_noise: f64,
    /// Tenants whose jobs run at low priority (all others: normal).
    pub low_priority_tenants: BTreeSet<String>,
    /// At most this many queued units (the oldest by priority then arrival)
    /// are passed to each planning pass; the rest wait their turn (the
    /// region applies the same window, [`gangway_sched::QueueWindow`]).
    pub queue_window: usize,
    /// Beyond those, each tenant's first this many queued units are passed
    /// too, so that no tenant's work is invisible to fair sharing behind
    /// another's backlog. 0 = only the plain window.
    pub queue_window_per_tenant: usize,
    /// At least this many seconds of virtual time between two planning
    /// passes, like a scheduler loop's period: events in between are applied
    /// at once, the pass they call for runs at the period's end. 0 = a pass
    /// at every event time that may place something.
    pub pass_interval_s: u64,
    /// What the fleet's spare nodes do (`swap` by default).
    pub spares: SpareMode,
    /// Extra failures at fixed times (seconds of virtual time, node id), on
    /// top of the random ones: for tests and what-if runs.
    pub scheduled_failures: Vec<(u64, String)>,
    /// Percent of the fleet's GPUs given, at the start of the replay, to
    /// open-ended capacity reservations of the tenants with the largest
    /// guarantees (`workload.rs`, [`crate::Simulation::new`]). 0 = none.
    #[serde(skip_serializing_if = "is_zero")]
    pub reserve_pct: f64,
    /// Whether the reservations lend their idle GPUs to preemptible work
    /// (`Policy::lend_reserved`).
    #[serde(skip_serializing_if = "is_true")]
    pub lend_reserved: bool,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_true(v: &bool) -> bool {
    *v
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            load: 1.0,
            max_jobs: None,
            checkpoint_interval_s: 3600,
            node_failure_rate: 0.0,
            repair_time_s: 4 * 3600,
            seed: 1,
            entitlements: None,
            quota_caps: false,
            weights: BTreeMap::new(),
            history_half_life_s: 24 * 3600,
            preemption: PreemptionPolicy::default(),
            size_aging_s: gangway_sched::Policy::default().size_aging_s,
            locality_patience_pct: gangway_sched::Policy::default().locality_patience_pct,
            pack_by_end: gangway_sched::Policy::default().pack_by_end,
            checkpoint_write_s: 30,
            locality: LocalityModel::default(),
            estimate_noise: 0.0,
            low_priority_tenants: BTreeSet::new(),
            queue_window: gangway_sched::QueueWindow::default().cap,
            queue_window_per_tenant: gangway_sched::QueueWindow::default().per_tenant,
            pass_interval_s: 0,
            spares: SpareMode::Swap,
            scheduled_failures: Vec::new(),
            reserve_pct: 0.0,
            lend_reserved: gangway_sched::Policy::default().lend_reserved,
        }
    }
}

/// What the fleet file's spare nodes (`spares = N` per leaf) do in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpareMode {
    /// As the region does: spares take no work; when a node fails under
    /// running work, the nearest idle spare (same leaf, else same spine,
    /// else anywhere) takes its place at once and the node's jobs restart
    /// there from their last checkpoint, keeping the rest of their GPUs.
    /// The failed node, once repaired, joins the pool. With no spare left,
    /// the jobs requeue at the front as with `Off`.
    #[default]
    Swap,
    /// The spares stay out of service; a failure requeues the node's jobs
    /// at the front of the queue (the fleet without spares).
    Off,
    /// The spares are ordinary nodes (more capacity, no pool).
    Capacity,
}

impl std::str::FromStr for SpareMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SpareMode, String> {
        match s {
            "swap" => Ok(SpareMode::Swap),
            "off" => Ok(SpareMode::Off),
            "capacity" => Ok(SpareMode::Capacity),
            _ => Err(format!("spares must be swap, off or capacity, not {s:?}")),
        }
    }
}
