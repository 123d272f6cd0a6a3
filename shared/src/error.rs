//! The one error body every Gangway API returns, and its stable codes.
//!
//! A `code` never changes meaning once shipped; clients match on it. The
//! `message` is for people and may be reworded.

use serde::{Deserialize, Serialize};

/// An error answer: a stable `code` for programs, a `message` for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code (see [`codes`]).
    pub code: String,
    /// What went wrong and what to do about it, for people; may be reworded.
    pub message: String,
    /// The request's id, when known (every response also carries it in the
    /// `x-request-id` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Only with `reservation_unavailable`: the start of the earliest
    /// window of the same length (open-ended if the request was) that the
    /// region could promise; absent when none could be found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_start: Option<chrono::DateTime<chrono::Utc>>,
    /// Only with `reservation_unavailable` and `earliest_start`: that
    /// window's end; absent for an open-ended window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_end: Option<chrono::DateTime<chrono::Utc>>,
}

/// Stable machine-readable error codes.
pub mod codes {
    /// The body is not valid JSON (400).
    pub const MALFORMED_JSON: &str = "malformed_json";
    /// The body is JSON but not a valid document for this endpoint: a
    /// missing or unknown field, a wrong type (422).
    pub const INVALID_SPEC: &str = "invalid_spec";
    /// `gpus` or `gpus_per_worker` is zero, negative, absurd, or does not
    /// divide (422).
    pub const INVALID_GPUS: &str = "invalid_gpus";
    /// `min_gpus` of an elastic job is not a multiple of `gpus_per_worker`
    /// between `gpus_per_worker` and `gpus`, or is set on an array job (422).
    pub const INVALID_MIN_GPUS: &str = "invalid_min_gpus";
    /// No node of this region has GPUs of that type (422).
    pub const UNKNOWN_GPU_TYPE: &str = "unknown_gpu_type";
    /// The job is larger than the region could ever hold (422).
    pub const EXCEEDS_REGION_CAPACITY: &str = "exceeds_region_capacity";
    /// No domain at the required topology level could ever hold the gang (422).
    pub const UNSATISFIABLE_TOPOLOGY: &str = "unsatisfiable_topology";
    /// The request is malformed in a way no more specific code covers (400).
    pub const BAD_REQUEST: &str = "bad_request";
    /// A query parameter is malformed (400).
    pub const INVALID_QUERY: &str = "invalid_query";
    /// The tenant header is missing or malformed (400).
    pub const INVALID_TENANT: &str = "invalid_tenant";
    /// The `Idempotency-Key` header is malformed (400).
    pub const INVALID_IDEMPOTENCY_KEY: &str = "invalid_idempotency_key";
    /// The key was used before with a different body (422).
    pub const IDEMPOTENCY_KEY_REUSED: &str = "idempotency_key_reused";
    /// A request with the same idempotency key is still being processed;
    /// retry shortly to get its result (409).
    pub const IDEMPOTENCY_REQUEST_IN_FLIGHT: &str = "idempotency_request_in_flight";
    /// The job is pinned to another region than the one asked (422).
    pub const WRONG_REGION: &str = "wrong_region";
    /// No region that the tenant may use can take the request now (503).
    pub const NO_REGION_AVAILABLE: &str = "no_region_available";
    /// A region did not answer in time or at all (502/503).
    pub const REGION_UNAVAILABLE: &str = "region_unavailable";
    /// Too many requests from this tenant; see Retry-After (429).
    pub const RATE_LIMITED: &str = "rate_limited";
    /// The token is valid but its role may not do this (403).
    pub const FORBIDDEN: &str = "forbidden";
    /// The request has no valid credentials (401); the detail code (for
    /// example `token_expired`) comes from the authenticator.
    pub const UNAUTHENTICATED: &str = "unauthenticated";
    /// A quota's terms do not hold together: a cap below the guarantee, or
    /// a weight out of range (422).
    pub const INVALID_QUOTA: &str = "invalid_quota";
    /// A tenant's admission limits are out of range, or name no limit at
    /// all (422).
    pub const INVALID_LIMITS: &str = "invalid_limits";
    /// The tenant already has as many queued jobs in the region as its
    /// limit allows; nothing was created. Retry once some start or finish,
    /// cancel some, or ask an operator to raise the limit (429).
    pub const QUEUED_JOBS_LIMIT: &str = "queued_jobs_limit";
    /// The job's GPUs and those of the tenant's unfinished jobs in the
    /// region would be more than its limit allows; nothing was created.
    /// Retry once jobs finish, cancel some, ask for fewer GPUs, or ask an
    /// operator to raise the limit (429).
    pub const REQUESTED_GPUS_LIMIT: &str = "requested_gpus_limit";
    /// The job is not running, so it cannot be preempted (409).
    pub const JOB_NOT_RUNNING: &str = "job_not_running";
    /// The requested thing does not exist, or belongs to someone else (404).
    pub const NOT_FOUND: &str = "not_found";
    /// The body is larger than the limit (413).
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// The body's content type is not `application/json` (415).
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    /// An agent that the region does not know (re-register) (404).
    pub const UNKNOWN_AGENT: &str = "unknown_agent";
    /// An agent reported from an old boot (409).
    pub const STALE_BOOT: &str = "stale_boot";
    /// A machine the region's inventory does not have tried to register;
    /// it is listed as `unknown` until an operator admits it (403).
    pub const UNKNOWN_NODE: &str = "unknown_node";
    /// Another agent holds the node and is alive: no silent takeover (409).
    pub const NODE_CLAIMED: &str = "node_claimed";
    /// The agent's credentials do not cover this agent or node: its token
    /// names another agent, or the inventory binds the node to another
    /// agent (403).
    pub const WRONG_AGENT: &str = "wrong_agent";
    /// A machine reports other GPUs than the inventory says it has (422).
    pub const NODE_MISMATCH: &str = "node_mismatch";
    /// An inventory entry (`gangway admin node add` / `admit`) is invalid
    /// (422).
    pub const INVALID_NODE: &str = "invalid_node";
    /// The database is unreachable or overloaded; retry later (503).
    pub const UNAVAILABLE: &str = "unavailable";
    /// The region is overloaded and sheds this request (a submission, a
    /// dry run, a listing) to keep its agents and peers heard; retry after
    /// the `Retry-After` header's seconds (503).
    pub const OVERLOADED: &str = "overloaded";
    /// The endpoint exists but not with this method (405).
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    /// The request took longer than the server allows (408).
    pub const TIMEOUT: &str = "timeout";
    /// A bug on our side (500). Never returned for bad input.
    pub const INTERNAL: &str = "internal";
    /// A drain's deadline or reason is out of range (422).
    pub const INVALID_DRAIN: &str = "invalid_drain";
    /// An injected fault names a GPU the node does not have, or a value out
    /// of range (422).
    pub const INVALID_FAULT: &str = "invalid_fault";
    /// The node's operator state does not allow this action now, for
    /// example uncordoning a node a maintenance plan holds (409).
    pub const NODE_STATE_CONFLICT: &str = "node_state_conflict";
    /// Faults can be injected only into nodes of simulated agents (409).
    pub const NODE_NOT_SIMULATED: &str = "node_not_simulated";
    /// A maintenance plan names no targets, an unknown node, or limits out
    /// of range (422).
    pub const INVALID_MAINTENANCE: &str = "invalid_maintenance";
    /// Another maintenance plan is running in the region, or the plan is
    /// no longer running (409).
    pub const MAINTENANCE_CONFLICT: &str = "maintenance_conflict";
    /// A capacity reservation cannot be honoured as asked (no domain of the
    /// level keeps that many GPUs unreserved for the whole window); nothing
    /// was created or changed. The body's `earliest_start` / `earliest_end`
    /// give the earliest window of the same length that would work, when
    /// there is one (409).
    pub const RESERVATION_UNAVAILABLE: &str = "reservation_unavailable";
    /// A reservation request is out of range (an end not after its start
    /// or now), or a job names a reservation it cannot run in: another
    /// tenant's or none, another GPU type's, deleted or over, or smaller
    /// than the job (422).
    pub const INVALID_RESERVATION: &str = "invalid_reservation";
    /// The reservation's state does not allow the change: it is deleted or
    /// over, or the new size is below what its running jobs hold (409).
    pub const RESERVATION_CONFLICT: &str = "reservation_conflict";
    /// A dedicated cluster cannot be created or grown as asked: no domain
    /// of the level has that many free whole nodes of the type (or taking
    /// them would break a capacity reservation's promise); nothing was
    /// bound (409).
    pub const CLUSTER_UNAVAILABLE: &str = "cluster_unavailable";
    /// A cluster request is out of range, or a job names a cluster it
    /// cannot run in: another tenant's or none, another GPU type's, being
    /// deleted, or too small for the job (422).
    pub const INVALID_CLUSTER: &str = "invalid_cluster";
    /// The cluster's state does not allow the change: it is being deleted
    /// or is gone (409).
    pub const CLUSTER_CONFLICT: &str = "cluster_conflict";
    /// A region cannot be evacuated or failed back now: it has no peer
    /// regions to move its jobs to, or another region is being evacuated
    /// (409).
    pub const EVACUATION_CONFLICT: &str = "evacuation_conflict";

    /// The tenant is suspended by an operator: none of its credentials
    /// is served (403).
    pub const TENANT_SUSPENDED: &str = "tenant_suspended";
    /// The API key does not allow this: a `read` key on a change, a
    /// tenant's key on an admin endpoint (403).
    pub const KEY_SCOPE: &str = "key_scope";
    /// A key's name, scope, expiry or tenant is not acceptable (422).
    pub const INVALID_API_KEY: &str = "invalid_api_key";
    /// A tenant by that id exists already (409).
    pub const TENANT_EXISTS: &str = "tenant_exists";
    /// Too few regions answered to read or write tenants and keys (their
    /// records are kept by a majority of regions): retry (503).
    pub const IDENTITY_UNAVAILABLE: &str = "identity_unavailable";
    /// Costs cannot be priced: the operator configured no price book, or
    /// it lacks a price the month needs (503).
    pub const COSTS_UNAVAILABLE: &str = "costs_unavailable";

    /// Every code above, so documents and tests can list them. A new code
    /// goes here too.
    pub const ALL: &[&str] = &[
        MALFORMED_JSON,
        INVALID_SPEC,
        INVALID_GPUS,
        INVALID_MIN_GPUS,
        UNKNOWN_GPU_TYPE,
        EXCEEDS_REGION_CAPACITY,
        UNSATISFIABLE_TOPOLOGY,
        BAD_REQUEST,
        INVALID_QUERY,
        INVALID_TENANT,
        INVALID_IDEMPOTENCY_KEY,
        IDEMPOTENCY_KEY_REUSED,
        IDEMPOTENCY_REQUEST_IN_FLIGHT,
        WRONG_REGION,
        NO_REGION_AVAILABLE,
        REGION_UNAVAILABLE,
        RATE_LIMITED,
        FORBIDDEN,
        UNAUTHENTICATED,
        INVALID_QUOTA,
        INVALID_LIMITS,
        QUEUED_JOBS_LIMIT,
        REQUESTED_GPUS_LIMIT,
        JOB_NOT_RUNNING,
        NOT_FOUND,
        PAYLOAD_TOO_LARGE,
        UNSUPPORTED_MEDIA_TYPE,
        UNKNOWN_AGENT,
        STALE_BOOT,
        UNKNOWN_NODE,
        NODE_CLAIMED,
        WRONG_AGENT,
        NODE_MISMATCH,
        INVALID_NODE,
        UNAVAILABLE,
        OVERLOADED,
        METHOD_NOT_ALLOWED,
        TIMEOUT,
        INTERNAL,
        INVALID_DRAIN,
        INVALID_FAULT,
        NODE_STATE_CONFLICT,
        NODE_NOT_SIMULATED,
        INVALID_MAINTENANCE,
        MAINTENANCE_CONFLICT,
        RESERVATION_UNAVAILABLE,
        INVALID_RESERVATION,
        RESERVATION_CONFLICT,
        CLUSTER_UNAVAILABLE,
        INVALID_CLUSTER,
        CLUSTER_CONFLICT,
        EVACUATION_CONFLICT,
        TENANT_SUSPENDED,
        KEY_SCOPE,
        INVALID_API_KEY,
        TENANT_EXISTS,
        IDENTITY_UNAVAILABLE,
        COSTS_UNAVAILABLE,
    ];
}
