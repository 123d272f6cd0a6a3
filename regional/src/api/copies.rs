//! What a region holds so that a peer that never comes back can still be
//! billed (docs/billing.md, "A region that does not come back"), over
//! HTTP: a home tells its job's buddy of each placement
//! (`POST /internal/v1/replicas/placements`) and every peer of its
//! committed capacity (`POST /internal/v1/replicas/commitments`); the
//! hours an adopter closed are read where the home is billed from its
//! copies (`GET /v1/admin/usage/closings`).

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use gangway_shared::billing::Closings;
use gangway_shared::error::codes;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{Json, Query};
use super::AppState;
use crate::store::closings::{PlacementNote, MAX_NOTES};
use crate::store::commitment_copies::{CommitmentCopies, MAX_VERSIONS};

/// `POST /internal/v1/replicas/placements`: holds a home's placements of
/// the jobs whose intent we hold. One told already changes nothing but its
/// end.
pub async fn hold(
    State(state): State<AppState>,
    Json(notes): Json<Vec<PlacementNote>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if notes.len() > MAX_NOTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::INVALID_SPEC,
            format!(
                "at most {MAX_NOTES} placements at a time, not {}",
                notes.len()
            ),
        ));
    }
    let bad = notes.iter().find_map(|p| {
        if state.peers.peer(&p.home).is_none() {
            Some(format!(
                "placement of job {} is of {:?}, not a peer of this region",
                p.job_id, p.home
            ))
        } else if p.gpus <= 0 || p.ended_at.is_some_and(|e| e < p.started_at) {
            Some(format!(
                "placement of job {} holds no GPU or ends before it starts",
                p.job_id
            ))
        } else {
            None
        }
    });
    if let Some(message) = bad {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            message,
        ));
    }
    let held = state.store.hold_placements(&notes).await?;
    Ok(axum::Json(serde_json::json!({ "held": held })))
}

/// The query of `GET /v1/admin/usage/closings`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosingsQuery {
    /// Closings overlapping [from, to) (RFC 3339); credits whose lost
    /// time overlaps it or that were issued in it.
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Only those of this home.
    pub home: Option<String>,
}

/// `GET /v1/admin/usage/closings`: the hours of peers' placements this
/// region closed when it adopted their jobs, and their credits.
pub async fn closings(
    State(state): State<AppState>,
    Query(q): Query<ClosingsQuery>,
) -> Result<axum::Json<Closings>, ApiError> {
    if q.from >= q.to {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "`from` must be before `to`",
        ));
    }
    let c = state
        .store
        .closings(q.from, q.to, q.home.as_deref())
        .await?;
    Ok(axum::Json(c))
}

/// `POST /internal/v1/replicas/commitments`: holds a peer's commitment
/// versions. One held already takes a later change only.
pub async fn hold_commitments(
    State(state): State<AppState>,
    Json(copies): Json<CommitmentCopies>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if copies.versions.len() > MAX_VERSIONS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::INVALID_SPEC,
            format!(
                "at most {MAX_VERSIONS} commitment versions at a time, not {}",
                copies.versions.len()
            ),
        ));
    }
    if state.peers.peer(&copies.home).is_none() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!("{:?} is not a peer of this region", copies.home),
        ));
    }
    if let Some(v) = copies
        .versions
        .iter()
        .find(|v| v.gpus <= 0 || v.valid_until.is_some_and(|u| u < v.valid_from))
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "commitment version {} commits no GPU or ends before it begins",
                v.version_id
            ),
        ));
    }
    let held = state.store.hold_commitments(&copies).await?;
    Ok(axum::Json(serde_json::json!({ "held": held })))
}
