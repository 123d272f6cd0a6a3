//! The endpoints node agents call.

use axum::extract::State;
use axum::http::StatusCode;
use gangway_shared::agent::{RegisterRequest, RegisterResponse, SyncRequest, SyncResponse};
use gangway_shared::error::codes;
use tracing::instrument;

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
    Json(req): Json<RegisterRequest>,
) -> Result<axum::Json<RegisterResponse>, ApiError> {
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
    for n in &req.nodes {
        if n.node_id.is_empty() || n.gpu_type.is_empty() || n.gpus.is_empty() {
            return Err(bad("every node needs an id, a GPU type and GPUs"));
        }
        if n.gpus.len() > 1024 {
            return Err(bad("too many GPUs on one node"));
        }
    }
    retry_races(|| state.store.register_agent(&req)).await?;
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
    Path(agent_id): Path<String>,
    Json(req): Json<SyncRequest>,
) -> Result<axum::Json<SyncResponse>, ApiError> {
    let timing = StopTiming {
        grace_period_s: state.config.grace_period.as_secs(),
        checkpoint_deadline_s: state.config.checkpoint_deadline.as_secs(),
    };
    let outcome = retry_races(|| state.store.sync_agent(&agent_id, &req, timing)).await?;
    if outcome.freed_gpus {
        state.wake_scheduler();
    }
    Ok(axum::Json(SyncResponse {
        assignments: outcome.assignments,
    }))
}
