//! The regional HTTP API: `/v1` for jobs (called by tenants' clients, later
//! through the global tier) and `/internal/v1` for node agents.
//!
//! # Layout
//! - `mod.rs`: [`app`], the router with its layers (its state is
//!   [`crate::state::AppState`]).
//! - `jobs.rs`, `agents.rs`, `admin.rs`, `usage.rs`: handlers.
//! - `reservations.rs`: capacity reservations (create, list, get,
//!   resize, delete; every tenant's for operators).
//! - `clusters.rs`: dedicated clusters (create, list, get, resize,
//!   delete; every tenant's for operators, whose changes are audited).
//! - `nodes.rs`: operators' node endpoints (list, get, cordon, uncordon,
//!   drain, injected faults, admit/add to the inventory, release).
//! - `peers.rs`: what regions ask each other (heartbeats, job intent,
//!   updates, moves).
//! - `evacuation.rs`: operators' evacuation and fail back of the region,
//!   and the handovers regions ask each other for.
//! - `shed.rs`: an overloaded region sheds submissions, dry runs and
//!   listings (503 `overloaded`, `Retry-After`) to keep agents and peers
//!   heard.
//! - `auth.rs`: only the global tier, peer regions and this region's agents
//!   get in.
//! - `extract.rs`: extractors whose rejections are our JSON errors.
//! - `validate.rs`: job spec validation against the fleet's shape.
//! - `error.rs`: [`ApiError`], the one mapping from internal errors.

mod admin;
mod agents;
mod auth;
mod billing;
mod clusters;
mod copies;
pub mod error;
mod evacuation;
mod extract;
mod identity;
mod jobs;
mod maintenance;
mod nodes;
mod peers;
mod reservations;
pub mod shed;
mod usage;
pub mod validate;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;

pub use crate::state::AppState;

/// Largest body a tenant may send.
const PUBLIC_BODY_LIMIT: usize = 1024 * 1024;
/// Largest body an agent may send (registering thousands of nodes).
const AGENT_BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The router, with every layer, for the server and for tests.
pub fn app(state: AppState) -> Router {
    let public = Router::new()
        .route("/v1/jobs", post(jobs::submit).get(jobs::list))
        .route("/v1/jobs/dry-run", post(jobs::dry_run))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route("/v1/jobs/{id}/explain", get(jobs::explain))
        .route("/v1/jobs/{id}/logs", get(jobs::logs))
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
        .route("/internal/v1/claims", post(jobs::claim))
        .route("/internal/v1/identity/{kind}", get(identity::list))
        .route(
            "/internal/v1/identity/{kind}/{id}",
            get(identity::get).put(identity::put),
        )
        .route(
            "/internal/v1/identity/{kind}/{id}/used",
            post(identity::used),
        )
        .route("/internal/v1/peers/heartbeat", post(peers::heartbeat))
        .route("/internal/v1/replicas/intents", post(peers::hold_intent))
        .route(
            "/internal/v1/replicas/intents/batch",
            post(peers::hold_intents),
        )
        .route("/internal/v1/replicas/updates", post(peers::updates))
        .route("/internal/v1/replicas/moves", post(peers::witness_move))
        .route("/internal/v1/replicas/moves/list", post(peers::moves))
        .route("/internal/v1/replicas/take", post(evacuation::take))
        .route("/internal/v1/replicas/handback", post(evacuation::handback))
        .route(
            "/internal/v1/evacuation/state",
            post(evacuation::peer_state),
        )
        .route("/v1/admin/region/evacuate", post(evacuation::evacuate))
        .route("/v1/admin/region/failback", post(evacuation::failback))
        .route("/v1/admin/region/evacuation", get(evacuation::status))
        .route("/v1/region", get(jobs::region))
        .route("/internal/v1/regions/status", post(jobs::region))
        .route("/v1/usage", get(usage::usage))
        .route("/v1/admin/quotas", get(admin::list_quotas))
        .route("/v1/admin/queue", get(admin::queue))
        .route("/v1/admin/jobs/{id}/preempt", post(admin::preempt_job))
        .route(
            "/v1/admin/quotas/{tenant}/{gpu_type}",
            axum::routing::put(admin::put_quota).delete(admin::delete_quota),
        )
        .route("/v1/admin/limits", get(admin::list_limits))
        .route(
            "/v1/admin/limits/{tenant}",
            axum::routing::put(admin::put_limits).delete(admin::delete_limits),
        )
        .route("/v1/admin/audit", get(admin::audit))
        .route("/v1/admin/goodput", get(admin::goodput))
        .route("/v1/admin/usage/records", get(billing::records))
        .route("/v1/admin/usage/credits", get(billing::credits))
        .route("/v1/admin/usage/commitments", get(billing::commitments))
        .route("/v1/admin/usage/allocated", get(billing::allocated))
        .route("/v1/admin/usage/closings", get(copies::closings))
        .route("/internal/v1/replicas/placements", post(copies::hold))
        .route(
            "/internal/v1/replicas/commitments",
            post(copies::hold_commitments),
        )
        .route("/internal/v1/replicas/usage", post(billing::hold))
        .route(
            "/internal/v1/replicas/usage/credits",
            post(billing::hold_credits),
        )
        .route("/v1/admin/nodes", get(nodes::list))
        .route("/v1/admin/nodes/{id}", get(nodes::get))
        .route("/v1/admin/nodes/{id}/cordon", post(nodes::cordon))
        .route("/v1/admin/nodes/{id}/uncordon", post(nodes::uncordon))
        .route("/v1/admin/nodes/{id}/drain", post(nodes::drain))
        .route("/v1/admin/nodes/{id}/faults", post(nodes::inject_fault))
        .route("/v1/admin/nodes/{id}/admit", post(nodes::admit))
        .route("/v1/admin/nodes/{id}/release", post(nodes::release))
        .route("/v1/admin/inventory/{id}", axum::routing::put(nodes::add))
        .route(
            "/v1/admin/maintenance",
            post(maintenance::start).get(maintenance::list),
        )
        .route("/v1/admin/maintenance/{id}", get(maintenance::get))
        .route(
            "/v1/admin/maintenance/{id}/cancel",
            post(maintenance::cancel),
        )
        .layer(DefaultBodyLimit::max(PUBLIC_BODY_LIMIT));
    let internal = Router::new()
        .route("/internal/v1/agents/register", post(agents::register))
        .route("/internal/v1/agents/{agent_id}/sync", post(agents::sync))
        .route(
            "/internal/v1/agents/{agent_id}/changes",
            post(agents::changes),
        )
        // Chunks of checkpoint files copied in by a home region.
        .route(
            "/internal/v1/replicas/checkpoints/file",
            post(peers::checkpoint_file),
        )
        .route(
            "/internal/v1/replicas/checkpoints/commit",
            post(peers::checkpoint_commit),
        )
        .layer(DefaultBodyLimit::max(AGENT_BODY_LIMIT));
    let router = Router::new()
        .merge(public)
        .merge(internal)
        // Shedding after authentication: a stranger's request is refused
        // without taking a turn.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            shed::admit,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_caller,
        ))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    gangway_shared::http::finish_router(router)
}
