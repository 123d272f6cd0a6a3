//! Operator endpoints for rolling maintenance: start a plan, list plans,
//! show one with every node's step, cancel one. Starting and cancelling are
//! audited with the operator the global tier names (`X-Gangway-Actor`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use gangway_shared::api::{
    MaintenancePlan, MaintenancePlanList, MaintenanceStart, NodeActionRequest,
};
use gangway_shared::error::codes;
use gangway_shared::http::Path;
use uuid::Uuid;

use super::error::ApiError;
use super::nodes::{actor, body, check_reason, required};
use super::AppState;
use crate::store::{retry_races, MaintenanceRefusal};

fn refused(r: MaintenanceRefusal) -> ApiError {
    match r {
        MaintenanceRefusal::Invalid(why) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_MAINTENANCE,
            why,
        ),
        MaintenanceRefusal::Conflict(why) => {
            ApiError::new(StatusCode::CONFLICT, codes::MAINTENANCE_CONFLICT, why)
        }
        MaintenanceRefusal::NotFound => ApiError::not_found("maintenance plan"),
    }
}

fn plan_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse()
        .map_err(|_| ApiError::not_found("maintenance plan"))
}

/// Creates a plan; the leader starts its first wave on its next tick.
pub async fn start(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<MaintenancePlan>), ApiError> {
    let bytes = bytes.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("cannot read the body: {e}"),
        )
    })?;
    let mut req: MaintenanceStart = required(&bytes)?;
    req.reason = check_reason(&req.reason, codes::INVALID_MAINTENANCE)?;
    if req.nodes.len() > 100_000 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_MAINTENANCE,
            "too many nodes in one plan",
        ));
    }
    let actor = actor(&headers);
    let plan = retry_races(|| state.store.start_maintenance(&actor, &req))
        .await?
        .map_err(refused)?;
    tracing::info!(plan = %plan.plan_id, %actor, nodes = plan.total, "maintenance plan started");
    Ok((StatusCode::CREATED, axum::Json(plan)))
}

pub async fn list(
    State(state): State<AppState>,
) -> Result<axum::Json<MaintenancePlanList>, ApiError> {
    Ok(axum::Json(state.store.list_maintenance().await?))
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<MaintenancePlan>, ApiError> {
    let id = plan_id(&id)?;
    match state.store.get_maintenance(id).await? {
        Some(p) => Ok(axum::Json(p)),
        None => Err(ApiError::not_found("maintenance plan")),
    }
}

/// Stops a running plan: nodes it took out return to service.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<MaintenancePlan>, ApiError> {
    let id = plan_id(&id)?;
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_MAINTENANCE)?;
    let actor = actor(&headers);
    let ctx = state.store.health_context();
    let plan = retry_races(|| {
        state
            .store
            .cancel_maintenance(&ctx, &actor, id, reason.as_deref())
    })
    .await?
    .map_err(refused)?;
    state.wake_scheduler();
    Ok(axum::Json(plan))
}
