//! Calling the regions on a caller's behalf: a region's answer relayed
//! as it is, a region that cannot be reached turned into `503
//! region_unavailable`, the same call sent to every region to find the one
//! that has a job or a resource, and a keyed create's region claimed. The
//! handlers (jobs, reservations, clusters, operators' calls) use these;
//! this module uses none of them.

use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use gangway_shared::error::codes;
use gangway_shared::http::ApiError;
use serde::Deserialize;
use uuid::Uuid;

use crate::regions::{Answer, Call, Region, Unreachable, Who};
use crate::state::GlobalState;

/// A region's answer, passed on as it is.
pub fn relay(answer: Answer) -> Response {
    let mut resp = (answer.status, answer.body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if answer.replayed {
        resp.headers_mut().insert(
            crate::regions::REPLAYED_HEADER,
            HeaderValue::from_static("true"),
        );
    }
    if let Some(v) = answer
        .retry_after
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

pub fn unavailable(e: &Unreachable) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::REGION_UNAVAILABLE,
        format!("{e}; retry shortly (creates: with the same Idempotency-Key)"),
    )
    .with_retry_after(RETRY_AFTER_S)
}

/// The `Retry-After` of a retryable 503 the global tier answers itself (a
/// region not answering, none could take the job): about a region
/// database's failover, or a heartbeat or two of a region's health.
pub const RETRY_AFTER_S: u64 = 2;

#[derive(Debug, Deserialize, serde::Serialize)]
struct Claim {
    job_id: Uuid,
    tenant: String,
    region: String,
}

/// Settles which region a keyed create goes to: the first region in the
/// job's rendezvous order that answers records the choice (or tells us an
/// earlier one), so concurrent first attempts through different replicas
/// agree on one region. When none does and one of them was shedding load,
/// its `503 overloaded` and `Retry-After` are the answer (the client
/// retries with the same key), not `no_region_available`. Timed
/// (`gangway_global_create_phase_seconds{phase="claim"}`) and counted
/// (`gangway_global_claims_total{how="separate"}`).
pub async fn claim(
    state: &GlobalState,
    job_id: Uuid,
    tenant: &str,
    chosen: &str,
    order: &[&str],
) -> Result<String, Response> {
    let _timed = ClaimTimer(std::time::Instant::now());
    let mut last_error = None;
    let mut overloaded = None;
    for name in order {
        let Some(region) = state.regions.get(name) else {
            continue;
        };
        let body = serde_json::to_vec(&Claim {
            job_id,
            tenant: tenant.to_string(),
            region: chosen.to_string(),
        })
        .expect("a claim serializes");
        match state
            .regions
            .call(
                region,
                Method::POST,
                "/internal/v1/claims",
                Call {
                    body: Some(body.into()),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(a) if a.status.is_success() => {
                let claim: Claim = serde_json::from_slice(&a.body).map_err(|e| {
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        codes::REGION_UNAVAILABLE,
                        format!("region {name} answered a claim with {e}"),
                    )
                    .into_response()
                })?;
                return Ok(claim.region);
            }
            Ok(a) if a.retry_after.is_some() => {
                last_error = Some(format!("region {name} is overloaded"));
                overloaded = Some(a);
            }
            Ok(a) => last_error = Some(format!("region {name} refused the claim ({})", a.status)),
            Err(e) => last_error = Some(e.to_string()),
        }
    }
    if let Some(answer) = overloaded {
        return Err(relay(answer));
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        codes::NO_REGION_AVAILABLE,
        format!(
            "no region could record where this job goes ({}); retry with the same Idempotency-Key",
            last_error.unwrap_or_else(|| "none healthy".into())
        ),
    )
    .with_retry_after(RETRY_AFTER_S)
    .into_response())
}

/// Times and counts a claim call when it ends, however it ends
/// (`gangway_global_create_phase_seconds{phase="claim"}`,
/// `gangway_global_claims_total{how="separate"}`).
struct ClaimTimer(std::time::Instant);

impl Drop for ClaimTimer {
    fn drop(&mut self) {
        metrics::histogram!("gangway_global_create_phase_seconds", "phase" => "claim")
            .record(self.0.elapsed().as_secs_f64());
        metrics::counter!("gangway_global_claims_total", "how" => "separate").increment(1);
    }
}

/// How much an answer's copy of a job owns it: not moved away first, then
/// the highest ownership epoch (bodies without them rank alike).
pub fn ownership(body: &[u8]) -> (bool, i64) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    (
        v.get("moved_to").is_none_or(|m| m.is_null()),
        v.get("epoch").and_then(|e| e.as_i64()).unwrap_or(1),
    )
}

/// Sends the same call to every region at once and returns the first
/// answer that is not a 404 (nor a region failing): the region that has
/// the job (or the `what` the path names) answers, the others do not know
/// it. Nobody has it → 404, unless a region did not answer (503: it may be
/// there; retry).
pub async fn ask_every_region<'a>(
    state: &'a GlobalState,
    method: Method,
    path: &str,
    who: Who<'_>,
    what: &str,
) -> Result<(&'a Region, Answer), ApiError> {
    let asks = state.regions.list.iter().map(|r| {
        let method = method.clone();
        async move {
            let a = state.regions.call(r, method, path, who.call()).await;
            (r, a)
        }
    });
    let mut down = None;
    let mut found: Vec<(&Region, Answer)> = Vec::new();
    for (region, answer) in join_all(asks).await {
        match answer {
            Ok(a) if a.status == StatusCode::NOT_FOUND => {}
            Ok(a) if a.status.is_server_error() => {
                down = Some(format!("region {} answered {}", region.name, a.status))
            }
            Ok(a) => found.push((region, a)),
            Err(e) => down = Some(e.to_string()),
        }
    }
    // A job adopted by another region after its home was cut off is in
    // both: the owner is the copy that did not move, at the highest epoch.
    if let Some(best) = (found.into_iter()).max_by_key(|(_, a)| ownership(&a.body)) {
        return Ok(best);
    }
    match down {
        None => Err(ApiError::not_found(what)),
        Some(why) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!(
                "the {what} was not found in the regions that answered, and {why}; retry shortly"
            ),
        )
        .with_retry_after(RETRY_AFTER_S)),
    }
}
