//! Capacity reservation endpoints under `/v1/reservations` (a tenant's
//! own) and `/v1/admin/reservations` (every tenant's, for operators).
//!
//! Operators may also create, resize and delete any tenant's
//! (`/v1/admin/tenants/{tenant}/reservations`, `/v1/admin/reservations/{id}`),
//! audited as `reservation.create` / `.resize` / `.delete`.
//!
//! A reservation that cannot be honoured is 409 `reservation_unavailable`
//! with why, and the earliest window that would work in the error body's
//! `earliest_start` / `earliest_end`. Create, resize and delete take an
//! `Idempotency-Key`; a retry with the same key and body is answered with
//! the reservation as it is now (`Idempotent-Replayed: true`) and does
//! nothing again. Deleting a deleted reservation answers 200 again.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_shared::api::{Reservation, ReservationList};
use gangway_shared::error::codes;
use gangway_shared::http::{
    idempotency_key, reservation_resize, reservation_spec, Path, ReservationId,
};
use gangway_shared::ids::reservation_id_for_key;
use tracing::instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Json, Tenant};
use super::AppState;
use crate::store::{NewReservation, ReservationOutcome, StoreError, Who};

/// The store's answer as the API gives it: reservations are what is not
/// found, and a reused key is about reservation requests.
fn refused(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("reservation"),
        StoreError::KeyReused => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this Idempotency-Key was already used for another reservation request (another \
             body, operation or reservation); use a new key for a new request",
        ),
        e => e.into(),
    }
}

/// `op`'s outcome, counted, as a response with `status`.
fn answer(op: &'static str, status: StatusCode, outcome: ReservationOutcome) -> Response {
    let (r, replayed) = match outcome {
        ReservationOutcome::Done(r) => (r, false),
        ReservationOutcome::Replayed(r) => (r, true),
    };
    let outcome = if replayed { "replayed" } else { "done" };
    metrics::counter!("gangway_reservation_requests_total", "op" => op, "outcome" => outcome)
        .increment(1);
    let mut resp = (status, axum::Json(r)).into_response();
    if replayed {
        resp.headers_mut().insert(
            "idempotent-replayed",
            "true".parse().expect("static header"),
        );
    }
    resp
}

fn count_refusal(op: &'static str, e: &StoreError) {
    if matches!(e, StoreError::ReservationRefused { .. }) {
        metrics::counter!("gangway_reservation_requests_total", "op" => op, "outcome" => "refused")
            .increment(1);
    }
}

/// `POST /v1/reservations`: admits a reservation, or refuses it with the
/// earliest window that would work.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    do_create(&state, &tenant, Who::Tenant(&tenant), &headers, body).await
}

/// `POST /v1/admin/tenants/{tenant}/reservations`: an operator reserves on
/// a tenant's behalf (audited).
pub async fn create_for(
    State(state): State<AppState>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    super::admin::check_tenant(&tenant)?;
    let actor = super::nodes::actor(&headers);
    do_create(&state, &tenant, Who::Operator(&actor), &headers, body).await
}

async fn do_create(
    state: &AppState,
    tenant: &str,
    who: Who<'_>,
    headers: &HeaderMap,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let spec = reservation_spec(body)?;
    if let Some(pinned) = spec.region.as_deref() {
        if pinned != state.store.region() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!(
                    "the reservation names region {pinned:?}, but this is {:?}",
                    state.store.region()
                ),
            ));
        }
    }
    let id = match &key {
        Some(k) => reservation_id_for_key(tenant, k),
        None => Uuid::new_v4(),
    };
    let new = NewReservation {
        id,
        tenant: tenant.to_string(),
        idempotency_key: key,
        spec,
    };
    let outcome = (state.store.create_reservation(&new, who).await)
        .inspect_err(|e| count_refusal("create", e))
        .map_err(refused)?;
    if matches!(outcome, ReservationOutcome::Done(_)) {
        state.wake_scheduler();
    }
    Ok(answer("create", StatusCode::CREATED, outcome))
}

/// `GET /v1/reservations`: the tenant's, newest first.
pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<axum::Json<ReservationList>, ApiError> {
    listed(&state, Some(&tenant)).await
}

async fn listed(
    state: &AppState,
    tenant: Option<&str>,
) -> Result<axum::Json<ReservationList>, ApiError> {
    let reservations = (state.store.list_reservations(tenant).await).map_err(refused)?;
    Ok(axum::Json(ReservationList {
        reservations,
        unavailable_regions: Vec::new(),
    }))
}

/// `GET /v1/reservations/{id}`: another tenant's is 404.
pub async fn get(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ReservationId(id): ReservationId,
) -> Result<axum::Json<Reservation>, ApiError> {
    let r = (state.store.get_reservation(Some(&tenant), id).await).map_err(refused)?;
    Ok(axum::Json(r))
}

/// `PATCH /v1/reservations/{id}`: a new size and/or end, in its domain.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn resize(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    do_resize(&state, Who::Tenant(&tenant), id, &headers, body).await
}

async fn do_resize(
    state: &AppState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let resize = reservation_resize(body)?;
    let outcome = (state.store)
        .resize_reservation(who, id, key.as_deref(), &resize)
        .await
        .inspect_err(|e| count_refusal("resize", e))
        .map_err(refused)?;
    if matches!(outcome, ReservationOutcome::Done(_)) {
        state.wake_scheduler();
    }
    Ok(answer("resize", StatusCode::OK, outcome))
}

/// `DELETE /v1/reservations/{id}`: 200 with the deleted reservation, every
/// time.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn delete(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    do_delete(&state, Who::Tenant(&tenant), id, &headers).await
}

async fn do_delete(
    state: &AppState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let outcome = (state
        .store
        .delete_reservation(who, id, key.as_deref())
        .await)
        .map_err(refused)?;
    state.wake_scheduler();
    Ok(answer("delete", StatusCode::OK, outcome))
}

/// `GET /v1/admin/reservations`: every tenant's (operators).
pub async fn list_all(
    State(state): State<AppState>,
) -> Result<axum::Json<ReservationList>, ApiError> {
    listed(&state, None).await
}

/// `GET /v1/admin/reservations/{id}`: any tenant's (operators).
pub async fn get_any(
    State(state): State<AppState>,
    ReservationId(id): ReservationId,
) -> Result<axum::Json<Reservation>, ApiError> {
    let r = (state.store.get_reservation(None, id).await).map_err(refused)?;
    Ok(axum::Json(r))
}

/// `PATCH /v1/admin/reservations/{id}`: an operator resizes a tenant's
/// (audited).
pub async fn resize_any(
    State(state): State<AppState>,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let actor = super::nodes::actor(&headers);
    do_resize(&state, Who::Operator(&actor), id, &headers, body).await
}

/// `DELETE /v1/admin/reservations/{id}`: an operator deletes a tenant's
/// (audited).
pub async fn delete_any(
    State(state): State<AppState>,
    ReservationId(id): ReservationId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let actor = super::nodes::actor(&headers);
    do_delete(&state, Who::Operator(&actor), id, &headers).await
}
