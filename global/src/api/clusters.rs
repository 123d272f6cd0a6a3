//! Dedicated cluster endpoints: a create goes to the region its body names
//! (or the tenant's one region); the rest to the region that has the
//! cluster, found by asking every region at once, as for jobs; operators'
//! calls the same way, naming the operator to the region's audit log. The
//! routing, shared with capacity reservations, is [`super::resources`].
//! Regions' answers, refusals included (409 `cluster_unavailable` when no
//! domain has the free nodes, nothing bound), are passed on as they are.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, Utc};
use gangway_shared::api::{Cluster, ClusterList, ClusterResize, ClusterSpec};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{cluster_resize, cluster_spec, ApiError, ClusterId, Json};
use gangway_shared::ids::cluster_id_for_key;
use uuid::Uuid;

use super::resources::{self, Resource};
use super::responses;
use crate::auth::{AdminCaller, TenantCaller};
use crate::regions::Who;
use crate::state::GlobalState;

/// Dedicated clusters, as [`resources`] routes them.
pub(super) struct Clusters;

impl Resource for Clusters {
    const WHAT: &'static str = "cluster";
    const PATH: &'static str = "/v1/clusters";
    const ADMIN_PATH: &'static str = "/v1/admin/clusters";
    const INVALID: &'static str = codes::INVALID_CLUSTER;
    type Spec = ClusterSpec;
    type Resize = ClusterResize;
    type Item = Cluster;
    type List = ClusterList;

    fn spec(body: serde_json::Value) -> Result<ClusterSpec, ApiError> {
        cluster_spec(body)
    }
    fn resize(body: serde_json::Value) -> Result<ClusterResize, ApiError> {
        cluster_resize(body)
    }
    fn id_for_key(tenant: &str, key: &str) -> Uuid {
        cluster_id_for_key(tenant, key)
    }
    fn region(spec: &mut ClusterSpec) -> &mut Option<String> {
        &mut spec.region
    }
    fn created(c: &Cluster) -> (DateTime<Utc>, Uuid) {
        (c.created_at, c.id)
    }
    fn items(list: ClusterList) -> Vec<Cluster> {
        list.clusters
    }
    fn list(clusters: Vec<Cluster>, unavailable_regions: Vec<String>) -> ClusterList {
        ClusterList {
            clusters,
            unavailable_regions,
        }
    }
}

/// Create a dedicated cluster
///
/// Binds `nodes` whole nodes of a GPU type to the tenant, all inside one
/// domain of `level` (default `spine`), as tight as the region can make
/// them, in the region the body names (required when the tenant may use
/// more than one). All or nothing: with no domain holding that many free
/// nodes (none running work, spares excluded) it is refused with 409
/// `cluster_unavailable` and why, and nothing is bound. Only jobs naming
/// the cluster (`JobSpec.cluster`) run on its nodes. With an
/// `Idempotency-Key`, the same key and body give the same cluster however
/// often they are sent (a replay says `Idempotent-Replayed: true`).
#[utoipa::path(
    post,
    path = "/v1/clusters",
    operation_id = "create_cluster",
    tag = "clusters",
    security(("bearer" = [])),
    params(responses::IdempotencyKey),
    request_body(content = ClusterSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "The cluster, made now or by an earlier attempt with \
            the same Idempotency-Key and body (as it is now).", body = Cluster),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, response = responses::ClusterRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The request is invalid (the message says what to fix), names a region the \
             tenant may not use or none when it may use several, or the Idempotency-Key was \
             used before with another body or region.",
            &[codes::INVALID_SPEC, codes::INVALID_CLUSTER, codes::UNKNOWN_GPU_TYPE,
              codes::WRONG_REGION, codes::IDEMPOTENCY_KEY_REUSED]),
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
    resources::create::<Clusters>(&state, tenant, Who::Tenant(tenant), &headers, body).await
}

/// List dedicated clusters
///
/// The tenant's clusters in every region, newest first, deleted ones
/// included. Regions that do not answer are named in `unavailable_regions`
/// rather than failing the call.
#[utoipa::path(
    get,
    path = "/v1/clusters",
    operation_id = "list_clusters",
    tag = "clusters",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The clusters.", body = ClusterList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list(
    State(state): State<GlobalState>,
    caller: TenantCaller,
) -> Result<Response, ApiError> {
    resources::merged::<Clusters>(&state, Who::Tenant(&caller.tenant)).await
}

/// Get a dedicated cluster
///
/// From the region that has it: its state, domain, members (GPUs, GPUs in
/// use, whether each takes work now or is being given back) and its newest
/// events, oldest first.
#[utoipa::path(
    get,
    path = "/v1/clusters/{id}",
    operation_id = "get_cluster",
    tag = "clusters",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The cluster's id.")),
    responses(
        (status = 200, description = "The cluster, with its events.", body = Cluster),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ClusterId(id): ClusterId,
) -> Result<Response, ApiError> {
    resources::get::<Clusters>(&state, Who::Tenant(&caller.tenant), id).await
}

/// Resize a dedicated cluster
///
/// A new number of `nodes`, inside the cluster's domain. Growing binds free
/// nodes there at once, nearest its nodes first, all or none (409
/// `cluster_unavailable`); shrinking gives back idle nodes at once and busy
/// ones (state `resizing`) once their jobs are checkpointed and moved onto
/// the nodes that stay.
#[utoipa::path(
    patch,
    path = "/v1/clusters/{id}",
    operation_id = "resize_cluster",
    tag = "clusters",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The cluster's id."),
        responses::IdempotencyKey,
    ),
    request_body(content = ClusterResize, content_type = "application/json"),
    responses(
        (status = 200, description = "The cluster after the resize (or after the earlier \
            attempt with the same Idempotency-Key and body).", body = Cluster),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
        (status = 409, response = responses::ClusterRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The resize is invalid (a size out of range), or the Idempotency-Key was used \
             before for another request.",
            &[codes::INVALID_SPEC, codes::INVALID_CLUSTER, codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn resize(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let who = Who::Tenant(&caller.tenant);
    resources::resize::<Clusters>(&state, who, id, &headers, body).await
}

/// Delete a dedicated cluster
///
/// Its queued jobs are cancelled and its running ones asked to checkpoint
/// and stop; once nothing of its runs, its nodes go back to the region.
/// 202 while its jobs stop (state `deleting`: poll the cluster), 200 once it
/// is gone (state `deleted`), at once when nothing runs on it. Deleting a
/// deleted cluster answers 200 again.
#[utoipa::path(
    delete,
    path = "/v1/clusters/{id}",
    operation_id = "delete_cluster",
    tag = "clusters",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The cluster's id."),
        responses::IdempotencyKey,
    ),
    responses(
        (status = 200, description = "The deleted cluster: its nodes are back in the \
            region.", body = Cluster),
        (status = 202, description = "The cluster, `deleting`: its jobs are being stopped; \
            its nodes go back once they have.", body = Cluster),
        (status = 400, description = responses::errors(
            "The Idempotency-Key is malformed.", &[codes::INVALID_IDEMPOTENCY_KEY]),
            body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
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
    ClusterId(id): ClusterId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = Who::Tenant(&caller.tenant);
    resources::delete::<Clusters>(&state, who, id, &headers).await
}

/// Every tenant's dedicated clusters
///
/// In every region, newest first; regions that do not answer are named in
/// `unavailable_regions`.
#[utoipa::path(
    get,
    path = "/v1/admin/clusters",
    operation_id = "admin_list_clusters",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The clusters.", body = ClusterList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list_all(
    State(state): State<GlobalState>,
    admin: AdminCaller,
) -> Result<Response, ApiError> {
    resources::merged::<Clusters>(&state, Who::Operator(&admin.subject)).await
}

/// Get any tenant's dedicated cluster
///
/// From the region that has it, with its events.
#[utoipa::path(
    get,
    path = "/v1/admin/clusters/{id}",
    operation_id = "admin_get_cluster",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The cluster's id.")),
    responses(
        (status = 200, description = "The cluster, with its events.", body = Cluster),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get_any(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    ClusterId(id): ClusterId,
) -> Result<Response, ApiError> {
    resources::get::<Clusters>(&state, Who::Operator(&admin.subject), id).await
}

/// Resize any tenant's dedicated cluster
///
/// As the tenant's own resize; the region audits it under the operator's
/// name.
#[utoipa::path(
    patch,
    path = "/v1/admin/clusters/{id}",
    operation_id = "admin_resize_cluster",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The cluster's id."),
        responses::IdempotencyKey,
    ),
    request_body(content = ClusterResize, content_type = "application/json"),
    responses(
        (status = 200, description = "The cluster after the resize.", body = Cluster),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
        (status = 409, response = responses::ClusterRefused),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The resize is invalid, or the Idempotency-Key was used before for another \
             request.",
            &[codes::INVALID_SPEC, codes::INVALID_CLUSTER, codes::IDEMPOTENCY_KEY_REUSED]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn resize_any(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    ClusterId(id): ClusterId,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let who = Who::Operator(&admin.subject);
    resources::resize::<Clusters>(&state, who, id, &headers, body).await
}

/// Delete any tenant's dedicated cluster
///
/// As the tenant's own delete (202 while its jobs stop, 200 once gone);
/// the region audits it under the operator's name.
#[utoipa::path(
    delete,
    path = "/v1/admin/clusters/{id}",
    operation_id = "admin_delete_cluster",
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "The cluster's id."),
        responses::IdempotencyKey,
    ),
    responses(
        (status = 200, description = "The deleted cluster.", body = Cluster),
        (status = 202, description = "The cluster, `deleting`: its jobs are being \
            stopped.", body = Cluster),
        (status = 400, description = responses::errors(
            "The Idempotency-Key is malformed.", &[codes::INVALID_IDEMPOTENCY_KEY]),
            body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::ClusterNotFound),
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
    ClusterId(id): ClusterId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let who = Who::Operator(&admin.subject);
    resources::delete::<Clusters>(&state, who, id, &headers).await
}
