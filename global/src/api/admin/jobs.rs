//! An operator's preemption of a job, passed to the region that has it;
//! the queue by tenant and GPU type of every region; the regions as
//! operators see them (leases and replication lag).

use axum::extract::State;
use axum::http::Method;
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;

use crate::auth::AdminCaller;
use crate::regions::Region;
use crate::state::GlobalState;

use super::{ask_regions, fan_out, PerRegion, RegionParam};
use crate::api::responses;
use gangway_shared::api::RegionList;
use gangway_shared::error::ErrorBody;

/// The queue by tenant
///
/// Each region's unfinished work by tenant and GPU type (or the one
/// region named): jobs and GPUs waiting, jobs and GPUs placed, and when
/// the longest-waiting job was submitted.
#[utoipa::path(
    get,
    path = "/v1/admin/queue",
    operation_id = "queue_by_tenant",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's `QueueSummary` (or the error it gave), \
            by region name.", body = PerRegion),
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
pub async fn queue(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    gangway_shared::http::Query(p): gangway_shared::http::Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/queue",
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// List regions (operators)
///
/// Each region's health and capacity as this replica last saw them, with
/// what only operators see: each region's lease (seconds since its last
/// round trip to each peer, and the lease's length) and its replication
/// lag (how long the oldest job intent or update not yet held by its buddy
/// has waited).
#[utoipa::path(
    get,
    path = "/v1/admin/regions",
    operation_id = "admin_list_regions",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The regions.", body = RegionList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn regions(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
) -> axum::Json<RegionList> {
    axum::Json(RegionList {
        regions: state.regions.infos(),
    })
}

/// Asks a job, in whichever region holds it, to checkpoint, stop and
/// requeue; it resumes from its newest checkpoint.
#[utoipa::path(
    post,
    path = "/v1/admin/jobs/{id}/preempt",
    operation_id = "preempt_job",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The job was asked to checkpoint and stop."),
        (status = 401, response = crate::api::responses::Unauthenticated),
        (status = 403, response = crate::api::responses::Forbidden),
        (status = 404, response = crate::api::responses::JobNotFound),
        (status = 409, description = crate::api::responses::errors(
            "The job is not running or starting.", &[codes::JOB_NOT_RUNNING]),
            body = gangway_shared::error::ErrorBody),
        (status = 429, response = crate::api::responses::RateLimited),
        (status = 503, response = crate::api::responses::RegionUnavailable),
    )
)]
pub async fn preempt_job(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    gangway_shared::http::JobId(id): gangway_shared::http::JobId,
) -> Result<axum::response::Response, ApiError> {
    let path = format!("/v1/admin/jobs/{id}/preempt");
    let all: Vec<&Region> = state.regions.list.iter().collect();
    ask_regions(
        &state,
        &all,
        Method::POST,
        &path,
        None,
        &admin.subject,
        "job",
    )
    .await
}
