//! Operator endpoints: quotas (guarantees, weights and caps) and admission
//! limits (queued jobs, GPUs of unfinished jobs), set in every region (or
//! one) at once; nodes (list, inspect, cordon, uncordon, drain,
//! inject faults, admit, release), passed to the region that has the
//! node; the inventory (add a machine to a region) and agent tokens
//! (minted per agent with the service key); rolling
//! maintenance plans, passed to the region they run in; the audit log of
//! every region. Every call names the operator (the admin token's
//! subject) to the regions, which write it into their audit logs.
//!
//! # Layout
//! - `mod.rs`: what the others share — which regions a call goes to
//!   ([`RegionParam`]), one answer per region ([`PerRegion`]), and the
//!   two ways of calling them (every region at once, or the ones named).
//! - `quotas.rs`, `jobs.rs`, `nodes.rs`, `audit.rs`, `maintenance.rs`,
//!   `usage.rs`: the endpoints, by what they are about.

mod audit;
mod jobs;
mod maintenance;
mod nodes;
mod quotas;
mod tenants;
mod usage;

pub use audit::*;
pub use jobs::*;
pub use maintenance::*;
pub use nodes::*;
pub use quotas::*;
pub use tenants::*;
pub use usage::*;

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use futures_util::future::join_all;
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::responses;
use crate::regions::{Call, Region};
use crate::state::GlobalState;

/// Which regions an operator call goes to.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RegionParam {
    /// Only this region (default: every region).
    region: Option<String>,
}

/// Each region's answer (a JSON document, or the error it gave).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PerRegion {
    /// By region name.
    #[schema(value_type = BTreeMap<String, responses::RegionAnswer>)]
    pub regions: BTreeMap<String, serde_json::Value>,
}

async fn fan_out(
    state: &GlobalState,
    only: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    actor: Option<&str>,
    query: Option<&str>,
) -> Result<PerRegion, ApiError> {
    if let Some(name) = only {
        if state.regions.get(name).is_none() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}"),
            ));
        }
    }
    let asks = state
        .regions
        .list
        .iter()
        .filter(|r| only.is_none_or(|n| n == r.name))
        .map(|r| {
            let (method, body) = (method.clone(), body.clone());
            async move {
                let a = state
                    .regions
                    .call(
                        r,
                        method,
                        path,
                        Call {
                            body: body.map(Into::into),
                            actor,
                            query,
                            ..Default::default()
                        },
                    )
                    .await;
                let v = match a {
                    Ok(a) if a.status == StatusCode::NO_CONTENT => {
                        serde_json::json!({"deleted": true})
                    }
                    Ok(a) => serde_json::from_slice(&a.body).unwrap_or_else(|_| {
                        serde_json::json!({"code": codes::REGION_UNAVAILABLE,
                                           "message": format!("answered {}", a.status)})
                    }),
                    Err(e) => serde_json::json!({"code": codes::REGION_UNAVAILABLE,
                                                 "message": e.to_string()}),
                };
                (r.name.clone(), v)
            }
        });
    Ok(PerRegion {
        regions: join_all(asks).await.into_iter().collect(),
    })
}

/// Sends one call to `regions` at once and relays the first answer that is
/// not a 404: the region that has the node (or job) answers, the others do
/// not know it. Nobody has it → 404, unless a region did not answer (503).
async fn ask_regions(
    state: &GlobalState,
    regions: &[&Region],
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    actor: &str,
    what: &str,
) -> Result<axum::response::Response, ApiError> {
    let asks = regions.iter().map(|r| {
        let (method, body) = (method.clone(), body.clone());
        async move {
            let a = state
                .regions
                .call(
                    r,
                    method,
                    path,
                    Call {
                        body: body.map(Into::into),
                        actor: Some(actor),
                        ..Default::default()
                    },
                )
                .await;
            (*r, a)
        }
    });
    let mut down = None;
    let mut not_found = None;
    for (region, answer) in join_all(asks).await {
        match answer {
            Ok(a) if a.status == StatusCode::NOT_FOUND => not_found = Some(a),
            Ok(a) if a.status.is_server_error() => {
                down = Some(format!("region {} answered {}", region.name, a.status))
            }
            Ok(a) => return Ok(super::relay::relay(a)),
            Err(e) => down = Some(e.to_string()),
        }
    }
    match (down, not_found) {
        (None, Some(a)) if regions.len() == 1 => Ok(super::relay::relay(a)),
        (None, _) => Err(ApiError::not_found(what)),
        (Some(why), _) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!(
                "the {what} was not found in the regions that answered, and {why}; retry shortly"
            ),
        )),
    }
}
