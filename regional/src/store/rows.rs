//! Row → domain conversions. Columns are read by name.

use std::str::FromStr;

use gangway_shared::api::{Job, JobEvent, JobSpec, JobState, Worker, WorkerState};
use tokio_postgres::Row;
use uuid::Uuid;

/// Columns every job query selects, in the shape [`job_from_row`] reads.
pub(super) const JOB_COLUMNS: &str = "j.job_id, j.tenant, j.spec, j.name, j.state::text AS state, \
     j.reason, j.created_at, j.started_at, j.finished_at, j.preemptions, j.node_moves, j.restore_from, j.lost_gpu_s, \
     (SELECT coalesce(sum(extract(epoch FROM coalesce(x.released_at, now()) - x.allocated_at)), 0)::float8 \
      FROM allocations x WHERE x.job_id = j.job_id) AS allocated_gpu_s, \
     j.run_workers, j.epoch, j.moved_to, j.adopted_from, \
     (SELECT json_build_object('key', c.key, 'epoch', c.epoch, 'seq', c.seq, 'name', c.name, \
             'size_bytes', c.size_bytes, 'files', c.files, 'created_at', c.created_at) \
      FROM checkpoints c WHERE c.job_id = j.job_id \
      ORDER BY c.epoch DESC, c.seq DESC, c.attempt DESC LIMIT 1) AS checkpoint";

pub(super) const WORKER_COLUMNS: &str = "w.job_id, w.rank, w.state::text AS state, w.node_id, \
     w.gpus, w.exit_code";

/// Useful over allocated GPU time; `None` before anything was allocated.
pub(super) fn goodput(allocated: f64, lost: f64) -> Option<f64> {
    (allocated > 0.0).then(|| ((allocated - lost) / allocated).clamp(0.0, 1.0))
}

pub(super) fn job_from_row(row: &Row, region: &str, workers: Vec<Worker>) -> Job {
    let allocated: f64 = row.get::<_, f64>("allocated_gpu_s").max(0.0);
    let lost: f64 = row
        .get::<_, f64>("lost_gpu_s")
        .clamp(0.0, allocated.max(0.0));
    let spec: serde_json::Value = row.get("spec");
    let state: String = row.get("state");
    Job {
        id: row.get("job_id"),
        tenant: row.get("tenant"),
        region: region.to_string(),
        name: row.get("name"),
        // The spec and state were written by this code; a row that does not
        // decode is a bug, and panicking here would take the server down,
        // so fall back to something visible instead.
        state: JobState::from_str(&state).unwrap_or(JobState::Failed),
        spec: serde_json::from_value::<JobSpec>(spec).unwrap_or_else(|_| JobSpec {
            name: row.get("name"),
            gpus: 0,
            gpu_type: String::new(),
            priority: Default::default(),
            estimated_duration_s: 0,
            max_duration_s: None,
            command: Vec::new(),
            env: Default::default(),
            gpus_per_worker: None,
            mode: Default::default(),
            min_gpus: None,
            topology: Default::default(),
            region: None,
            reservation: None,
            cluster: None,
        }),
        created_at: row.get("created_at"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
        reason: row.get("reason"),
        workers,
        run_workers: row
            .get::<_, Option<i32>>("run_workers")
            .map(|n| n.max(0) as u32),
        preemptions: row.get::<_, i32>("preemptions").max(0) as u32,
        node_moves: row.get::<_, i32>("node_moves").max(0) as u32,
        allocated_gpu_s: allocated,
        lost_gpu_s: lost,
        goodput: goodput(allocated, lost),
        restore_from: row.get("restore_from"),
        epoch: row.get("epoch"),
        moved_to: row.get("moved_to"),
        adopted_from: row.get("adopted_from"),
        // Written by this code: one that does not decode is left out
        // rather than failing the read.
        checkpoint: row
            .get::<_, Option<serde_json::Value>>("checkpoint")
            .and_then(|v| serde_json::from_value(v).ok()),
    }
}

pub(super) fn worker_from_row(row: &Row) -> (Uuid, Worker) {
    let state: String = row.get("state");
    let gpus: Vec<i32> = row.get("gpus");
    let rank: i32 = row.get("rank");
    (
        row.get("job_id"),
        Worker {
            rank: rank as u32,
            state: WorkerState::from_str(&state).unwrap_or(WorkerState::Failed),
            node: row.get("node_id"),
            gpus: gpus.into_iter().map(|g| g as u32).collect(),
            exit_code: row.get("exit_code"),
        },
    )
}

pub(super) fn event_from_row(row: &Row) -> JobEvent {
    JobEvent {
        seq: row.get("event_id"),
        at: row.get("at"),
        kind: row.get("kind"),
        message: row.get("message"),
        detail: row.get("detail"),
    }
}

/// The API's topology level as the scheduler core's (one for one).
pub(crate) fn level_of(t: gangway_shared::api::TopologyLevel) -> gangway_sched::Level {
    use gangway_sched::Level;
    use gangway_shared::api::TopologyLevel as T;
    match t {
        T::Nvlink => Level::Nvlink,
        T::Leaf => Level::Leaf,
        T::Spine => Level::Spine,
        T::Region => Level::Region,
    }
}

/// The core's topology level as the API's.
pub(crate) fn topology_of(l: gangway_sched::Level) -> gangway_shared::api::TopologyLevel {
    use gangway_sched::Level;
    use gangway_shared::api::TopologyLevel as T;
    match l {
        Level::Nvlink => T::Nvlink,
        Level::Leaf => T::Leaf,
        Level::Spine => T::Spine,
        Level::Region => T::Region,
    }
}
