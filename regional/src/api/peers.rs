//! What regions ask each other (`/internal/v1/peers/…`,
//! `/internal/v1/replicas/…`; service tokens only): heartbeats, job intent
//! held for a home, the home's later updates, and moves witnessed for an
//! adopter and read back by a returning home. See `peers.rs` and
//! `store/replicas.rs`.

use axum::extract::State;
use axum::http::StatusCode;

use super::error::ApiError;
use super::extract::Json;
use super::AppState;
use crate::peers::Heartbeat;
use crate::store::replicas::{Intent, Move, MoveAnswer, MovesList, MovesQuery, Update};

/// Only a configured peer's name is accepted where one is named.
fn known(state: &AppState, name: &str) -> Result<(), ApiError> {
    if state.peers.peer(name).is_some() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            gangway_shared::error::codes::INVALID_SPEC,
            format!("{name:?} is not a peer of this region"),
        ))
    }
}

/// `POST /internal/v1/peers/heartbeat`: records that the sender is alive
/// (and what it hears), answers with what this region hears.
pub async fn heartbeat(
    State(state): State<AppState>,
    Json(hb): Json<Heartbeat>,
) -> Result<axum::Json<Heartbeat>, ApiError> {
    known(&state, &hb.from)?;
    state.store.peer_heard(&hb.from, &hb.silent_s).await?;
    Ok(axum::Json(Heartbeat {
        from: state.store.region().to_string(),
        silent_s: state.store.silences(&state.peers).await?,
    }))
}

/// `POST /internal/v1/replicas/intents`: holds a home's new job.
pub async fn hold_intent(
    State(state): State<AppState>,
    Json(intent): Json<Intent>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    known(&state, &intent.home)?;
    state.store.hold_intent(&intent).await?;
    Ok(axum::Json(serde_json::json!({"held": intent.job_id})))
}

/// `POST /internal/v1/replicas/updates`: a home's jobs ended or
/// checkpointed.
pub async fn updates(
    State(state): State<AppState>,
    Json(updates): Json<Vec<Update>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    for u in &updates {
        known(&state, &u.home)?;
    }
    state.store.apply_updates(&updates).await?;
    Ok(axum::Json(serde_json::json!({"applied": updates.len()})))
}

/// `POST /internal/v1/replicas/moves`: witnesses an adopter's move, unless
/// this region heard from the home too recently.
pub async fn witness_move(
    State(state): State<AppState>,
    Json(m): Json<Move>,
) -> Result<axum::Json<MoveAnswer>, ApiError> {
    known(&state, &m.from_home)?;
    known(&state, &m.to_region)?;
    let recorded = (state.store)
        .witness_move(&m, state.peers.adopt_after.as_secs_f64())
        .await?;
    Ok(axum::Json(MoveAnswer { recorded }))
}

/// `POST /internal/v1/replicas/moves/list`: the moves of a home's jobs this
/// region witnessed.
pub async fn moves(
    State(state): State<AppState>,
    Json(q): Json<MovesQuery>,
) -> Result<axum::Json<MovesList>, ApiError> {
    known(&state, &q.home)?;
    Ok(axum::Json(MovesList {
        moves: state.store.moves_from(&q.home).await?,
    }))
}
