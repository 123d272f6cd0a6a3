//! The public API under `/v1`.
//!
//! # Layout
//! - `mod.rs`: [`app`], the router (its state is [`crate::state::GlobalState`]).
//! - `jobs.rs`: jobs (create with idempotency and routing, merged listing,
//!   forwarding to the owning region) and regions.
//! - `reservations.rs`: capacity reservations (creates routed to the
//!   region the body names, the rest to the region that has them, merged
//!   listing).
//! - `clusters.rs`: dedicated clusters, routed the same way, and their
//!   operator endpoints.
//! - `resources.rs`: that routing, shared by reservations and clusters.
//! - `admin/`: operator endpoints, a file per concern (quotas and limits,
//!   jobs, nodes and the inventory, audit, maintenance, usage).
//! - `evacuation.rs`: operators' evacuation and fail back of a region.
//! - `logs.rs`: a job's output, read from every region that ran an
//!   attempt and merged under one cursor (and followed).
//! - `costs.rs`: a tenant's costs of a month, priced as the billing
//!   export prices them.
//! - `keys.rs`: API keys, a tenant's own and operators' (`admin/tenants.rs`
//!   has the tenants' records).
//! - `relay.rs`: calling the regions for a caller — answers relayed as
//!   they are, the region that has a job or resource found, keyed creates'
//!   regions claimed.
//! - `openapi.rs`: the OpenAPI document; `responses.rs`, the answers
//!   many operations share (errors with their codes, the
//!   `Idempotency-Key` header), which handlers name.

mod admin;
mod clusters;
mod costs;
mod evacuation;
mod jobs;
mod keys;
mod logs;
pub mod openapi;
mod relay;
mod reservations;
mod resources;
pub mod responses;
mod usage;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::Router;

pub use crate::state::GlobalState;

/// Largest body a tenant may send.
const BODY_LIMIT: usize = 1024 * 1024;

/// The router, with every layer, for the server and for tests.
pub fn app(state: GlobalState) -> Router {
    let router = Router::new()
        .route("/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/jobs/dry-run", post(jobs::dry_run))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route("/v1/jobs/{id}/explain", get(jobs::explain))
        .route("/v1/jobs/{id}/logs", get(logs::logs))
        .route("/v1/regions", get(jobs::regions))
        .route("/v1/keys", post(keys::create).get(keys::list))
        .route("/v1/keys/{id}", axum::routing::delete(keys::revoke))
        .route(
            "/v1/admin/keys",
            post(keys::admin_create).get(keys::admin_list),
        )
        .route(
            "/v1/admin/keys/{id}",
            axum::routing::delete(keys::admin_revoke),
        )
        .route(
            "/v1/admin/tenants",
            post(admin::create_tenant).get(admin::list_tenants),
        )
        .route(
            "/v1/admin/tenants/{tenant}/suspend",
            post(admin::suspend_tenant),
        )
        .route(
            "/v1/admin/tenants/{tenant}/resume",
            post(admin::resume_tenant),
        )
        .route(
            "/v1/reservations",
            post(reservations::create).get(reservations::list),
        )
        .route(
            "/v1/reservations/{id}",
            get(reservations::get)
                .patch(reservations::resize)
                .delete(reservations::delete),
        )
        .route("/v1/admin/reservations", get(reservations::list_all))
        .route(
            "/v1/admin/reservations/{id}",
            get(reservations::get_any)
                .patch(reservations::resize_any)
                .delete(reservations::delete_any),
        )
        .route(
            "/v1/admin/tenants/{tenant}/reservations",
            post(reservations::create_for),
        )
        .route("/v1/clusters", post(clusters::create).get(clusters::list))
        .route(
            "/v1/clusters/{id}",
            get(clusters::get)
                .patch(clusters::resize)
                .delete(clusters::delete),
        )
        .route("/v1/admin/clusters", get(clusters::list_all))
        .route(
            "/v1/admin/clusters/{id}",
            get(clusters::get_any)
                .patch(clusters::resize_any)
                .delete(clusters::delete_any),
        )
        .route("/v1/usage", get(usage::usage))
        .route("/v1/costs", get(costs::costs))
        .route("/v1/admin/quotas", get(admin::list_quotas))
        .route("/v1/admin/queue", get(admin::queue))
        .route("/v1/admin/regions", get(admin::regions))
        .route("/v1/admin/limits", get(admin::list_limits))
        .route(
            "/v1/admin/limits/{tenant}",
            put(admin::put_limits).delete(admin::delete_limits),
        )
        .route("/v1/admin/jobs/{id}/preempt", post(admin::preempt_job))
        .route(
            "/v1/admin/quotas/{tenant}/{gpu_type}",
            put(admin::put_quota).delete(admin::delete_quota),
        )
        .route("/v1/admin/nodes", get(admin::list_nodes))
        .route("/v1/admin/nodes/{id}", get(admin::get_node))
        .route("/v1/admin/nodes/{id}/cordon", post(admin::cordon_node))
        .route("/v1/admin/nodes/{id}/uncordon", post(admin::uncordon_node))
        .route("/v1/admin/nodes/{id}/drain", post(admin::drain_node))
        .route("/v1/admin/nodes/{id}/faults", post(admin::inject_fault))
        .route("/v1/admin/nodes/{id}/admit", post(admin::admit_node))
        .route("/v1/admin/nodes/{id}/release", post(admin::release_node))
        .route("/v1/admin/inventory/{id}", put(admin::add_node))
        .route("/v1/admin/agents/{id}/token", post(admin::agent_token))
        .route("/v1/admin/audit", get(admin::audit_log))
        .route("/v1/admin/goodput", get(admin::goodput))
        .route("/v1/admin/usage/records", get(admin::usage_records))
        .route("/v1/admin/usage/credits", get(admin::usage_credits))
        .route("/v1/admin/usage/commitments", get(admin::usage_commitments))
        .route("/v1/admin/usage/allocated", get(admin::usage_allocated))
        .route("/v1/admin/usage/closings", get(admin::usage_closings))
        .route(
            "/v1/admin/regions/{name}/evacuate",
            post(evacuation::evacuate),
        )
        .route(
            "/v1/admin/regions/{name}/failback",
            post(evacuation::failback),
        )
        .route(
            "/v1/admin/regions/{name}/evacuation",
            get(evacuation::evacuation),
        )
        .route(
            "/v1/admin/maintenance",
            post(admin::start_maintenance).get(admin::list_maintenance),
        )
        .route("/v1/admin/maintenance/{id}", get(admin::get_maintenance))
        .route(
            "/v1/admin/maintenance/{id}/cancel",
            post(admin::cancel_maintenance),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .route("/healthz", get(healthz))
        .route("/v1/openapi.json", get(openapi::serve))
        .with_state(state.clone());
    // The console's pages call the API above in process, as the signed-in
    // person (crate::console).
    let console = crate::console::router(router.clone(), &state);
    gangway_shared::http::finish_router(router.merge(console))
}

/// Liveness: the process answers. Needs no token and is never rate-limited.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "meta",
    responses((status = 200, description = "The replica is up.", body = String,
               content_type = "text/plain", example = "ok"))
)]
async fn healthz() -> &'static str {
    "ok"
}
