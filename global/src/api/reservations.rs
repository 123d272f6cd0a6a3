//! Capacity reservation endpoints: a create goes to the region its body
//! names (or the tenant's one region); the rest to the region that has the
//! reservation, found by asking every region at once, as for jobs (the
//! routing, shared with dedicated clusters, is [`super::resources`]).
//! Regions' answers, refusals included (409 `reservation_unavailable` with
//! `earliest_start` / `earliest_end`), are passed on as they are.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use gangway_shared::api::{Reservation, ReservationList, ReservationResize, ReservationSpec};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{
    reservation_resize, reservation_spec, ApiError, Json, Path, ReservationId,
};
use gangway_shared::ids::{reservation_id_for_key, valid_tenant};
use uuid::Uuid;

use super::resources::{self, Resource};
use super::responses;
use crate::auth::{AdminCaller, TenantCaller};
use crate::regions::Who;
use crate::state::GlobalState;

/// Capacity reservations, as [`resources`] routes them.
pub(super) struct Reservations;

impl Resource for Reservations {
    const WHAT: &'static str = "reservation";
    const PATH: &'static str = "/v1/reservations";
    const ADMIN_PATH: &'static str = "/v1/admin/reservations";
    const INVALID: &'static str = codes::INVALID_RESERVATION;
    type Spec = ReservationSpec;
    type Resize = ReservationResize;
    type Item = Reservation;
    type List = ReservationList;

    fn spec(body: serde_json::Value) -> Result<ReservationSpec, ApiError> {
        reservation_spec(body)
    }
    fn resize(body: serde_json::Value) -> Result<ReservationResize, ApiError> {
        reservation_resize(body)
    }
    fn id_for_key(tenant: &str, key: &str) -> Uuid {
        reservation_id_for_key(tenant, key)
    }
    fn region(spec: &mut ReservationSpec) -> &mut Option<String> {
        &mut spec.region
    }
    fn created(r: &Reservation) -> (DateTime<Utc>, Uuid) {
        (r.created_at, r.id)
    }
    fn items(list: ReservationList) -> Vec<Reservation> {
        list.reservations
    }
    fn list(reservations: Vec<Reservation>, unavailable_regions: Vec<String>) -> ReservationList {
        ReservationList {
            reservations,
            unavailable_regions,
        }
    }
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
    params(responses::IdempotencyKey),
    request_body(content = ReservationSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "The reservation, admitted now or by an earlier \
            attempt with the same Idempotency-Key and body.", body = Reservation),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, response = responses::ReservationRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The request is invalid (the message says what to fix), names a region the \
             tenant may not use or none when it may use several, or the Idempotency-Key was \
             used before with another body or region.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::UNKNOWN_GPU_TYPE, codes::WRONG_REGION, codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
#[tracing::instrument(skip_all, fields(tenant = %caller.tenant))]
pub async fn create(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let tenant = &caller.tenant;
    resources::create::<Reservations>(&state, tenant, Who::Tenant(tenant), &headers, body).await
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
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list(
    State(state): State<GlobalState>,
    caller: TenantCaller,
) -> Result<Response, ApiError> {
    resources::merged::<Reservations>(&state, Who::Tenant(&caller.tenant)).await
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
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
) -> Result<Response, ApiError> {
    resources::get::<Reservations>(&state, Who::Tenant(&caller.tenant), id).await
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
        responses::IdempotencyKey,
    ),
    request_body(content = ReservationResize, content_type = "application/json"),
    responses(
        (status = 200, description = "The reservation after the resize (or after the \
            earlier attempt with the same Idempotency-Key and body).", body = Reservation),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 409, response = responses::ReservationRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The resize is invalid (nothing to change, a size out of range, an end not \
             after the start or now), or the Idempotency-Key was used before for another \
             request.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn resize(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let who = Who::Tenant(&caller.tenant);
    resources::resize::<Reservations>(&state, who, id, &headers, body).await
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
        responses::IdempotencyKey,
    ),
    responses(
        (status = 200, description = "The deleted reservation.", body = Reservation),
        (status = 400, description = responses::errors(
            "The Idempotency-Key is malformed.", &[codes::INVALID_IDEMPOTENCY_KEY]),
            body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 422, description = responses::errors(
            "The Idempotency-Key was used before for another request.",
            &[codes::IDEMPOTENCY_KEY_REUSED]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn delete(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = Who::Tenant(&caller.tenant);
    resources::delete::<Reservations>(&state, who, id, &headers).await
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
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list_all(
    State(state): State<GlobalState>,
    admin: AdminCaller,
) -> Result<Response, ApiError> {
    resources::merged::<Reservations>(&state, Who::Operator(&admin.subject)).await
}

/// Reserve capacity for a tenant
///
/// An operator's create on a tenant's behalf, as the tenant's own (the
/// same body, keys, region choice and refusals); the region audits it as
/// `reservation.create` under the operator's name.
#[utoipa::path(
    post,
    path = "/v1/admin/tenants/{tenant}/reservations",
    operation_id = "admin_create_reservation",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("tenant" = String, Path, description = "The tenant the reservation is for."),
        responses::IdempotencyKey,
    ),
    request_body(content = ReservationSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "The tenant's reservation, admitted now or by an \
            earlier attempt with the same Idempotency-Key and body.", body = Reservation),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, response = responses::ReservationRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The tenant's name or the request is invalid, names a region the tenant may \
             not use or none when it may use several, or the Idempotency-Key was used before \
             with another body or region.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::UNKNOWN_GPU_TYPE, codes::WRONG_REGION, codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn create_for(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    if !valid_tenant(&tenant) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a tenant is a lowercase name of a-z, 0-9 and '-' (1–63 characters)",
        ));
    }
    let by = Who::Operator(&admin.subject);
    resources::create::<Reservations>(&state, &tenant, by, &headers, body).await
}

/// Get any tenant's reservation
#[utoipa::path(
    get,
    path = "/v1/admin/reservations/{id}",
    operation_id = "admin_get_reservation",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The reservation's id.")),
    responses(
        (status = 200, description = "The reservation.", body = Reservation),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get_any(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    ReservationId(id): ReservationId,
) -> Result<Response, ApiError> {
    resources::get::<Reservations>(&state, Who::Operator(&admin.subject), id).await
}

/// Resize any tenant's reservation
///
/// As the tenant's own resize; the region audits it under the operator's
/// name.
#[utoipa::path(
    patch,
    path = "/v1/admin/reservations/{id}",
    operation_id = "admin_resize_reservation",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The reservation's id."),
        responses::IdempotencyKey,
    ),
    request_body(content = ReservationResize, content_type = "application/json"),
    responses(
        (status = 200, description = "The reservation after the resize.", body = Reservation),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 409, response = responses::ReservationRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The resize is invalid, or the Idempotency-Key was used before for another \
             request.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_RESERVATION,
              codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn resize_any(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let who = Who::Operator(&admin.subject);
    resources::resize::<Reservations>(&state, who, id, &headers, body).await
}

/// Delete any tenant's reservation
///
/// As the tenant's own delete; the region audits it under the operator's
/// name.
#[utoipa::path(
    delete,
    path = "/v1/admin/reservations/{id}",
    operation_id = "admin_delete_reservation",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The reservation's id."),
        responses::IdempotencyKey,
    ),
    responses(
        (status = 200, description = "The deleted reservation.", body = Reservation),
        (status = 400, description = responses::errors(
            "The Idempotency-Key is malformed.", &[codes::INVALID_IDEMPOTENCY_KEY]),
            body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ReservationNotFound),
        (status = 422, description = responses::errors(
            "The Idempotency-Key was used before for another request.",
            &[codes::IDEMPOTENCY_KEY_REUSED]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn delete_any(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = Who::Operator(&admin.subject);
    resources::delete::<Reservations>(&state, who, id, &headers).await
}
