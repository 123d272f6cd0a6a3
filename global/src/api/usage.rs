//! `GET /v1/usage`: a tenant's allocated GPU time, merged from every region.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use chrono::SecondsFormat;
use futures_util::future::join_all;
use gangway_shared::api::{Usage, UsageQuery, UsageRow};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Query};

use super::openapi;
use super::GlobalState;
use crate::auth::TenantCaller;
use crate::regions::Call;

/// Usage
///
/// The tenant's allocated GPU-seconds per period (hour, day or month),
/// grouped by GPU type, job or region, from every region. A tenant sees
/// only its own.
#[utoipa::path(
    get,
    path = "/v1/usage",
    operation_id = "get_usage",
    tag = "usage",
    security(("bearer" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "The tenant's usage.", body = Usage),
        (status = 400, description = openapi::errors(
            "The period or a parameter is malformed.", &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 429, response = openapi::RateLimited),
    )
)]
pub async fn usage(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Query(q): Query<UsageQuery>,
) -> Result<axum::Json<Usage>, ApiError> {
    let (from, to, granularity, group_by) = q
        .resolve(chrono::Utc::now())
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m))?;
    // Every region answers for the same window, whatever its clock says.
    let query = format!(
        "from={}&to={}&granularity={}&group_by={}",
        from.to_rfc3339_opts(SecondsFormat::Micros, true),
        to.to_rfc3339_opts(SecondsFormat::Micros, true),
        granularity.as_str(),
        group_by.as_str()
    );
    let (state, tenant, query) = (&state, &caller.tenant, &query);
    let asks = state.regions.list.iter().map(|r| async move {
        let a = state
            .regions
            .call(
                r,
                Method::GET,
                "/v1/usage",
                Call {
                    tenant: Some(tenant),
                    query: Some(query),
                    ..Default::default()
                },
            )
            .await;
        (r, a)
    });
    let mut merged: BTreeMap<(chrono::DateTime<chrono::Utc>, String), f64> = BTreeMap::new();
    let mut unavailable_regions = Vec::new();
    for (region, answer) in join_all(asks).await {
        let part = answer
            .ok()
            .filter(|a| a.status == StatusCode::OK)
            .and_then(|a| serde_json::from_slice::<Usage>(&a.body).ok());
        match part {
            Some(u) => {
                for row in u.rows {
                    *merged.entry((row.period_start, row.key)).or_default() += row.gpu_seconds;
                }
            }
            None => unavailable_regions.push(region.name.clone()),
        }
    }
    let rows: Vec<UsageRow> = merged
        .into_iter()
        .map(|((period_start, key), gpu_seconds)| UsageRow {
            period_start,
            key,
            gpu_seconds,
        })
        .collect();
    let total_gpu_seconds = rows.iter().map(|r| r.gpu_seconds).sum();
    Ok(axum::Json(Usage {
        from,
        to,
        granularity,
        group_by,
        rows,
        total_gpu_seconds,
        unavailable_regions,
    }))
}
