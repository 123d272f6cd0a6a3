//! Operator endpoints under `/v1/admin`: quotas, admission limits,
//! preemption and the audit log (nodes are in `nodes.rs`). Only the global
//! tier reaches them (its service token), and it lets only operators
//! through; it names the operator in `X-Gangway-Actor`, which every action
//! writes into the audit log.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use gangway_shared::api::{
    AuditList, AuditQuery, GoodputList, LimitsUpdate, Quota, QuotaList, QuotaUpdate, TenantLimits,
    TenantLimitsList,
};
use gangway_shared::error::codes;
use gangway_shared::ids::valid_tenant;

use super::error::ApiError;
use super::extract::Json;
use super::AppState;
use crate::store::retry_races;
use gangway_shared::http::Path;

pub async fn list_quotas(State(state): State<AppState>) -> Result<axum::Json<QuotaList>, ApiError> {
    Ok(axum::Json(QuotaList {
        quotas: state.store.list_quotas().await?,
    }))
}

/// The region's unfinished work by tenant and GPU type (operators).
pub async fn queue(
    State(state): State<AppState>,
) -> Result<axum::Json<gangway_shared::api::QueueSummary>, ApiError> {
    Ok(axum::Json(gangway_shared::api::QueueSummary {
        rows: state.store.queue_summary().await?,
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

/// Replaces a tenant's terms for one GPU type. Bad numbers are refused
/// with `invalid_gpus` or `invalid_quota`, and nothing changes.
pub async fn put_quota(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Json(body): Json<QuotaUpdate>,
) -> Result<axum::Json<Quota>, ApiError> {
    check_names(&tenant, &gpu_type)?;
    let terms = body
        .check()
        .map_err(|r| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, r.code, r.message))?;
    let actor = super::nodes::actor(&headers);
    state
        .store
        .set_quota_as(&actor, &tenant, &gpu_type, &terms)
        .await?;
    state.wake_scheduler();
    Ok(axum::Json(Quota {
        tenant,
        gpu_type,
        guaranteed_gpus: terms.guaranteed_gpus,
        max_gpus: terms.max_gpus,
        weight: f64::from(terms.weight_milli) / 1000.0,
    }))
}

pub async fn delete_quota(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, gpu_type)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_names(&tenant, &gpu_type)?;
    let actor = super::nodes::actor(&headers);
    if state
        .store
        .delete_quota_as(&actor, &tenant, &gpu_type)
        .await?
    {
        state.wake_scheduler();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("quota"))
    }
}

/// Every tenant's admission limits in this region.
pub async fn list_limits(
    State(state): State<AppState>,
) -> Result<axum::Json<TenantLimitsList>, ApiError> {
    Ok(axum::Json(state.store.list_limits().await?))
}

pub(super) fn check_tenant(tenant: &str) -> Result<(), ApiError> {
    if !valid_tenant(tenant) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a tenant is a lowercase name of a-z, 0-9 and '-' (1–63 characters)",
        ));
    }
    Ok(())
}

/// Replaces a tenant's admission limits. Numbers out of range, or no limit
/// named at all, are refused with `invalid_limits`, and nothing changes.
/// Jobs already accepted stay; the limits apply from the next submit.
pub async fn put_limits(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Json(body): Json<LimitsUpdate>,
) -> Result<axum::Json<TenantLimits>, ApiError> {
    check_tenant(&tenant)?;
    let terms = body
        .check()
        .map_err(|r| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, r.code, r.message))?;
    let actor = super::nodes::actor(&headers);
    Ok(axum::Json(
        state.store.set_limits_as(&actor, &tenant, &terms).await?,
    ))
}

/// Removes a tenant's admission limits (`not_found` when it had none).
pub async fn delete_limits(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    check_tenant(&tenant)?;
    let actor = super::nodes::actor(&headers);
    if state.store.delete_limits_as(&actor, &tenant).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("limits for this tenant"))
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
    headers: HeaderMap,
    gangway_shared::http::JobId(id): gangway_shared::http::JobId,
) -> Result<axum::Json<Preempted>, ApiError> {
    let actor = super::nodes::actor(&headers);
    if !retry_races(|| {
        state
            .store
            .preempt_job_as(&actor, id, "requested by an operator")
    })
    .await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::JOB_NOT_RUNNING,
            "the job is not running or starting; only those can be preempted",
        ));
    }
    metrics::counter!("gangway_preemptions_total", "cause" => "operator").increment(1);
    // Its agents ask its workers to checkpoint now, not at their next sync.
    if let Err(e) = state.store.wake_agents_of(&[], &[id]).await {
        tracing::warn!(job_id = %id, error = %e, "waking a preempted job's agents failed: they hear at their next sync");
    }
    Ok(axum::Json(Preempted {
        job_id: id,
        preempted: true,
    }))
}

/// The audit log, newest first: every operator action in this region.
pub async fn audit(
    State(state): State<AppState>,
    gangway_shared::http::Query(q): gangway_shared::http::Query<AuditQuery>,
) -> Result<axum::Json<AuditList>, ApiError> {
    if q.limit.is_some_and(|l| !(1..=1000).contains(&l)) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "limit must be between 1 and 1000",
        ));
    }
    Ok(axum::Json(state.store.audit_log(&q).await?))
}

/// Goodput per tenant: useful over allocated GPU time of all its jobs.
pub async fn goodput(State(state): State<AppState>) -> Result<axum::Json<GoodputList>, ApiError> {
    Ok(axum::Json(state.store.goodput_by_tenant().await?))
}
