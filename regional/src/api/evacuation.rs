//! Planned evacuation and fail back (`crate::loops::evacuation`, docs/failover.md):
//! the operators' endpoints under `/v1/admin/region/…` (only the global
//! tier reaches them; it names the operator in `X-Gangway-Actor`, which the
//! audit log records), and what regions ask each other about it under
//! `/internal/v1/…`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use gangway_shared::api::{Evacuation, NodeActionRequest};
use gangway_shared::error::codes;

use super::error::ApiError;
use super::extract::Json;
use super::nodes::{actor, body, check_reason};
use super::AppState;
use crate::loops::evacuation::{peer_states, PeerEvacuation};
use crate::replication::{replicate_intent, resumable_here};
use crate::store::handovers::{
    Handback, HandbackAnswer, Take, Taken, BALANCING, EVACUATING, FAILING_BACK,
};
use crate::store::replicas::Move;

fn conflict(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, codes::EVACUATION_CONFLICT, message)
}

fn needs_peers(state: &AppState, what: &str) -> Result<(), ApiError> {
    if state.peers.config.peers.is_empty() {
        return Err(conflict(format!(
            "region {} has no peer regions (--peer), so there is nowhere to {what} its jobs",
            state.store.region()
        )));
    }
    Ok(())
}

/// `POST /v1/admin/region/evacuate`: the region stops taking new jobs and
/// placing any, and hands every live job to another region through a
/// checkpoint. Evacuating again changes nothing (the answer is the
/// progress). Audited (`region.evacuate`).
pub async fn evacuate(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Evacuation>, ApiError> {
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_SPEC)?;
    needs_peers(&state, "move")?;
    if !state.store.evacuation_state().await?.is_evacuating() {
        // Two regions evacuated at once would hand their jobs to each
        // other: refused while a peer that answers is evacuated.
        if let Some(p) = peer_states(&state)
            .await
            .into_iter()
            .find(|p| p.state.is_evacuating())
        {
            return Err(conflict(format!(
                "region {} is being evacuated ({}): fail it back before evacuating region {}",
                p.region,
                p.state.as_str(),
                state.store.region()
            )));
        }
    }
    let actor = actor(&headers);
    if state
        .store
        .start_evacuation(&actor, reason.as_deref())
        .await?
    {
        tracing::warn!(
            actor,
            reason,
            "evacuation started: no new jobs, every job moves away"
        );
        metrics::counter!("gangway_evacuations_total", "op" => "evacuate").increment(1);
    }
    state.set_evacuating(true);
    Ok(axum::Json(state.store.evacuation().await?))
}

/// `POST /v1/admin/region/failback`: the region takes work again, and the
/// jobs moved away from it (by its evacuation, or adopted while it was
/// down) come back the same planned way. Audited (`region.failback`).
pub async fn failback(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<Evacuation>, ApiError> {
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_SPEC)?;
    needs_peers(&state, "bring back")?;
    let actor = actor(&headers);
    let (changed, called_off) = state
        .store
        .start_failback(&actor, reason.as_deref())
        .await?;
    if changed {
        tracing::warn!(
            actor,
            reason,
            called_off,
            "fail back started: taking work again"
        );
        metrics::counter!("gangway_evacuations_total", "op" => "failback").increment(1);
    }
    state.set_evacuating(false);
    state.wake_scheduler();
    Ok(axum::Json(state.store.evacuation().await?))
}

/// `GET /v1/admin/region/evacuation`: the state, jobs left, moved, held,
/// and each job's step.
pub async fn status(State(state): State<AppState>) -> Result<axum::Json<Evacuation>, ApiError> {
    Ok(axum::Json(state.store.evacuation().await?))
}

/// `POST /internal/v1/evacuation/state`: this region's evacuation state.
pub async fn peer_state(
    State(state): State<AppState>,
    Json(_): Json<serde_json::Value>,
) -> Result<axum::Json<PeerEvacuation>, ApiError> {
    Ok(axum::Json(PeerEvacuation {
        region: state.store.region().to_string(),
        state: state.store.evacuation_state().await?,
    }))
}

fn unknown_peer(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::INVALID_SPEC,
        format!("{name:?} is not a peer of this region"),
    )
}

/// `POST /internal/v1/replicas/take`: a region hands us a job whose move
/// (to us, at `epoch`) it recorded at a majority. We record the move too
/// (refused if one at that epoch or later, elsewhere, is recorded here),
/// then make the job ours at that epoch from the intent we hold, and hand
/// its intent to a buddy of ours before it is scheduled. Taking it again
/// changes nothing.
pub async fn take(
    State(state): State<AppState>,
    Json(t): Json<Take>,
) -> Result<axum::Json<Taken>, ApiError> {
    if state.peers.peer(&t.from_home).is_none() {
        return Err(unknown_peer(&t.from_home));
    }
    if ![EVACUATING, FAILING_BACK, BALANCING].contains(&t.cause.as_str()) || t.epoch < 2 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "a take names a cause ({EVACUATING}, {FAILING_BACK} or {BALANCING}) and an epoch \
                 of 2 or more"
            ),
        ));
    }
    let m = Move {
        job_id: t.job_id,
        from_home: t.from_home.clone(),
        to_region: state.store.region().to_string(),
        epoch: t.epoch,
        planned: true,
        at: None,
    };
    let adopt_after = state.peers.adopt_after.as_secs_f64();
    if !state.store.witness_move(&m, adopt_after).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::INVALID_SPEC,
            format!(
                "a move of job {} at epoch {} or later to another region is recorded here: not \
                 taken",
                t.job_id, t.epoch
            ),
        ));
    }
    let checkpoint = resumable_here(state.link(), t.checkpoint.clone()).await;
    if t.checkpoint.is_some() && checkpoint.is_none() {
        tracing::warn!(job_id = %t.job_id, checkpoint = ?t.checkpoint, "a handed-over job's checkpoint is not in this region's store: it starts over");
    }
    let taken = state.store.take_handover(&t, checkpoint.as_deref()).await?;
    if state.store.awaits_buddy(t.job_id).await? {
        if let Err(e) = replicate_intent(state.link(), t.job_id).await {
            // The beat hands it over again (`replicate_pending_intents`).
            tracing::warn!(error = %e, job_id = %t.job_id, "replicating a taken job's intent failed");
        }
    }
    if taken {
        let cause = [FAILING_BACK, BALANCING]
            .into_iter()
            .find(|c| *c == t.cause)
            .unwrap_or(EVACUATING);
        metrics::counter!("gangway_jobs_handed_over_total", "way" => "in", "cause" => cause)
            .increment(1);
        tracing::info!(job_id = %t.job_id, from = %t.from_home, epoch = t.epoch, cause = %t.cause, "job taken over");
        state.wake_scheduler();
    }
    Ok(axum::Json(Taken { taken }))
}

/// `POST /internal/v1/replicas/handback`: a failing-back region asks for
/// its jobs back; they are marked to go, and the answer says how many we
/// still run.
pub async fn handback(
    State(state): State<AppState>,
    Json(q): Json<Handback>,
) -> Result<axum::Json<HandbackAnswer>, ApiError> {
    if state.peers.peer(&q.home).is_none() {
        return Err(unknown_peer(&q.home));
    }
    let away = state.store.mark_handback(&q.home).await?;
    Ok(axum::Json(HandbackAnswer { away }))
}
