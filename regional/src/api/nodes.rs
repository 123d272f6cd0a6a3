//! Operator endpoints for nodes: list and inspect them with both axes and
//! what they decide (and the machines refused as unknown), cordon,
//! uncordon, drain, inject faults into a simulated fleet, admit or add a
//! machine to the inventory, and release a node's claim (takeover). Every action is audited with the operator the global
//! tier names (`X-Gangway-Actor`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use gangway_shared::api::{
    DrainMode, DrainRequest, Fault, InventoryEntry, NodeActionRequest, NodeList, NodeView,
    ACTOR_HEADER, MAX_DRAIN_DEADLINE_S, MAX_REASON_LEN,
};
use gangway_shared::error::codes;
use gangway_shared::http::Path;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::store::{retry_races, AdminChange, NodeRefusal, NodesOutcome, StoreError};

/// The operator the global tier names, or `unknown` for a direct caller.
pub(super) fn actor(headers: &HeaderMap) -> String {
    headers
        .get(ACTOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|a| !a.is_empty() && a.len() <= 200)
        .unwrap_or("unknown")
        .to_string()
}

/// A node id as it may appear: 1–200 letters, digits, `-`, `_`, `.`.
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

/// An optional JSON body: empty means the defaults.
pub(super) fn body<T: DeserializeOwned + Default>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::PAYLOAD_TOO_LARGE,
                "request body too large",
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::MALFORMED_JSON,
                format!("cannot read the body: {e}"),
            )
        }
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    required(&bytes)
}

pub(super) fn required<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!("invalid document: {e}"),
        ),
        _ => ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("malformed JSON: {e}"),
        ),
    })
}

pub(super) fn check_reason(
    reason: &Option<String>,
    code: &'static str,
) -> Result<Option<String>, ApiError> {
    match reason.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(r) if r.chars().count() > MAX_REASON_LEN || r.chars().any(char::is_control) => {
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                code,
                format!("reason must be at most {MAX_REASON_LEN} printable characters"),
            ))
        }
        Some(r) => Ok(Some(r.to_string())),
    }
}

fn refused(r: NodeRefusal) -> ApiError {
    match r {
        NodeRefusal::NotFound => ApiError::not_found("node"),
        NodeRefusal::Conflict(why) => {
            ApiError::new(StatusCode::CONFLICT, codes::NODE_STATE_CONFLICT, why)
        }
        NodeRefusal::NotSimulated => ApiError::new(
            StatusCode::CONFLICT,
            codes::NODE_NOT_SIMULATED,
            "faults can be injected only into nodes of simulated agents (--executor sim)",
        ),
        NodeRefusal::InvalidFault(why) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_FAULT, why)
        }
    }
}

async fn view(state: &AppState, id: &str) -> Result<axum::Json<NodeView>, ApiError> {
    let policy = state.store.health_policy().clone();
    match state.store.get_node(&policy, id).await? {
        Some(v) => Ok(axum::Json(v)),
        None => Err(ApiError::not_found("node")),
    }
}

/// After a change to node `id`: its agent, and the agents of the jobs it
/// moved, hear of it now (a drain's deadline, a checkpoint to write), not
/// at their next sync; the scheduler if anything may now be placed.
async fn after(state: &AppState, id: &str, o: &NodesOutcome) {
    let moved = o.moved();
    if let Err(e) = state.store.wake_agents_of(&[id], &moved).await {
        tracing::warn!(node_id = %id, error = %e, "waking the agents of a node's jobs failed: they hear at their next sync");
    }
    if o.fleet_changed || o.freed_gpus || !moved.is_empty() {
        state.wake_scheduler();
    }
}

/// `GET /v1/admin/nodes`'s query.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListNodes {
    /// Only this leaf's nodes (the console's zoom into one).
    leaf: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    gangway_shared::http::Query(q): gangway_shared::http::Query<ListNodes>,
) -> Result<axum::Json<NodeList>, ApiError> {
    if let Some(leaf) = &q.leaf {
        check_node_id(leaf)?;
    }
    let policy = state.store.health_policy().clone();
    Ok(axum::Json(NodeList {
        nodes: state.store.list_nodes(&policy, q.leaf.as_deref()).await?,
        unknown: state.store.unknown_nodes().await?,
    }))
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<NodeView>, ApiError> {
    check_node_id(&id)?;
    view(&state, &id).await
}

async fn change(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    change: AdminChange,
    reason: Option<String>,
) -> Result<axum::Json<NodeView>, ApiError> {
    let actor = actor(headers);
    let ctx = state.store.health_context();
    let out = retry_races(|| {
        state
            .store
            .set_node_admin(&ctx, &actor, id, change, reason.as_deref())
    })
    .await?
    .map_err(refused)?;
    tracing::info!(node_id = %id, %actor, ?change, "node admin state changed");
    after(state, id, &out).await;
    view(state, id).await
}

/// No new work on the node; its running jobs stay.
pub async fn cordon(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<NodeView>, ApiError> {
    check_node_id(&id)?;
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_SPEC)?;
    change(&state, &headers, &id, AdminChange::Cordon, reason).await
}

/// Returns the node to service (from cordon, drain or repair).
pub async fn uncordon(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<NodeView>, ApiError> {
    check_node_id(&id)?;
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_SPEC)?;
    change(&state, &headers, &id, AdminChange::Uncordon, reason).await
}

/// Cordons the node and moves its jobs: at once through a checkpoint
/// (`checkpoint`), or once the deadline passes if they have not finished
/// (`wait`).
pub async fn drain(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<NodeView>, ApiError> {
    check_node_id(&id)?;
    let req: DrainRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_DRAIN)?;
    let deadline_s = match req.deadline_s {
        Some(d) if !(1..=MAX_DRAIN_DEADLINE_S).contains(&d) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_DRAIN,
                format!("deadline_s must be between 1 and {MAX_DRAIN_DEADLINE_S} seconds"),
            ))
        }
        Some(d) => d as u64,
        None => match req.mode {
            DrainMode::Checkpoint => state.config.checkpoint_deadline.as_secs().max(1),
            DrainMode::Wait => 3600,
        },
    };
    change(
        &state,
        &headers,
        &id,
        AdminChange::Drain {
            mode: req.mode,
            deadline_s,
        },
        reason,
    )
    .await
}

/// Injects a fault into a simulated node, as if its agent had reported it.
pub async fn inject_fault(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<NodeView>, ApiError> {
    check_node_id(&id)?;
    let bytes = bytes.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("cannot read the body: {e}"),
        )
    })?;
    let fault: Fault = required(&bytes)?;
    match &fault {
        Fault::Thermal {
            celsius: Some(c), ..
        } if *c > 200 => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_FAULT,
                "celsius must be at most 200",
            ))
        }
        Fault::LinkFlap {
            silent_s: Some(s), ..
        } if *s == 0 || *s > 86_400 => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_FAULT,
                "silent_s must be between 1 and 86400",
            ))
        }
        _ => {}
    }
    let actor = actor(&headers);
    let ctx = state.store.health_context();
    let out = retry_races(|| state.store.inject_fault(&ctx, &actor, &id, &fault))
        .await?
        .map_err(refused)?;
    tracing::info!(node_id = %id, %actor, fault = fault.kind(), "fault injected");
    after(&state, &id, &out).await;
    view(&state, &id).await
}

/// `admit` (a machine listed as unknown; 404 otherwise) or `add` (any
/// machine): puts it in the inventory where the body says it sits, so its
/// next registration is accepted. Audited.
async fn place(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    bytes: Result<Bytes, BytesRejection>,
    must_be_unknown: bool,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let entry: InventoryEntry = required(&bytes.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::MALFORMED_JSON,
            format!("cannot read the body: {e}"),
        )
    })?)?;
    let mut entry = entry;
    entry.reason = check_reason(&entry.reason, codes::INVALID_NODE)?;
    let actor = actor(headers);
    let node = match state
        .store
        .admit_node(&actor, id, &entry, must_be_unknown)
        .await
    {
        Err(StoreError::NotFound) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                codes::NOT_FOUND,
                format!(
                    "no machine named {id} has tried to join this region: add it instead \
                     (gangway admin node add {id} --region REGION …)"
                ),
            ))
        }
        r => r?,
    };
    tracing::info!(node_id = %id, %actor, must_be_unknown, "node placed in the inventory");
    Ok(axum::Json(serde_json::json!({
        "node_id": node.node_id,
        "agent_id": node.agent(),
        "spine": node.spine,
        "leaf": node.leaf,
        "nvlink_domain": node.nvlink_domain,
        "spare": node.spare,
        "gpu_type": node.gpu_type,
        "rack_power_budget_w": node.rack_power_budget_w,
    })))
}

/// Admits a machine seen as unknown.
pub async fn admit(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    check_node_id(&id)?;
    place(&state, &headers, &id, bytes, true).await
}

/// Adds a machine to the inventory (or moves it).
pub async fn add(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    check_node_id(&id)?;
    place(&state, &headers, &id, bytes, false).await
}

/// An operator's takeover: the agent holding the node loses its claim, so
/// the next agent to register the node takes it over, alive or not.
/// Audited (`node.release`).
pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    check_node_id(&id)?;
    let req: NodeActionRequest = body(bytes)?;
    let reason = check_reason(&req.reason, codes::INVALID_SPEC)?;
    let actor = actor(&headers);
    let agent = match state
        .store
        .release_node(&actor, &id, reason.as_deref())
        .await
    {
        Err(StoreError::NotFound) => return Err(ApiError::not_found("node")),
        r => r?,
    };
    tracing::info!(node_id = %id, %actor, agent_id = %agent, "node's claim released");
    Ok(axum::Json(
        serde_json::json!({ "node_id": id, "agent_id": agent, "released": true }),
    ))
}
