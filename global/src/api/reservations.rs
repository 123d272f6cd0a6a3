//! Capacity reservation endpoints: a create goes to the region its body
//! names (or the tenant's one region); the rest to the region that has the
//! reservation, found by asking every region at once, as for jobs.
//!
//! A keyed create's id is UUIDv5(tenant, key) in the reservations'
//! namespace. The region it went to is claimed like a keyed job's
//! (`POST /internal/v1/claims`), so the same key sent again naming another
//! region is refused (`idempotency_key_reused`) instead of making a second
//! reservation there; the region itself refuses the key with another body.
//! Regions' answers, refusals included (409 `reservation_unavailable` with
//! `earliest_start` / `earliest_end`), are passed on as they are.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use gangway_shared::api::{Reservation, ReservationList, ReservationResize, ReservationSpec};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{
    idempotency_key, reservation_resize, reservation_spec, ApiError, Json, ReservationId,
};
use gangway_shared::ids::reservation_id_for_key;
use tracing::instrument;
use uuid::Uuid;

use super::jobs::{ask_every_region, claim, relay, unavailable};
use super::{openapi, GlobalState};
use crate::auth::{AdminCaller, TenantCaller};
use crate::regions::{Call, Region};
use crate::routing::rendezvous;

/// The region a reservation is made in: the one the body names (known,
/// allowed to the tenant, answering), or the tenant's only region.
fn target<'a>(
    state: &'a GlobalState,
    tenant: &str,
    spec: &ReservationSpec,
) -> Result<&'a Region, ApiError> {
    let allowed: Vec<&Region> = (state.regions.list.iter())
        .filter(|r| state.tenant_may_use(tenant, &r.name))
        .collect();
    let name = match spec.region.as_deref() {
        Some(name) => name,
        None if allowed.len() == 1 => allowed[0].name.as_str(),
        None => {
            let names: Vec<&str> = allowed.iter().map(|r| r.name.as_str()).collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_RESERVATION,
                format!(
                    "name the region to reserve in (\"region\"): you may use {}; GET /v1/regions \
                     lists them",
                    names.join(", ")
                ),
            ));
        }
    };
    let Some(region) = allowed.iter().find(|r| r.name == name) else {
        let why = if state.regions.get(name).is_some() {
            format!("your tenant may not use region {name}; ask an operator")
        } else {
            format!("no region named {name:?}; GET /v1/regions lists them")
        };
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            why,
        ));
    };
    if !state.regions.healthy().iter().any(|r| r.name == name) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!("region {name} is not answering; retry shortly with the same Idempotency-Key"),
        ));
    }
    Ok(region)
}

/// Reserve capacity
///
/// Reserves `gpus` GPUs of a type inside one domain of `level` in the region
/// the body names (required when the tenant may use more than one), from
/// `start` (default now) to `end` (default open-ended). The region admits it
/// only if it can keep the promise next to every other one and next to the
/// running work it could not evict; otherwise it is refused with 409
/// `reservation_unavailable`, why, and the earliest window of the same
/// length that would work in `earliest_start` / `earliest_end`. With an
/// `Idempotency-Key`, the same key and body give the same reservation
/// however often they are sent.
#[utoipa::path(
    post,
    path = "/v1/reservations",
    operation_id = "create_reservation",
    tag = "reservations",
    security(("bearer" = [])),
    params(openapi::IdempotencyKey),
    request_body(content = ReservationSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "The reservation, admitted now or by an earlier \
            attempt with the same Idempotency-Key and body.", body = Reservation),
        (status = 400, description = openapi::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 409, response = openapi::ReservationRefused),
        (status = 413, response = openapi::PayloadTooLarge),
        (status = 415, response = openapi::UnsupportedMediaType),
        (status = 422, description = openapi::errors(
            "The request is invalid (the message says what to fix), names a region the \
             tenant may not use or none when it may use several, or the Idempotency-Key was \
             used before with another body or region.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::UNKNOWN_GPU_TYPE, codes::WRONG_REGION, codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
        (status = 503, response = openapi::RegionUnavailable),
    )
)]
#[instrument(skip_all, fields(tenant = %caller.tenant))]
pub async fn create(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant;
    let key = idempotency_key(&headers)?;
    let mut spec = reservation_spec(body)?;
    let region = target(&state, &tenant, &spec)?;
    // The region is part of what a key stands for.
    spec.region = Some(region.name.clone());
    if let Some(k) = &key {
        let id = reservation_id_for_key(&tenant, k);
        let healthy: Vec<&str> = (state.regions.healthy().into_iter())
            .map(|r| r.name.as_str())
            .collect();
        let order = rendezvous(id, healthy);
        let claimed = claim(&state, id, &tenant, &region.name, &order).await?;
        if claimed != region.name {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::IDEMPOTENCY_KEY_REUSED,
                format!(
                    "this Idempotency-Key was already used for a reservation in region \
                     {claimed}; use a new key for a reservation in {}",
                    region.name
                ),
            ));
        }
    }
    let body = serde_json::to_vec(&spec).expect("a ReservationSpec serializes");
    let answer = state
        .regions
        .call(
            region,
            Method::POST,
            "/v1/reservations",
            Call {
                tenant: Some(&tenant),
                idempotency_key: key.as_deref(),
                body: Some(body.into()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}

/// Every region's `path` (the tenant's reservations, or every tenant's),
/// merged newest first; regions that do not answer are named.
async fn merged(
    state: &GlobalState,
    path: &str,
    tenant: Option<&str>,
) -> Result<Response, ApiError> {
    let asks = state.regions.list.iter().map(|r| async move {
        let call = Call {
            tenant,
            ..Default::default()
        };
        (r, state.regions.call(r, Method::GET, path, call).await)
    });
    let mut reservations = Vec::new();
    let mut unavailable_regions = BTreeSet::new();
    for (region, answer) in join_all(asks).await {
        let page = (answer.ok())
            .filter(|a| a.status == StatusCode::OK)
            .and_then(|a| serde_json::from_slice::<ReservationList>(&a.body).ok());
        match page {
            Some(p) => reservations.extend(p.reservations),
            None => {
                unavailable_regions.insert(region.name.clone());
            }
        }
    }
    reservations.sort_by_key(|r: &Reservation| std::cmp::Reverse((r.created_at, r.id)));
    Ok(axum::Json(ReservationList {
        reservations,
        unavailable_regions: unavailable_regions.into_iter().collect(),
    })
    .into_response())
}

/// List reservations
///
/// The tenant's reservations in every region, newest first, deleted and
/// ended ones included. Regions that do not answer are named in
/// `unavailable_regions` rather than failing the call.
#[utoipa::path(
    get,
    path = "/v1/reservations",
    operation_id = "list_reservations",
    tag = "reservations",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The reservations.", body = ReservationList),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 429, response = openapi::RateLimited),
    )
)]
pub async fn list(
    State(state): State<GlobalState>,
    caller: TenantCaller,
) -> Result<Response, ApiError> {
    merged(&state, "/v1/reservations", Some(&caller.tenant)).await
}

/// Get a reservation
///
/// From the region that has it: its size, domain, window, state and the
/// GPUs its jobs hold now.
#[utoipa::path(
    get,
    path = "/v1/reservations/{id}",
    operation_id = "get_reservation",
    tag = "reservations",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The reservation's id.")),
    responses(
        (status = 200, description = "The reservation.", body = Reservation),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 404, response = openapi::ReservationNotFound),
        (status = 429, response = openapi::RateLimited),
        (status = 503, response = openapi::RegionUnavailable),
    )
)]
pub async fn get(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
) -> Result<Response, ApiError> {
    let (_, answer) = find(&state, &caller.tenant, id).await?;
    Ok(relay(answer))
}

/// The region that has `tenant`'s reservation `id`, with its answer to a GET.
async fn find<'a>(
    state: &'a GlobalState,
    tenant: &str,
    id: Uuid,
) -> Result<(&'a Region, crate::regions::Answer), ApiError> {
    let path = format!("/v1/reservations/{id}");
    ask_every_region(state, Method::GET, &path, Some(tenant), "reservation").await
}

/// Sends `method` with `key` and `body` to the region that has the
/// reservation.
async fn forward(
    state: &GlobalState,
    tenant: &str,
    id: Uuid,
    method: Method,
    key: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<Response, ApiError> {
    let (region, _) = find(state, tenant, id).await?;
    let answer = state
        .regions
        .call(
            region,
            method,
            &format!("/v1/reservations/{id}"),
            Call {
                tenant: Some(tenant),
                idempotency_key: key,
                body: body.map(Into::into),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}

/// Resize a reservation
///
/// A new `gpus`, a new `end` (`null`: open-ended), or both. The reservation
/// stays in the domain it is pinned to; growing there is admitted like a
/// create (409 `reservation_unavailable` with the earliest window that
/// would work), and it cannot shrink below what its running jobs hold.
#[utoipa::path(
    patch,
    path = "/v1/reservations/{id}",
    operation_id = "resize_reservation",
    tag = "reservations",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The reservation's id."),
        openapi::IdempotencyKey,
    ),
    request_body(content = ReservationResize, content_type = "application/json"),
    responses(
        (status = 200, description = "The reservation after the resize (or after the \
            earlier attempt with the same Idempotency-Key and body).", body = Reservation),
        (status = 400, description = openapi::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 404, response = openapi::ReservationNotFound),
        (status = 409, response = openapi::ReservationRefused),
        (status = 413, response = openapi::PayloadTooLarge),
        (status = 415, response = openapi::UnsupportedMediaType),
        (status = 422, description = openapi::errors(
            "The resize is invalid (nothing to change, a size out of range, an end not \
             after the start or now), or the Idempotency-Key was used before for another \
             request.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
        (status = 503, response = openapi::RegionUnavailable),
    )
)]
pub async fn resize(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let resize = reservation_resize(body)?;
    let body = serde_json::to_vec(&resize).expect("a ReservationResize serializes");
    let (tenant, key) = (&caller.tenant, key.as_deref());
    forward(&state, tenant, id, Method::PATCH, key, Some(body)).await
}

/// Delete a reservation
///
/// Its GPUs are no longer held; jobs running in it go on as ordinary work,
/// and its queued jobs wait (`reservation_unavailable`) until cancelled.
/// Deleting a deleted reservation answers 200 again.
#[utoipa::path(
    delete,
    path = "/v1/reservations/{id}",
    operation_id = "delete_reservation",
    tag = "reservations",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The reservation's id."),
        openapi::IdempotencyKey,
    ),
    responses(
        (status = 200, description = "The deleted reservation.", body = Reservation),
        (status = 400, description = openapi::errors(
            "The Idempotency-Key is malformed.", &[codes::INVALID_IDEMPOTENCY_KEY]),
            body = ErrorBody),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 404, response = openapi::ReservationNotFound),
        (status = 422, description = openapi::errors(
            "The Idempotency-Key was used before for another request.",
            &[codes::IDEMPOTENCY_KEY_REUSED]), body = ErrorBody),
        (status = 429, response = openapi::RateLimited),
        (status = 503, response = openapi::RegionUnavailable),
    )
)]
pub async fn delete(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    forward(
        &state,
        &caller.tenant,
        id,
        Method::DELETE,
        key.as_deref(),
        None,
    )
    .await
}

/// Every tenant's reservations
///
/// In every region, newest first; regions that do not answer are named in
/// `unavailable_regions`.
#[utoipa::path(
    get,
    path = "/v1/admin/reservations",
    operation_id = "admin_list_reservations",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The reservations.", body = ReservationList),
        (status = 401, response = openapi::Unauthenticated),
        (status = 403, response = openapi::Forbidden),
        (status = 429, response = openapi::RateLimited),
    )
)]
pub async fn list_all(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
) -> Result<Response, ApiError> {
    merged(&state, "/v1/admin/reservations", None).await
}
