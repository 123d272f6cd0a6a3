//! The endpoints node agents call.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Extension;
use gangway_shared::agent::{
    ChangesRequest, ChangesResponse, RegisterRequest, RegisterResponse, SyncRequest, SyncResponse,
};
use gangway_shared::error::codes;
use tracing::instrument;

use super::auth::AgentCaller;
use super::error::ApiError;
use super::extract::Json;
use super::AppState;
use crate::store::{retry_races, StopTiming};
use gangway_shared::http::Path;

/// Most nodes one agent may register (a 40,000-GPU region has 5,000).
const MAX_NODES_PER_AGENT: usize = 20_000;

#[instrument(skip_all, fields(region = %state.store.region(), agent_id = %req.agent_id))]
pub async fn register(
    State(state): State<AppState>,
    caller: Option<Extension<AgentCaller>>,
    Json(req): Json<RegisterRequest>,
) -> Result<axum::Json<RegisterResponse>, ApiError> {
    AgentCaller::check(caller.as_deref(), &req.agent_id)?;
    let bad = |m: &str| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_SPEC, m);
    if req.agent_id.is_empty() || req.agent_id.len() > 200 {
        return Err(bad("agent_id must be 1–200 characters"));
    }
    if !matches!(req.executor.as_str(), "real" | "sim") {
        return Err(bad("executor must be \"real\" or \"sim\""));
    }
    if req.nodes.len() > MAX_NODES_PER_AGENT {
        return Err(bad("too many nodes for one agent"));
    }
    if req.host_id.as_ref().is_some_and(|h| h.len() > 200) {
        return Err(bad("host_id must be at most 200 characters"));
    }
    for n in &req.nodes {
        if n.node_id.is_empty() || n.gpu_type.is_empty() || n.gpus.is_empty() {
            return Err(bad("every node needs an id, a GPU type and GPUs"));
        }
        if n.gpus.len() > 1024 {
            return Err(bad("too many GPUs on one node"));
        }
    }
    retry_races(|| state.store.register_agent(&req))
        .await
        .inspect_err(
            |e| tracing::warn!(error = %e, nodes = req.nodes.len(), "registration refused"),
        )?;
    tracing::info!(nodes = req.nodes.len(), "agent registered");
    state.wake_scheduler();
    // The agents' lease (checked at start-up against lost_after_s).
    let fencing = state.config.fencing().ok();
    Ok(axum::Json(RegisterResponse {
        region: state.store.region().to_string(),
        sync_interval_ms: state.config.agent_sync_interval.as_millis() as u64,
        fence_after_ms: fencing.map_or(0, |f| f.fence_after.as_millis() as u64),
        fence_checkpoint_s: fencing.map_or(0, |f| f.fence_checkpoint.as_secs().max(1)),
    }))
}

pub async fn sync(
    State(state): State<AppState>,
    caller: Option<Extension<AgentCaller>>,
    Path(agent_id): Path<String>,
    Json(mut req): Json<SyncRequest>,
) -> Result<axum::Json<SyncResponse>, ApiError> {
    AgentCaller::check(caller.as_deref(), &agent_id)?;
    if let (Some(store), Some(reported)) = (&state.config.checkpoint_store, &mut req.checkpoints) {
        verify_checkpoints(store, reported).await;
    }
    let timing = StopTiming {
        grace_period_s: state.config.grace_period.as_secs(),
        // A fenced region's workers must be down before a peer may adopt
        // their jobs: they get the fenced checkpoint time at most.
        checkpoint_deadline_s: if state.peers.is_fenced() {
            let fenced = state.config.fencing().map(|f| f.fence_checkpoint);
            (state.config.checkpoint_deadline)
                .min(fenced.unwrap_or(state.config.checkpoint_deadline))
                .as_secs()
        } else {
            state.config.checkpoint_deadline.as_secs()
        },
    };
    // The sync runs to its end even if the agent stops waiting (its request
    // timed out): what it recorded is not thrown away to be done again by
    // the retry, which then finds it done. Under load, this is what keeps
    // a slow region from falling further behind.
    let started = std::time::Instant::now();
    let store = state.store.clone();
    let work = {
        let agent_id = agent_id.clone();
        tokio::spawn(async move {
            // Output first: a job seen ended has the output its last sync
            // carried (a follower stops reading once it is).
            let logs_kept = req.logs.is_empty()
                || match store.append_logs(&agent_id, &req.logs).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, %agent_id, "workers' output not kept; the agent sends it again");
                        false
                    }
                };
            let outcome = retry_races(|| store.sync_agent(&agent_id, &req, timing)).await;
            let kind = match &outcome {
                Ok(o) if o.quiet => "quiet",
                Ok(_) => "changed",
                Err(_) => "failed",
            };
            metrics::histogram!("gangway_sync_seconds", "kind" => kind)
                .record(started.elapsed().as_secs_f64());
            outcome.map(|o| (o, req, logs_kept))
        })
    };
    let (mut outcome, req, logs_kept) = work.await.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            gangway_shared::error::codes::INTERNAL,
            format!("the sync failed unexpectedly ({e}); the agent retries"),
        )
    })??;
    if outcome.freed_gpus {
        state.wake_scheduler();
    }
    if state.peers.is_fenced() {
        withhold_starts(&mut outcome.assignments, &req.workers);
    }
    Ok(axum::Json(SyncResponse {
        assignments: outcome.assignments,
        report_again: outcome.deferred,
        logs_kept,
    }))
}

/// The longest an agent's `changes` poll is held. Under its request
/// timeout (the agent's is 10 s), so an answer comes back rather than a
/// timeout.
const MAX_CHANGES_WAIT: std::time::Duration = std::time::Duration::from_secs(8);

/// `POST /internal/v1/agents/{agent_id}/changes`: answers `changed` as soon
/// as a plan committed by this process places or preempts work on one of
/// the agent's nodes (`store/wakes.rs`), or after the wait asked for (at
/// most [`MAX_CHANGES_WAIT`]) with nothing. Costs one indexed read of the
/// agent's nodes and no connection while it waits.
pub async fn changes(
    State(state): State<AppState>,
    caller: Option<Extension<AgentCaller>>,
    Path(agent_id): Path<String>,
    Json(req): Json<ChangesRequest>,
) -> Result<axum::Json<ChangesResponse>, ApiError> {
    AgentCaller::check(caller.as_deref(), &agent_id)?;
    let nodes = state.store.agent_nodes(&agent_id).await?;
    let wait = std::time::Duration::from_millis(req.wait_ms).min(MAX_CHANGES_WAIT);
    let watch = state.store.agent_wakes().watch(nodes);
    let changed = tokio::time::timeout(wait, watch.changed()).await.is_ok();
    Ok(axum::Json(ChangesResponse { changed }))
}

/// A fenced region starts no worker: its jobs may have moved to another
/// region meanwhile (it learns which before it unfences). So only the
/// workers the agent runs now stay wanted — those it reports running, and
/// those recorded running (`started`), which an agent stops reporting once
/// heard: recorded for this agent's boot, they are in its table (a new
/// boot registers, and registering loses the old boot's workers). The ones
/// it would launch — say, after the machine rebooted with the region
/// down — wait.
fn withhold_starts(
    assignments: &mut Vec<gangway_shared::agent::Assignment>,
    reports: &[gangway_shared::agent::WorkerReport],
) {
    use gangway_shared::agent::{Desired, WorkerStatus};
    assignments.retain(|a| {
        a.desired != Desired::Run
            || a.started
            || reports.iter().any(|r| {
                (r.job_id, r.rank, r.attempt) == (a.job_id, a.rank, a.attempt)
                    && r.status == WorkerStatus::Running
            })
    });
}

/// Keeps only the reported checkpoints whose manifest the region reads
/// back from its store and finds to say what the agent said: a checkpoint
/// the region records is surely committed where restores fetch from. One
/// that does not check out is dropped with a log (a store other than the
/// agent's, a manifest not written, a report that does not match it); an
/// unreachable store drops it too, and the restore point stays where it
/// was — the job loses at most the work since its last recorded one.
async fn verify_checkpoints(
    store: &gangway_checkpoint::CheckpointStore,
    reported: &mut Vec<gangway_shared::agent::CheckpointRecord>,
) {
    let mut kept = Vec::with_capacity(reported.len());
    for r in reported.drain(..) {
        match store.manifest(&r.key).await {
            Ok(m) if m.record() == r => kept.push(r),
            Ok(m) => {
                tracing::warn!(job_id = %r.job_id, key = %r.key, reported = ?r, manifest = ?m.record(), "checkpoint report does not match its manifest in the store: not recorded");
                metrics::counter!("gangway_checkpoints_refused_total", "reason" => "manifest_mismatch").increment(1);
            }
            Err(e) => {
                tracing::warn!(job_id = %r.job_id, key = %r.key, error = %e, store = %store.url(), "reported checkpoint not found whole in the region's checkpoint store (is the agent's --checkpoint-store the region's?): not recorded");
                metrics::counter!("gangway_checkpoints_refused_total", "reason" => "not_in_store")
                    .increment(1);
            }
        }
    }
    *reported = kept;
}

#[cfg(test)]
mod tests {
    use gangway_shared::agent::{Assignment, Desired, WorkerReport, WorkerStatus};
    use uuid::Uuid;

    fn wanted(desired: Desired, started: bool) -> Assignment {
        Assignment {
            job_id: Uuid::new_v4(),
            tenant: "acme".into(),
            rank: 0,
            attempt: 1,
            desired,
            node_id: "n0".into(),
            gpus: vec![0],
            world_size: 1,
            local_rank: 0,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            command: vec!["train".into()],
            env: Default::default(),
            estimated_duration_s: 60,
            max_duration_s: None,
            grace_period_s: 30,
            checkpoint_deadline_s: 30,
            restore_from: None,
            epoch: 1,
            started,
        }
    }

    fn running(a: &Assignment) -> WorkerReport {
        WorkerReport {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
            status: WorkerStatus::Running,
            checkpoint: None,
            fenced: false,
            unasked: false,
        }
    }

    /// A fenced region starts nothing, and does not unlist a worker the
    /// agent runs — whether it reports it running or, heard before, does
    /// not report it at all (unlisted, the agent would stop it).
    #[test]
    fn a_fenced_region_withholds_only_workers_not_yet_running() {
        let new = wanted(Desired::Run, false);
        let reported = wanted(Desired::Run, false);
        let heard = wanted(Desired::Run, true);
        let checkpoint = wanted(Desired::Checkpoint, false);
        let mut assignments = vec![
            new.clone(),
            reported.clone(),
            heard.clone(),
            checkpoint.clone(),
        ];
        super::withhold_starts(&mut assignments, &[running(&reported)]);
        let kept: Vec<Uuid> = assignments.iter().map(|a| a.job_id).collect();
        assert_eq!(kept, vec![reported.job_id, heard.job_id, checkpoint.job_id]);
    }
}
