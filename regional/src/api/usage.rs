//! `GET /v1/usage`: the tenant's GPU time from this region's usage ledger
//! (its own rows, and apart those it holds for its peers, which the global
//! tier uses when a peer does not answer) and its credits, with its live
//! placements' time not metered yet.

use axum::extract::State;
use axum::http::StatusCode;
use gangway_shared::api::{Usage, UsageQuery};
use gangway_shared::error::codes;

use super::error::ApiError;
use super::extract::{Query, Tenant};
use super::AppState;

pub async fn usage(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Query(q): Query<UsageQuery>,
) -> Result<axum::Json<Usage>, ApiError> {
    let window = q
        .resolve(chrono::Utc::now())
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m))?;
    let (from, to, granularity, group_by) = window;
    let held = state
        .store
        .usage(&tenant, from, to, granularity, group_by, q.job)
        .await?;
    let mut usage = Usage::of(window, held.own);
    usage.held_for = held.held_for;
    Ok(axum::Json(usage))
}
