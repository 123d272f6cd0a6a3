//! Operator endpoints under `/v1/admin`. Until the global tier authenticates
//! callers (issue 3), the regional API is reachable only by the operator's
//! own network.

use axum::extract::State;
use axum::http::StatusCode;
use gangway_shared::api::{Quota, QuotaList, QuotaUpdate};
use gangway_shared::error::codes;
use gangway_shared::ids::valid_tenant;

use super::error::ApiError;
use super::extract::Json;
use super::AppState;
use gangway_shared::http::Path;

/// Largest cap accepted (larger is a typo).
const MAX_QUOTA: i64 = 10_000_000;

pub async fn list_quotas(State(state): State<AppState>) -> Result<axum::Json<QuotaList>, ApiError> {
    Ok(axum::Json(QuotaList {
        quotas: state.store.list_quotas().await?,
    }))
}

fn check_names(tenant: &str, gpu_type: &str) -> Result<(), ApiError> {
    let type_ok = !gpu_type.is_empty()
        && gpu_type.len() <= 64
        && gpu_type
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid_tenant(tenant) || !type_ok {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "tenant and GPU type must be lowercase names of a-z, 0-9 and '-'",
        ));
    }
    Ok(())
}

pub async fn put_quota(
    State(state): State<AppState>,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Json(body): Json<QuotaUpdate>,
) -> Result<axum::Json<Quota>, ApiError> {
    check_names(&tenant, &gpu_type)?;
    if !(0..=MAX_QUOTA).contains(&body.max_gpus) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_GPUS,
            format!("max_gpus must be between 0 and {MAX_QUOTA}"),
        ));
    }
    state
        .store
        .set_quota(&tenant, &gpu_type, body.max_gpus as i32)
        .await?;
    state.wake_scheduler();
    Ok(axum::Json(Quota {
        tenant,
        gpu_type,
        max_gpus: body.max_gpus as u32,
    }))
}

pub async fn delete_quota(
    State(state): State<AppState>,
    Path((tenant, gpu_type)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_names(&tenant, &gpu_type)?;
    if state.store.delete_quota(&tenant, &gpu_type).await? {
        state.wake_scheduler();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("quota"))
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Preempted {
    pub job_id: uuid::Uuid,
    pub preempted: bool,
}

/// Asks a job to checkpoint, stop and requeue (operators; the scheduler
/// does the same for priority and drains).
pub async fn preempt_job(
    State(state): State<AppState>,
    gangway_shared::http::JobId(id): gangway_shared::http::JobId,
) -> Result<axum::Json<Preempted>, ApiError> {
    if !state
        .store
        .preempt_job(id, "requested by an operator")
        .await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::JOB_NOT_RUNNING,
            "the job is not running or starting; only those can be preempted",
        ));
    }
    Ok(axum::Json(Preempted {
        job_id: id,
        preempted: true,
    }))
}
