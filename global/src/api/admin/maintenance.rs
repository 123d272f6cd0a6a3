//! Rolling maintenance plans, passed to the region they run in.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::api::{MaintenancePlan, MaintenanceStart, NodeActionRequest};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Path, Query};

use super::responses;
use crate::auth::AdminCaller;
use crate::regions::Region;
use crate::state::GlobalState;

use super::{ask_regions, fan_out, PerRegion, RegionParam};

/// The one region a maintenance call names (`region` is required: plans
/// are per region).
fn maintenance_region<'a>(
    state: &'a GlobalState,
    region: Option<&str>,
) -> Result<Vec<&'a Region>, ApiError> {
    match region {
        Some(name) => match state.regions.get(name) {
            Some(r) => Ok(vec![r]),
            None => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            )),
        },
        None => Ok(state.regions.list.iter().collect()),
    }
}

/// Start rolling maintenance
///
/// Reboots a set of the named region's nodes (all, a leaf, a GPU type or a
/// list) in capacity-aware waves: at most `per_leaf` nodes of one leaf and
/// `region_percent` % of the region out at once (other outages counted),
/// never two nodes of one running gang; each node drained with checkpoints,
/// rebooted, and returned once its agent reports a new boot id and it is
/// healthy. A node out of service for another reason when its turn comes is
/// skipped, with the reason: at once when that lasts (lost, failed, in
/// repair, cordoned or drained by an operator), after ten minutes of
/// waiting for it when it passes (suspect, held down after flapping); the
/// plan finishes once every node is done or skipped. Persisted: a
/// control-plane restart resumes the waves. One plan runs at a time per
/// region. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/maintenance",
    operation_id = "start_maintenance",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    request_body(content = MaintenanceStart, content_type = "application/json"),
    responses(
        (status = 201, description = "The plan.", body = MaintenancePlan),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, description = responses::errors(
            "Another plan is running in the region.", &[codes::MAINTENANCE_CONFLICT]),
            body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a plan (`invalid_spec`), names no target, an unknown node or \
             limits out of range (`invalid_maintenance`), or `region` is missing or names no \
             region.",
            &[codes::INVALID_SPEC, codes::INVALID_MAINTENANCE, codes::WRONG_REGION]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn start_maintenance(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    let Some(name) = p.region.as_deref() else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            "name the region to maintain (?region=NAME)",
        ));
    };
    let regions = maintenance_region(&state, Some(name))?;
    ask_regions(
        &state,
        &regions,
        Method::POST,
        "/v1/admin/maintenance",
        Some(body.to_vec()),
        &admin.subject,
        "region",
    )
    .await
}

/// List maintenance plans
///
/// Every region's (or the named one's) plans, newest first, with nodes per
/// step and the nodes each skipped.
#[utoipa::path(
    get,
    path = "/v1/admin/maintenance",
    operation_id = "list_maintenance",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's `MaintenancePlanList`, by region name.",
            body = PerRegion),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list_maintenance(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/maintenance",
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

fn check_plan_id(id: &str) -> Result<(), ApiError> {
    id.parse::<uuid::Uuid>()
        .map(|_| ())
        .map_err(|_| ApiError::not_found("maintenance plan"))
}

/// Get a maintenance plan
///
/// One plan with nodes per step, every node's step, and the nodes it
/// skipped with why (`skipped`).
#[utoipa::path(
    get,
    path = "/v1/admin/maintenance/{id}",
    operation_id = "get_maintenance",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The plan's id."), RegionParam),
    responses(
        (status = 200, description = "The plan.", body = MaintenancePlan),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such plan.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get_maintenance(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
) -> Result<axum::response::Response, ApiError> {
    check_plan_id(&id)?;
    let regions = maintenance_region(&state, p.region.as_deref())?;
    let path = format!("/v1/admin/maintenance/{id}");
    ask_regions(
        &state,
        &regions,
        Method::GET,
        &path,
        None,
        &admin.subject,
        "maintenance plan",
    )
    .await
}

/// Cancel a maintenance plan
///
/// Stops a running plan: nodes it has not started stay as they are, nodes
/// it took out return to service. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/maintenance/{id}/cancel",
    operation_id = "cancel_maintenance",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The plan's id."), RegionParam),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The plan.", body = MaintenancePlan),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such plan.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "The plan is no longer running.", &[codes::MAINTENANCE_CONFLICT]),
            body = ErrorBody),
        (status = 422, description = responses::errors(
            "The reason is too long, or no region has the name given in `region`.",
            &[codes::INVALID_MAINTENANCE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn cancel_maintenance(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    check_plan_id(&id)?;
    let regions = maintenance_region(&state, p.region.as_deref())?;
    let path = format!("/v1/admin/maintenance/{id}/cancel");
    ask_regions(
        &state,
        &regions,
        Method::POST,
        &path,
        Some(body.to_vec()),
        &admin.subject,
        "maintenance plan",
    )
    .await
}
