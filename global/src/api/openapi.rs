//! The OpenAPI 3.1 document of the public API, served at
//! `GET /v1/openapi.json`.
//!
//! It is generated from the code: each handler's `#[utoipa::path]` says its
//! path, parameters, bodies and answers; the schemas come from the API types
//! themselves (`ToSchema`); the error codes from [`codes::ALL`] and from the
//! authenticator's [`AuthError`]. The route uses no caller extractor, so it
//! needs no token and is never rate-limited.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use gangway_shared::api::{
    AuditEntry, AuditList, Cluster, ClusterEvent, ClusterList, ClusterNode, ClusterResize,
    ClusterSpec, ClusterState, DrainMode, DrainRequest, Evacuation, EvacuationJob, EvacuationState,
    Fault, GoodputList, MaintenanceNode, MaintenancePlan, MaintenancePlanList, MaintenanceStart,
    NodeActionRequest, NodeEvent, NodeList, NodeView, SkippedNode, TenantGoodput,
};
use gangway_shared::api::{
    Explanation, GpuTypeCapacity, Job, JobEvent, JobEvents, JobList, JobMode, JobSpec, JobState,
    LimitsUpdate, PeerLease, Priority, QueueRow, QueueSummary, Quota, QuotaList, QuotaUpdate,
    RegionInfo, RegionList, RegionStatus, Reservation, ReservationList, ReservationResize,
    ReservationSpec, ReservationState, TenantLimits, TenantLimitsList, TopologyLevel, TopologySpec,
    Worker, WorkerState,
};
use gangway_shared::error::{codes, ErrorBody};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi};

use super::responses::*;
use super::{admin, clusters, evacuation, jobs, keys, logs, reservations};

pub use super::responses::auth_codes;

/// Name of the bearer-JWT security scheme; the handlers' `security(...)`
/// spell it as a literal (the macro takes no constant), and the tests check
/// they agree.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Gangway",
        description = "The public API of Gangway, a multi-region GPU cloud: submit jobs, \
            follow them, see regions' capacity, reserve capacity, run dedicated clusters; operators \
            set quotas and admission limits.\n\n\
            Every call except `/healthz` and `/v1/openapi.json` takes a bearer JWT \
            (`Authorization: Bearer <token>`). Every error is a JSON `ErrorBody` with a \
            stable `code`. Besides the answers each operation lists, any call may get \
            400 `bad_request` (refused before reaching the endpoint), 404 `not_found` \
            (no such endpoint), 405 `method_not_allowed`, 408 `timeout` (it took over \
            30 s) or 500 `internal`. Every response carries an `x-request-id` header."
    ),
    paths(
        jobs::create,
        jobs::dry_run,
        jobs::list,
        jobs::get,
        jobs::cancel,
        jobs::events,
        jobs::explain,
        logs::logs,
        jobs::regions,
        keys::create,
        keys::list,
        keys::revoke,
        keys::admin_create,
        keys::admin_list,
        keys::admin_revoke,
        admin::create_tenant,
        admin::list_tenants,
        admin::suspend_tenant,
        admin::resume_tenant,
        reservations::create,
        reservations::list,
        reservations::get,
        reservations::resize,
        reservations::delete,
        reservations::list_all,
        reservations::create_for,
        reservations::get_any,
        reservations::resize_any,
        reservations::delete_any,
        clusters::create,
        clusters::list,
        clusters::get,
        clusters::resize,
        clusters::delete,
        clusters::list_all,
        clusters::get_any,
        clusters::resize_any,
        clusters::delete_any,
        super::usage::usage,
        super::costs::costs,
        admin::list_quotas,
        admin::queue,
        admin::regions,
        admin::put_quota,
        admin::delete_quota,
        admin::list_limits,
        admin::put_limits,
        admin::delete_limits,
        admin::preempt_job,
        admin::list_nodes,
        admin::get_node,
        admin::cordon_node,
        admin::uncordon_node,
        admin::drain_node,
        admin::inject_fault,
        admin::admit_node,
        admin::release_node,
        admin::add_node,
        admin::agent_token,
        admin::audit_log,
        admin::start_maintenance,
        admin::list_maintenance,
        admin::get_maintenance,
        admin::cancel_maintenance,
        admin::goodput,
        admin::usage_records,
        admin::usage_credits,
        admin::usage_commitments,
        admin::usage_allocated,
        admin::usage_closings,
        evacuation::evacuate,
        evacuation::failback,
        evacuation::evacuation,
        super::healthz,
        serve,
    ),
    components(
        schemas(
            JobSpec,
            Job,
            Worker,
            JobEvent,
            JobEvents,
            JobList,
            gangway_shared::api::JobLogs,
            gangway_shared::api::JobLogChunk,
            gangway_shared::api::Costs,
            gangway_shared::api::CostDay,
            gangway_shared::api::CostSku,
            JobState,
            WorkerState,
            JobMode,
            Priority,
            TopologyLevel,
            TopologySpec,
            Explanation,
            RegionInfo,
            RegionList,
            RegionStatus,
            PeerLease,
            QueueSummary,
            QueueRow,
            GpuTypeCapacity,
            Quota,
            QuotaUpdate,
            QuotaList,
            TenantLimits,
            LimitsUpdate,
            TenantLimitsList,
            NodeView,
            NodeList,
            gangway_shared::api::UnknownNode,
            gangway_shared::api::InventoryEntry,
            super::admin::AgentToken,
            NodeEvent,
            DrainRequest,
            DrainMode,
            NodeActionRequest,
            Fault,
            AuditEntry,
            AuditList,
            MaintenanceStart,
            MaintenancePlan,
            MaintenanceNode,
            SkippedNode,
            MaintenancePlanList,
            GoodputList,
            TenantGoodput,
            ReservationSpec,
            ReservationResize,
            Reservation,
            ReservationList,
            ReservationState,
            ClusterSpec,
            ClusterResize,
            Cluster,
            ClusterList,
            ClusterState,
            ClusterNode,
            ClusterEvent,
            Evacuation,
            EvacuationJob,
            EvacuationState,
            gangway_shared::api::ApiKey,
            gangway_shared::api::ApiKeyCreate,
            gangway_shared::api::ApiKeyCreated,
            gangway_shared::api::ApiKeyList,
            gangway_shared::api::KeyScope,
            gangway_shared::api::TenantRecord,
            gangway_shared::api::TenantCreate,
            gangway_shared::api::TenantSuspend,
            gangway_shared::api::TenantChanged,
            gangway_shared::api::TenantList,
            gangway_shared::api::TenantState,
            ErrorBody,
        ),
        responses(
            Unauthenticated,
            Forbidden,
            RateLimited,
            CreateRefused,
            JobNotFound,
            ReservationNotFound,
            ReservationRefused,
            ClusterNotFound,
            ClusterRefused,
            RegionUnavailable,
            IdentityUnavailable,
            PayloadTooLarge,
            UnsupportedMediaType,
        )
    ),
    modifiers(&BearerScheme, &ErrorCodes, &RequestIds),
    tags(
        (name = "jobs", description = "A tenant's jobs, in whichever region runs them."),
        (name = "regions", description = "Regions, their health and their capacity."),
        (name = "reservations", description = "Capacity a tenant reserves ahead of time in \
            a region, and its jobs run in."),
        (name = "clusters", description = "Dedicated clusters: whole nodes of a region bound \
            to one tenant, inside one topology domain, that only its jobs naming them run on."),
        (name = "keys", description = "A tenant's API keys: made, listed and revoked by the \
            tenant itself."),
        (name = "admin", description = "Operator endpoints; they take an admin token."),
        (name = "meta", description = "Health and this document; no token needed."),
    )
)]
struct ApiDoc;

/// The document, as the route serves it.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// Built once: the document depends only on the code.
static JSON: LazyLock<String> = LazyLock::new(|| {
    document()
        .to_json()
        .expect("the OpenAPI document serializes")
});

/// This document: every endpoint, schema and error code of the public API.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document.",
         content_type = "application/json", body = Object),
    )
)]
pub async fn serve() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], JSON.as_str()).into_response()
}

/// Adds the bearer-JWT scheme that operations name in `security`.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "An ES256 JWT from the Gangway issuer, naming its signing key \
                         (`kid`), with audience, expiry, a role (`tenant` or `admin`) and, \
                         for tenants, a `tenant` claim.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Describes every stable error code on `ErrorBody.code`.
struct ErrorCodes;

impl Modify for ErrorCodes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let auth = auth_codes();
        let all: Vec<&str> = codes::ALL
            .iter()
            .copied()
            .chain(auth.iter().copied())
            .collect();
        let quoted = |list: &[&str]| {
            list.iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let description = format!(
            "A stable, machine-readable code: clients match on it, and a code never \
             changes meaning. Each operation's error answers say which codes they carry. \
             New codes may be added, so treat an unknown code by its HTTP status.\n\n\
             Codes: {}.\n\nWhy a token was refused (401): {}.",
            quoted(codes::ALL),
            quoted(&auth),
        );
        let code = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
            .examples(all)
            .build();
        let schema = openapi
            .components
            .as_mut()
            .and_then(|c| c.schemas.get_mut("ErrorBody"));
        if let Some(RefOr::T(Schema::Object(body))) = schema {
            body.properties.insert("code".into(), code.into());
        }
    }
}

/// Every answer carries the request's id.
struct RequestIds;

impl Modify for RequestIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let add = |response: &mut RefOr<utoipa::openapi::Response>| {
            if let RefOr::T(r) = response {
                r.headers.insert(
                    "x-request-id".into(),
                    string_header(
                        "The request's id (the caller's `x-request-id` if it sent one); \
                         logs name it too.",
                    )
                    .into(),
                );
            }
        };
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                op.responses.responses.values_mut().for_each(add);
            }
        }
        if let Some(components) = openapi.components.as_mut() {
            components.responses.values_mut().for_each(add);
        }
    }
}
