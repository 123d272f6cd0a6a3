//! An operator's preemption of a job, passed to the region that has it.

use axum::extract::State;
use axum::http::Method;
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;

use crate::auth::AdminCaller;
use crate::regions::Region;
use crate::state::GlobalState;

use super::ask_regions;

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
