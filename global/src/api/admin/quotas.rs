//! Quotas (guarantees, weights and caps) and admission limits (queued
//! jobs, GPUs of unfinished jobs), set in every region (or one) at once.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::api::{LimitsUpdate, QuotaList, QuotaUpdate, TenantLimitsList};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Json, Path, Query};

use super::responses;
use crate::auth::AdminCaller;
use crate::state::GlobalState;

use super::{fan_out, PerRegion, RegionParam};

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
