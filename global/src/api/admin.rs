//! Operator endpoints: quotas, set in every region (or one) at once.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use futures_util::future::join_all;
use gangway_shared::api::{QuotaList, QuotaUpdate};
use gangway_shared::error::codes;
use gangway_shared::http::{ApiError, Json, Query};
use serde::{Deserialize, Serialize};

use super::GlobalState;
use crate::auth::AdminCaller;
use crate::regions::Call;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionParam {
    /// Only this region (default: every region).
    region: Option<String>,
}

/// Each region's answer (a JSON document, or the error it gave).
#[derive(Debug, Serialize, Deserialize)]
pub struct PerRegion {
    pub regions: BTreeMap<String, serde_json::Value>,
}

async fn fan_out(
    state: &GlobalState,
    only: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
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

pub async fn list_quotas(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let out = fan_out(
        &state,
        p.region.as_deref(),
        Method::GET,
        "/v1/admin/quotas",
        None,
    )
    .await?;
    // Keep the shape checkable: every region's value is a QuotaList or an error.
    debug_assert!(
        out.regions
            .values()
            .all(|v| serde_json::from_value::<QuotaList>(v.clone()).is_ok()
                || v.get("code").is_some())
    );
    Ok(axum::Json(out))
}

pub async fn put_quota(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
    Json(body): Json<QuotaUpdate>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    let body = serde_json::to_vec(&body).expect("a quota serializes");
    Ok(axum::Json(
        fan_out(&state, p.region.as_deref(), Method::PUT, &path, Some(body)).await?,
    ))
}

pub async fn delete_quota(
    State(state): State<GlobalState>,
    _admin: AdminCaller,
    Path((tenant, gpu_type)): Path<(String, String)>,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    let path = format!("/v1/admin/quotas/{tenant}/{gpu_type}");
    Ok(axum::Json(
        fan_out(&state, p.region.as_deref(), Method::DELETE, &path, None).await?,
    ))
}
