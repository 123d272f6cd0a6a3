//! The audit log of every region, merged.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Query};
use serde::Deserialize;
use utoipa::IntoParams;

use super::responses;
use crate::auth::AdminCaller;
use crate::state::GlobalState;

use super::{fan_out, PerRegion};

/// The query of `GET /v1/admin/audit`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Only this region (default: every region).
    region: Option<String>,
    /// Entries older than this id (paging, per region).
    before: Option<i64>,
    /// Only this action (`node.drain`, `quota.set`, …).
    action: Option<String>,
    /// Only this target (a node id, a job id, `tenant/gpu_type`).
    target: Option<String>,
    /// 1–1000, default 100.
    limit: Option<i64>,
}

/// Read the audit log
///
/// Every operator action — node cordons, uncordons, drains and injected
/// faults, quota changes, job preemptions — with who (the admin token's
/// subject), what, on what, when and why, newest first, as each region (or
/// the one named) keeps it. Append-only; no tenant may read it.
#[utoipa::path(
    get,
    path = "/v1/admin/audit",
    operation_id = "audit_log",
    tag = "admin",
    security(("bearer" = [])),
    params(AuditParams),
    responses(
        (status = 200, description = "Each region's `AuditList`, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn audit_log(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<AuditParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let bad = |m: &str| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m);
    let plain = |v: &str| {
        !v.is_empty()
            && v.len() <= 200
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
    };
    let mut query = Vec::new();
    if let Some(b) = p.before {
        query.push(format!("before={b}"));
    }
    if let Some(l) = p.limit {
        if !(1..=1000).contains(&l) {
            return Err(bad("limit must be between 1 and 1000"));
        }
        query.push(format!("limit={l}"));
    }
    for (name, v) in [("action", &p.action), ("target", &p.target)] {
        if let Some(v) = v {
            if !plain(v) {
                return Err(bad(&format!(
                    "{name} has characters no action or target has"
                )));
            }
            query.push(format!("{name}={v}"));
        }
    }
    let query = query.join("&");
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/audit",
            None,
            Some(&admin.subject),
            Some(&query),
        )
        .await?,
    ))
}
