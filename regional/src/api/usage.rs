//! `GET /v1/usage`: the tenant's allocated GPU time in this region.

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
    let (from, to, granularity, group_by) = q
        .resolve(chrono::Utc::now())
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m))?;
    let rows = state
        .store
        .usage(&tenant, from, to, granularity, group_by)
        .await?;
    let total_gpu_seconds = rows.iter().map(|r| r.gpu_seconds).sum();
    Ok(axum::Json(Usage {
        from,
        to,
        granularity,
        group_by,
        rows,
        total_gpu_seconds,
        unavailable_regions: Vec::new(),
    }))
}
