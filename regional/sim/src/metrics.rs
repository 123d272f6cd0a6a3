//! What a run reports ([`Metrics`]) and the accumulators that build it.
//!
//! Time-weighted figures integrate a piecewise-constant state over virtual
//! time: the state only changes at event times, so each interval between two
//! consecutive event times adds `value × length`.

use gangway_sched::PolicyKind;
use serde::Serialize;

/// Mean, median and 99th percentile of a set of durations, in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
}

impl Summary {
    /// Median: the middle value (mean of the two middle ones for an even
    /// count). p99: the nearest-rank 99th percentile. All 0 when empty.
    pub fn of(mut values: Vec<f64>) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        Summary {
            mean: values.iter().sum::<f64>() / n as f64,
            median,
            p99: values[rank - 1],
        }
    }
}

/// Where multi-node gangs were placed (counted per start, restarts included).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GangStats {
    /// Starts of units with more than one worker.
    pub multi_node_starts: u64,
    /// % of them inside one leaf (or one NVLink domain).
    pub in_one_leaf_pct: Option<f64>,
    /// % of them inside one spine.
    pub in_one_spine_pct: Option<f64>,
    /// Starts where, at that moment, some leaf had room for the whole gang.
    pub leaf_could_hold: u64,
    /// % of those placed inside one leaf.
    pub in_one_leaf_when_a_leaf_could_pct: Option<f64>,
    /// Starts placed above their tightest possible level, so slowed down.
    pub spread_starts: u64,
}

/// One tenant's share of the fleet against its entitlement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantShare {
    pub tenant: String,
    /// Entitled share of the fleet, % (0 when not named in the quotas file).
    pub entitlement_pct: f64,
    pub jobs: u64,
    /// GPU-hours it held (lost work included).
    pub gpu_hours: f64,
    /// Hours during which it had work waiting (demand beyond what it held).
    pub hours_with_demand: f64,
    /// Its mean share of the schedulable GPUs over those hours, %.
    pub share_while_demand_pct: Option<f64>,
    /// `share_while_demand / entitlement` (above 1: it borrowed idle capacity).
    pub share_vs_entitlement: Option<f64>,
    /// Over those hours, `∫ min(held, E) / ∫ min(demand, E)` with E its
    /// entitled GPUs and demand = held + waiting GPUs, %: how much of the
    /// entitlement it could use it got. 100 = never short of it.
    pub entitlement_fulfilment_pct: Option<f64>,
    /// Over those hours, the % of the time it held less than 90 % of
    /// `min(demand, E)`: how often the goal "no tenant below 90 % of its
    /// entitled share while it has demand" was missed for it.
    pub time_below_90_pct: Option<f64>,
    /// Its shortfalls: stretches of that time (held below 90 % of
    /// `min(demand, E)`) from their start until it held enough again or had
    /// nothing waiting. How long a tenant short of its entitlement waits to
    /// be made whole; the count says how often it happened.
    pub shortfalls: u64,
    pub shortfall_s: Summary,
    pub longest_shortfall_s: f64,
    /// Its units preempted (asked to checkpoint and stop), by any cause.
    pub preempted: u64,
    /// Mean completion time of its jobs that completed, seconds.
    pub jct_mean_s: Option<f64>,
    /// GPU-hours of its work thrown away by failures.
    pub gpu_hours_lost_to_failures: f64,
}

/// One policy's results on one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metrics {
    pub policy: PolicyKind,
    /// Jobs replayed (after `max_jobs`), rejected ones included.
    pub jobs: u64,
    pub jobs_completed: u64,
    /// Jobs that could never be placed (larger than the fleet or their quota).
    pub jobs_rejected: u64,
    /// Jobs still waiting when nothing could change any more (0 unless the core
    /// leaves a placeable unit waiting on an idle fleet).
    pub jobs_unfinished: u64,
    /// Schedulable GPUs of the fleet (the simulated type, spares excluded).
    pub fleet_gpus: u64,
    /// Allocated / schedulable GPUs, time-weighted over the intervals when
    /// some unit waits, %.
    pub allocation_while_waiting_pct: Option<f64>,
    /// Allocated / schedulable GPUs over the whole makespan, %.
    pub utilization_pct: Option<f64>,
    /// Hours during which some unit waited.
    pub hours_with_waiting_jobs: f64,
    /// Free GPUs while some waiting gang fits in the total free count but in
    /// no single domain, time-weighted over the intervals when some unit
    /// waits, as % of the schedulable GPUs.
    pub stranded_while_gang_waits_pct: Option<f64>,
    /// Free GPUs held for reserved gangs (their reservations' GPUs free
    /// now, which only units ending before the reservation may use),
    /// time-weighted while some unit waits, as % of the schedulable GPUs.
    #[serde(default)]
    pub held_for_reservations_while_waiting_pct: Option<f64>,
    /// The stranded share split by the smallest waiting unit that could
    /// have used the GPUs by count: its size class, and whether it held a
    /// reservation (`reserved`) or had none (`no capacity`); the values add
    /// up to `stranded_while_gang_waits_pct`.
    #[serde(default)]
    pub stranded_by_waiting_unit_pct: std::collections::BTreeMap<String, f64>,
    /// Completion time (end − submit).
    pub jct_s: Summary,
    /// Queueing delay (first start − submit).
    pub queueing_delay_s: Summary,
    /// Last completion, from the first arrival.
    pub makespan_s: u64,
    pub gangs: GangStats,
    /// GPU-hours allocated (useful and lost).
    pub gpu_hours: f64,
    pub gpu_hours_lost_to_failures: f64,
    /// GPU time of preempted victims that bought no work: the time spent
    /// writing the on-demand checkpoint (GPUs held, no progress), plus, when
    /// the write cannot finish before the deadline, the work since the last
    /// periodic checkpoint.
    pub gpu_hours_lost_to_preemption: f64,
    /// Units the core asked to checkpoint and stop, in all and by cause.
    pub preemptions: u64,
    pub preemptions_priority: u64,
    pub preemptions_reclaim: u64,
    /// Small low-priority units moved out of a reserved gang's way.
    pub preemptions_defrag: u64,
    /// Jobs preempted at least once, and the most times one job was.
    pub jobs_preempted: u64,
    pub max_preemptions_of_a_job: u32,
    /// Victims whose run ended by itself before their checkpoint was written
    /// (they finish instead of stopping; counted in `preemptions`).
    pub preemption_victims_finished: u64,
    /// Victims whose checkpoint write takes longer than the deadline, so
    /// they stop without it.
    pub preemption_checkpoint_timeouts: u64,
    /// What the core reported at risk for its victims (GPU-seconds since
    /// their last checkpoints), in GPU-hours: what preemption would have
    /// cost without on-demand checkpoints.
    pub gpu_hours_at_risk_in_preemption: f64,
    /// Node failures that hit a node in service.
    pub node_failures: u64,
    /// Failures that hit a node with running (or stopping) work on it.
    pub failures_under_work: u64,
    /// Failures where an idle spare took the failed node's place
    /// (`SpareMode::Swap`).
    pub spare_swaps: u64,
    /// Unit restarts after a failure (on a spare, or requeued).
    pub restarts: u64,
    /// Per unit hit by a failure: from the failure until it ran again
    /// (0 when a spare took the node's place).
    pub recovery_after_failure_s: Summary,
    /// Σ GPUs × that wait: GPU time the hit units' owners went without.
    pub gpu_hours_waiting_after_failures: f64,
    /// Allocated GPU time that bought work, %: 100 × (allocated − lost to
    /// failures − lost to preemption) ÷ allocated.
    pub goodput_pct: Option<f64>,
    /// The lowest `entitlement_fulfilment_pct` among entitled tenants.
    pub min_entitlement_fulfilment_pct: Option<f64>,
    pub min_entitlement_fulfilment_tenant: Option<String>,
    /// The highest `time_below_90_pct` among entitled tenants.
    pub max_time_below_90_pct: Option<f64>,
    pub max_time_below_90_tenant: Option<String>,
    pub tenants: Vec<TenantShare>,
    /// Planning passes run, and event times where a pass was skipped because
    /// nothing new could fit.
    pub passes: u64,
    pub passes_skipped: u64,
    /// The capacity reservations' use, when the run made any
    /// (`SimConfig::reserve_pct`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<ReservedStats>,
}

/// How a run's capacity reservations were used. Shares of the reserved GPUs
/// are time-weighted over the intervals when some unit waits, like
/// `allocation_while_waiting_pct`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReservedStats {
    /// GPUs reserved in all.
    pub gpus: u64,
    /// Whether the reservations lent idle GPUs to preemptible work.
    pub lent: bool,
    /// % of the reserved GPUs held by the reservations' own units.
    pub used_by_owners_pct: Option<f64>,
    /// % of them held by other work: what other work holds in the
    /// reservations' domains beyond the GPUs there no reservation covers.
    pub used_by_borrowers_pct: Option<f64>,
    /// Borrowers asked to checkpoint and stop for an owner's unit
    /// (`PreemptCause::Reservation`).
    pub preemptions: u64,
    /// The reserving tenants' jobs that (last) ran in their reservation,
    /// and those that went to the shared pool (no room left in it).
    pub owner_jobs_in_reservations: u64,
    pub owner_jobs_in_pool: u64,
    /// Mean completion time of the reserving tenants' jobs, and of the
    /// other tenants' jobs, seconds.
    pub jct_mean_reserving_tenants_s: Option<f64>,
    pub jct_mean_other_tenants_s: Option<f64>,
    /// Mean queueing delay (first start − submit) of the reserving tenants'
    /// jobs in their reservations, and of those in the pool, seconds.
    pub queueing_delay_mean_in_reservations_s: Option<f64>,
    pub queueing_delay_mean_owners_in_pool_s: Option<f64>,
}

pub(crate) fn pct(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| 100.0 * num / den)
}

/// Per-tenant running totals.
#[derive(Clone, Debug, Default)]
pub(crate) struct TenantAcc {
    /// GPUs held now, and GPUs of its units waiting now.
    pub held: u64,
    pub waiting_gpus: u64,
    pub waiting_units: u64,
    pub jobs: u64,
    pub gpu_s: f64,
    pub demand_s: f64,
    pub held_while_demand: f64,
    pub sched_while_demand: f64,
    pub got_of_entitlement: f64,
    pub could_use_of_entitlement: f64,
    pub below_90_s: f64,
    /// The shortfall under way (seconds so far), and those that ended.
    pub short_s: f64,
    pub shortfalls: Vec<f64>,
    pub preempted: u64,
    pub completed: u64,
    pub jct_sum_s: f64,
    pub lost_failures_gpu_s: f64,
}

impl TenantAcc {
    /// Adds an interval of `dt` seconds in which the state did not change.
    pub fn integrate(&mut self, dt: f64, schedulable: u64, share: f64) {
        let held = self.held as f64;
        self.gpu_s += held * dt;
        if self.waiting_units > 0 {
            let entitled = share * schedulable as f64;
            let demand = held + self.waiting_gpus as f64;
            self.demand_s += dt;
            self.held_while_demand += held * dt;
            self.sched_while_demand += schedulable as f64 * dt;
            self.got_of_entitlement += held.min(entitled) * dt;
            self.could_use_of_entitlement += demand.min(entitled) * dt;
            if held < 0.9 * demand.min(entitled) {
                self.below_90_s += dt;
                self.short_s += dt;
                return;
            }
        }
        if self.short_s > 0.0 {
            self.shortfalls.push(std::mem::take(&mut self.short_s));
        }
    }

    pub fn report(&self, tenant: &str, share: f64) -> TenantShare {
        let mean_share = pct(self.held_while_demand, self.sched_while_demand);
        // (A shortfall still under way when the run ends counts as it is.)
        let mut shortfalls = self.shortfalls.clone();
        shortfalls.extend((self.short_s > 0.0).then_some(self.short_s));
        TenantShare {
            tenant: tenant.to_string(),
            entitlement_pct: 100.0 * share,
            jobs: self.jobs,
            gpu_hours: self.gpu_s / 3600.0,
            hours_with_demand: self.demand_s / 3600.0,
            share_while_demand_pct: mean_share,
            share_vs_entitlement: mean_share
                .filter(|_| share > 0.0)
                .map(|s| s / (100.0 * share)),
            entitlement_fulfilment_pct: pct(self.got_of_entitlement, self.could_use_of_entitlement),
            time_below_90_pct: pct(self.below_90_s, self.demand_s).filter(|_| share > 0.0),
            shortfalls: shortfalls.len() as u64,
            longest_shortfall_s: shortfalls.iter().copied().fold(0.0, f64::max),
            shortfall_s: Summary::of(shortfalls),
            preempted: self.preempted,
            jct_mean_s: (self.completed > 0).then(|| self.jct_sum_s / self.completed as f64),
            gpu_hours_lost_to_failures: self.lost_failures_gpu_s / 3600.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_statistics() {
        let s = Summary::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.median, s.p99), (2.5, 2.5, 4.0));
        let s = Summary::of((1..=1000).map(f64::from).collect());
        assert_eq!((s.median, s.p99), (500.5, 990.0));
        assert_eq!(Summary::of(vec![]), Summary::default());
    }

    #[test]
    fn fulfilment_counts_only_what_the_entitlement_covers() {
        let mut t = TenantAcc {
            held: 10,
            waiting_gpus: 30,
            waiting_units: 1,
            ..Default::default()
        };
        // Entitled to 25 % of 100 = 25 GPUs; could use 25, got 10.
        t.integrate(10.0, 100, 0.25);
        t.held = 40;
        t.waiting_gpus = 8;
        // Holds more than its 25: fully served.
        t.integrate(10.0, 100, 0.25);
        let r = t.report("a", 0.25);
        assert_eq!(r.entitlement_fulfilment_pct, Some(100.0 * 35.0 / 50.0));
        assert_eq!(r.share_while_demand_pct, Some(25.0));
        assert_eq!(r.share_vs_entitlement, Some(1.0));
        assert_eq!(r.hours_with_demand, 20.0 / 3600.0);
        // Below 90 % of min(40, 25) during the first interval only.
        assert_eq!(r.time_below_90_pct, Some(50.0));
        assert_eq!((r.shortfalls, r.longest_shortfall_s), (1, 10.0));
    }

    #[test]
    fn a_shortfall_lasts_until_the_tenant_holds_enough_or_waits_for_nothing() {
        // Entitled to 20 of 100 GPUs.
        let mut t = TenantAcc {
            held: 0,
            waiting_gpus: 8,
            waiting_units: 1,
            ..Default::default()
        };
        // Short for 30 s over two intervals (one shortfall), then served.
        t.integrate(20.0, 100, 0.2);
        t.integrate(10.0, 100, 0.2);
        (t.held, t.waiting_gpus, t.waiting_units) = (8, 0, 0);
        t.integrate(100.0, 100, 0.2);
        // Short again for 5 s; its unit then leaves the queue unplaced
        // (cancelled): nothing waits, so the shortfall ends.
        (t.waiting_gpus, t.waiting_units) = (12, 1);
        t.integrate(5.0, 100, 0.2);
        (t.waiting_gpus, t.waiting_units) = (0, 0);
        t.integrate(50.0, 100, 0.2);
        // A third one still under way when the run ends.
        (t.waiting_gpus, t.waiting_units) = (16, 1);
        t.integrate(7.0, 100, 0.2);
        let r = t.report("a", 0.2);
        assert_eq!(r.shortfalls, 3);
        assert_eq!(r.longest_shortfall_s, 30.0);
        assert_eq!((r.shortfall_s.median, r.shortfall_s.p99), (7.0, 30.0));
        assert_eq!(r.time_below_90_pct, Some(100.0));
    }
}
