//! Who may call a region: the global tier (service tokens) on the job and
//! admin endpoints, and the region's own agents (agent tokens naming this
//! region) on the agent endpoints. Nothing else. An agent token's subject
//! is the agent it is for: the agent endpoints check it against the agent
//! they act for ([`AgentCaller`]), and the store the nodes against the
//! inventory.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gangway_auth::jwt::Role;
use gangway_shared::error::codes;

use super::error::ApiError;
use super::AppState;

/// The agent a verified agent token is for (its subject), for the agent
/// endpoints to check; absent when the region runs without authentication.
#[derive(Clone, Debug)]
pub struct AgentCaller(pub String);

impl AgentCaller {
    /// Refuses (403 `wrong_agent`) a caller whose token is for another
    /// agent than `agent_id`.
    pub fn check(caller: Option<&AgentCaller>, agent_id: &str) -> Result<(), ApiError> {
        match caller {
            Some(AgentCaller(sub)) if sub != agent_id => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::WRONG_AGENT,
                format!(
                    "this agent token is for agent {sub:?}, not {agent_id:?}: each agent \
                     presents its own (gangway admin agent token NODE)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

pub async fn require_caller(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    // The verifier in use when the request came in (SIGHUP may replace it
    // for the next ones).
    let credentials = state.credentials.current();
    let Some(verifier) = &credentials.verifier else {
        return next.run(req).await;
    };
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // The verifier remembers tokens that passed until their `exp`, so the
    // global tier's service token (renewed at half-life) and an agent's token
    // cost an ES256 check once, not on every call; the role and region
    // checks below still run on every request.
    let claims = match verifier.verify_header(authorization) {
        Ok(c) => c,
        Err(e) => {
            return ApiError::new(StatusCode::UNAUTHORIZED, e.code(), e.to_string()).into_response()
        }
    };
    let agent_endpoint = req.uri().path().starts_with("/internal/v1/agents/");
    let allowed = if agent_endpoint {
        claims.role == Role::Agent && claims.region.as_deref() == Some(state.store.region())
    } else {
        claims.role == Role::Service
    };
    if !allowed {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            codes::FORBIDDEN,
            if agent_endpoint {
                "only this region's agents may call agent endpoints"
            } else {
                "only the global tier may call this endpoint"
            },
        )
        .into_response();
    }
    if agent_endpoint {
        req.extensions_mut().insert(AgentCaller(claims.sub.clone()));
    }
    next.run(req).await
}
