//! Dedicated cluster endpoints under `/v1/clusters` (a tenant's own) and
//! `/v1/admin/clusters` (every tenant's, for operators).
//!
//! A cluster that cannot be made (or grown) now is 409
//! `cluster_unavailable` with why, and nothing is bound. Create, resize
//! and delete take an `Idempotency-Key`; a retry with the same key and body
//! is answered with the cluster as it is now (`Idempotent-Replayed: true`)
//! and does nothing again. A delete answers 202 while the cluster's jobs
//! are being stopped (state `deleting`) and 200 once it is gone.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_shared::api::{Cluster, ClusterList, ClusterState};
use gangway_shared::error::codes;
use gangway_shared::http::{cluster_resize, cluster_spec, idempotency_key, ClusterId};
use gangway_shared::ids::cluster_id_for_key;
use tracing::instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Json, Tenant};
use super::AppState;
use crate::store::{retry_races, ClusterOutcome, NewCluster, StoreError, Who};

/// The store's answer as the API gives it: clusters are what is not found,
/// and a reused key is about cluster requests.
fn refused(e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound => ApiError::not_found("cluster"),
        StoreError::KeyReused => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::IDEMPOTENCY_KEY_REUSED,
            "this Idempotency-Key was already used for another cluster request (another body, \
             operation or cluster); use a new key for a new request",
        ),
        e => {
            if let StoreError::Conflict { code, .. } = &e {
                metrics::counter!("gangway_cluster_refusals_total", "code" => *code).increment(1);
            }
            e.into()
        }
    }
}

/// An outcome as a response with `status` (a delete still under way: 202).
fn answer(state: &AppState, status: StatusCode, outcome: ClusterOutcome) -> Response {
    let (c, replayed) = match outcome {
        ClusterOutcome::Done(c) => (c, false),
        ClusterOutcome::Replayed(c) => (c, true),
    };
    if !replayed {
        state.wake_scheduler();
    }
    let status = if c.state == ClusterState::Deleting {
        StatusCode::ACCEPTED
    } else {
        status
    };
    let mut resp = (status, axum::Json(c)).into_response();
    if replayed {
        resp.headers_mut().insert(
            "idempotent-replayed",
            "true".parse().expect("static header"),
        );
    }
    resp
}

/// `POST /v1/clusters`: binds the cluster's nodes, all or none.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn create(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let spec = cluster_spec(body)?;
    if let Some(pinned) = spec.region.as_deref() {
        if pinned != state.store.region() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!(
                    "the cluster names region {pinned:?}, but this is {:?}",
                    state.store.region()
                ),
            ));
        }
    }
    let id = match &key {
        Some(k) => cluster_id_for_key(&tenant, k),
        None => Uuid::new_v4(),
    };
    let new = NewCluster {
        id,
        tenant,
        idempotency_key: key,
        spec,
        agent_timeout: state.config.agent_timeout,
    };
    // A lost race with the health path's healing is tried again.
    let outcome = (retry_races(|| state.store.create_cluster(&new)).await).map_err(refused)?;
    Ok(answer(&state, StatusCode::CREATED, outcome))
}

/// `GET /v1/clusters`: the tenant's, newest first.
pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<axum::Json<ClusterList>, ApiError> {
    let clusters = (state.store.list_clusters(Some(&tenant)).await).map_err(refused)?;
    Ok(axum::Json(ClusterList {
        clusters,
        unavailable_regions: Vec::new(),
    }))
}

/// `GET /v1/clusters/{id}`, with its newest events; another tenant's is 404.
pub async fn get(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ClusterId(id): ClusterId,
) -> Result<axum::Json<Cluster>, ApiError> {
    Ok(axum::Json(
        (state.store.get_cluster(Some(&tenant), id).await).map_err(refused)?,
    ))
}

async fn do_resize(
    state: &AppState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
    body: serde_json::Value,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let resize = cluster_resize(body)?;
    let timeout = state.config.agent_timeout;
    let outcome =
        retry_races(|| (state.store).resize_cluster(who, id, key.as_deref(), &resize, timeout))
            .await
            .map_err(refused)?;
    Ok(answer(state, StatusCode::OK, outcome))
}

async fn do_delete(
    state: &AppState,
    who: Who<'_>,
    id: Uuid,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let key = idempotency_key(headers)?;
    let outcome = (retry_races(|| state.store.delete_cluster(who, id, key.as_deref())).await)
        .map_err(refused)?;
    Ok(answer(state, StatusCode::OK, outcome))
}

/// `PATCH /v1/clusters/{id}`: a new number of nodes, inside its domain.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn resize(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    do_resize(&state, Who::Tenant(&tenant), id, &headers, body).await
}

/// `DELETE /v1/clusters/{id}`: 202 while its jobs stop, 200 once gone.
#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn delete(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    do_delete(&state, Who::Tenant(&tenant), id, &headers).await
}

/// `GET /v1/admin/clusters`: every tenant's (operators).
pub async fn list_all(State(state): State<AppState>) -> Result<axum::Json<ClusterList>, ApiError> {
    let clusters = (state.store.list_clusters(None).await).map_err(refused)?;
    Ok(axum::Json(ClusterList {
        clusters,
        unavailable_regions: Vec::new(),
    }))
}

/// `GET /v1/admin/clusters/{id}`: any tenant's (operators).
pub async fn get_any(
    State(state): State<AppState>,
    ClusterId(id): ClusterId,
) -> Result<axum::Json<Cluster>, ApiError> {
    Ok(axum::Json(
        (state.store.get_cluster(None, id).await).map_err(refused)?,
    ))
}

/// `PATCH /v1/admin/clusters/{id}`: an operator resizes a tenant's
/// (audited).
pub async fn resize_any(
    State(state): State<AppState>,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let actor = super::nodes::actor(&headers);
    do_resize(&state, Who::Operator(&actor), id, &headers, body).await
}

/// `DELETE /v1/admin/clusters/{id}`: an operator deletes a tenant's
/// (audited).
pub async fn delete_any(
    State(state): State<AppState>,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let actor = super::nodes::actor(&headers);
    do_delete(&state, Who::Operator(&actor), id, &headers).await
}
