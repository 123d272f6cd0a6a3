//! The scheduling loop: snapshot → plan (pure core) → generation-checked
//! commit. Only the leader runs passes; see [`crate::leader`].
//!
//! Scheduling is partitioned by GPU type: while it leads, a replica runs
//! one pass loop per type of its fleet, each on its own snapshot of that
//! type's nodes and jobs, committing against that type's partition
//! version ([`Store::apply_plan`]). A slow or busy pool never holds up
//! another's passes, and two pools' commits never make each other stale.
//! Each dedicated cluster is a partition too (`store::pool_key`): its own
//! loop, snapshot and version, over its nodes and jobs only.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::Utc;
use gangway_sched::{plan, plan_partitioned, Snapshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::AppState;
use crate::config::Planning;
use crate::leader::Leadership;
use crate::store::{Store, StoreError};

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct PassOutcome {
    /// Units (gangs or array workers) placed.
    pub placements: usize,
    pub placed_workers: usize,
    /// Units left waiting.
    pub waiting: usize,
    /// Running jobs asked to checkpoint and stop to make room.
    pub preempted: usize,
    /// The plan lost a race and was discarded.
    pub stale: bool,
    /// Time spent reading the snapshot, planning, and committing.
    pub phases: Phases,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    pub snapshot: Duration,
    pub plan: Duration,
    pub commit: Duration,
}

/// Runs one scheduling pass against the store with the default planning
/// settings ([`crate::RegionConfig::new`]'s) and this agent timeout.
pub async fn run_pass(store: &Store, agent_timeout: Duration) -> Result<PassOutcome, StoreError> {
    run_pass_with(store, &Planning::with_agent_timeout(agent_timeout)).await
}

/// Runs one scheduling pass over every GPU type against the store (the
/// types' shared pools planned at once, [`plan_partitioned`]; committed
/// together), then one over each dedicated cluster; the outcomes summed.
pub async fn run_pass_with(store: &Store, planning: &Planning) -> Result<PassOutcome, StoreError> {
    let mut out = pass(store, planning, None).await?;
    let (_, shape) = store.fleet_shape().await?;
    for key in shape
        .keys()
        .filter(|k| crate::store::cluster_of_key(k).is_some())
    {
        let o = pass(store, planning, Some(key)).await?;
        out.placements += o.placements;
        out.placed_workers += o.placed_workers;
        out.waiting += o.waiting;
        out.preempted += o.preempted;
        out.stale |= o.stale;
    }
    Ok(out)
}

/// Runs one scheduling pass over one partition: a GPU type's shared pool,
/// or a dedicated cluster's (`store::pool_key`).
pub async fn run_partition_pass(
    store: &Store,
    planning: &Planning,
    partition: &str,
) -> Result<PassOutcome, StoreError> {
    pass(store, planning, Some(partition)).await
}

async fn pass(
    store: &Store,
    planning: &Planning,
    only: Option<&str>,
) -> Result<PassOutcome, StoreError> {
    let started = Instant::now();
    let data = match only {
        Some(t) => (store.snapshot_partition(t, planning.agent_timeout, planning.history)).await?,
        None => (store.snapshot_with(planning.agent_timeout, planning.history)).await?,
    };
    let snapshot_took = started.elapsed();
    let snapshot = data.snapshot;
    let policy = planning.policy.clone();
    let (snapshot, planned, plan_took) = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let p = plan_partitioned(&snapshot, &policy);
        (snapshot, p, t.elapsed())
    })
    .await
    .expect("the planner does not panic");
    let partition = only.unwrap_or("all").to_string();
    record_fleet_metrics(&snapshot, &data.racks, only);
    let mut outcome = PassOutcome {
        placements: planned.placements.len(),
        waiting: planned.waiting.len(),
        phases: Phases {
            snapshot: snapshot_took,
            plan: plan_took,
            commit: Duration::ZERO,
        },
        ..Default::default()
    };
    metrics::histogram!("gangway_schedule_phase_seconds", "phase" => "snapshot", "partition" => partition.clone())
        .record(snapshot_took.as_secs_f64());
    metrics::histogram!("gangway_schedule_phase_seconds", "phase" => "plan", "partition" => partition.clone())
        .record(plan_took.as_secs_f64());
    if planned.placements.is_empty() && planned.preemptions.is_empty() {
        // Nothing to commit: leave the generation alone so that a plan
        // another replica is applying right now does not go stale for nothing.
        metrics::counter!("gangway_schedule_passes_total", "outcome" => "idle", "partition" => partition.clone()).increment(1);
        metrics::histogram!("gangway_schedule_pass_seconds", "partition" => partition)
            .record(started.elapsed().as_secs_f64());
        return Ok(outcome);
    }
    let commit_started = Instant::now();
    let applied = store.apply_plan(&planned).await;
    outcome.phases.commit = commit_started.elapsed();
    metrics::histogram!("gangway_schedule_phase_seconds", "phase" => "commit", "partition" => partition.clone())
        .record(outcome.phases.commit.as_secs_f64());
    match applied {
        Ok(applied) => {
            outcome.placed_workers = applied.placed_workers;
            outcome.preempted = applied.preempted.len();
            for (job, cause) in &applied.preempted {
                tracing::info!(job_id = %job, cause = cause.as_str(), "asked to checkpoint and stop to make room");
                metrics::counter!("gangway_preemptions_total", "cause" => cause.as_str())
                    .increment(1);
            }
            let now = Utc::now();
            for p in &planned.placements {
                metrics::counter!("gangway_placements_total", "level" => p.level.as_str())
                    .increment(1);
                if let Some(at) = data.submitted_at.get(&p.job) {
                    let wait = (now - *at).num_milliseconds().max(0) as f64 / 1000.0;
                    metrics::histogram!("gangway_queue_wait_seconds").record(wait);
                }
            }
            metrics::counter!("gangway_schedule_passes_total", "outcome" => "committed", "partition" => partition.clone())
                .increment(1);
        }
        Err(StoreError::StalePlan(why)) => {
            tracing::debug!(%why, "plan rejected as stale");
            metrics::counter!("gangway_schedule_passes_total", "outcome" => "stale", "partition" => partition.clone()).increment(1);
            outcome.stale = true;
        }
        Err(e) => {
            metrics::counter!("gangway_schedule_passes_total", "outcome" => "error", "partition" => partition.clone()).increment(1);
            return Err(e);
        }
    }
    metrics::histogram!("gangway_schedule_pass_seconds", "partition" => partition)
        .record(started.elapsed().as_secs_f64());
    Ok(outcome)
}

/// GPU and queue gauges per type (per dedicated cluster, for a cluster's
/// `partition`), and each budgeted rack's power budget and headroom. A partition's pass covers only the racks holding its
/// type's nodes; their figures are whole-rack, so passes of different
/// partitions agree on a shared rack.
fn record_fleet_metrics(
    s: &Snapshot,
    racks: &BTreeMap<String, crate::store::RackPower>,
    partition: Option<&str>,
) {
    for (rack, p) in racks {
        metrics::gauge!("gangway_rack_power_budget_watts", "rack" => rack.clone())
            .set(p.budget_w as f64);
        metrics::gauge!("gangway_rack_power_headroom_watts", "rack" => rack.clone())
            .set(p.headroom_w() as f64);
    }
    let mut by_type: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for n in &s.nodes {
        let e = by_type.entry(n.gpu_type.as_str()).or_default();
        e.0 += (n.gpus as u64).saturating_sub(n.free.len() as u64);
        if n.schedulable {
            e.1 += n.free.len() as u64;
        }
    }
    let mut queued: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &s.queue {
        *queued.entry(r.gpu_type.as_str()).or_default() += 1;
    }
    if let Some(cluster) = partition.and_then(crate::store::cluster_of_key) {
        // A dedicated cluster's GPUs are not its type's shared pool's.
        let (allocated, free) = by_type.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let id = cluster.to_string();
        metrics::gauge!("gangway_cluster_gpus_allocated", "cluster" => id.clone())
            .set(allocated as f64);
        metrics::gauge!("gangway_cluster_gpus_free", "cluster" => id.clone()).set(free as f64);
        metrics::gauge!("gangway_cluster_queue_depth", "cluster" => id).set(s.queue.len() as f64);
        return;
    }
    for (t, (allocated, free)) in by_type {
        metrics::gauge!("gangway_gpus_allocated", "gpu_type" => t.to_string())
            .set(allocated as f64);
        metrics::gauge!("gangway_gpus_free", "gpu_type" => t.to_string()).set(free as f64);
        let depth = queued.get(t).copied().unwrap_or(0);
        metrics::gauge!("gangway_queue_depth", "gpu_type" => t.to_string()).set(depth as f64);
    }
}

/// Competes for leadership and, while leader, runs one pass loop per GPU
/// type ([`partition_loop`]) until `shutdown` or until leadership is lost.
pub async fn run_loop(state: AppState, shutdown: CancellationToken) {
    let span = tracing::info_span!("scheduler", region = %state.store.region());
    async move {
        let cfg = state.config.clone();
        let planning = cfg.planning();
        let mut leadership: Option<Leadership> = None;
        let mut last_health_tick = None;
        let mut partitions = Partitions::default();
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            // (Re)connect the leadership connection when needed.
            if leadership.as_ref().is_none_or(|l| l.is_closed()) {
                set_leader(&state, false);
                partitions.stop_all().await;
                match Leadership::connect(&cfg.database_url).await {
                    Ok(l) => leadership = Some(l),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot open the leader connection");
                        sleep_or_cancel(cfg.leader_retry_interval, &shutdown).await;
                        continue;
                    }
                }
            }
            let l = leadership.as_mut().expect("connected above");
            let leading = match l.try_acquire().await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "leadership check failed");
                    false
                }
            };
            set_leader(&state, leading);
            if !leading {
                partitions.stop_all().await;
                sleep_or_cancel(cfg.leader_retry_interval, &shutdown).await;
                continue;
            }
            crate::health::tick_if_due(&state, &mut last_health_tick).await;
            // One pass loop per GPU type of the fleet (re-read only when
            // the fleet changed).
            match state.fleet_shape().await {
                Ok(shape) => partitions.reconcile(&state, &planning, shape.keys()),
                Err(e) => tracing::warn!(error = %e, "cannot read the fleet's GPU types"),
            }
            sleep_or_cancel(cfg.schedule_interval, &shutdown).await;
        }
        partitions.stop_all().await;
        if let Some(mut l) = leadership {
            l.release().await;
        }
        set_leader(&state, false);
    }
    .instrument(span)
    .await
}

/// The running pass loops, by partition (GPU type, or cluster key).
#[derive(Default)]
struct Partitions {
    loops: BTreeMap<String, (CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Partitions {
    /// Starts a loop for every partition that has none, stops those gone
    /// from the fleet (a type no node has any more, a deleted cluster).
    fn reconcile<'t>(
        &mut self,
        state: &AppState,
        planning: &Planning,
        types: impl Iterator<Item = &'t String>,
    ) {
        let types: std::collections::BTreeSet<&String> = types.collect();
        self.loops.retain(|t, (stop, task)| {
            let keep = types.contains(t) && !task.is_finished();
            if !keep {
                stop.cancel();
            }
            keep
        });
        for t in types {
            if !self.loops.contains_key(t) {
                let stop = CancellationToken::new();
                let task = tokio::spawn(partition_loop(
                    state.clone(),
                    planning.clone(),
                    t.clone(),
                    stop.clone(),
                ));
                tracing::info!(gpu_type = %t, "scheduling partition started");
                self.loops.insert(t.clone(), (stop, task));
            }
        }
    }

    /// Stops every loop and waits until none is in a pass.
    async fn stop_all(&mut self) {
        for (t, (stop, task)) in std::mem::take(&mut self.loops) {
            stop.cancel();
            let _ = task.await;
            tracing::info!(gpu_type = %t, "scheduling partition stopped");
        }
    }
}

/// How often a partition with nothing to place or grow is planned anyway.
const IDLE_PASS_EVERY: Duration = Duration::from_secs(10);

/// One GPU type's passes: again at once while they place work or lose a
/// race, else on a wake-up (new job, freed GPUs) or every
/// `schedule_interval`, until `stop`.
async fn partition_loop(
    state: AppState,
    planning: Planning,
    gpu_type: String,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("partition", gpu_type = %gpu_type);
    async move {
        let mut wake = state.sched_wakeup.subscribe();
        // When the partition was last planned, and whether this round was
        // woken (a job came, GPUs were freed) rather than timed: a timed
        // round over an idle partition is skipped, but it is planned at
        // least every `IDLE_PASS_EVERY` (its fleet gauges stay fresh).
        let mut planned_at: Option<Instant> = None;
        let mut woken = true;
        while !stop.is_cancelled() {
            // Wake-ups from now on count for the next wait.
            wake.borrow_and_update();
            // A fenced region places nothing (`peers.rs`), nor does one
            // being evacuated (`evacuation.rs`).
            if state.peers.is_fenced() || state.is_evacuating() {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(state.config.schedule_interval) => {}
                }
                continue;
            }
            // A partition with nothing to place and nothing to grow is
            // not planned: its snapshot reads the whole fleet (at 10,000
            // GPUs, the region's largest read) for an empty plan.
            let idle = !woken
                && planned_at.is_some_and(|t| t.elapsed() < IDLE_PASS_EVERY)
                && match state.store.partition_has_work(&gpu_type).await {
                    Ok(work) => !work,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot tell whether work waits: planning");
                        false
                    }
                };
            if idle {
                metrics::counter!("gangway_schedule_passes_total", "outcome" => "skipped", "partition" => gpu_type.clone()).increment(1);
            } else {
                planned_at = Some(Instant::now());
                // A pass under way finishes (its commit is checked anyway).
                match run_partition_pass(&state.store, &planning, &gpu_type).await {
                    Ok(o) if o.stale => continue, // replan at once on fresh state
                    Ok(o) if o.placements > 0 => {
                        tracing::debug!(
                            placements = o.placements,
                            waiting = o.waiting,
                            "pass committed"
                        );
                        continue; // more may fit now that these are out of the queue
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "scheduling pass failed"),
                }
            }
            woken = tokio::select! {
                _ = stop.cancelled() => break,
                _ = wake.changed() => true,
                _ = tokio::time::sleep(state.config.schedule_interval) => false,
            };
        }
    }
    .instrument(span)
    .await
}

/// Records whether this replica leads: the flag `GET /v1/region` reports
/// and the `gangway_scheduler_leader` gauge, always together.
fn set_leader(state: &AppState, leading: bool) {
    let was = state.leader.swap(leading, Ordering::Relaxed);
    if leading != was {
        tracing::info!(leader = leading, "scheduling leadership changed");
    }
    metrics::gauge!("gangway_scheduler_leader").set(if leading { 1.0 } else { 0.0 });
}

async fn sleep_or_cancel(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

/// The wall-clock time of a snapshot-clock instant (seconds since the epoch
/// on the database's clock).
fn at(t: u64) -> Option<chrono::DateTime<Utc>> {
    chrono::DateTime::from_timestamp(t.min(i64::MAX as u64) as i64, 0)
}

/// When a waiting unit is expected to start, where its reason says.
fn expected_start(reason: &gangway_sched::WaitReason) -> Option<chrono::DateTime<Utc>> {
    match reason {
        gangway_sched::WaitReason::Reserved { start, .. } => at(*start),
        gangway_sched::WaitReason::Preempting { until, .. } => at(*until),
        gangway_sched::WaitReason::ReservationNotStarted { start, .. } => at(*start),
        _ => None,
    }
}

/// Why a job is where it is. For work still waiting, this runs the planner
/// on a fresh snapshot (no commit) and reports what it decided for the job.
pub async fn explain(
    store: &Store,
    tenant: &str,
    id: uuid::Uuid,
    planning: &Planning,
) -> Result<gangway_shared::api::Explanation, StoreError> {
    use gangway_shared::api::{Explanation, JobState, WorkerState};
    let job = store.get_job(tenant, id).await?;
    // A gang placed with fewer than all its ranks (elastic) runs with ranks
    // 0 … run_workers − 1; the others are not part of the run.
    let total = job.workers.len();
    let size = job.run_workers.map_or(total, |n| (n as usize).min(total));
    let pending = job
        .workers
        .iter()
        .filter(|w| (w.rank as usize) < size && w.state == WorkerState::Pending)
        .count();
    let done = |code: &str, message: String, estimated_start| {
        Ok(Explanation {
            job_id: id,
            state: job.state,
            code: code.to_string(),
            message,
            estimated_start,
        })
    };
    if job.state.is_terminal() {
        return done(
            "finished",
            format!(
                "the job ended {} ({})",
                job.state,
                job.reason.clone().unwrap_or_default()
            ),
            None,
        );
    }
    if job.state == JobState::Cancelling {
        return done(
            "cancelling",
            "cancel requested; waiting for the agents to report the workers stopped".into(),
            None,
        );
    }
    if job.state == JobState::Preempting {
        let up = size - pending;
        return done(
            "preempting",
            format!(
                "asked to checkpoint and stop ({up} of {size} worker(s) not down yet); it \
                 requeues when all are, and resumes from its newest checkpoint"
            ),
            None,
        );
    }
    if pending == 0 {
        let nodes: std::collections::BTreeSet<&str> = job
            .workers
            .iter()
            .filter_map(|w| w.node.as_deref())
            .collect();
        let code = if job.state == JobState::Running {
            "running"
        } else {
            "starting"
        };
        let elastic = if size < total {
            format!(
                " (elastic: running with {size} of its {total} workers; it restarts larger from \
                 a checkpoint when capacity frees)"
            )
        } else {
            String::new()
        };
        return done(
            code,
            format!(
                "{size} worker(s) placed on {} node(s); {}{elastic}",
                nodes.len(),
                if code == "running" {
                    "all started"
                } else {
                    "waiting for the agents to start them"
                }
            ),
            None,
        );
    }
    // What the job's own partition's pass would decide.
    let data = store
        .snapshot_partition(
            &crate::store::job_pool(&job.spec),
            planning.agent_timeout,
            planning.history,
        )
        .await?;
    let job_key = id.to_string();
    let policy = planning.policy.clone();
    let planned = tokio::task::spawn_blocking(move || plan(&data.snapshot, &policy))
        .await
        .expect("the planner does not panic");
    if planned.placements.iter().any(|p| p.job == job_key) {
        return done(
            "schedulable",
            format!("{pending} worker(s) waiting; GPUs are free for them and the next scheduling pass places them"),
            None,
        );
    }
    match planned.waiting.iter().find(|w| w.job == job_key) {
        Some(w) => done(
            w.reason.code(),
            format!("{pending} worker(s) waiting: {}", w.reason),
            expected_start(&w.reason),
        ),
        None => done(
            "schedulable",
            format!("{pending} worker(s) waiting for the next scheduling pass"),
            None,
        ),
    }
}

/// What submitting `spec` for `tenant` would do now: the planner runs on a
/// fresh snapshot with the job added at the back of its priority class;
/// nothing is written.
pub async fn dry_run(
    store: &Store,
    tenant: &str,
    spec: &gangway_shared::api::JobSpec,
    planning: &Planning,
) -> Result<gangway_shared::api::DryRun, StoreError> {
    use gangway_shared::api::{DryRun, DryRunNode, JobMode, TopologyLevel};
    const PROBE: &str = "dry-run";
    // The pass of the job's partition (its GPU type's, or its cluster's),
    // as the region runs it.
    let mut data = store
        .snapshot_partition(
            &crate::store::job_pool(spec),
            planning.agent_timeout,
            planning.history,
        )
        .await?;
    let per = spec.gpus_per_worker() as u32;
    let workers = spec.workers() as u32;
    let level = crate::store::level_of;
    let base = gangway_sched::Request {
        job: PROBE.to_string(),
        ranks: (0..workers).collect(),
        tenant: tenant.to_string(),
        gpu_type: spec.gpu_type.clone(),
        gpus_per_worker: per,
        required: level(spec.topology.required()),
        preferred: level(spec.topology.preferred()),
        priority: spec.priority.rank(),
        seq: u64::MAX,
        estimated_duration_s: spec.estimated_duration_s.max(0) as u64,
        // An elastic gang may start with fewer workers.
        min_workers: match spec.mode {
            JobMode::Gang => spec.min_workers().unwrap_or(0).max(0) as u32,
            JobMode::Array => 0,
        },
        submitted: data.snapshot.now,
        reservation: spec.reservation.map(|r| r.to_string()),
    };
    match spec.mode {
        // An array job starts worker by worker: probe its first worker.
        JobMode::Array => data.snapshot.queue.push(gangway_sched::Request {
            ranks: vec![0],
            ..base
        }),
        JobMode::Gang => data.snapshot.queue.push(base),
    }
    let policy = planning.policy.clone();
    let planned = tokio::task::spawn_blocking(move || plan(&data.snapshot, &policy))
        .await
        .expect("the planner does not panic");
    let region = store.region().to_string();
    // Running jobs the planner would ask to checkpoint and stop for the
    // would-be job (never an elastic job's own restart to grow).
    let would_preempt: Vec<uuid::Uuid> = planned
        .preemptions
        .iter()
        .filter(|p| p.for_job == PROBE && p.cause != gangway_sched::PreemptCause::Grow)
        .filter_map(|p| uuid::Uuid::parse_str(&p.job).ok())
        .collect();
    if let Some(p) = planned.placements.iter().find(|p| p.job == PROBE) {
        let mut nodes: Vec<DryRunNode> = Vec::new();
        for w in &p.workers {
            match nodes.iter_mut().find(|n| n.node == w.node) {
                Some(n) => n.gpus.extend(&w.gpus),
                None => nodes.push(DryRunNode {
                    node: w.node.clone(),
                    gpus: w.gpus.clone(),
                }),
            }
        }
        let lvl = match p.level {
            gangway_sched::Level::Nvlink => TopologyLevel::Nvlink,
            gangway_sched::Level::Leaf => TopologyLevel::Leaf,
            gangway_sched::Level::Spine => TopologyLevel::Spine,
            gangway_sched::Level::Region => TopologyLevel::Region,
        };
        let elastic = if spec.mode == JobMode::Gang && p.ranks.len() < workers as usize {
            format!(" with {} of its {workers} workers (elastic)", p.ranks.len())
        } else {
            String::new()
        };
        return Ok(DryRun {
            region,
            code: "would_start".into(),
            message: format!(
                "would start now{elastic} on {} node(s) within one {} domain",
                nodes.len(),
                lvl
            ),
            level: Some(lvl),
            nodes,
            estimated_start: Some(chrono::Utc::now()),
            would_preempt,
        });
    }
    let (code, message, start) = match planned.waiting.iter().find(|w| w.job == PROBE) {
        Some(w) => (
            w.reason.code().to_string(),
            format!("would wait: {}", w.reason),
            expected_start(&w.reason),
        ),
        None if !would_preempt.is_empty() => (
            "waiting_for_preemption".to_string(),
            format!(
                "would wait while {} running job(s) checkpoint and stop to make room",
                would_preempt.len()
            ),
            None,
        ),
        None => (
            "schedulable".to_string(),
            "would wait for a later pass".to_string(),
            None,
        ),
    };
    Ok(DryRun {
        region,
        code,
        message,
        level: None,
        nodes: Vec::new(),
        estimated_start: start,
        would_preempt,
    })
}
