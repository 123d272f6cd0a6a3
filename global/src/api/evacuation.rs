//! Operators evacuate a whole region and fail it back (docs/failover.md,
//! "Planned evacuation and fail back"): each call goes to the region it
//! names, with the operator in `X-Gangway-Actor` (the region audits it),
//! and the region's answer — its evacuation's progress — is passed on as it
//! is. While a region is evacuated the tier routes new jobs around it
//! (`RegionStatus.evacuating`, `jobs.rs`).

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::api::{Evacuation, NodeActionRequest};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Path};

use super::responses;
use crate::auth::AdminCaller;
use crate::regions::{Call, Region};
use crate::state::GlobalState;

fn region<'a>(state: &'a GlobalState, name: &str) -> Result<&'a Region, ApiError> {
    state.regions.get(name).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            format!("no region named {name:?}; GET /v1/regions lists them"),
        )
    })
}

async fn relay_to(
    state: &GlobalState,
    name: &str,
    method: Method,
    suffix: &str,
    body: Option<Vec<u8>>,
    actor: &str,
) -> Result<axum::response::Response, ApiError> {
    let r = region(state, name)?;
    let answer = state
        .regions
        .call(
            r,
            method,
            &format!("/v1/admin/region/{suffix}"),
            Call {
                body: body.map(Into::into),
                actor: Some(actor),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| super::relay::unavailable(&e))?;
    Ok(super::relay::relay(answer))
}

/// Evacuate a region
///
/// The named region stops taking new jobs (the global tier routes creates
/// to the others) and placing any, and hands every live job to another
/// region with zero lost work: a running job is asked to checkpoint and
/// stop, then moves with that checkpoint to the region that holds its
/// intent, at the next ownership epoch; a queued job moves at once. Jobs
/// that cannot leave (pinned to the region, in one of its reservations or
/// dedicated clusters) are checkpointed, stopped and held there. The
/// answer is the evacuation's progress; `GET …/evacuation` follows it.
/// Evacuating again changes nothing. Persisted: a restart of the region
/// carries on. Audited (`region.evacuate`).
#[utoipa::path(
    post,
    path = "/v1/admin/regions/{name}/evacuate",
    operation_id = "evacuate_region",
    tag = "admin",
    security(("bearer" = [])),
    params(("name" = String, Path, description = "The region.")),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The evacuation, started now or before.", body = Evacuation),
        (status = 400, description = responses::errors(
            "The body is not JSON.", &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, description = responses::errors(
            "The region has no peer regions to move its jobs to, or another region is being \
             evacuated.", &[codes::EVACUATION_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has this name, or the reason is too long.",
            &[codes::WRONG_REGION, codes::INVALID_SPEC]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn evacuate(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    let body = Some(body.to_vec());
    relay_to(
        &state,
        &name,
        Method::POST,
        "evacuate",
        body,
        &admin.subject,
    )
    .await
}

/// Fail a region back
///
/// The named region takes work again, and the live jobs moved away from it
/// (by its evacuation, or adopted elsewhere while it was down) come back
/// the same planned way: checkpoint, stop, move at the next epoch. Handovers
/// of its evacuation not under way yet are called off. The answer is the
/// progress (`failing_back` until every job is back, then `none`). Audited
/// (`region.failback`).
#[utoipa::path(
    post,
    path = "/v1/admin/regions/{name}/failback",
    operation_id = "failback_region",
    tag = "admin",
    security(("bearer" = [])),
    params(("name" = String, Path, description = "The region.")),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The fail back, started now or before.", body = Evacuation),
        (status = 400, description = responses::errors(
            "The body is not JSON.", &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, description = responses::errors(
            "The region has no peer regions.", &[codes::EVACUATION_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has this name, or the reason is too long.",
            &[codes::WRONG_REGION, codes::INVALID_SPEC]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn failback(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    let body = Some(body.to_vec());
    relay_to(
        &state,
        &name,
        Method::POST,
        "failback",
        body,
        &admin.subject,
    )
    .await
}

/// A region's evacuation
///
/// Its state (`none`, `evacuating`, `evacuated`, `failing_back`), who asked
/// and when, the jobs left to move, moved and held, and each job's step and
/// where it goes.
#[utoipa::path(
    get,
    path = "/v1/admin/regions/{name}/evacuation",
    operation_id = "region_evacuation",
    tag = "admin",
    security(("bearer" = [])),
    params(("name" = String, Path, description = "The region.")),
    responses(
        (status = 200, description = "The evacuation.", body = Evacuation),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has this name.", &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn evacuation(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(name): Path<String>,
) -> Result<axum::response::Response, ApiError> {
    relay_to(
        &state,
        &name,
        Method::GET,
        "evacuation",
        None,
        &admin.subject,
    )
    .await
}
