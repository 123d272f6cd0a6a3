//! The event loop: one policy's run over a prepared [`Simulation`].
//!
//! Events are arrivals, completions, preempted victims stopping, node
//! failures and repairs (and wake-ups: a run reaching the minimum run time
//! before it may be preempted, the end of a pass interval). All events of
//! one virtual second are applied together, then one planning pass runs (or
//! is skipped when nothing new could fit or preempt), its placements start
//! at once and its victims are asked to checkpoint and stop. The scheduler's
//! snapshot is kept between passes and updated in place: only what an event
//! or a placement changes is touched.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use gangway_sched::{
    plan, Level, Node, Placement, Plan, Policy, PolicyKind, PreemptCause, Preemption, Request,
    Running, Share, Snapshot, WaitReason, PREEMPTIBLE_PRIORITY,
};
use serde::Serialize;

use crate::config::SpareMode;
use crate::metrics::{pct, GangStats, Metrics, ReservedStats, Summary, TenantAcc};
use crate::queue::{QKey, Queue};
use crate::rng::SimRng;
use crate::workload::{JobSpec, Simulation, STREAM_FAILURES};

/// Where a run is, for progress reports.
#[derive(Clone, Debug, Serialize)]
pub struct Progress {
    pub policy: PolicyKind,
    /// Virtual time, seconds.
    pub now_s: u64,
    pub jobs_done: u64,
    pub jobs_total: u64,
    pub waiting: u64,
    pub running: u64,
}

/// One job's fate in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobOutcome {
    /// Index in submit order (the unit's job id is `j{index}`).
    pub index: usize,
    pub tenant: String,
    /// GPUs it held (the trace's count rounded up to whole nodes).
    pub gpus: u64,
    pub submit_s: u64,
    pub first_start_s: Option<u64>,
    pub end_s: Option<u64>,
    /// Times it started (1 + restarts).
    pub starts: u32,
    /// Level of its last placement.
    pub level: Option<Level>,
    /// GPU-seconds of work thrown away by failures.
    pub lost_gpu_s: f64,
    /// Times the core preempted it.
    pub preemptions: u32,
    /// GPU-seconds its preemptions cost (checkpoint writes, and work lost
    /// when a write could not finish before the deadline).
    pub lost_to_preemption_gpu_s: f64,
    pub rejected: bool,
}

/// A run's metrics and every job's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimOutcome {
    pub metrics: Metrics,
    pub jobs: Vec<JobOutcome>,
    /// Every placement that held GPUs, as the usage ledger would record it
    /// (`gangway sim --usage-out`); not in the JSON report.
    #[serde(skip)]
    pub placements: Vec<PlacementRecord>,
}

/// One worker's GPUs on one node, held from `start_s` to `end_s` by one
/// attempt of a job: a placement, the unit of the usage ledger
/// (docs/billing.md).
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementRecord {
    /// The job's index in submit order.
    pub job: usize,
    pub tenant: u32,
    pub priority: i32,
    pub attempt: u32,
    /// The node's place in the fleet's order, and its position among the
    /// job's nodes (its rank, as the ledger counts placements).
    pub node: u32,
    pub rank: u32,
    pub gpus: u32,
    pub start_s: u64,
    pub end_s: u64,
    pub ended_by: PlacementEnd,
    /// The job's newest checkpoint when the placement ended.
    pub checkpointed_s: Option<u64>,
}

/// How a placement ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementEnd {
    Succeeded,
    Preempted(PreemptCause),
    /// Its node failed (or, with spares, was swapped out under it).
    NodeLost,
    /// Still held when the run ended.
    Running,
}

/// What computes a pass: [`gangway_sched::plan`], or a stand-in for tests
/// and what-if experiments.
pub type Planner<'p> = dyn FnMut(&Snapshot, &Policy) -> Plan + 'p;

impl Simulation {
    /// Replays the workload under `policy`.
    pub fn run(&self, policy: PolicyKind) -> SimOutcome {
        self.run_with_progress(policy, &mut |_| {})
    }

    /// As [`Simulation::run`], calling `progress` every few thousand events.
    pub fn run_with_progress(
        &self,
        policy: PolicyKind,
        progress: &mut dyn FnMut(&Progress),
    ) -> SimOutcome {
        self.run_with_planner(policy, &mut plan, progress)
    }

    /// As [`Simulation::run_with_progress`], with each pass computed by
    /// `planner` instead of the core: for tests of the simulator's own
    /// mechanics (say, scripted preemptions) and for experiments. The
    /// simulator carries out whatever the plan says, checking that every
    /// placement uses free GPUs and every victim is running.
    pub fn run_with_planner(
        &self,
        policy: PolicyKind,
        planner: &mut Planner<'_>,
        progress: &mut dyn FnMut(&Progress),
    ) -> SimOutcome {
        let mut run = Run::new(self, policy, planner);
        run.main_loop(progress);
        run.finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Queued,
    Running,
    /// Preempted: writing its checkpoint, still holding its GPUs.
    Stopping,
    Done,
    Rejected,
}

/// A job's mutable state in one run.
#[derive(Clone, Debug)]
struct JobRun {
    phase: Phase,
    /// Bumped on every (re)start; stale completion events carry an old one.
    attempt: u32,
    /// Work (full-speed seconds) saved by the last checkpoint before this attempt.
    saved: f64,
    start: u64,
    factor: f64,
    level: Option<Level>,
    first_start: Option<u64>,
    end: Option<u64>,
    starts: u32,
    lost_gpu_s: f64,
    /// (node index, GPU indices) held while running.
    held: Vec<(u32, Vec<u32>)>,
    /// Its queue position key while queued.
    qkey: QKey,
    /// The seq it is queued with (a preempted job keeps it).
    seq: u64,
    preemptions: u32,
    /// While stopping: when it was asked to.
    preempt_at: Option<u64>,
    /// When it last wrote a checkpoint (in an earlier run; the current run's
    /// periodic ones are computed from `start`).
    checkpointed: Option<u64>,
    lost_preempt_gpu_s: f64,
    /// Counted in `Run::low_pri_gpus` (a priority-preemption candidate).
    low_counted: bool,
    /// When a failure stopped it and requeued it (until it starts again).
    hit_at: Option<u64>,
    /// The capacity reservation (index in `Simulation::reserved`) it was
    /// queued in and runs in, if any.
    reservation: Option<u32>,
    /// While stopping: why it was asked to.
    preempt_cause: Option<PreemptCause>,
}

/// Event kinds, in the order they apply within one second: completions
/// before victims stopping before repairs before failures (a job ending the
/// second its node fails has finished).
const EV_COMPLETE: u8 = 0;
/// A preempted victim has written its checkpoint (or hit the deadline).
const EV_STOP: u8 = 1;
const EV_REPAIR: u8 = 2;
const EV_FAIL: u8 = 3;
/// A failure drawn by the failure stream: its subject is a slot of the
/// fleet in service (see `Run::slot_node`), not a node.
const EV_RANDOM_FAIL: u8 = 4;
/// A run reaches the minimum run time and may now be preempted.
const EV_ELIGIBLE: u8 = 5;
/// The end of a pass interval with a deferred pass.
const EV_WAKE: u8 = 6;

/// (time, kind, subject, attempt): completion, stop and eligibility (job,
/// attempt), repair (node), failure (node).
type Event = Reverse<(u64, u8, u32, u32)>;

/// Seqs of first arrivals start here; a requeued gang takes its arrival
/// index below it, so it goes before every fresh arrival ("at the front").
const FRESH_SEQ: u64 = 1 << 40;

struct Run<'a, 'p> {
    sim: &'a Simulation,
    policy: Policy,
    planner: &'p mut Planner<'p>,
    /// Whether the policy may preempt (Gangway's, preemption enabled): then
    /// passes also run when a waiting unit could preempt.
    preempting: bool,
    snap: Snapshot,
    jobs: Vec<JobRun>,
    events: BinaryHeap<Event>,
    next_arrival: usize,
    queue: Queue,
    /// Per tenant: its key in the snapshot's usage map.
    usage_keys: Vec<(String, String)>,
    /// Position of each running job in `snap.running` (u32::MAX: none).
    running_at: Vec<u32>,
    /// The job of each entry of `snap.running`.
    running_jobs: Vec<u32>,
    /// GPUs of running units that priority preemption may take (low
    /// priority, under the cap, not stopping already); the minimum run time
    /// is not checked.
    low_pri_gpus: u64,
    /// Queued units above the preemptible priority.
    waiting_high: u64,
    /// Per tenant: decayed average GPUs held.
    history: Vec<f64>,
    /// Per tenant: GPUs its units hold in its capacity reservation (not
    /// its usage of the shared pool).
    reserved_held: Vec<u64>,
    /// Per reservation: GPUs of the units queued or running in it.
    committed: Vec<u64>,
    /// Queued units in capacity reservations.
    waiting_owner_units: u64,
    /// The history's decay rate per second (ln 2 / half-life; 0 = none).
    decay: f64,
    node_up: Vec<bool>,
    /// Per node: an idle spare, healthy, ready to take a failed node's place
    /// (only with `SpareMode::Swap`).
    in_pool: Vec<bool>,
    /// The node in each slot of the fleet in service (slot i starts as
    /// `Simulation::failable[i]`; a spare swapped in takes the failed node's
    /// slot). The failure stream draws slots, so every spare mode meets the
    /// same failures of the same positions.
    slot_node: Vec<u32>,
    /// Each node's slot; u32::MAX for a node outside the fleet in service
    /// (a spare, or a failed node a spare replaced).
    node_slot: Vec<u32>,
    now: u64,
    last: u64,
    free: u64,
    schedulable: u64,
    allocated: u64,
    stranded: bool,
    /// Free GPUs the last pass held for reserved gangs (out of reach of
    /// everything that does not end before their start).
    held_free: u64,
    /// While stranded: the smallest waiting unit that fits the free count,
    /// by [`stranded_class`].
    stranded_for: &'static str,
    waiting_units: u64,
    running_units: u64,
    done: u64,
    fail_rng: SimRng,
    fail_clock: f64,
    /// When the last pass ran, and what the next one owes (with a pass
    /// interval, passes that come due too soon are deferred).
    last_pass: Option<u64>,
    deferred_must_pass: bool,
    deferred_units: Vec<u32>,
    wake_pending: bool,
    tenants: Vec<TenantAcc>,
    acc: Acc,
    placements: Vec<PlacementRecord>,
}

#[derive(Default)]
struct Acc {
    waiting_s: f64,
    alloc_while_waiting: f64,
    sched_while_waiting: f64,
    stranded_while_waiting: f64,
    held_while_waiting: f64,
    /// While some unit waits: reserved GPU-seconds, and those used by the
    /// reservations' units and by other work (`Run::reserved_use`).
    reserved_while_waiting: f64,
    reserved_owner_while_waiting: f64,
    reserved_borrowed_while_waiting: f64,
    /// Stranded GPU-seconds by the smallest waiting unit that could have
    /// used them ([`stranded_class`]).
    stranded_by: BTreeMap<&'static str, f64>,
    alloc_total: f64,
    sched_total: f64,
    gangs: GangStats,
    in_leaf: u64,
    in_spine: u64,
    in_leaf_when_could: u64,
    lost_failures_gpu_s: f64,
    lost_preempt_gpu_s: f64,
    at_risk_gpu_s: f64,
    preempt_priority: u64,
    preempt_reclaim: u64,
    preempt_grow: u64,
    preempt_defrag: u64,
    preempt_reservation: u64,
    victims_finished: u64,
    checkpoint_timeouts: u64,
    node_failures: u64,
    failures_under_work: u64,
    spare_swaps: u64,
    restarts: u64,
    /// Per job hit by a failure: seconds until it ran again.
    recovery_s: Vec<f64>,
    waiting_after_failures_gpu_s: f64,
    passes: u64,
    skipped: u64,
    unfinished: u64,
}

impl<'a, 'p> Run<'a, 'p> {
    fn new(sim: &'a Simulation, kind: PolicyKind, planner: &'p mut Planner<'p>) -> Run<'a, 'p> {
        let nodes: Vec<Node> = sim
            .nodes
            .iter()
            .map(|n| Node {
                id: n.node_id.clone(),
                spine: n.spine.clone(),
                leaf: n.leaf.clone(),
                nvlink_domain: n.nvlink_domain.clone(),
                gpu_type: n.gpu_type.clone(),
                gpus: n.gpus,
                free: (0..n.gpus).collect(),
                schedulable: !n.spare,
            })
            .collect();
        let quotas = sim
            .quotas
            .iter()
            .enumerate()
            .filter_map(|(t, q)| Some(((sim.tenants[t].clone(), sim.gpu_type.clone()), (*q)?)))
            .collect();
        let mut events = BinaryHeap::new();
        for &(at, node) in &sim.scheduled_failures {
            events.push(Reverse((at, EV_FAIL, node, 0)));
        }
        let jobs = sim
            .jobs
            .iter()
            .map(|j| JobRun {
                phase: if j.rejected {
                    Phase::Rejected
                } else {
                    Phase::Pending
                },
                attempt: 0,
                saved: 0.0,
                start: 0,
                factor: 1.0,
                level: None,
                first_start: None,
                end: None,
                starts: 0,
                lost_gpu_s: 0.0,
                held: Vec::new(),
                qkey: (Reverse(0), 0, 0),
                seq: 0,
                preemptions: 0,
                preempt_at: None,
                checkpointed: None,
                lost_preempt_gpu_s: 0.0,
                low_counted: false,
                hit_at: None,
                reservation: None,
                preempt_cause: None,
            })
            .collect();
        let shares = sim
            .tenants
            .iter()
            .enumerate()
            .map(|(t, name)| {
                let share = Share {
                    guaranteed: u32::try_from(sim.guarantees[t]).unwrap_or(u32::MAX),
                    weight: sim.weights[t],
                    history: 0,
                };
                ((name.clone(), sim.gpu_type.clone()), share)
            })
            .collect();
        let policy = Policy {
            kind,
            preemption: sim.config.preemption.clone(),
            size_aging_s: sim.config.size_aging_s,
            locality_patience_pct: sim.config.locality_patience_pct,
            lend_reserved: sim.config.lend_reserved,
            pack_by_end: sim.config.pack_by_end,
            ..Policy::default()
        };
        // Only Gangway's discipline preempts; the others never look at it.
        let preempting = kind == PolicyKind::Gangway && policy.preemption.enabled;
        let half_life = sim.config.history_half_life_s;
        let mut tenants = vec![TenantAcc::default(); sim.tenants.len()];
        for j in &sim.jobs {
            tenants[j.tenant as usize].jobs += 1;
        }
        let mut run = Run {
            placements: Vec::new(),
            sim,
            policy,
            planner,
            preempting,
            snap: Snapshot {
                nodes,
                quotas,
                shares,
                reserved: sim.reserved.clone(),
                ..Snapshot::default()
            },
            jobs,
            events,
            next_arrival: 0,
            queue: Queue::new(
                sim.config.queue_window,
                sim.config.queue_window_per_tenant,
                sim.jobs.iter().map(|j| j.tenant).collect(),
            ),
            usage_keys: sim
                .tenants
                .iter()
                .map(|t| (t.clone(), sim.gpu_type.clone()))
                .collect(),
            running_at: vec![u32::MAX; sim.jobs.len()],
            running_jobs: Vec::new(),
            low_pri_gpus: 0,
            waiting_high: 0,
            history: vec![0.0; sim.tenants.len()],
            reserved_held: vec![0; sim.tenants.len()],
            committed: vec![0; sim.reserved.len()],
            waiting_owner_units: 0,
            decay: if half_life == 0 {
                0.0
            } else {
                std::f64::consts::LN_2 / half_life as f64
            },
            node_up: vec![true; sim.nodes.len()],
            in_pool: sim
                .nodes
                .iter()
                .map(|n| n.spare && sim.config.spares == SpareMode::Swap)
                .collect(),
            slot_node: sim.failable.clone(),
            node_slot: {
                let mut slots = vec![u32::MAX; sim.nodes.len()];
                for (slot, &n) in sim.failable.iter().enumerate() {
                    slots[n as usize] = slot as u32;
                }
                slots
            },
            now: 0,
            last: 0,
            free: sim.fleet_gpus,
            schedulable: sim.fleet_gpus,
            allocated: 0,
            stranded: false,
            held_free: 0,
            stranded_for: "",
            waiting_units: 0,
            running_units: 0,
            done: 0,
            fail_rng: SimRng::derive(sim.config.seed, STREAM_FAILURES, 0),
            fail_clock: 0.0,
            last_pass: None,
            deferred_must_pass: false,
            deferred_units: Vec::new(),
            wake_pending: false,
            tenants,
            acc: Acc::default(),
        };
        run.schedule_random_failure();
        run
    }

    fn spec(&self, job: u32) -> &'a JobSpec {
        &self.sim.jobs[job as usize]
    }

    /// Draws the next random failure (time and slot of the fleet in
    /// service) from the failure stream, which depends on the seed alone, so
    /// every policy and spare mode meets the same ones.
    fn schedule_random_failure(&mut self) {
        let rate = self.sim.config.node_failure_rate;
        if rate <= 0.0 || self.sim.failable.is_empty() {
            return;
        }
        let per_s = rate * self.sim.failable.len() as f64 / 86_400.0;
        self.fail_clock += self.fail_rng.exp(per_s);
        let slot = self.fail_rng.below(self.sim.failable.len() as u64) as u32;
        let at = self.fail_clock.ceil().min(u64::MAX as f64) as u64;
        self.events.push(Reverse((at, EV_RANDOM_FAIL, slot, 0)));
    }

    fn live(&self) -> bool {
        self.next_arrival < self.sim.jobs.len() || self.waiting_units > 0 || self.running_units > 0
    }

    fn main_loop(&mut self, progress: &mut dyn FnMut(&Progress)) {
        let mut steps: u64 = 0;
        while self.live() {
            let next_arrival = self.next_pending_arrival();
            let next_event = self.events.peek().map(|Reverse(e)| e.0);
            let t = match (next_arrival, next_event) {
                (Some(a), Some(e)) => a.min(e),
                (Some(a), None) => a,
                (None, Some(e)) => e,
                (None, None) => break,
            };
            if self.waiting_units > 0
                && self.running_units == 0
                && next_arrival.is_none()
                && self.node_up.iter().all(|&u| u)
                && !self.wake_pending
            {
                // Everything is free and the last pass placed nothing: only
                // failures could still happen, and they change nothing.
                self.acc.unfinished = self.waiting_units;
                break;
            }
            self.advance(t);
            let mut must_pass = false;
            let mut new_units: Vec<u32> = Vec::new();
            while let Some(&Reverse((at, kind, a, b))) = self.events.peek() {
                if at != t {
                    break;
                }
                self.events.pop();
                match kind {
                    EV_COMPLETE => must_pass |= self.complete(a, b),
                    EV_STOP => must_pass |= self.stop(a, b, &mut new_units),
                    EV_ELIGIBLE => must_pass |= self.eligible(a, b),
                    EV_REPAIR => must_pass |= self.repair(a),
                    EV_FAIL => must_pass |= self.fail(a, &mut new_units),
                    EV_RANDOM_FAIL => {
                        self.schedule_random_failure();
                        let node = self.slot_node[a as usize];
                        must_pass |= self.fail(node, &mut new_units);
                    }
                    EV_WAKE => self.wake_pending = false,
                    _ => unreachable!("unknown event kind {kind}"),
                }
            }
            while let Some(j) = self.next_arrival_at(t) {
                self.next_arrival += 1;
                if self.jobs[j as usize].phase == Phase::Pending {
                    self.enqueue(j, FRESH_SEQ + u64::from(j), &mut new_units);
                }
            }
            self.pass_or_defer(must_pass, new_units);
            debug_assert_eq!(self.waiting_units as usize, self.queue.len());
            steps += 1;
            if steps.is_multiple_of(4096) {
                progress(&self.progress());
            }
        }
        progress(&self.progress());
    }

    fn progress(&self) -> Progress {
        Progress {
            policy: self.policy.kind,
            now_s: self.now,
            jobs_done: self.done,
            jobs_total: self.sim.jobs.len() as u64,
            waiting: self.waiting_units,
            running: self.running_units,
        }
    }

    /// The arrival time of the next job not rejected.
    fn next_pending_arrival(&mut self) -> Option<u64> {
        while self.next_arrival < self.sim.jobs.len()
            && self.jobs[self.next_arrival].phase == Phase::Rejected
        {
            self.next_arrival += 1;
        }
        self.sim.jobs.get(self.next_arrival).map(|j| j.submit)
    }

    fn next_arrival_at(&mut self, t: u64) -> Option<u32> {
        match self.next_pending_arrival() {
            Some(at) if at <= t => Some(self.next_arrival as u32),
            _ => None,
        }
    }

    /// Integrates the (constant) state over `[last, t)` and moves the clock.
    fn advance(&mut self, t: u64) {
        let dt = t.saturating_sub(self.last) as f64;
        if dt > 0.0 {
            let acc = &mut self.acc;
            let (alloc, sched) = (self.allocated as f64, self.schedulable as f64);
            acc.alloc_total += alloc * dt;
            acc.sched_total += sched * dt;
            if self.waiting_units > 0 {
                acc.waiting_s += dt;
                acc.alloc_while_waiting += alloc * dt;
                acc.sched_while_waiting += sched * dt;
                if self.stranded {
                    acc.stranded_while_waiting += self.free as f64 * dt;
                    *acc.stranded_by.entry(self.stranded_for).or_default() += self.free as f64 * dt;
                }
                acc.held_while_waiting += self.held_free as f64 * dt;
                if !self.sim.reserved.is_empty() {
                    let (reserved, owner, borrowed) = self.reserved_use();
                    let acc = &mut self.acc;
                    acc.reserved_while_waiting += reserved as f64 * dt;
                    acc.reserved_owner_while_waiting += owner as f64 * dt;
                    acc.reserved_borrowed_while_waiting += borrowed as f64 * dt;
                }
            }
            for (i, t) in self.tenants.iter_mut().enumerate() {
                t.integrate(dt, self.schedulable, self.sim.shares[i]);
            }
            if self.decay > 0.0 {
                // The average of the GPUs held, weighted by exp(-decay × age):
                // over a constant stretch it moves towards what is held now.
                let keep = (-self.decay * dt).exp();
                for (h, t) in self.history.iter_mut().zip(&self.tenants) {
                    let held = t.held as f64;
                    *h = held + (*h - held) * keep;
                }
            }
        }
        self.last = t;
        self.now = t;
    }

    fn request(&self, job: u32, seq: u64) -> Request {
        let spec = self.spec(job);
        let remaining = (spec.est_work - self.jobs[job as usize].saved).max(1.0);
        Request {
            job: format!("j{job}"),
            ranks: (0..spec.workers).collect(),
            tenant: self.sim.tenants[spec.tenant as usize].clone(),
            gpu_type: self.sim.gpu_type.clone(),
            gpus_per_worker: spec.gpus_per_worker,
            required: Level::Region,
            preferred: spec.best,
            priority: spec.priority,
            seq,
            estimated_duration_s: remaining.ceil() as u64,
            min_workers: 0,
            submitted: spec.submit,
            reservation: (self.jobs[job as usize].reservation)
                .map(|r| self.sim.reserved[r as usize].id.clone()),
        }
    }

    /// GPUs of the capacity reservations now: reserved in all, used by
    /// their own units, and used by other work. The core holds a
    /// reservation's idle GPUs anywhere in its domain, so what other work
    /// holds in the reservations' domains beyond the GPUs there that no
    /// reservation covers is on reserved GPUs: borrowed.
    fn reserved_use(&self) -> (u64, u64, u64) {
        let reserved: u64 = self.sim.reserved.iter().map(|r| u64::from(r.gpus)).sum();
        let owner: u64 = self.reserved_held.iter().sum();
        let (mut gpus, mut allocated) = (0u64, 0u64);
        for (n, node) in self.snap.nodes.iter().enumerate() {
            if node.schedulable && self.sim.in_reserved_domain[n] {
                gpus += u64::from(node.gpus);
                allocated += u64::from(node.gpus) - node.free.len() as u64;
            }
        }
        let others = allocated.saturating_sub(owner);
        let borrowed = (others.saturating_sub(gpus.saturating_sub(reserved)))
            .min(reserved.saturating_sub(owner));
        (reserved, owner, borrowed)
    }

    /// Queues a unit with `seq` (fresh arrivals: `FRESH_SEQ + job`; after a
    /// failure: `job`, at the front; after a preemption: the seq it had);
    /// `new_units` gets it when it entered the window.
    fn enqueue(&mut self, job: u32, seq: u64, new_units: &mut Vec<u32>) {
        // A reserving tenant's unit goes into its reservation when it fits
        // in what the tenant's units there leave of it, else to the pool.
        let spec = self.spec(job);
        let routed = self.sim.reservation_of[spec.tenant as usize].filter(|&r| {
            self.committed[r as usize] + spec.gpus()
                <= u64::from(self.sim.reserved[r as usize].gpus)
        });
        if let Some(r) = routed {
            self.committed[r as usize] += spec.gpus();
            self.waiting_owner_units += 1;
        }
        self.jobs[job as usize].reservation = routed;
        let req = self.request(job, seq);
        let key = (Reverse(req.priority), req.seq, job);
        let spec = self.spec(job);
        let t = &mut self.tenants[spec.tenant as usize];
        t.waiting_units += 1;
        t.waiting_gpus += spec.gpus();
        self.waiting_units += 1;
        self.waiting_high += u64::from(spec.priority > PREEMPTIBLE_PRIORITY);
        let run = &mut self.jobs[job as usize];
        run.phase = Phase::Queued;
        run.qkey = key;
        run.seq = seq;
        if self.queue.push(key, req, spec.gpus()) {
            new_units.push(job);
        }
    }

    /// Could this queued unit fit now, judging by free counts only?
    fn could_fit(&self, job: u32, max_node_free: u32) -> bool {
        let spec = self.spec(job);
        spec.gpus() <= self.free && spec.gpus_per_worker <= max_node_free && self.under_quota(job)
    }

    fn max_node_free(&self) -> u32 {
        self.snap
            .nodes
            .iter()
            .filter(|n| n.schedulable)
            .map(|n| n.free.len() as u32)
            .max()
            .unwrap_or(0)
    }

    /// With a pass interval, a pass that comes due less than an interval
    /// after the last one waits for the interval's end (what it owes is
    /// kept); otherwise it runs now.
    fn pass_or_defer(&mut self, must_pass: bool, mut new_units: Vec<u32>) {
        let must_pass = must_pass || std::mem::take(&mut self.deferred_must_pass);
        if !self.deferred_units.is_empty() {
            let mut owed = std::mem::take(&mut self.deferred_units);
            owed.append(&mut new_units);
            new_units = owed;
        }
        let interval = self.sim.config.pass_interval_s;
        let due = self.last_pass.map_or(0, |t| t.saturating_add(interval));
        if interval > 0 && self.now < due && (must_pass || !new_units.is_empty()) {
            self.deferred_must_pass = must_pass;
            self.deferred_units = new_units;
            if !self.wake_pending {
                self.wake_pending = true;
                self.events.push(Reverse((due, EV_WAKE, 0, 0)));
            }
            return;
        }
        self.schedule(must_pass, new_units);
    }

    /// Runs planning passes at the current time. A pass runs when capacity
    /// grew since the last one, or when a unit new to the window could fit
    /// by free counts; otherwise nothing the last pass left waiting can fit
    /// now either, and the pass is skipped. Under a preempting policy a pass
    /// also runs when a newcomer could preempt, or when the state changed
    /// (`must_pass`) and some waiting unit could. After a pass that placed
    /// units, the window is topped up and the newcomers get a pass of their
    /// own.
    fn schedule(&mut self, mut must_pass: bool, mut new_units: Vec<u32>) {
        loop {
            // A newcomer pushed beyond the window again is not new to the core.
            new_units.retain(|&j| self.queue.windowed(&self.jobs[j as usize].qkey));
            let Some(min_gpus) = self.queue.min_gpus() else {
                self.stranded = false;
                self.held_free = 0;
                return;
            };
            let preempt = |run: &Self| {
                run.preempting
                    && (new_units.iter().any(|&j| run.could_preempt(j))
                        || (must_pass && run.any_waiting_could_preempt()))
            };
            if min_gpus > self.free {
                if !preempt(self) {
                    // Nothing shown to the core fits even the total free
                    // count, and nothing could make room by preempting.
                    self.acc.skipped += u64::from(must_pass || !new_units.is_empty());
                    self.stranded = false;
                    return;
                }
            } else {
                let max_free = self.max_node_free();
                let fitting_new = new_units.iter().any(|&j| self.could_fit(j, max_free));
                if !must_pass && !fitting_new && !preempt(self) {
                    if !new_units.is_empty() {
                        self.acc.skipped += 1;
                    }
                    // A newcomer that fits the free count but no node is stranded.
                    let smallest = (new_units.iter())
                        .filter(|&&j| self.spec(j).gpus() <= self.free && self.under_quota(j))
                        .map(|&j| self.spec(j).gpus())
                        .min();
                    if let Some(gpus) = smallest {
                        self.stranded = true;
                        self.stranded_for = stranded_class(gpus, false);
                    }
                    return;
                }
            }
            self.snap.now = self.now;
            // (The core ignores claims past their time; this only keeps the
            // map small.)
            let now = self.now;
            self.snap.claims.retain(|_, until| *until >= now);
            self.snap.generation += 1;
            self.acc.passes += 1;
            self.last_pass = Some(self.now);
            self.refresh_for_pass();
            self.snap.queue = std::mem::take(&mut self.queue.requests);
            // Jobs owed what their victims free come first in the core's
            // order: shown whatever the window, as the region shows them.
            let windowed = self.snap.queue.len();
            let owed = (self.snap.owed().into_iter())
                .map(job_index)
                .filter(|&j| self.jobs[j as usize].phase == Phase::Queued)
                .filter_map(|j| self.queue.beyond_request(&self.jobs[j as usize].qkey))
                .cloned()
                .collect::<Vec<_>>();
            self.snap.queue.extend(owed);
            let plan = (self.planner)(&self.snap, &self.policy);
            self.snap.queue.truncate(windowed);
            self.queue.requests = std::mem::take(&mut self.snap.queue);
            let mut placed: BTreeMap<u32, QKey> = BTreeMap::new();
            for p in &plan.placements {
                let job = job_index(&p.job);
                let run = &self.jobs[job as usize];
                if run.phase == Phase::Queued && !placed.contains_key(&job) {
                    placed.insert(job, run.qkey);
                    self.start(job, p);
                }
            }
            for p in &plan.preemptions {
                self.preempt(p);
            }
            // The units they are for have the first claim on what they free.
            (self.snap.claims).extend(plan.claims.iter().map(|(j, &until)| (j.clone(), until)));
            new_units.clear();
            self.queue.remove(&placed, &mut new_units);
            // The reservations' GPUs that are free now are held for them.
            self.held_free = (plan.reservations.iter())
                .flat_map(|r| &r.gpus)
                .map(|(node, gpus)| {
                    let n = &self.snap.nodes[self.sim.node_at[node.as_str()] as usize];
                    gpus.iter().filter(|g| n.free.contains(g)).count() as u64
                })
                .sum();
            let free = self.free;
            let smallest = (plan.waiting.iter())
                .filter(|w| {
                    matches!(
                        w.reason,
                        WaitReason::NoCapacity { .. } | WaitReason::Reserved { .. }
                    )
                })
                .map(|w| {
                    let gpus = self.spec(job_index(&w.job)).gpus();
                    (gpus, matches!(w.reason, WaitReason::Reserved { .. }))
                })
                .filter(|&(gpus, _)| gpus <= free)
                .min();
            self.stranded = self.queue.min_gpus().is_some_and(|m| m <= free) && smallest.is_some();
            if let Some((gpus, reserved)) = smallest {
                self.stranded_for = stranded_class(gpus, reserved);
            }
            if placed.is_empty() {
                return;
            }
            must_pass = false;
        }
    }

    /// Brings what changes with time alone up to date in the snapshot: each
    /// tenant's decayed history and each running unit's last checkpoint.
    fn refresh_for_pass(&mut self) {
        for (t, key) in self.usage_keys.iter().enumerate() {
            if let Some(share) = self.snap.shares.get_mut(key) {
                share.history = (self.history[t] * 1000.0).round() as u64;
            }
        }
        if !self.preempting {
            return; // only preemption looks at checkpoints
        }
        let mut running = std::mem::take(&mut self.snap.running);
        for (entry, &job) in running.iter_mut().zip(&self.running_jobs) {
            entry.checkpointed = self.checkpointed(job);
        }
        self.snap.running = running;
    }

    /// When the job last wrote a checkpoint, as of now: the last periodic
    /// one of its current run (every `checkpoint_interval_s` of run time from
    /// its start, none after it was asked to stop), or else its last one
    /// from an earlier run.
    fn checkpointed(&self, job: u32) -> Option<u64> {
        let run = &self.jobs[job as usize];
        let interval = self.sim.config.checkpoint_interval_s;
        let progress_end = run.preempt_at.map_or(self.now, |p| p.min(self.now));
        match progress_end.saturating_sub(run.start).checked_div(interval) {
            Some(k) if k > 0 => Some(run.start + k * interval),
            _ => run.checkpointed,
        }
    }

    /// GPUs held beyond their guarantee by tenants other than `tenant`:
    /// every unit of such a tenant may be a reclaim victim.
    fn borrowers_gpus(&self, tenant: usize) -> u64 {
        (0..self.tenants.len())
            .filter(|&u| u != tenant && self.pool_held(u) > self.sim.guarantees[u])
            .map(|u| self.pool_held(u))
            .sum()
    }

    /// Could this queued unit start by preempting, judging by counts only
    /// (an over-estimate: it costs a pass, never a missed preemption)?
    /// Priority: it is above the preemptible priority and the free GPUs plus
    /// those of preemptible low-priority units cover it. Reclaim: its tenant
    /// is under its guarantee and the free GPUs plus those of tenants beyond
    /// theirs cover it.
    fn could_preempt(&self, job: u32) -> bool {
        let spec = self.spec(job);
        let gpus = spec.gpus();
        if self.jobs[job as usize].reservation.is_some() {
            return self.may_borrow_reserved();
        }
        if spec.priority > PREEMPTIBLE_PRIORITY && self.free + self.low_pri_gpus >= gpus {
            return true;
        }
        let t = spec.tenant as usize;
        self.pool_held(t) < self.sim.guarantees[t]
            && self.under_quota(job)
            && self.free + self.borrowers_gpus(t) >= gpus
    }

    /// Whether preemptible work may hold reserved GPUs, which a unit in the
    /// reservation takes back (`PreemptCause::Reservation`).
    fn may_borrow_reserved(&self) -> bool {
        self.policy.lend_reserved && !self.sim.config.low_priority_tenants.is_empty()
    }

    /// GPUs the tenant holds of the shared pool (outside its reservation).
    fn pool_held(&self, tenant: usize) -> u64 {
        self.tenants[tenant].held - self.reserved_held[tenant]
    }

    /// Could some queued unit (in the window or beyond) preempt, by the
    /// coarser test of counts per tenant?
    fn any_waiting_could_preempt(&self) -> bool {
        if self.waiting_high > 0 && self.low_pri_gpus > 0 {
            return true;
        }
        if self.waiting_owner_units > 0 && self.may_borrow_reserved() {
            return true;
        }
        self.tenants.iter().enumerate().any(|(t, acc)| {
            acc.waiting_units > 0
                && self.pool_held(t) < self.sim.guarantees[t]
                && self.borrowers_gpus(t) > 0
        })
    }

    /// Could this running unit be a victim for some queued unit?
    fn could_be_victim(&self, job: u32) -> bool {
        let spec = self.spec(job);
        let t = spec.tenant as usize;
        if self.jobs[job as usize].low_counted && self.waiting_high > 0 {
            return true;
        }
        // A unit in a reservation is never a victim; a reservation's
        // borrowers are victims whatever their age (no wake-up needed).
        self.jobs[job as usize].reservation.is_none()
            && self.pool_held(t) > self.sim.guarantees[t]
            && (0..self.tenants.len()).any(|u| {
                self.tenants[u].waiting_units > 0 && self.pool_held(u) < self.sim.guarantees[u]
            })
    }

    /// A run reached the minimum run time: true (a pass) when some queued
    /// unit could now take its GPUs.
    fn eligible(&mut self, job: u32, attempt: u32) -> bool {
        let run = &self.jobs[job as usize];
        run.phase == Phase::Running && run.attempt == attempt && self.could_be_victim(job)
    }

    /// Carries out one preemption of the plan: the victim is asked to write a
    /// checkpoint and stop. It keeps its GPUs until the checkpoint is written
    /// (`checkpoint_write_s`) or the deadline passes, whichever is first.
    fn preempt(&mut self, p: &Preemption) {
        let job = job_index(&p.job);
        assert!(
            self.jobs[job as usize].phase == Phase::Running,
            "the core chose {} as a victim for {}, but it is not running (or already stopping)",
            p.job,
            p.for_job
        );
        let write = self.sim.config.checkpoint_write_s;
        let deadline = self.policy.preemption.checkpoint_deadline_s;
        let stop_at = self.now.saturating_add(write.min(deadline));
        self.uncount_low(job);
        let run = &mut self.jobs[job as usize];
        run.phase = Phase::Stopping;
        run.preempt_at = Some(self.now);
        run.preempt_cause = Some(p.cause);
        run.preemptions += 1;
        let (preemptions, attempt) = (run.preemptions, run.attempt);
        match p.cause {
            PreemptCause::Priority => self.acc.preempt_priority += 1,
            PreemptCause::Reclaim => self.acc.preempt_reclaim += 1,
            // The simulator runs no elastic jobs yet, so the core never
            // restarts one larger; counted in the total if it did.
            PreemptCause::Grow => self.acc.preempt_grow += 1,
            PreemptCause::Defrag => self.acc.preempt_defrag += 1,
            PreemptCause::Reservation => self.acc.preempt_reservation += 1,
        }
        self.acc.at_risk_gpu_s += p.at_risk_gpu_s as f64;
        let tenant = self.spec(job).tenant as usize;
        self.tenants[tenant].preempted += 1;
        let entry = &mut self.snap.running[self.running_at[job as usize] as usize];
        entry.preempted_for = Some(p.for_job.clone());
        entry.preempted_at = Some(self.now);
        entry.preemptions = preemptions;
        entry.expected_end = entry.expected_end.min(stop_at);
        self.events.push(Reverse((stop_at, EV_STOP, job, attempt)));
    }

    /// A victim's checkpoint is written (or the deadline passed): it frees
    /// its GPUs and requeues with its seq and priority, to resume from the
    /// checkpoint. True when it stopped (capacity grew).
    fn stop(&mut self, job: u32, attempt: u32, new_units: &mut Vec<u32>) -> bool {
        let run = &self.jobs[job as usize];
        if run.phase != Phase::Stopping || run.attempt != attempt {
            return false; // it finished, or a failure stopped it first
        }
        let spec = self.spec(job);
        let gpus = spec.gpus() as f64;
        let asked = run.preempt_at.expect("a stopping job was asked");
        let progress = (asked - run.start) as f64 * run.factor;
        let interval = self.sim.config.checkpoint_interval_s;
        let written =
            self.sim.config.checkpoint_write_s <= self.policy.preemption.checkpoint_deadline_s;
        let now = self.now;
        let run = &mut self.jobs[job as usize];
        let lost = if written {
            // Resumes with everything done until it was asked; the write
            // itself bought nothing.
            run.saved = (run.saved + progress).min(spec.work);
            run.checkpointed = Some(now);
            (now - asked) as f64 * gpus
        } else {
            // No checkpoint in time: back to the last periodic one.
            self.acc.checkpoint_timeouts += 1;
            let k = (asked - run.start).checked_div(interval).unwrap_or(0);
            if k > 0 {
                run.saved = (run.saved + run.factor * (k * interval) as f64).min(spec.work);
                run.checkpointed = Some(run.start + k * interval);
            }
            (now - run.start - k * interval) as f64 * gpus
        };
        run.preempt_at = None;
        run.lost_preempt_gpu_s += lost;
        let seq = run.seq;
        let cause = run.preempt_cause.take().unwrap_or(PreemptCause::Priority);
        self.acc.lost_preempt_gpu_s += lost;
        self.record(job, PlacementEnd::Preempted(cause));
        self.release(job);
        self.enqueue(job, seq, new_units);
        true
    }

    /// Counts a running unit as a priority-preemption candidate when it is one.
    fn count_low(&mut self, job: u32) {
        let spec = self.spec(job);
        let run = &mut self.jobs[job as usize];
        if spec.priority <= PREEMPTIBLE_PRIORITY
            && run.preemptions < self.policy.preemption.max_preemptions
        {
            run.low_counted = true;
            self.low_pri_gpus += spec.gpus();
        }
    }

    fn uncount_low(&mut self, job: u32) {
        let gpus = self.spec(job).gpus();
        let run = &mut self.jobs[job as usize];
        if std::mem::take(&mut run.low_counted) {
            self.low_pri_gpus -= gpus;
        }
    }

    /// Would starting it keep its tenant within a hard quota?
    fn under_quota(&self, job: u32) -> bool {
        let spec = self.spec(job);
        self.sim.quotas[spec.tenant as usize]
            .is_none_or(|q| self.tenants[spec.tenant as usize].held + spec.gpus() <= u64::from(q))
    }

    /// Starts a placed unit.
    fn start(&mut self, job: u32, p: &Placement) {
        let spec = self.spec(job);
        if spec.workers > 1 {
            self.note_gang(job, p);
        }
        let now = self.now;
        let factor = self.sim.config.locality.factor(p.level, spec.best);
        let gpus = spec.gpus();
        let mut held: Vec<(u32, Vec<u32>)> = Vec::with_capacity(p.workers.len());
        for w in &p.workers {
            let n = self.sim.node_at[w.node.as_str()];
            let node = &mut self.snap.nodes[n as usize];
            assert!(
                node.schedulable && w.gpus.iter().all(|g| node.free.contains(g)),
                "the core placed {} on GPUs of {} that are not free",
                p.job,
                w.node
            );
            node.free.retain(|g| !w.gpus.contains(g));
            match held.last_mut() {
                Some((last, gs)) if *last == n => gs.extend_from_slice(&w.gpus),
                _ => held.push((n, w.gpus.clone())),
            }
        }
        let run = &mut self.jobs[job as usize];
        let remaining = (spec.work - run.saved).max(0.0);
        let est_remaining = (spec.est_work - run.saved).max(0.0);
        let end = now + (remaining / factor).ceil() as u64;
        let expected_end = now + (est_remaining / factor).ceil() as u64;
        run.phase = Phase::Running;
        run.attempt += 1;
        run.start = now;
        run.factor = factor;
        run.level = Some(p.level);
        run.first_start.get_or_insert(now);
        run.starts += 1;
        if let Some(hit) = run.hit_at.take() {
            let waited = (now - hit) as f64;
            self.acc.recovery_s.push(waited);
            self.acc.waiting_after_failures_gpu_s += waited * gpus as f64;
        }
        let run = &mut self.jobs[job as usize];
        let attempt = run.attempt;
        let (checkpointed, preemptions, reservation) =
            (run.checkpointed, run.preemptions, run.reservation);
        let tenant = &self.sim.tenants[spec.tenant as usize];
        self.running_at[job as usize] = self.snap.running.len() as u32;
        self.running_jobs.push(job);
        // `..Default` keeps this building when the core grows new fields.
        #[allow(clippy::needless_update)]
        let entry = Running {
            job: p.job.clone(),
            tenant: tenant.clone(),
            gpu_type: self.sim.gpu_type.clone(),
            priority: spec.priority,
            gpus: held
                .iter()
                .map(|(n, gs)| (self.sim.nodes[*n as usize].node_id.clone(), gs.clone()))
                .collect(),
            expected_end,
            started: now,
            checkpointed,
            preemptions,
            preempted_for: None,
            reservation: reservation.map(|r| self.sim.reserved[r as usize].id.clone()),
            ..Running::default()
        };
        if reservation.is_some() {
            self.reserved_held[spec.tenant as usize] += gpus;
            self.waiting_owner_units -= 1;
        }
        self.snap.running.push(entry);
        self.jobs[job as usize].held = held;
        let usage_key = &self.usage_keys[spec.tenant as usize];
        match self.snap.usage.get_mut(usage_key) {
            Some(u) => *u += gpus as u32,
            None => {
                self.snap.usage.insert(usage_key.clone(), gpus as u32);
            }
        }
        let t = &mut self.tenants[spec.tenant as usize];
        t.held += gpus;
        t.waiting_units -= 1;
        t.waiting_gpus -= gpus;
        self.waiting_units -= 1;
        self.waiting_high -= u64::from(spec.priority > PREEMPTIBLE_PRIORITY);
        self.running_units += 1;
        self.free -= gpus;
        self.allocated += gpus;
        if spec.level_is_spread(p.level) {
            self.acc.gangs.spread_starts += 1;
        }
        if self.preempting {
            self.count_low(job);
        }
        self.schedule_run(job, attempt, end);
    }

    /// The events of a run that starts now: its completion at `end` and,
    /// under a preempting policy, the moment it reaches the minimum run time.
    fn schedule_run(&mut self, job: u32, attempt: u32, end: u64) {
        self.events.push(Reverse((end, EV_COMPLETE, job, attempt)));
        if self.preempting {
            let times = self.jobs[job as usize].preemptions;
            let eligible = (self.now).saturating_add(self.policy.preemption.min_run_for(times));
            self.events
                .push(Reverse((eligible, EV_ELIGIBLE, job, attempt)));
        }
    }

    /// Part of the fleet in service (up or failed): holds a slot.
    fn in_service(&self, node: u32) -> bool {
        self.node_slot[node as usize] != u32::MAX
    }

    /// Gang placement statistics, taken before the gang's GPUs leave the
    /// free lists (so "a leaf could hold it" sees what this pass left).
    fn note_gang(&mut self, job: u32, p: &Placement) {
        let spec = self.spec(job);
        let mut fits_per_leaf = vec![0u32; self.sim.leaves as usize];
        for (i, n) in self.snap.nodes.iter().enumerate() {
            if n.schedulable {
                fits_per_leaf[self.sim.leaf_of[i] as usize] +=
                    n.free.len() as u32 / spec.gpus_per_worker;
            }
        }
        let leaf_could = fits_per_leaf.iter().any(|&w| w >= spec.workers);
        let g = &mut self.acc;
        g.gangs.multi_node_starts += 1;
        let in_leaf = p.level <= Level::Leaf;
        g.in_leaf += u64::from(in_leaf);
        g.in_spine += u64::from(p.level <= Level::Spine);
        if leaf_could {
            g.gangs.leaf_could_hold += 1;
            g.in_leaf_when_could += u64::from(in_leaf);
        }
    }

    /// Frees a unit's GPUs (into its nodes' free lists; only GPUs of nodes in
    /// service count as free capacity).
    fn release(&mut self, job: u32) {
        let spec = self.spec(job);
        let gpus = spec.gpus();
        let held = std::mem::take(&mut self.jobs[job as usize].held);
        for (n, gs) in held {
            let node = &mut self.snap.nodes[n as usize];
            node.free.extend_from_slice(&gs);
            node.free.sort_unstable();
            if self.node_up[n as usize] {
                self.free += gs.len() as u64;
            }
        }
        let at = std::mem::replace(&mut self.running_at[job as usize], u32::MAX) as usize;
        self.snap.running.swap_remove(at);
        self.running_jobs.swap_remove(at);
        if let Some(&moved) = self.running_jobs.get(at) {
            self.running_at[moved as usize] = at as u32;
        }
        self.uncount_low(job);
        if let Some(u) = self
            .snap
            .usage
            .get_mut(&self.usage_keys[spec.tenant as usize])
        {
            *u = u.saturating_sub(gpus as u32);
        }
        self.tenants[spec.tenant as usize].held -= gpus;
        if let Some(r) = self.jobs[job as usize].reservation {
            self.reserved_held[spec.tenant as usize] -= gpus;
            self.committed[r as usize] -= gpus;
        }
        self.allocated -= gpus;
        self.running_units -= 1;
    }

    /// A completion event; true when it freed GPUs. A victim still writing
    /// its checkpoint when its run ends finishes instead of stopping.
    fn complete(&mut self, job: u32, attempt: u32) -> bool {
        let run = &self.jobs[job as usize];
        if !matches!(run.phase, Phase::Running | Phase::Stopping) || run.attempt != attempt {
            return false; // killed since; a later attempt has its own event
        }
        if run.phase == Phase::Stopping {
            self.acc.victims_finished += 1;
        }
        self.record(job, PlacementEnd::Succeeded);
        self.release(job);
        let run = &mut self.jobs[job as usize];
        run.preempt_at = None;
        run.phase = Phase::Done;
        run.end = Some(self.now);
        self.done += 1;
        true
    }

    /// A node fails: it leaves service until repaired. Every unit with a
    /// worker on it loses the work since its last checkpoint. Under
    /// `SpareMode::Swap`, when running work is hit and an idle spare is
    /// left, the nearest spare takes the node's place and its running units
    /// restart there at once, keeping their other GPUs; otherwise (and for a
    /// victim already stopping) they requeue at the front. True when a node
    /// in service went down.
    fn fail(&mut self, node: u32, new_units: &mut Vec<u32>) -> bool {
        let n = node as usize;
        if !self.node_up[n] || !self.in_service(node) {
            return false;
        }
        self.acc.node_failures += 1;
        self.node_up[n] = false;
        self.snap.nodes[n].schedulable = false;
        let gpus = u64::from(self.sim.nodes[n].gpus);
        self.schedulable -= gpus;
        self.free -= self.snap.nodes[n].free.len() as u64;
        let victims: Vec<u32> = self
            .snap
            .running
            .iter()
            .map(|r| job_index(&r.job))
            .filter(|&j| self.jobs[j as usize].held.iter().any(|(h, _)| *h == node))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        let (running, stopping): (Vec<u32>, Vec<u32>) = victims
            .iter()
            .partition(|&&j| self.jobs[j as usize].phase == Phase::Running);
        self.acc.failures_under_work += u64::from(!victims.is_empty());
        let spare = if running.is_empty() {
            None
        } else {
            self.nearest_spare(node)
        };
        let requeued = if spare.is_some() { stopping } else { victims };
        for &job in &requeued {
            self.kill(job);
            self.jobs[job as usize].hit_at = Some(self.now);
            self.enqueue(job, u64::from(job), new_units);
        }
        if let Some(s) = spare {
            self.swap_in(node, s);
            for &job in &running {
                self.restart_on_spare(job, node, s);
            }
        }
        let repair_at = self.now.saturating_add(self.sim.config.repair_time_s);
        self.events.push(Reverse((repair_at, EV_REPAIR, node, 0)));
        // Pass even when nobody was hit: the free count shrank, so what the
        // last pass found stranded must be judged again.
        true
    }

    /// The idle spare nearest to `failed` on the fabric: in its leaf, else
    /// in its spine, else anywhere (lowest index among equals), with as
    /// many GPUs.
    fn nearest_spare(&self, failed: u32) -> Option<u32> {
        let f = &self.sim.nodes[failed as usize];
        (0..self.sim.nodes.len())
            .filter(|&i| self.in_pool[i] && self.node_up[i])
            .filter(|&i| self.sim.nodes[i].gpus == f.gpus)
            .min_by_key(|&i| {
                let c = &self.sim.nodes[i];
                let distance = if c.spine != f.spine {
                    2
                } else if c.leaf != f.leaf {
                    1
                } else {
                    0
                };
                (distance, i)
            })
            .map(|i| i as u32)
    }

    /// Spare `s` takes the place of failed node `n` in the fleet in service:
    /// its slot, its free GPUs (the same indices) and its capacity. `n`
    /// leaves the fleet in service; once repaired it joins the pool.
    fn swap_in(&mut self, n: u32, s: u32) {
        let (ni, si) = (n as usize, s as usize);
        let all: Vec<u32> = (0..self.sim.nodes[ni].gpus).collect();
        let free = std::mem::replace(&mut self.snap.nodes[ni].free, all);
        self.free += free.len() as u64;
        self.snap.nodes[si].free = free;
        self.snap.nodes[si].schedulable = true;
        self.schedulable += u64::from(self.sim.nodes[si].gpus);
        self.in_pool[si] = false;
        let slot = std::mem::replace(&mut self.node_slot[ni], u32::MAX);
        self.slot_node[slot as usize] = s;
        self.node_slot[si] = slot;
        self.acc.spare_swaps += 1;
    }

    /// A running unit whose node `from` failed restarts at once from its
    /// last checkpoint with spare `to` in that node's place (the same GPU
    /// indices) and its other GPUs kept; its level, and so its speed, is
    /// that of the new set of nodes.
    fn restart_on_spare(&mut self, job: u32, from: u32, to: u32) {
        self.roll_back_to_checkpoint(job);
        self.record(job, PlacementEnd::NodeLost);
        let now = self.now;
        let spec = self.spec(job);
        let mut held = std::mem::take(&mut self.jobs[job as usize].held);
        for (node, _) in &mut held {
            if *node == from {
                *node = to;
            }
        }
        let level = self.level_of(&held);
        let factor = self.sim.config.locality.factor(level, spec.best);
        let run = &mut self.jobs[job as usize];
        run.held = held;
        let remaining = (spec.work - run.saved).max(0.0);
        let est_remaining = (spec.est_work - run.saved).max(0.0);
        run.attempt += 1;
        run.start = now;
        run.factor = factor;
        run.level = Some(level);
        run.starts += 1;
        let attempt = run.attempt;
        let checkpointed = run.checkpointed;
        self.acc.recovery_s.push(0.0);
        let (from_id, to_id) = (
            &self.sim.nodes[from as usize].node_id,
            &self.sim.nodes[to as usize].node_id,
        );
        let entry = &mut self.snap.running[self.running_at[job as usize] as usize];
        for (node, _) in &mut entry.gpus {
            if node == from_id {
                node.clone_from(to_id);
            }
        }
        entry.started = now;
        entry.checkpointed = checkpointed;
        entry.expected_end = now + (est_remaining / factor).ceil() as u64;
        self.schedule_run(job, attempt, now + (remaining / factor).ceil() as u64);
    }

    /// The tightest level holding every node of `held`.
    fn level_of(&self, held: &[(u32, Vec<u32>)]) -> Level {
        Level::holding(held.iter().map(|(n, _)| {
            let n = &self.sim.nodes[*n as usize];
            (n.spine.as_str(), n.leaf.as_str(), n.nvlink_domain.as_str())
        }))
    }

    /// Stops a running (or stopping) unit after a failure, keeping what its
    /// last checkpoint saved, and frees its GPUs.
    fn kill(&mut self, job: u32) {
        self.roll_back_to_checkpoint(job);
        self.record(job, PlacementEnd::NodeLost);
        self.release(job);
    }

    /// The placements of a unit's current attempt, ending now.
    fn record(&mut self, job: u32, ended_by: PlacementEnd) {
        let spec = self.spec(job);
        let run = &self.jobs[job as usize];
        for (rank, (node, gpus)) in run.held.iter().enumerate() {
            self.placements.push(PlacementRecord {
                job: job as usize,
                tenant: spec.tenant,
                priority: spec.priority,
                attempt: run.attempt,
                node: *node,
                rank: rank as u32,
                gpus: gpus.len() as u32,
                start_s: run.start,
                end_s: self.now,
                ended_by,
                checkpointed_s: run.checkpointed,
            });
        }
    }

    /// A failure's cost to a unit: it keeps what its last checkpoint saved
    /// (the last periodic one of this run, else what it resumed from; a
    /// victim still writing its checkpoint loses it) and loses the rest of
    /// the run, counted as lost to failures.
    fn roll_back_to_checkpoint(&mut self, job: u32) {
        let spec = self.spec(job);
        let interval = self.sim.config.checkpoint_interval_s;
        let now = self.now;
        let run = &mut self.jobs[job as usize];
        let elapsed = now - run.start;
        // No progress after it was asked to checkpoint.
        let progress = run.preempt_at.take().map_or(elapsed, |p| p - run.start);
        // Without periodic checkpoints (interval 0) nothing of this run is kept.
        let intervals = progress.checked_div(interval).unwrap_or(0);
        if intervals > 0 {
            let kept = run.factor * (intervals * interval) as f64;
            run.saved = (run.saved + kept).min(spec.work);
            run.checkpointed = Some(run.start + intervals * interval);
        }
        let lost = (elapsed - intervals * interval) as f64 * spec.gpus() as f64;
        run.lost_gpu_s += lost;
        self.acc.lost_failures_gpu_s += lost;
        self.acc.restarts += 1;
    }

    /// A node comes back from repair. Into service when it still holds its
    /// slot (true: capacity grew). When a spare took its place, it fills the
    /// slot of a node in service that failed with no spare left, if there
    /// is one (true), else it joins the spare pool (false): repaired nodes
    /// refill the fleet in service first, then the pool.
    fn repair(&mut self, node: u32) -> bool {
        let n = node as usize;
        if self.node_up[n] {
            return false;
        }
        self.node_up[n] = true;
        if !self.in_service(node) {
            let gpus = self.sim.nodes[n].gpus;
            let empty = self.slot_node.iter().position(|&k| {
                !self.node_up[k as usize] && self.sim.nodes[k as usize].gpus == gpus
            });
            let Some(slot) = empty else {
                self.in_pool[n] = true;
                return false;
            };
            // The failed node gives up its slot (it holds nothing: its
            // units were stopped when it failed) and joins the pool once
            // repaired, by this same rule.
            let k = self.slot_node[slot] as usize;
            self.node_slot[k] = u32::MAX;
            self.slot_node[slot] = node;
            self.node_slot[n] = slot as u32;
        }
        self.snap.nodes[n].schedulable = true;
        self.schedulable += u64::from(self.sim.nodes[n].gpus);
        self.free += self.snap.nodes[n].free.len() as u64;
        true
    }

    /// How the capacity reservations were used, and what the reserving
    /// tenants' jobs saw against the others'.
    fn reserved_stats(&self) -> ReservedStats {
        let sim = self.sim;
        let acc = &self.acc;
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let (mut jct_reserving, mut jct_others) = (Vec::new(), Vec::new());
        let (mut delay_in, mut delay_pool) = (Vec::new(), Vec::new());
        let mut jobs_in = 0;
        for (spec, run) in sim.jobs.iter().zip(&self.jobs) {
            let reserving = sim.reservation_of[spec.tenant as usize].is_some();
            if let Some(end) = run.end {
                let jct = (end - spec.submit) as f64;
                if reserving {
                    jct_reserving.push(jct);
                } else {
                    jct_others.push(jct);
                }
            }
            if let (true, Some(start)) = (reserving, run.first_start) {
                let delay = (start - spec.submit) as f64;
                if run.reservation.is_some() {
                    jobs_in += 1;
                    delay_in.push(delay);
                } else {
                    delay_pool.push(delay);
                }
            }
        }
        ReservedStats {
            gpus: sim.reserved.iter().map(|r| u64::from(r.gpus)).sum(),
            lent: self.policy.lend_reserved,
            used_by_owners_pct: pct(acc.reserved_owner_while_waiting, acc.reserved_while_waiting),
            used_by_borrowers_pct: pct(
                acc.reserved_borrowed_while_waiting,
                acc.reserved_while_waiting,
            ),
            preemptions: acc.preempt_reservation,
            owner_jobs_in_reservations: jobs_in,
            owner_jobs_in_pool: delay_pool.len() as u64,
            jct_mean_reserving_tenants_s: mean(&jct_reserving),
            jct_mean_other_tenants_s: mean(&jct_others),
            queueing_delay_mean_in_reservations_s: mean(&delay_in),
            queueing_delay_mean_owners_in_pool_s: mean(&delay_pool),
        }
    }

    fn finish(mut self) -> SimOutcome {
        let sim = self.sim;
        for job in 0..self.jobs.len() as u32 {
            if matches!(
                self.jobs[job as usize].phase,
                Phase::Running | Phase::Stopping
            ) {
                self.record(job, PlacementEnd::Running);
            }
        }
        let mut jct = Vec::new();
        let mut delay = Vec::new();
        let mut makespan = 0;
        let mut outcomes = Vec::with_capacity(sim.jobs.len());
        for (i, (spec, run)) in sim.jobs.iter().zip(&self.jobs).enumerate() {
            let tenant = &mut self.tenants[spec.tenant as usize];
            tenant.lost_failures_gpu_s += run.lost_gpu_s;
            if let Some(end) = run.end {
                tenant.completed += 1;
                tenant.jct_sum_s += (end - spec.submit) as f64;
                jct.push((end - spec.submit) as f64);
                makespan = makespan.max(end);
            }
            if let Some(start) = run.first_start {
                delay.push((start - spec.submit) as f64);
            }
            outcomes.push(JobOutcome {
                index: i,
                tenant: sim.tenants[spec.tenant as usize].clone(),
                gpus: spec.gpus(),
                submit_s: spec.submit,
                first_start_s: run.first_start,
                end_s: run.end,
                starts: run.starts,
                level: run.level,
                lost_gpu_s: run.lost_gpu_s,
                preemptions: run.preemptions,
                lost_to_preemption_gpu_s: run.lost_preempt_gpu_s,
                rejected: run.phase == Phase::Rejected,
            });
        }
        if self.acc.unfinished == 0 {
            self.acc.unfinished = self.waiting_units + self.running_units;
        }
        let reserved = (!sim.reserved.is_empty()).then(|| self.reserved_stats());
        let acc = &self.acc;
        let tenants: Vec<_> = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| t.report(&sim.tenants[i], sim.shares[i]))
            .collect();
        let min = tenants
            .iter()
            .filter(|t| t.entitlement_pct > 0.0)
            .filter_map(|t| Some((t.entitlement_fulfilment_pct?, t.tenant.clone())))
            .min_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let below = tenants
            .iter()
            .filter(|t| t.entitlement_pct > 0.0)
            .filter_map(|t| Some((t.time_below_90_pct?, t.tenant.clone())))
            .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)));
        let mut gangs = acc.gangs.clone();
        let starts = gangs.multi_node_starts as f64;
        gangs.in_one_leaf_pct = pct(acc.in_leaf as f64, starts);
        gangs.in_one_spine_pct = pct(acc.in_spine as f64, starts);
        gangs.in_one_leaf_when_a_leaf_could_pct =
            pct(acc.in_leaf_when_could as f64, gangs.leaf_could_hold as f64);
        let metrics = Metrics {
            policy: self.policy.kind,
            jobs: sim.jobs.len() as u64,
            jobs_completed: self.done,
            jobs_rejected: sim.summary.jobs_rejected,
            jobs_unfinished: acc.unfinished,
            fleet_gpus: sim.fleet_gpus,
            allocation_while_waiting_pct: pct(acc.alloc_while_waiting, acc.sched_while_waiting),
            utilization_pct: pct(acc.alloc_total, acc.sched_total),
            hours_with_waiting_jobs: acc.waiting_s / 3600.0,
            stranded_while_gang_waits_pct: pct(acc.stranded_while_waiting, acc.sched_while_waiting),
            held_for_reservations_while_waiting_pct: pct(
                acc.held_while_waiting,
                acc.sched_while_waiting,
            ),
            stranded_by_waiting_unit_pct: (acc.stranded_by.iter())
                .filter_map(|(k, &v)| Some((k.to_string(), pct(v, acc.sched_while_waiting)?)))
                .collect(),
            jct_s: Summary::of(jct),
            queueing_delay_s: Summary::of(delay),
            makespan_s: makespan,
            gangs,
            gpu_hours: acc.alloc_total / 3600.0,
            gpu_hours_lost_to_failures: acc.lost_failures_gpu_s / 3600.0,
            gpu_hours_lost_to_preemption: acc.lost_preempt_gpu_s / 3600.0,
            preemptions: acc.preempt_priority
                + acc.preempt_reclaim
                + acc.preempt_grow
                + acc.preempt_defrag
                + acc.preempt_reservation,
            preemptions_priority: acc.preempt_priority,
            preemptions_reclaim: acc.preempt_reclaim,
            preemptions_defrag: acc.preempt_defrag,
            jobs_preempted: self.jobs.iter().filter(|r| r.preemptions > 0).count() as u64,
            max_preemptions_of_a_job: self.jobs.iter().map(|r| r.preemptions).max().unwrap_or(0),
            preemption_victims_finished: acc.victims_finished,
            preemption_checkpoint_timeouts: acc.checkpoint_timeouts,
            gpu_hours_at_risk_in_preemption: acc.at_risk_gpu_s / 3600.0,
            node_failures: acc.node_failures,
            failures_under_work: acc.failures_under_work,
            spare_swaps: acc.spare_swaps,
            restarts: acc.restarts,
            recovery_after_failure_s: Summary::of(acc.recovery_s.clone()),
            gpu_hours_waiting_after_failures: acc.waiting_after_failures_gpu_s / 3600.0,
            goodput_pct: pct(
                acc.alloc_total - acc.lost_failures_gpu_s - acc.lost_preempt_gpu_s,
                acc.alloc_total,
            ),
            min_entitlement_fulfilment_pct: min.as_ref().map(|m| m.0),
            min_entitlement_fulfilment_tenant: min.map(|m| m.1),
            max_time_below_90_pct: below.as_ref().map(|m| m.0),
            max_time_below_90_tenant: below.map(|m| m.1),
            tenants,
            passes: acc.passes,
            passes_skipped: acc.skipped,
            reserved,
        };
        SimOutcome {
            metrics,
            jobs: outcomes,
            placements: std::mem::take(&mut self.placements),
        }
    }
}

impl JobSpec {
    fn level_is_spread(&self, placed: Level) -> bool {
        placed > self.best
    }
}

/// `j123` → 123.
fn job_index(id: &str) -> u32 {
    id.strip_prefix('j')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the core returned a job id {id:?} the simulator never queued"))
}

/// The class of the smallest waiting unit that could have used stranded
/// GPUs: its size, and whether it held a reservation (waiting for the
/// domain it prefers or the first it fits) or had none (no domain now).
fn stranded_class(gpus: u64, reserved: bool) -> &'static str {
    match (gpus, reserved) {
        (0..=1, false) => "1 GPU, no capacity",
        (0..=1, true) => "1 GPU, reserved",
        (2..=4, false) => "2-4 GPUs, no capacity",
        (2..=4, true) => "2-4 GPUs, reserved",
        (5..=8, false) => "5-8 GPUs, no capacity",
        (5..=8, true) => "5-8 GPUs, reserved",
        (9..=32, false) => "9-32 GPUs, no capacity",
        (9..=32, true) => "9-32 GPUs, reserved",
        (_, false) => "33+ GPUs, no capacity",
        (_, true) => "33+ GPUs, reserved",
    }
}
