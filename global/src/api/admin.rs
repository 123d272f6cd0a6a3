//! Operator endpoints: quotas (guarantees, weights and caps), set in every
//! region (or one) at once.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use futures_util::future::join_all;
use gangway_shared::api::{QuotaList, QuotaUpdate};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Json, Path, Query};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{openapi, GlobalState};
use crate::auth::AdminCaller;
use crate::regions::Call;

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
    #[schema(value_type = BTreeMap<String, openapi::RegionAnswer>)]
    pub regions: BTreeMap<String, serde_json::Value>,
}

async fn fan_out(
    state: &GlobalState,
    only: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
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
        (status = 400, description = openapi::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 422, description = openapi::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
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
        (status = 400, description = openapi::errors(
            "The body is not JSON, or a query parameter is unknown or malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 404, description = openapi::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 413, response = openapi::PayloadTooLarge),
        (status = 415, response = openapi::UnsupportedMediaType),
        (status = 422, description = openapi::errors(
            "The body is not a quota update, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
    )
)]
pub async fn put_quota(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
    Json(body): Json<QuotaUpdate>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    let body = serde_json::to_vec(&body).expect("a quota serializes");
    Ok(axum::Json(
        fan_out(&state, p.region.as_deref(), Method::PUT, &path, Some(body)).await?,
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
        (status = 400, description = openapi::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 404, description = openapi::errors(
            "The path does not decode.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = openapi::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
    )
)]
pub async fn delete_quota(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    Ok(axum::Json(
        fan_out(&state, p.region.as_deref(), Method::DELETE, &path, None).await?,
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
        (status = 401, response = crate::api::openapi::Unauthenticated),
        (status = 403, response = crate::api::openapi::Forbidden),
        (status = 404, response = crate::api::openapi::JobNotFound),
        (status = 409, description = crate::api::openapi::errors(
            "The job is not running or starting.", &[codes::JOB_NOT_RUNNING]),
            body = gangway_shared::error::ErrorBody),
        (status = 429, response = crate::api::openapi::RateLimited),
        (status = 503, response = crate::api::openapi::RegionUnavailable),
    )
)]
pub async fn preempt_job(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    gangway_shared::http::JobId(id): gangway_shared::http::JobId,
) -> Result<axum::response::Response, ApiError> {
    let path = format!("/v1/admin/jobs/{id}/preempt");
    let (_, answer) = super::jobs::ask_every_region(&state, Method::POST, &path, None).await?;
    Ok(super::jobs::relay(answer))
}
