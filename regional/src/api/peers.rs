//! What regions ask each other (`/internal/v1/peers/…`,
//! `/internal/v1/replicas/…`; service tokens only): heartbeats, job intent
//! held for a home, the home's later updates, and moves witnessed for an
//! adopter and read back by a returning home. See `loops/beat.rs` and
//! `store/replicas.rs`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::error::ApiError;
use super::extract::{Json, Query};
use super::AppState;
use crate::replication::intents::{BatchAnswer, IntentBatch, MAX_BATCH};
use crate::replication::peers::Heartbeat;
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
        silent_s: state
            .store
            .leases(&state.peers.names(), state.peers.uptime_s())
            .await?
            .silent_s,
    }))
}

/// `POST /internal/v1/replicas/intents`: holds a home's new job.
pub async fn hold_intent(
    State(state): State<AppState>,
    Json(intent): Json<Intent>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    known(&state, &intent.home)?;
    if refuses_new_intent(&state, &intent).await? {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            gangway_shared::error::codes::REGION_UNAVAILABLE,
            format!(
                "region {} is being evacuated and holds no new job's intent",
                state.store.region()
            ),
        ));
    }
    state.store.hold_intent(&intent).await?;
    Ok(axum::Json(serde_json::json!({"held": intent.job_id})))
}

/// A region being evacuated holds no new job's intent (it could have to
/// adopt it), only again one it holds already: the home gives the others
/// to their next buddy, and only when every buddy refused comes back to
/// it as a last resort (a batch's `last_resort`), which it takes.
async fn refuses_new_intent(state: &AppState, i: &Intent) -> Result<bool, ApiError> {
    Ok(state.is_evacuating() && state.store.replica_epoch(i.job_id).await?.is_none())
}

/// `POST /internal/v1/replicas/intents/batch`: holds a batch of a home's
/// new jobs in one commit (the home's group commit,
/// `replication::intents`); answers which it holds and which it refused.
pub async fn hold_intents(
    State(state): State<AppState>,
    Json(batch): Json<IntentBatch>,
) -> Result<axum::Json<BatchAnswer>, ApiError> {
    for i in &batch.intents {
        known(&state, &i.home)?;
    }
    if batch.intents.len() > MAX_BATCH {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            gangway_shared::error::codes::INVALID_SPEC,
            format!(
                "{} intents in one batch; at most {MAX_BATCH}",
                batch.intents.len()
            ),
        ));
    }
    let mut answer = BatchAnswer::default();
    let mut take = Vec::with_capacity(batch.intents.len());
    for i in batch.intents {
        if !batch.last_resort && refuses_new_intent(&state, &i).await? {
            answer.refused.push(i.job_id);
        } else {
            take.push(i);
        }
    }
    if !take.is_empty() {
        state.store.hold_intents(&take).await?;
    }
    answer.held = take.iter().map(|i| i.job_id).collect();
    Ok(axum::Json(answer))
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
/// this region heard from the home too recently, or a home's planned move;
/// either unless a conflicting one is recorded here.
pub async fn witness_move(
    State(state): State<AppState>,
    Json(m): Json<Move>,
) -> Result<axum::Json<MoveAnswer>, ApiError> {
    known(&state, &m.from_home)?;
    // A planned move may name us as where the job goes.
    if m.to_region != state.store.region() {
        known(&state, &m.to_region)?;
    }
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

fn bad(message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        gangway_shared::error::codes::INVALID_SPEC,
        message,
    )
}

/// One chunk of a checkpoint file a home copies in.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileChunk {
    key: String,
    name: String,
    path: String,
    offset: u64,
}

/// A relative path of plain components (no `.`, `..`, empty or absolute).
fn plain(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\'))
}

/// The staging directory of a checkpoint being copied in.
fn staged(state: &AppState, key: &str, name: &str) -> std::path::PathBuf {
    crate::replication::staging_root(state.store.region(), "in")
        .join(key.replace('/', "_"))
        .join(name)
}

/// `POST /internal/v1/replicas/checkpoints/file?key&name&path&offset`: a
/// chunk of a file of a checkpoint a home copies to this region's store,
/// staged on local disk until its manifest arrives.
pub async fn checkpoint_file(
    State(state): State<AppState>,
    Query(q): Query<FileChunk>,
    body: Bytes,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if gangway_checkpoint::parse_key(&q.key).is_none() || !plain(&q.name) || q.name.contains('/') {
        return Err(bad(format!(
            "{:?} / {:?} names no checkpoint",
            q.key, q.name
        )));
    }
    if !plain(&q.path) {
        return Err(bad(format!(
            "{:?} is not a relative path of a checkpoint",
            q.path
        )));
    }
    let file = (q.path.split('/')).fold(staged(&state, &q.key, &q.name), |p, c| p.join(c));
    let io = |e: std::io::Error| bad(format!("cannot stage {}: {e}", q.path));
    if let Some(parent) = file.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io)?;
    }
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(q.offset == 0)
        .open(&file)
        .await
        .map_err(io)?;
    f.seek(std::io::SeekFrom::Start(q.offset))
        .await
        .map_err(io)?;
    f.write_all(&body).await.map_err(io)?;
    f.flush().await.map_err(io)?;
    Ok(axum::Json(serde_json::json!({"staged": body.len()})))
}

/// `POST /internal/v1/replicas/checkpoints/commit`: the manifest of a
/// checkpoint whose files were staged: committed to this region's store
/// (only if every file matches it) when this region holds the job's intent
/// at that epoch, live; refused for an older epoch (the job was adopted or
/// moved on: the checkpoint store refuses work of a superseded owner).
pub async fn checkpoint_commit(
    State(state): State<AppState>,
    Json(m): Json<gangway_checkpoint::Manifest>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let dir = staged(&state, &m.key, &m.name);
    let root = dir.parent().map(std::path::Path::to_path_buf);
    let clean = || async {
        if let Some(r) = &root {
            let _ = tokio::fs::remove_dir_all(r).await;
        }
    };
    let Some(store) = &state.config.checkpoint_store else {
        clean().await;
        return Ok(axum::Json(serde_json::json!({"held": false})));
    };
    match state.store.replica_epoch(m.job_id).await? {
        Some((epoch, live)) if epoch == m.epoch && live == "live" => {}
        held => {
            clean().await;
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                gangway_shared::error::codes::INVALID_SPEC,
                format!(
                    "checkpoint {} is of epoch {}, and this region holds {}: refused",
                    m.key,
                    m.epoch,
                    match held {
                        Some((e, st)) => format!("the job at epoch {e} ({st})"),
                        None => "no intent of the job".into(),
                    }
                ),
            ));
        }
    }
    let done = store.upload_copy(&dir, &m).await;
    clean().await;
    done.map_err(|e| bad(format!("checkpoint {} not copied: {e}", m.key)))?;
    Ok(axum::Json(serde_json::json!({"held": true})))
}
