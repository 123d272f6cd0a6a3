//! Nodes (list, inspect, cordon, uncordon, drain, inject faults, admit,
//! release), passed to the region that has the node; the inventory (add
//! a machine to a region) and agent tokens (minted per agent with the
//! service key).

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::api::{DrainRequest, Fault, InventoryEntry, NodeActionRequest, NodeView};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Path, Query};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::responses;
use crate::auth::AdminCaller;
use crate::regions::Region;
use crate::state::GlobalState;

use super::{ask_regions, fan_out, PerRegion, RegionParam};

/// The regions that may have node `id`: the one named in `region`, else the
/// one whose name prefixes the id (node ids are `{region}-s00-l01-n03`),
/// else every region.
fn node_regions<'a>(
    state: &'a GlobalState,
    region: Option<&str>,
    id: &str,
) -> Result<Vec<&'a Region>, ApiError> {
    if let Some(name) = region {
        return match state.regions.get(name) {
            Some(r) => Ok(vec![r]),
            None => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            )),
        };
    }
    let by_prefix = state
        .regions
        .list
        .iter()
        .filter(|r| {
            id.strip_prefix(r.name.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .max_by_key(|r| r.name.len());
    Ok(match by_prefix {
        Some(r) => vec![r],
        None => state.regions.list.iter().collect(),
    })
}

/// A node id as it may appear in a path.
fn check_node_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::not_found("node"))
    }
}

/// Which nodes a listing covers.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct NodesParam {
    /// Only this region (default: every region).
    region: Option<String>,
    /// Only this leaf's nodes.
    leaf: Option<String>,
}

/// List nodes
///
/// Every node of every region (or the one named; or one leaf's), with both axes of its
/// state — what operators asked (`admin_state`: active, cordoned, draining,
/// maintenance, repair) and what its agent observes (`observed`: healthy,
/// degraded, suspect, lost, failed, damped, needs_repair) — and what they
/// decide: whether it is schedulable, its usable GPUs, and why not.
#[utoipa::path(
    get,
    path = "/v1/admin/nodes",
    operation_id = "list_nodes",
    tag = "admin",
    security(("bearer" = [])),
    params(NodesParam),
    responses(
        (status = 200, description = "Each region's `NodeList`, by region name.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is unknown or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn list_nodes(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<NodesParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let query = match &p.leaf {
        Some(leaf) => {
            if check_node_id(leaf).is_err() {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    codes::INVALID_QUERY,
                    "leaf has characters no leaf name has (a-z, 0-9, '-', '_', '.')",
                ));
            }
            Some(format!("leaf={leaf}"))
        }
        None => None,
    };
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/nodes",
            None,
            Some(&admin.subject),
            query.as_deref(),
        )
        .await?,
    ))
}

/// Get a node
///
/// One node (from the region named, or the one its id names), with its
/// newest events: health effects, operator actions, injected faults, jobs
/// moved off it.
#[utoipa::path(
    get,
    path = "/v1/admin/nodes/{id}",
    operation_id = "get_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    responses(
        (status = 200, description = "The node.", body = NodeView),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(&id)?;
    let regions = node_regions(&state, p.region.as_deref(), &id)?;
    let path = format!("/v1/admin/nodes/{id}");
    ask_regions(
        &state,
        &regions,
        Method::GET,
        &path,
        None,
        &admin.subject,
        "node",
    )
    .await
}

async fn node_action(
    state: &GlobalState,
    admin: &AdminCaller,
    region: Option<&str>,
    id: &str,
    action: &str,
    body: Vec<u8>,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(id)?;
    let regions = node_regions(state, region, id)?;
    let path = format!("/v1/admin/nodes/{id}/{action}");
    ask_regions(
        state,
        &regions,
        Method::POST,
        &path,
        Some(body),
        &admin.subject,
        "node",
    )
    .await
}

/// Cordon a node
///
/// No new work goes to the node; the jobs running on it stay. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/cordon",
    operation_id = "cordon_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a node action, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn cordon_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "cordon",
        body.to_vec(),
    )
    .await
}

/// Uncordon a node
///
/// Returns the node to service: from a cordon, a drain, or repair (the
/// operator vouches it is fixed). Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/uncordon",
    operation_id = "uncordon_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = NodeActionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a node action, or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn uncordon_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "uncordon",
        body.to_vec(),
    )
    .await
}

/// Drain a node
///
/// Cordons the node and moves its jobs elsewhere through the checkpoint
/// protocol: `checkpoint` mode asks them to checkpoint now (each is stopped
/// once its checkpoint is written, or at the deadline) and restarts them
/// elsewhere from it; `wait` mode lets them finish, and checkpoints and
/// moves those still running at the deadline. The node stays out (drained)
/// until uncordoned. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/drain",
    operation_id = "drain_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = DrainRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "A maintenance plan holds the node.", &[codes::NODE_STATE_CONFLICT]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a drain (`invalid_spec`), its deadline or reason is out of range, \
             or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::INVALID_DRAIN, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn drain_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "drain",
        body.to_vec(),
    )
    .await
}

/// Inject a fault
///
/// Applies a fault to a node of a simulated fleet as if its agent had
/// reported it: an XID (`{"kind": "xid", "gpu": 0, "code": 79}`), ECC
/// errors, a row remap, a thermal event, NVLink errors, a dead node
/// (`node_down`), a flapping link (`link_flap`), a reboot, or its rack
/// thermally throttling (`rack_thermal`: no node of the node's leaf takes
/// new work until `{"kind": "rack_thermal", "throttled": false}`). The
/// health policy then acts on it as on a real report. Refused for real
/// agents' nodes. Audited.
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/faults",
    operation_id = "inject_fault",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body(content = Fault, content_type = "application/json"),
    responses(
        (status = 200, description = "The node as it is now.", body = NodeView),
        (status = 400, description = responses::errors("The body is not JSON.",
            &[codes::MALFORMED_JSON, codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 409, description = responses::errors(
            "The node's agent is not simulated.", &[codes::NODE_NOT_SIMULATED]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The body is not a fault (`invalid_spec`), names a GPU the node does not have or a \
             value out of range (`invalid_fault`), or no region has the name given in `region`.",
            &[codes::INVALID_SPEC, codes::INVALID_FAULT, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn inject_fault(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "faults",
        body.to_vec(),
    )
    .await
}

/// Admit an unknown machine
///
/// Puts a machine that tried to join and was refused (`unknown_node`,
/// listed as `unknown`) into its region's inventory where the body says it
/// sits, so its next registration is accepted and it takes work. Passed to
/// the region that saw it. Audited (`node.admit`).
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/admit",
    operation_id = "admit_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The machine's name."), RegionParam),
    request_body = InventoryEntry,
    responses(
        (status = 200, description = "The machine's inventory entry."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors(
            "No region has seen a machine of that name.", &[codes::NOT_FOUND]), body = ErrorBody),
        (status = 422, description = responses::errors(
            "The entry is invalid, or no region has the name given in `region`.",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn admit_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "admit",
        body.to_vec(),
    )
    .await
}

/// Release a node (takeover)
///
/// The agent holding the node loses its claim: the next agent to register
/// the node takes it over at once, even while the old one is alive (use it
/// when the old machine is gone or replaced). Audited (`node.release`).
#[utoipa::path(
    post,
    path = "/v1/admin/nodes/{id}/release",
    operation_id = "release_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The node's id."), RegionParam),
    request_body = NodeActionRequest,
    responses(
        (status = 200, description = "The agent whose claim was released."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, description = responses::errors("No such node.", &[codes::NOT_FOUND]),
            body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn release_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    node_action(
        &state,
        &admin,
        p.region.as_deref(),
        &id,
        "release",
        body.to_vec(),
    )
    .await
}

/// The one region an inventory or token call is for: the one named, or
/// the only one.
fn one_region<'a>(state: &'a GlobalState, region: Option<&str>) -> Result<&'a Region, ApiError> {
    match (region, state.regions.list.as_slice()) {
        (Some(name), _) => state.regions.get(name).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            )
        }),
        (None, [only]) => Ok(only),
        (None, _) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::WRONG_REGION,
            "name the region (?region=NAME): the machine belongs to one",
        )),
    }
}

/// Add a machine to a region's inventory
///
/// Says that a machine belongs to the region and where it sits (spine,
/// leaf, NVLink domain, spare or not), before or after it first tries to
/// join; its agent's registrations are accepted from then on. Audited
/// (`node.add`).
#[utoipa::path(
    put,
    path = "/v1/admin/inventory/{id}",
    operation_id = "add_node",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The machine's name."), RegionParam),
    request_body = InventoryEntry,
    responses(
        (status = 200, description = "The machine's inventory entry."),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The entry is invalid, or the region is not named (or unknown).",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn add_node(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<RegionParam>,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    check_node_id(&id)?;
    let region = one_region(&state, p.region.as_deref())?;
    ask_regions(
        &state,
        &[region],
        Method::PUT,
        &format!("/v1/admin/inventory/{id}"),
        Some(body.to_vec()),
        &admin.subject,
        "node",
    )
    .await
}

/// The query of `POST /v1/admin/agents/{id}/token`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AgentTokenParams {
    /// The region the agent serves (default: the only one).
    region: Option<String>,
    /// How long the token lasts, in days (1–400; default 90).
    ttl_days: Option<u64>,
}

/// An agent's token, minted for one agent of one region.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AgentToken {
    pub agent_id: String,
    pub region: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// The token (role agent; subject: the agent; region: the region).
    pub token: String,
}

/// Mint an agent token
///
/// A token for one agent — a real machine's agent is named as its node —
/// of one region, signed with the service key the regions trust. The
/// region checks its subject against the agent of every call, and the
/// inventory binds each node to the agent that may serve it, so a token
/// of node A cannot register or report for node B, and a token of region
/// X is refused by region Y. Each minting is logged with the operator.
#[utoipa::path(
    post,
    path = "/v1/admin/agents/{id}/token",
    operation_id = "agent_token",
    tag = "admin",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The agent (a real machine's: its node name)."),
        AgentTokenParams),
    responses(
        (status = 200, description = "The token.", body = AgentToken),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "The agent id or lifetime is invalid, or the region is not named (or unknown).",
            &[codes::INVALID_NODE, codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn agent_token(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Path(id): Path<String>,
    Query(p): Query<AgentTokenParams>,
) -> Result<axum::Json<AgentToken>, ApiError> {
    if !gangway_shared::fleet::valid_node_name(&id) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_NODE,
            "an agent id is 1-200 letters, digits, '.', '_' or '-'",
        ));
    }
    let days = p.ttl_days.unwrap_or(90);
    if !(1..=400).contains(&days) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_NODE,
            "ttl_days must be between 1 and 400",
        ));
    }
    let region = one_region(&state, p.region.as_deref())?;
    let ttl = std::time::Duration::from_secs(days * 86_400);
    let token = state.regions.agent_token(&region.name, &id, ttl);
    tracing::info!(operator = %admin.subject, agent_id = %id, region = %region.name, ttl_days = days, "agent token minted");
    Ok(axum::Json(AgentToken {
        agent_id: id,
        region: region.name.clone(),
        expires_at: chrono::Utc::now() + chrono::Duration::seconds((days * 86_400) as i64),
        token,
    }))
}
