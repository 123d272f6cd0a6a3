//! Why a job is where it is, and where a job would go: the planner run on a
//! fresh snapshot without committing anything (`GET /v1/jobs/{id}/explain`,
//! `POST /v1/jobs/dry-run`).

use chrono::Utc;
use gangway_sched::plan;

use crate::config::Planning;
use crate::store::{QueuePlace, Store, StoreError};

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

/// The code and message of a unit beyond the queue's window, with `all`
/// units ahead of it (`own` of them its tenant's).
fn beyond_window(
    window: gangway_sched::QueueWindow,
    all: usize,
    own: usize,
) -> (&'static str, String) {
    (
        "beyond_window",
        format!(
            "{all} queued unit(s) are ahead of it, {own} of them its tenant's; each scheduling \
             pass considers the first {} in priority and submission order and each tenant's \
             first {}, and it moves into that window as those ahead of it start or leave",
            window.cap, window.per_tenant
        ),
    )
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
    // A job beyond the window of the queue the passes are shown waits its
    // turn there, whatever the planner would do with it.
    if !data.snapshot.queue.iter().any(|r| r.job == job_key) {
        let ahead = store.queue_ahead(&data.queue_key, &job.tenant, QueuePlace::Job(id));
        if let Some((all, own)) = ahead.await {
            let (code, why) = beyond_window(store.queue_window(), all, own);
            return done(code, format!("{pending} worker(s) waiting: {why}"), None);
        }
    }
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
    let window = store.queue_window();
    let at = QueuePlace::BackOf(spec.priority.rank());
    let ahead = store.queue_ahead(&data.queue_key, tenant, at);
    if let Some((all, own)) = ahead.await.filter(|&(a, o)| !window.shows(a, o)) {
        let (code, why) = beyond_window(window, all, own);
        return Ok(DryRun {
            region: store.region().to_string(),
            code: code.to_string(),
            message: format!("would wait: {why}"),
            level: None,
            nodes: Vec::new(),
            estimated_start: None,
            would_preempt: Vec::new(),
        });
    }
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
