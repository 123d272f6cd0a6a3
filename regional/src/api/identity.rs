//! `/internal/v1/identity/{kind}/…`: the region's copy of tenants'
//! records and API keys, written and read by the global tier only (its
//! service token), which keeps them on a majority of regions
//! (`global/src/identity.rs`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use gangway_shared::api::{IdentityRecord, IdentityRecordList, IdentityWrite};
use gangway_shared::error::codes;
use gangway_shared::http::{Path, Query};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::Json;
use super::nodes::actor;
use super::AppState;

/// A kind and an id as the global tier writes them.
fn check(kind: &str, id: &str) -> Result<(), ApiError> {
    let id_ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    if !matches!(kind, "tenant" | "key") || !id_ok {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "an identity record is a `tenant` or a `key` with an id of 1-64 letters, digits, \
             '-' and '_'",
        ));
    }
    Ok(())
}

pub async fn put(
    State(state): State<AppState>,
    Path((kind, id)): Path<(String, String)>,
    headers: HeaderMap,
    Json(w): Json<IdentityWrite>,
) -> Result<StatusCode, ApiError> {
    check(&kind, &id)?;
    if !w.doc.is_object() || w.action.is_empty() || w.action.len() > 64 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a record's doc is an object and its action a short name",
        ));
    }
    let kept = state
        .store
        .put_identity(&kind, &id, w.version, &w.doc, &actor(&headers), &w.action)
        .await?;
    // 200 kept, 202 a newer version was kept already (either way the
    // region holds this version or a later one).
    Ok(if kept {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    })
}

pub async fn get(
    State(state): State<AppState>,
    Path((kind, id)): Path<(String, String)>,
) -> Result<axum::Json<IdentityRecord>, ApiError> {
    check(&kind, &id)?;
    match state.store.get_identity(&kind, &id).await? {
        Some(r) => Ok(axum::Json(r)),
        None => Err(ApiError::not_found("record")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    tenant: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Path(kind): Path<String>,
    Query(p): Query<ListParams>,
) -> Result<axum::Json<IdentityRecordList>, ApiError> {
    check(&kind, "x")?;
    let records = state
        .store
        .list_identity(&kind, p.tenant.as_deref())
        .await?;
    Ok(axum::Json(IdentityRecordList { records }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Used {
    at: DateTime<Utc>,
}

pub async fn used(
    State(state): State<AppState>,
    Path((kind, id)): Path<(String, String)>,
    Json(u): Json<Used>,
) -> Result<StatusCode, ApiError> {
    check(&kind, &id)?;
    if state.store.identity_used(&kind, &id, u.at).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("record"))
    }
}
