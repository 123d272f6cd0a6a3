//! Tenants as records: created, listed, suspended and resumed by
//! operators, kept by a majority of regions (`crate::identity`), audited
//! in every region that holds them (`tenant.create`, `tenant.suspend`,
//! `tenant.resume`). A suspended tenant's every request is refused
//! (`tenant_suspended`) by every global replica within 5 s.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use chrono::Utc;
use gangway_shared::api::{
    JobList, TenantChanged, TenantCreate, TenantList, TenantRecord, TenantState, TenantSuspend,
};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Json, Path};

use super::responses;
use crate::auth::AdminCaller;
use crate::identity::Kind;
use crate::regions::{Call, Who};
use crate::state::GlobalState;

fn check_tenant_name(tenant: &str) -> Result<(), ApiError> {
    if !gangway_shared::ids::valid_tenant(tenant) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_TENANT,
            "a tenant is 1-63 characters of a-z, 0-9 and '-'",
        ));
    }
    Ok(())
}

/// Create a tenant
///
/// A record of a tenant (its id as its tokens and keys name it, a display
/// name, `active`). Tenants without a record are served as their tokens
/// say; a record is what lets an operator suspend one.
#[utoipa::path(
    post,
    path = "/v1/admin/tenants",
    operation_id = "create_tenant",
    tag = "admin",
    security(("bearer" = [])),
    request_body(content = TenantCreate, content_type = "application/json"),
    responses(
        (status = 201, description = "The tenant.", body = TenantRecord),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, description = responses::errors("A tenant by that id exists.",
            &[codes::TENANT_EXISTS]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The id or display name is not acceptable.",
            &[codes::INVALID_TENANT, codes::INVALID_SPEC]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn create_tenant(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Json(c): Json<TenantCreate>,
) -> Result<(StatusCode, axum::Json<TenantRecord>), ApiError> {
    check_tenant_name(&c.tenant)?;
    let display_name = c.display_name.unwrap_or_else(|| c.tenant.clone());
    if display_name.trim().is_empty() || display_name.chars().count() > 200 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a display name is 1-200 characters",
        ));
    }
    let existing = (state.identity)
        .read_fresh(&state.regions, Kind::Tenant, &c.tenant)
        .await?;
    if existing.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::TENANT_EXISTS,
            format!("tenant {:?} exists already", c.tenant),
        ));
    }
    let now = Utc::now();
    let record = TenantRecord {
        tenant: c.tenant.clone(),
        display_name,
        state: TenantState::Active,
        created_at: now,
        updated_at: now,
        updated_by: admin.subject.clone(),
    };
    let doc = serde_json::to_value(&record).expect("a tenant serializes");
    (state.identity)
        .write(
            &state.regions,
            Kind::Tenant,
            &c.tenant,
            0,
            doc,
            "tenant.create",
            &admin.subject,
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(record)))
}

/// List tenants
///
/// Every tenant with a record, by id.
#[utoipa::path(
    get,
    path = "/v1/admin/tenants",
    operation_id = "list_tenants",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The tenants.", body = TenantList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn list_tenants(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
) -> Result<axum::Json<TenantList>, ApiError> {
    let records = (state.identity)
        .list(&state.regions, Kind::Tenant, None)
        .await?;
    Ok(axum::Json(TenantList {
        tenants: (records.into_values())
            .filter_map(|r| serde_json::from_value(r.doc).ok())
            .collect(),
    }))
}

/// Sets a tenant's state; answers the record and the jobs stopped.
async fn set_state(
    state: &GlobalState,
    admin: &AdminCaller,
    tenant: &str,
    to: TenantState,
    stop_jobs: bool,
) -> Result<axum::Json<TenantChanged>, ApiError> {
    check_tenant_name(tenant)?;
    let found = (state.identity)
        .read_fresh(&state.regions, Kind::Tenant, tenant)
        .await?;
    let Some((version, mut record)) = found.and_then(|r| {
        serde_json::from_value::<TenantRecord>(r.doc)
            .ok()
            .map(|t| (r.version, t))
    }) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::NOT_FOUND,
            format!(
                "tenant {tenant:?} has no record: make one first (gangway admin tenant create \
                 {tenant})"
            ),
        ));
    };
    if record.state != to {
        record.state = to;
        record.updated_at = Utc::now();
        record.updated_by = admin.subject.clone();
        let action = match to {
            TenantState::Suspended => "tenant.suspend",
            TenantState::Active => "tenant.resume",
        };
        let doc = serde_json::to_value(&record).expect("a tenant serializes");
        (state.identity)
            .write(
                &state.regions,
                Kind::Tenant,
                tenant,
                version,
                doc,
                action,
                &admin.subject,
            )
            .await?;
    }
    let stopped_jobs = if stop_jobs {
        stop_all_jobs(state, tenant).await?
    } else {
        0
    };
    Ok(axum::Json(TenantChanged {
        tenant: record,
        stopped_jobs,
    }))
}

/// Cancels every unfinished job of `tenant` in every region; how many.
async fn stop_all_jobs(state: &GlobalState, tenant: &str) -> Result<u32, ApiError> {
    let mut stopped = 0;
    for region in &state.regions.list {
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("limit", "500".to_string())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let query = gangway_shared::http::query_string(&q);
            let call = Call {
                query: Some(&query),
                ..Who::Tenant(tenant).call()
            };
            let unreachable = |why: String| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!(
                        "the tenant is suspended, but region {} did not list its jobs ({why}): \
                         suspend it again with stop_jobs to stop the rest",
                        region.name
                    ),
                )
            };
            let a = (state.regions)
                .call(region, Method::GET, "/v1/jobs", call)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let page: JobList = serde_json::from_slice(&a.body)
                .map_err(|_| unreachable(format!("answered {}", a.status)))?;
            for job in page.jobs.iter().filter(|j| !j.state.is_terminal()) {
                let path = format!("/v1/jobs/{}/cancel", job.id);
                let call = Who::Tenant(tenant).call();
                if let Ok(a) = (state.regions)
                    .call(region, Method::POST, &path, call)
                    .await
                {
                    stopped += a.status.is_success() as u32;
                }
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
    }
    Ok(stopped)
}

/// Suspend a tenant
///
/// Every request of the tenant's, by token or key, is refused with 403
/// `tenant_suspended` by every global replica within 5 s. Its running jobs
/// run on, unless `stop_jobs` asks to cancel every unfinished one.
#[utoipa::path(
    post,
    path = "/v1/admin/tenants/{tenant}/suspend",
    operation_id = "suspend_tenant",
    tag = "admin",
    security(("bearer" = [])),
    params(("tenant" = String, Path, description = "The tenant.")),
    request_body(content = TenantSuspend, content_type = "application/json"),
    responses(
        (status = 200, description = "The tenant, suspended.", body = TenantChanged),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("The tenant has no record.",
            &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors("The tenant id is malformed.",
            &[codes::INVALID_TENANT]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn suspend_tenant(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(tenant): Path<String>,
    Json(s): Json<TenantSuspend>,
) -> Result<axum::Json<TenantChanged>, ApiError> {
    set_state(&state, &admin, &tenant, TenantState::Suspended, s.stop_jobs).await
}

/// Resume a tenant
///
/// Its tokens and keys are served again (by every replica within 5 s).
#[utoipa::path(
    post,
    path = "/v1/admin/tenants/{tenant}/resume",
    operation_id = "resume_tenant",
    tag = "admin",
    security(("bearer" = [])),
    params(("tenant" = String, Path, description = "The tenant.")),
    responses(
        (status = 200, description = "The tenant, active.", body = TenantChanged),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("The tenant has no record.",
            &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors("The tenant id is malformed.",
            &[codes::INVALID_TENANT]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::IdentityUnavailable),
    )
)]
pub async fn resume_tenant(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<TenantChanged>, ApiError> {
    set_state(&state, &admin, &tenant, TenantState::Active, false).await
}
