//! Operator endpoints: quotas (guarantees, weights and caps) and admission
//! limits (queued jobs, GPUs of unfinished jobs), set in every region (or
//! one) at once; nodes (list, inspect, cordon, uncordon, drain,
//! inject faults, admit, release), passed to the region that has the
//! node; the inventory (add a machine to a region) and agent tokens
//! (minted per agent with the service key); rolling
//! maintenance plans, passed to the region they run in; the audit log of
//! every region. Every call names the operator (the admin token's
//! subject) to the regions, which write it into their audit logs.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use futures_util::future::join_all;
use gangway_shared::api::{
    DrainRequest, Fault, InventoryEntry, LimitsUpdate, MaintenancePlan, MaintenanceStart,
    NodeActionRequest, NodeView, QuotaList, QuotaUpdate, TenantLimitsList,
};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Json, Path, Query};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::responses;
use crate::auth::AdminCaller;
use crate::regions::{Call, Region};
use crate::state::GlobalState;

/// Which regions an operator call goes to.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RegionParam {
    /// Only this region (default: every region).
    region: Option<String>,
}

/// Each region's answer (a JSON document, or the error it gave).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PerRegion {
    /// By region name.
    #[schema(value_type = BTreeMap<String, responses::RegionAnswer>)]
    pub regions: BTreeMap<String, serde_json::Value>,
}

async fn fan_out(
    state: &GlobalState,
    only: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    actor: Option<&str>,
    query: Option<&str>,
) -> Result<PerRegion, ApiError> {
    if let Some(name) = only {
        if state.regions.get(name).is_none() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            ));
        }
    }
    let asks = state
        .regions
        .list
        .iter()
        .filter(|r| only.is_none_or(|n| n == r.name))
        .map(|r| {
            let (method, body) = (method.clone(), body.clone());
            async move {
                let a = state
                    .regions
                    .call(
                        r,
                        method,
                        path,
                        Call {
                            body: body.map(Into::into),
                            actor,
                            query,
                            ..Default::default()
                        },
                    )
                    .await;
                let v = match a {
                    Ok(a) if a.status == StatusCode::NO_CONTENT => {
                        serde_json::json!({"deleted": true})
                    }
                    Ok(a) => serde_json::from_slice(&a.body).unwrap_or_else(|_| {
                        serde_json::json!({"code": codes::REGION_UNAVAILABLE,
                                           "message": format!("answered {}", a.status)})
                    }),
                    Err(e) => serde_json::json!({"code": codes::REGION_UNAVAILABLE,
                                                 "message": e.to_string()}),
                };
                (r.name.clone(), v)
            }
        });
    Ok(PerRegion {
        regions: join_all(asks).await.into_iter().collect(),
    })
}

/// List quotas
///
/// Every tenant's quotas, as each region (or the one named) holds them.
#[utoipa::path(
    get,
    path = "/v1/admin/quotas",
    operation_id = "list_quotas",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
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
pub async fn list_quotas(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let out = fan_out(
        &state,
        p.region.as_deref(),
        Method::GET,
        "/v1/admin/quotas",
        None,
        None,
        None,
    )
    .await?;
    // Keep the shape checkable: every region's value is a QuotaList or an error.
    debug_assert!(
        out.regions
            .values()
            .all(|v| serde_json::from_value::<QuotaList>(v.clone()).is_ok()
                || v.get("code").is_some())
    );
    Ok(axum::Json(out))
}

/// Set a quota
///
/// Replaces the tenant's terms for one GPU type, in every region (or the
/// one named): GPUs it is guaranteed (lent to others while unused, taken
/// back by preempting borrowers when it needs them), its fair-share weight
/// (default 1.0) and an optional cap on what it may hold at once, borrowing
/// included (absent = no cap). Each region checks the names and the
/// numbers; its refusal (`invalid_spec`, `invalid_gpus` for a count out of
/// range, `invalid_quota` for a cap below the guarantee or a weight out of
/// range) is its entry in the answer, and changes nothing there.
#[utoipa::path(
    put,
    path = "/v1/admin/quotas/{tenant}/{gpu_type}",
    operation_id = "put_quota",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("tenant" = String, Path, description = "The tenant."),
        ("gpu_type" = String, Path, description = "The GPU type, for example `h100`."),
        RegionParam,
    ),
    request_body(content = QuotaUpdate, content_type = "application/json"),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "The body is not JSON, or a query parameter is unknown or malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The body is not a quota update, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn put_quota(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
    Json(body): Json<QuotaUpdate>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    let body = serde_json::to_vec(&body).expect("a quota serializes");
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::PUT,
            &path,
            Some(body),
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// Remove a quota
///
/// The tenant is no longer capped for that GPU type, in every region (or
/// the one named). A region without that quota answers `not_found` in its
/// entry.
#[utoipa::path(
    delete,
    path = "/v1/admin/quotas/{tenant}/{gpu_type}",
    operation_id = "delete_quota",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("tenant" = String, Path, description = "The tenant."),
        ("gpu_type" = String, Path, description = "The GPU type, for example `h100`."),
        RegionParam,
    ),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn delete_quota(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::DELETE,
            &path,
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// A tenant named in the path, checked here because it goes into each
/// region's URL as it is.
fn check_tenant(tenant: &str) -> Result<(), ApiError> {
    if !gangway_shared::ids::valid_tenant(tenant) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a tenant is a lowercase name of a-z, 0-9 and '-' (1–63 characters)",
        ));
    }
    Ok(())
}

/// List admission limits
///
/// Every tenant's admission limits, as each region (or the one named)
/// holds them.
#[utoipa::path(
    get,
    path = "/v1/admin/limits",
    operation_id = "list_limits",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
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
pub async fn list_limits(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let out = fan_out(
        &state,
        p.region.as_deref(),
        Method::GET,
        "/v1/admin/limits",
        None,
        None,
        None,
    )
    .await?;
    debug_assert!(out
        .regions
        .values()
        .all(
            |v| serde_json::from_value::<TenantLimitsList>(v.clone()).is_ok()
                || v.get("code").is_some()
        ));
    Ok(axum::Json(out))
}

/// Set admission limits
///
/// Replaces the tenant's admission limits, in every region (or the one
/// named): at most `max_queued_jobs` of its jobs queued, and at most
/// `max_gpus` GPUs asked by its unfinished jobs, each counted per region
/// (absent or `null` = no limit on that dimension; at least one must be
/// set). A submit that would go over one is refused with 429
/// `queued_jobs_limit` or `requested_gpus_limit`, and nothing is created;
/// jobs already accepted stay. A bad tenant name or body is refused here
/// (422: `invalid_spec`; `invalid_limits` for a number out of range or no
/// limit set) before any region is asked, and changes nothing.
#[utoipa::path(
    put,
    path = "/v1/admin/limits/{tenant}",
    operation_id = "put_limits",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("tenant" = String, Path, description = "The tenant."),
        RegionParam,
    ),
    request_body(content = LimitsUpdate, content_type = "application/json"),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "The body is not JSON, or a query parameter is unknown or malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The tenant is not a valid name, the body is not a limits update (a wrong type, \
             an unknown field: `invalid_spec`), a limit is out of range or none is set \
             (`invalid_limits`), or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::INVALID_LIMITS, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn put_limits(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(tenant): Path<String>,
    Query(p): Query<RegionParam>,
    Json(body): Json<LimitsUpdate>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_tenant(&tenant)?;
    // Checked here too, so a typo is one clear refusal, not one per region.
    body.check()
        .map_err(|r| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, r.code, r.message))?;
    let path = format!("/v1/admin/limits/{tenant}");
    let body = serde_json::to_vec(&body).expect("a limits update serializes");
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::PUT,
            &path,
            Some(body),
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// Remove admission limits
///
/// The tenant is no longer limited at submission, in every region (or the
/// one named). A region where it had no limits answers `not_found` in its
/// entry.
#[utoipa::path(
    delete,
    path = "/v1/admin/limits/{tenant}",
    operation_id = "delete_limits",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("tenant" = String, Path, description = "The tenant."),
        RegionParam,
    ),
    responses(
        (status = 200, description = "Each region's answer, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The tenant is not a valid name, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn delete_limits(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(tenant): Path<String>,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_tenant(&tenant)?;
    let path = format!("/v1/admin/limits/{tenant}");
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::DELETE,
            &path,
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
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

/// Sends one call to `regions` at once and relays the first answer that is
/// not a 404: the region that has the node (or job) answers, the others do
/// not know it. Nobody has it → 404, unless a region did not answer (503).
async fn ask_regions(
    state: &GlobalState,
    regions: &[&Region],
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    actor: &str,
    what: &str,
) -> Result<axum::response::Response, ApiError> {
    let asks = regions.iter().map(|r| {
        let (method, body) = (method.clone(), body.clone());
        async move {
            let a = state
                .regions
                .call(
                    r,
                    method,
                    path,
                    Call {
                        body: body.map(Into::into),
                        actor: Some(actor),
                        ..Default::default()
                    },
                )
                .await;
            (*r, a)
        }
    });
    let mut down = None;
    let mut not_found = None;
    for (region, answer) in join_all(asks).await {
        match answer {
            Ok(a) if a.status == StatusCode::NOT_FOUND => not_found = Some(a),
            Ok(a) if a.status.is_server_error() => {
                down = Some(format!("region {} answered {}", region.name, a.status))
            }
            Ok(a) => return Ok(super::relay::relay(a)),
            Err(e) => down = Some(e.to_string()),
        }
    }
    match (down, not_found) {
        (None, Some(a)) if regions.len() == 1 => Ok(super::relay::relay(a)),
        (None, _) => Err(ApiError::not_found(what)),
        (Some(why), _) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!(
                "the {what} was not found in the regions that answered, and {why}; retry shortly"
            ),
        )),
    }
}

/// The regions that may have node `id`: the one named in `region`, else the
/// one whose name prefixes the id (node ids are `{region}-s00-l01-n03`),
/// else every region.
fn node_regions<'a>(
    state: &'a GlobalState,
    region: Option<&str>,
    id: &str,
) -> Result<Vec<&'a Region>, ApiError> {
    if let Some(name) = region {
        return match state.regions.get(name) {
            Some(r) => Ok(vec![r]),
            None => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            )),
        };
    }
    let by_prefix = state
        .regions
        .list
        .iter()
        .filter(|r| {
            id.strip_prefix(r.name.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .max_by_key(|r| r.name.len());
    Ok(match by_prefix {
        Some(r) => vec![r],
        None => state.regions.list.iter().collect(),
    })
}

/// A node id as it may appear in a path.
fn check_node_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::not_found("node"))
    }
}

/// List nodes
///
/// Every node of every region (or the one named), with both axes of its
/// state — what operators asked (`admin_state`: active, cordoned, draining,
/// maintenance, repair) and what its agent observes (`observed`: healthy,
/// degraded, suspect, lost, failed, damped, needs_repair) — and what they
/// decide: whether it is schedulable, its usable GPUs, and why not.
#[utoipa::path(
    get,
    path = "/v1/admin/nodes",
    operation_id = "list_nodes",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's `NodeList`, by region name.", body = PerRegion),
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
pub async fn list_nodes(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/nodes",
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// Get a node
///
/// One node (from the region named, or the one its id names), with its
/// newest events: health effects, operator actions, injected faults, jobs
/// moved off it.
#[utoipa::path(
    get,
    path = "/v1/admin/nodes/{id}",
    operation_id = "get_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    responses(
        (status = 200, description = "The node.", body = NodeView),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(&id)?;
    let regions = node_regions(&state, p.region.as_deref(), &id)?;
    let path = format!("/v1/admin/nodes/{id}");
    ask_regions(
        &state,
        &regions,
        Method::GET,
        &path,
        None,
        &admin.subject,
        "node",
    )
    .await
}

async fn node_action(
    state: &GlobalState,
    admin: &AdminCaller,
    region: Option<&str>,
    id: &str,
    action: &str,
    body: Vec<u8>,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(id)?;
    let regions = node_regions(state, region, id)?;
    let path = format!("/v1/admin/nodes/{id}/{action}");
    ask_regions(
        state,
        &regions,
        Method::POST,
        &path,
        Some(body),
        &admin.subject,
        "node",
    )
    .await
}

/// Cordon a node
///
/// No new work goes to the node; the jobs running on it stay. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/cordon",
    operation_id = "cordon_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a node action, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn cordon_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "cordon",
        body.to_vec(),
    )
    .await
}

/// Uncordon a node
///
/// Returns the node to service: from a cordon, a drain, or repair (the
/// operator vouches it is fixed). Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/uncordon",
    operation_id = "uncordon_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a node action, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn uncordon_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "uncordon",
        body.to_vec(),
    )
    .await
}

/// Drain a node
///
/// Cordons the node and moves its jobs elsewhere through the checkpoint
/// protocol: `checkpoint` mode asks them to checkpoint now (each is stopped
/// once its checkpoint is written, or at the deadline) and restarts them
/// elsewhere from it; `wait` mode lets them finish, and checkpoints and
/// moves those still running at the deadline. The node stays out (drained)
/// until uncordoned. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/drain",
    operation_id = "drain_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = DrainRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a drain (`invalid_spec`), its deadline or reason is out of range, \
             or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::INVALID_DRAIN, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn drain_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "drain",
        body.to_vec(),
    )
    .await
}

/// Inject a fault
///
/// Applies a fault to a node of a simulated fleet as if its agent had
/// reported it: an XID (`{"kind": "xid", "gpu": 0, "code": 79}`), ECC
/// errors, a row remap, a thermal event, NVLink errors, a dead node
/// (`node_down`), a flapping link (`link_flap`), a reboot, or its rack
/// thermally throttling (`rack_thermal`: no node of the node's leaf takes
/// new work until `{"kind": "rack_thermal", "throttled": false}`). The
/// health policy then acts on it as on a real report. Refused for real
/// agents' nodes. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/faults",
    operation_id = "inject_fault",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = Fault, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "The node's agent is not simulated.", &[codes::NODE_NOT_SIMULATED]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a fault (`invalid_spec`), names a GPU the node does not have or a \
             value out of range (`invalid_fault`), or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::INVALID_FAULT, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn inject_fault(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "faults",
        body.to_vec(),
    )
    .await
}

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

/// Goodput per tenant
///
/// Per region (or the one named), each tenant's allocated GPU time, the
/// part of it lost to restarts (work after the last checkpoint of runs
/// that were stopped and requeued), and goodput: useful over allocated.
#[utoipa::path(
    get,
    path = "/v1/admin/goodput",
    operation_id = "goodput",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's `GoodputList`, by region name.", body = PerRegion),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn goodput(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/goodput",
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// The query of `GET /v1/admin/usage/records` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageRecordsParams {
    /// The region whose ledger to read (its own rows and those it holds
    /// for its peers); default: every region's first page.
    pub region: Option<String>,
    /// Rows overlapping [from, to), RFC 3339.
    pub from: String,
    pub to: String,
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// The previous page's `next`.
    pub after: Option<String>,
    /// Rows per page (at most 5000).
    pub limit: Option<u32>,
    /// Usage records only: `id` (the default) or `time` — in
    /// (`started_at`, `usage_id`) order, so clock hour by clock hour, as
    /// the billing export streams them.
    pub order: Option<String>,
    /// Usage records in time order: the previous page's `next_start`
    /// (RFC 3339), with its `next` as `after`.
    pub after_start: Option<String>,
    /// Commitments only: those of this region, from the copies its peers
    /// hold (every peer holds them: docs/billing.md, "A region that does
    /// not come back"); each answer says when that peer last heard from
    /// it (`heard_at`).
    pub home: Option<String>,
}

/// A period of the ledger endpoints, checked here so that a bad one is
/// one 400 `invalid_query`, not an error from every region.
fn check_period(from: &str, to: &str) -> Result<(), ApiError> {
    let parse = |name: &str, v: &str| {
        chrono::DateTime::parse_from_rfc3339(v).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_QUERY,
                format!("`{name}` is not an RFC 3339 time ({e})"),
            )
        })
    };
    if parse("from", from)? >= parse("to", to)? {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "`from` must be before `to`",
        ));
    }
    Ok(())
}

/// Read a region's usage ledger
///
/// One page of the usage ledger rows of one region, or of each (its own
/// and those it holds for its peers), overlapping a period, in id order
/// — or with `order=time` in (`started_at`, `usage_id`) order, clock hour
/// by clock hour: what the billing export merges from every region as a
/// stream (`gangway billing export`). A region's next page is asked of it
/// by name with `after` (its `next`) and, in time order, `after_start`
/// (its `next_start`).
#[utoipa::path(
    get,
    path = "/v1/admin/usage/records",
    operation_id = "usage_records",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: UsageRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_records(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/records").await
}

/// Read a region's credits
///
/// One page of the credits of one region, or of each (its own and those
/// it holds for its peers): GPU time lost to provider-caused events, not
/// charged (docs/billing.md). Those whose lost time overlaps [from, to) or
/// that were issued in it, in id order; the same query as
/// `/v1/admin/usage/records`.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/credits",
    operation_id = "usage_credits",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: CreditRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_credits(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/credits").await
}

/// Read a region's committed capacity
///
/// One page of what each tenant had committed in one region, or in each —
/// guaranteed quotas, capacity reservations and dedicated clusters, billed
/// whether used or not (docs/billing.md) — one record per commitment and
/// clock hour of [from, to): its GPU-seconds (a reservation resized
/// mid-hour holds each size for its part; a deleted one, until it was
/// deleted), in id order; the same query as `/v1/admin/usage/records`.
/// What the billing export prices as commitments.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/commitments",
    operation_id = "usage_commitments",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: CommitmentRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_commitments(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/commitments").await
}

/// The order of a ledger page, checked here like its period: `order` and
/// `after_start` are the usage records' (`order` `id` or `time`;
/// `after_start` an RFC 3339 time, in time order only).
fn check_order(p: &UsageRecordsParams, path: &str) -> Result<(), ApiError> {
    let bad = |msg: String| {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            msg,
        ))
    };
    if path != "/v1/admin/usage/commitments" && p.home.is_some() {
        return bad(format!(
            "`home` is for /v1/admin/usage/commitments (for closed placements: \
             /v1/admin/usage/closings), not {path}"
        ));
    }
    if path != "/v1/admin/usage/records" && (p.order.is_some() || p.after_start.is_some()) {
        return bad(format!(
            "`order` and `after_start` are for /v1/admin/usage/records; {path} pages in id order"
        ));
    }
    match p.order.as_deref() {
        None | Some("id") if p.after_start.is_some() => {
            bad("`after_start` is for `order=time`".into())
        }
        None | Some("id") => Ok(()),
        Some("time") => match (&p.after_start, &p.after) {
            (Some(t), Some(_)) => match chrono::DateTime::parse_from_rfc3339(t) {
                Ok(_) => Ok(()),
                Err(e) => bad(format!("`after_start` is not an RFC 3339 time ({e})")),
            },
            (None, None) => Ok(()),
            _ => bad("in time order, `after` and `after_start` go together".into()),
        },
        Some(o) => bad(format!("`order` is `id` or `time`, not {o:?}")),
    }
}

/// One page of a ledger of one region, or of each (`path`: the region's
/// records, credits or commitments), for the query `p`.
async fn ledger_page(
    state: &GlobalState,
    admin: &AdminCaller,
    p: &UsageRecordsParams,
    path: &str,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    check_order(p, path)?;
    let mut q = vec![("from", p.from.clone()), ("to", p.to.clone())];
    q.extend(p.tenant.clone().map(|t| ("tenant", t)));
    q.extend(p.after.clone().map(|a| ("after", a)));
    q.extend(p.limit.map(|l| ("limit", l.to_string())));
    q.extend(p.order.clone().map(|o| ("order", o)));
    q.extend(p.after_start.clone().map(|t| ("after_start", t)));
    q.extend(p.home.clone().map(|h| ("home", h)));
    usage_of_each(state, admin, p.region.as_deref(), path, &q).await
}

/// The query of `GET /v1/admin/usage/allocated` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AllocatedParams {
    /// Only this region (default: every region).
    pub region: Option<String>,
    /// [from, to), RFC 3339.
    pub from: String,
    pub to: String,
}

/// GPU time the allocations held
///
/// Per region (or the one named), each tenant's GPU-seconds its
/// allocations held in [from, to) — a live placement only up to the hour
/// the region's meter has written (`metered_until`) — and the placements
/// live at the read, all from one snapshot of the region's database: what
/// `gangway billing reconcile` compares with the merged usage ledger.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/allocated",
    operation_id = "usage_allocated",
    tag = "admin",
    security(("bearer" = [])),
    params(AllocatedParams),
    responses(
        (status = 200, description = "`{regions: {NAME: AllocatedUsage}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_allocated(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<AllocatedParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    let q = [("from", p.from.clone()), ("to", p.to.clone())];
    usage_of_each(
        &state,
        &admin,
        p.region.as_deref(),
        "/v1/admin/usage/allocated",
        &q,
    )
    .await
}

/// `GET path?query` of one region (`region`) or of each, as the admin
/// `admin`: the usage endpoints' fan-out.
async fn usage_of_each(
    state: &GlobalState,
    admin: &AdminCaller,
    region: Option<&str>,
    path: &str,
    query: &[(&str, String)],
) -> Result<axum::Json<PerRegion>, ApiError> {
    let query = gangway_shared::http::query_string(query);
    Ok(axum::Json(
        fan_out(
            state,
            region,
            Method::GET,
            path,
            None,
            Some(&admin.subject),
            Some(&query),
        )
        .await?,
    ))
}

/// The query of `GET /v1/admin/usage/closings` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ClosingsParams {
    /// Only this region (default: every region).
    pub region: Option<String>,
    /// [from, to), RFC 3339.
    pub from: String,
    pub to: String,
    /// Only the closings of this home's placements.
    pub home: Option<String>,
}

/// Read the placements adopters closed
///
/// Per region (or the one named), the hours of a dead home's last
/// placements that the region closed when it adopted their jobs —
/// shaped as ledger rows of the home, from the newest row it held of each
/// to the last time it heard from the home — and the credits of the work
/// those placements lost (docs/billing.md, "A region that does not come
/// back"). They count only where the home is billed from its copies
/// (`gangway billing export --from-copies HOME`): a home that answers
/// bills its own placements.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/closings",
    operation_id = "usage_closings",
    tag = "admin",
    security(("bearer" = [])),
    params(ClosingsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: Closings}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_closings(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<ClosingsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    let mut q = vec![("from", p.from.clone()), ("to", p.to.clone())];
    q.extend(p.home.clone().map(|h| ("home", h)));
    usage_of_each(
        &state,
        &admin,
        p.region.as_deref(),
        "/v1/admin/usage/closings",
        &q,
    )
    .await
}

/// Admit an unknown machine
///
/// Puts a machine that tried to join and was refused (`unknown_node`,
/// listed as `unknown`) into its region's inventory where the body says it
/// sits, so its next registration is accepted and it takes work. Passed to
/// the region that saw it. Audited (`node.admit`).
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/admit",
    operation_id = "admit_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The machine's name."), RegionParam),
    request_body = InventoryEntry,
    responses(
        (status = 200, description = "The machine's inventory entry."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "No region has seen a machine of that name.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The entry is invalid, or no region has the name given in `region`.",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn admit_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "admit",
        body.to_vec(),
    )
    .await
}

/// Release a node (takeover)
///
/// The agent holding the node loses its claim: the next agent to register
/// the node takes it over at once, even while the old one is alive (use it
/// when the old machine is gone or replaced). Audited (`node.release`).
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/release",
    operation_id = "release_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body = NodeActionRequest,
    responses(
        (status = 200, description = "The agent whose claim was released."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn release_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "release",
        body.to_vec(),
    )
    .await
}

/// The one region an inventory or token call is for: the one named, or
/// the only one.
fn one_region<'a>(state: &'a GlobalState, region: Option<&str>) -> Result<&'a Region, ApiError> {
    match (region, state.regions.list.as_slice()) {
        (Some(name), _) => state.regions.get(name).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            )
        }),
        (None, [only]) => Ok(only),
        (None, _) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            "name the region (?region=NAME): the machine belongs to one",
        )),
    }
}

/// Add a machine to a region's inventory
///
/// Says that a machine belongs to the region and where it sits (spine,
/// leaf, NVLink domain, spare or not), before or after it first tries to
/// join; its agent's registrations are accepted from then on. Audited
/// (`node.add`).
#[utoipa::path(
    put,
    path = "/v1/admin/inventory/{id}",
    operation_id = "add_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The machine's name."), RegionParam),
    request_body = InventoryEntry,
    responses(
        (status = 200, description = "The machine's inventory entry."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The entry is invalid, or the region is not named (or unknown).",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn add_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(&id)?;
    let region = one_region(&state, p.region.as_deref())?;
    ask_regions(
        &state,
        &[region],
        Method::PUT,
        &format!("/v1/admin/inventory/{id}"),
        Some(body.to_vec()),
        &admin.subject,
        "node",
    )
    .await
}

/// The query of `POST /v1/admin/agents/{id}/token`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AgentTokenParams {
    /// The region the agent serves (default: the only one).
    region: Option<String>,
    /// How long the token lasts, in days (1–400; default 90).
    ttl_days: Option<u64>,
}

/// An agent's token, minted for one agent of one region.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AgentToken {
    pub agent_id: String,
    pub region: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// The token (role agent; subject: the agent; region: the region).
    pub token: String,
}

/// Mint an agent token
///
/// A token for one agent — a real machine's agent is named as its node —
/// of one region, signed with the service key the regions trust. The
/// region checks its subject against the agent of every call, and the
/// inventory binds each node to the agent that may serve it, so a token
/// of node A cannot register or report for node B, and a token of region
/// X is refused by region Y. Each minting is logged with the operator.
#[utoipa::path(
    post,
    path = "/v1/admin/agents/{id}/token",
    operation_id = "agent_token",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The agent (a real machine's: its node name)."),
        AgentTokenParams),
    responses(
        (status = 200, description = "The token.", body = AgentToken),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The agent id or lifetime is invalid, or the region is not named (or unknown).",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn agent_token(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<AgentTokenParams>,
) -> Result<axum::Json<AgentToken>, ApiError> {
    if !gangway_shared::fleet::valid_node_name(&id) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_NODE,
            "an agent id is 1-200 letters, digits, '.', '_' or '-'",
        ));
    }
    let days = p.ttl_days.unwrap_or(90);
    if !(1..=400).contains(&days) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_NODE,
            "ttl_days must be between 1 and 400",
        ));
    }
    let region = one_region(&state, p.region.as_deref())?;
    let ttl = std::time::Duration::from_secs(days * 86_400);
    let token = state.regions.agent_token(&region.name, &id, ttl);
    tracing::info!(operator = %admin.subject, agent_id = %id, region = %region.name, ttl_days = days, "agent token minted");
    Ok(axum::Json(AgentToken {
        agent_id: id,
        region: region.name.clone(),
        expires_at: chrono::Utc::now() + chrono::Duration::seconds((days * 86_400) as i64),
        token,
    }))
}
