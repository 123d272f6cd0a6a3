//! One scheduling pass: snapshot → plan (the pure `gangway-sched` core) →
//! a commit checked against the partition's version
//! ([`Store::apply_plan`]). The leader's pass loops (`loops/scheduler.rs`)
//! run it; so do tests and benchmarks, by hand.
//!
//! Scheduling is partitioned by pool: a GPU type's shared pool, or a
//! dedicated cluster (`store::pool_key`), each on its own snapshot of its
//! nodes and jobs, committing against its own version. A slow or busy pool
//! never holds up another's passes, and two pools' commits never make each
//! other stale.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use gangway_sched::{plan_partitioned, Snapshot};

use crate::config::Planning;
use crate::store::{QueueRead, Store, StoreError};

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
    /// How the pool's queue was read (whole, or what changed); `None`
    /// for a sum of passes.
    pub queue_read: Option<QueueRead>,
    /// The snapshot's reads and how long each took
    /// ([`crate::store::SnapshotData::reads`]); empty for a sum of passes.
    pub reads: Vec<(&'static str, Duration)>,
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
        out.queue_read = None;
        out.reads.clear();
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
    let mut data = match only {
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
    record_fleet_metrics(&snapshot, &planned, &data.racks, &data.queued_units, only);
    let mut outcome = PassOutcome {
        placements: planned.placements.len(),
        waiting: planned.waiting.len(),
        phases: Phases {
            snapshot: snapshot_took,
            plan: plan_took,
            commit: Duration::ZERO,
        },
        queue_read: Some(data.queue_read),
        reads: std::mem::take(&mut data.reads),
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
            // The agents of the nodes it placed or preempted on hear of it
            // now, not at their next sync — unless syncs already queue for
            // connections: then the region is behind on the syncs it has,
            // and the agents come at their interval as they would anyway.
            let victims: std::collections::HashSet<String> = (applied.preempted.iter())
                .map(|(job, _)| job.to_string())
                .collect();
            let placed = (planned.placements.iter())
                .flat_map(|p| &p.workers)
                .map(|w| w.node.as_str());
            let stopping = (snapshot.running.iter())
                .filter(|r| victims.contains(&r.job))
                .flat_map(|r| &r.gpus)
                .map(|(node, _)| node.as_str());
            if crate::store::queued_callers(&store.sync_pool_status()) == 0 {
                store.agent_wakes().wake(placed.chain(stopping));
                metrics::counter!("gangway_agent_pushes_total", "outcome" => "sent").increment(1);
            } else {
                metrics::counter!("gangway_agent_pushes_total", "outcome" => "skipped_busy")
                    .increment(1);
            }
            for (job, cause) in &applied.preempted {
                tracing::info!(job_id = %job, cause = cause.as_str(), "asked to checkpoint and stop to make room");
                metrics::counter!("gangway_preemptions_total", "cause" => cause.as_str())
                    .increment(1);
            }
            let now = Utc::now();
            let submitted = (store.submitted_at(
                &data.queue_key,
                planned.placements.iter().map(|p| p.job.as_str()),
            ))
            .await;
            let tenant_of: std::collections::HashMap<&str, &str> = (snapshot.queue.iter())
                .map(|r| (r.job.as_str(), r.tenant.as_str()))
                .collect();
            for (p, at) in planned.placements.iter().zip(submitted) {
                metrics::counter!("gangway_placements_total", "level" => p.level.as_str())
                    .increment(1);
                if let Some(at) = at {
                    let wait = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
                    let tenant = tenant_of.get(p.job.as_str()).copied().unwrap_or("");
                    metrics::histogram!("gangway_queue_wait_seconds", "tenant" => tenant.to_string())
                        .record(wait);
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
/// `partition`; the queue's depth is every unit `queued`, in the pass's
/// window or beyond it), and each budgeted rack's power budget and headroom. A partition's pass covers only the racks holding its
/// type's nodes; their figures are whole-rack, so passes of different
/// partitions agree on a shared rack.
///
/// `gangway_gpus_stranded` is a type's schedulable GPUs still free after
/// the plan while a unit of the type that could use GPUs (not held back by
/// its quota or a reservation it names) waits: capacity that is idle
/// though work waits, because of its shape or place.
fn record_fleet_metrics(
    s: &Snapshot,
    planned: &gangway_sched::Plan,
    racks: &BTreeMap<String, crate::store::RackPower>,
    queued: &BTreeMap<String, u64>,
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
    if let Some(cluster) = partition.and_then(crate::store::cluster_of_key) {
        // A dedicated cluster's GPUs are not its type's shared pool's.
        let (allocated, free) = by_type.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let id = cluster.to_string();
        metrics::gauge!("gangway_cluster_gpus_allocated", "cluster" => id.clone())
            .set(allocated as f64);
        metrics::gauge!("gangway_cluster_gpus_free", "cluster" => id.clone()).set(free as f64);
        metrics::gauge!("gangway_cluster_queue_depth", "cluster" => id)
            .set(queued.values().sum::<u64>() as f64);
        return;
    }
    let type_of_node: std::collections::HashMap<&str, &str> = (s.nodes.iter())
        .map(|n| (n.id.as_str(), n.gpu_type.as_str()))
        .collect();
    let mut placed: BTreeMap<&str, u64> = BTreeMap::new();
    for w in planned.placements.iter().flat_map(|p| &p.workers) {
        if let Some(t) = type_of_node.get(w.node.as_str()) {
            *placed.entry(t).or_default() += w.gpus.len() as u64;
        }
    }
    let type_of_job: std::collections::HashMap<&str, &str> = (s.queue.iter())
        .map(|r| (r.job.as_str(), r.gpu_type.as_str()))
        .collect();
    let mut starved: std::collections::HashSet<&str> = Default::default();
    for w in &planned.waiting {
        use gangway_sched::WaitReason as W;
        let wants_gpus = matches!(
            w.reason,
            W::NoCapacity { .. }
                | W::Reserved { .. }
                | W::BlockedByReservation { .. }
                | W::Preempting { .. }
                | W::HeldForReservation { .. }
        );
        if let (true, Some(t)) = (wants_gpus, type_of_job.get(w.job.as_str())) {
            starved.insert(t);
        }
    }
    for (t, (allocated, free)) in by_type {
        metrics::gauge!("gangway_gpus_allocated", "gpu_type" => t.to_string())
            .set(allocated as f64);
        metrics::gauge!("gangway_gpus_free", "gpu_type" => t.to_string()).set(free as f64);
        let depth = queued.get(t).copied().unwrap_or(0);
        metrics::gauge!("gangway_queue_depth", "gpu_type" => t.to_string()).set(depth as f64);
        let stranded = if starved.contains(t) {
            free.saturating_sub(placed.get(t).copied().unwrap_or(0))
        } else {
            0
        };
        metrics::gauge!("gangway_gpus_stranded", "gpu_type" => t.to_string()).set(stranded as f64);
    }
}
