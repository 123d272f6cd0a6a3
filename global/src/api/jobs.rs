//! Job endpoints: the global tier's routing of each call to a region.

use std::collections::BTreeSet;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use gangway_shared::api::{Cursor, Job, JobList, JobSpec, JobState, RegionList};
use gangway_shared::client::{CLAIM_ELSEWHERE, CLAIM_HELD};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{idempotency_key, job_spec, ApiError, JobId, Json, Query};
use gangway_shared::ids::job_id_for_key;
use serde::Deserialize;
use tracing::instrument;
use utoipa::IntoParams;
use uuid::Uuid;

use super::clusters::Clusters;
use super::relay::{ask_every_region, claim, ownership, relay, unavailable};
use super::reservations::Reservations;
use super::{resources, responses};
use crate::auth::TenantCaller;
use crate::regions::{Answer, Call, Region, Who};
use crate::routing::{choose, rendezvous, Candidate};
use crate::state::GlobalState;

/// Submit a job
///
/// Validates the spec, chooses a region (the pinned one, the one that has
/// the reservation or dedicated cluster the job names, else by health and
/// free GPUs of the type) and creates the job there. With an
/// `Idempotency-Key`, the same key and body give the same job and the same
/// answer however often they are sent, through any replica. A tenant with
/// admission limits is refused with 429 (`queued_jobs_limit`,
/// `requested_gpus_limit`) when the job would put it over one in that
/// region, and nothing is created; a retry of a create already accepted
/// still gets its job.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    operation_id = "create_job",
    tag = "jobs",
    security(("bearer" = [])),
    params(
        responses::IdempotencyKey,
    ),
    request_body(content = JobSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "The job, created now or by an earlier attempt \
            with the same Idempotency-Key and body.", body = Job),
        (status = 400, description = responses::errors(
            "The body is not JSON, or the Idempotency-Key is malformed.",
            &[codes::MALFORMED_JSON, codes::INVALID_IDEMPOTENCY_KEY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 409, description = responses::errors(
            "A request with this Idempotency-Key is still being processed; retry in a \
             moment to get its result.",
            &[codes::IDEMPOTENCY_REQUEST_IN_FLIGHT]), body = ErrorBody),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The spec is invalid or can never run (the message says what to fix), or the \
             Idempotency-Key was used before with a different body.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_MIN_GPUS,
              codes::UNKNOWN_GPU_TYPE, codes::EXCEEDS_REGION_CAPACITY,
              codes::UNSATISFIABLE_TOPOLOGY, codes::WRONG_REGION, codes::INVALID_RESERVATION,
              codes::INVALID_CLUSTER, codes::IDEMPOTENCY_KEY_REUSED]), body = ErrorBody),
        (status = 429, response = responses::CreateRefused),
        (status = 502, description = responses::errors(
            "A region gave an answer that could not be understood; retry with the same \
             Idempotency-Key.",
            &[codes::REGION_UNAVAILABLE]), body = ErrorBody),
        (status = 503, description = responses::errors(
            "No region the job may go to is answering now, or its database is \
             unavailable; retry with the same Idempotency-Key.",
            &[codes::NO_REGION_AVAILABLE, codes::REGION_UNAVAILABLE, codes::UNAVAILABLE]),
         body = ErrorBody),
    )
)]
#[instrument(skip_all, fields(tenant = %caller.tenant))]
pub async fn create(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant;
    let key = idempotency_key(&headers)?;
    // Everything that can be checked without a region is checked here, so
    // bad input never reaches a region and leaves nothing behind.
    let spec: JobSpec = job_spec(body)?;

    let job_id = match &key {
        Some(k) => job_id_for_key(&tenant, k),
        None => Uuid::new_v4(),
    };
    let routed = to_home_region(&state, &tenant, &spec).await?;
    let (chosen, candidates) =
        pick_region(&state, &tenant, routed.as_ref().unwrap_or(&spec), job_id)?;
    let order: Vec<&str> = match &key {
        Some(_) => rendezvous(job_id, candidates.iter().map(|r| r.name.as_str())),
        None => Vec::new(),
    };
    // A keyed create whose region is also the first of its claim order is
    // claimed there in the create's own commit (the common case while
    // regions have room); else the claim is settled first.
    let claim_here = key.is_some() && order.first() == Some(&chosen.as_str());
    let target = if key.is_some() && !claim_here {
        match claim(&state, job_id, &tenant, &chosen, &order).await {
            Ok(region) => region,
            Err(refusal) => return Ok(refusal),
        }
    } else {
        chosen.clone()
    };
    let body = axum::body::Bytes::from(serde_json::to_vec(&spec).expect("a JobSpec serializes"));
    let create = |target: String, claim_here: bool| {
        let (state, tenant, key, body) = (&state, &tenant, &key, body.clone());
        async move {
            let region = state.regions.get(&target).ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!(
                        "this job was routed to region {target}, which this replica does not know"
                    ),
                )
            })?;
            let started = std::time::Instant::now();
            let answer = (state.regions)
                .call(
                    region,
                    Method::POST,
                    "/v1/jobs",
                    Call {
                        tenant: Some(tenant),
                        idempotency_key: key.as_deref(),
                        body: Some(body),
                        claim_here,
                        ..Default::default()
                    },
                )
                .await;
            metrics::histogram!("gangway_global_create_phase_seconds", "phase" => "create")
                .record(started.elapsed().as_secs_f64());
            Ok::<_, ApiError>((region, answer))
        }
    };
    let (mut region, mut answer) = create(target, claim_here).await?;
    if claim_here {
        let says = |a: &Answer, word: &str| a.claim.as_ref().is_some_and(|v| v == word);
        match &answer {
            Ok(a) if says(a, CLAIM_HELD) => {
                metrics::counter!("gangway_global_claims_total", "how" => "merged").increment(1)
            }
            // Another region's claim holds the key: settle it and go there.
            Ok(a) if says(a, CLAIM_ELSEWHERE) => {
                metrics::counter!("gangway_global_claims_total", "how" => "elsewhere").increment(1);
                let target = match claim(&state, job_id, &tenant, &chosen, &order).await {
                    Ok(region) => region,
                    Err(refusal) => return Ok(refusal),
                };
                (region, answer) = create(target, false).await?;
            }
            // Made, but the region did not say the claim is its own (a
            // region older than merged claims, or a retry it answered
            // before its claim check): claim as before, so a later retry
            // through any replica finds where the job went.
            Ok(a) if a.status == StatusCode::CREATED => {
                metrics::counter!("gangway_global_claims_total", "how" => "after").increment(1);
                if let Ok(won) = claim(&state, job_id, &tenant, &chosen, &order).await {
                    if won != region.name {
                        tracing::warn!(%job_id, made_in = %region.name, claimed_for = %won,
                            "a keyed create was made where its claim does not say");
                    }
                }
            }
            // Refused (nothing made, nothing claimed), or unanswered (both
            // or neither: one commit); a retry settles which.
            _ => {}
        }
    }
    // A keyed create its region cannot answer for (gone, fenced, or its
    // copy moved): the job may have been adopted by another region, which
    // then answers for it, as a retry.
    let moved = |a: &Answer| a.status.is_success() && !ownership(&a.body).0;
    let lost = match &answer {
        Err(_) => true,
        Ok(a) => a.status == StatusCode::SERVICE_UNAVAILABLE || moved(a),
    };
    if key.is_some() && lost {
        if let Ok((_, found)) = find_owner(&state, &tenant, job_id).await {
            if !moved(&found) {
                metrics::counter!("gangway_global_creates_total", "status" => "adopted")
                    .increment(1);
                return Ok(relay(Answer {
                    status: StatusCode::CREATED,
                    replayed: true,
                    ..found
                }));
            }
        }
    }
    let answer = answer.map_err(|e| unavailable(&e))?;
    if answer.status == StatusCode::CREATED && !answer.replayed {
        region.note_routed(&spec.gpu_type, spec.gpus.max(0) as u32);
    }
    metrics::counter!("gangway_global_creates_total", "status" => answer.status.as_str().to_string())
        .increment(1);
    Ok(relay(answer))
}

/// For a job that names a capacity reservation or a dedicated cluster and
/// no region: the spec to route by, pinned to the region that has the
/// reservation or the cluster (the job can run nowhere else). One no region
/// has is refused here (`invalid_reservation`, `invalid_cluster`); the
/// region checks the rest.
async fn to_home_region(
    state: &GlobalState,
    tenant: &str,
    spec: &JobSpec,
) -> Result<Option<JobSpec>, ApiError> {
    let home = match (spec.reservation, spec.cluster, spec.region.as_deref()) {
        (_, _, Some(_)) | (None, None, None) => return Ok(None),
        (Some(_), Some(_), None) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::INVALID_CLUSTER,
                "a job runs in a reservation or on a cluster, not both; name one",
            ))
        }
        (Some(id), None, None) => resources::home::<Reservations>(state, tenant, id).await?,
        (None, Some(id), None) => resources::home::<Clusters>(state, tenant, id).await?,
    };
    Ok(Some(JobSpec {
        region: Some(home.name.clone()),
        ..spec.clone()
    }))
}

/// The region a new job should go to (see [`choose`]: a healthy region
/// the tenant may use, not being evacuated), and the regions its claim may
/// be recorded in (those answering, evacuated or not; for a pinned job,
/// its region), in configuration order.
fn pick_region<'a>(
    state: &'a GlobalState,
    tenant: &str,
    spec: &JobSpec,
    job_id: Uuid,
) -> Result<(String, Vec<&'a Region>), ApiError> {
    let allowed = |name: &str| state.tenant_may_use(tenant, name);
    let answering: Vec<&Region> = state
        .regions
        .healthy()
        .into_iter()
        .filter(|r| allowed(&r.name))
        .collect();
    // A region being evacuated takes no new jobs, like a fenced one; it
    // still records claims (so a key claimed there before the evacuation
    // keeps its answer, and one claimed now names where the job went).
    let healthy: Vec<&Region> = (answering.iter())
        .copied()
        .filter(|r| !r.is_evacuating())
        .collect();
    let claims = match spec.region {
        Some(_) => None,
        None => Some(answering),
    };
    let candidates: Vec<&Region> = match spec.region.as_deref() {
        Some(pinned) => {
            let Some(region) = state.regions.get(pinned) else {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    codes::WRONG_REGION,
                    format!("no region named {pinned:?}; GET /v1/regions lists them"),
                ));
            };
            if !allowed(pinned) {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    codes::WRONG_REGION,
                    format!("your tenant may not use region {pinned}; ask an operator, or unpin the job"),
                ));
            }
            if region.is_evacuating() {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!(
                        "region {pinned} is being evacuated by its operators and takes no new \
                         jobs; retry after its fail back, or unpin the job"
                    ),
                ));
            }
            if !healthy.iter().any(|r| r.name == pinned) {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::REGION_UNAVAILABLE,
                    format!("region {pinned} is not answering; retry later or unpin the job"),
                )
                .with_retry_after(super::relay::RETRY_AFTER_S));
            }
            vec![region]
        }
        None => healthy,
    };
    if candidates.is_empty() {
        // Regions that are there but too busy to answer their status in
        // time: the client should come back, as when they shed.
        if (state.regions.list.iter()).any(|r| allowed(&r.name) && r.is_busy()) {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::OVERLOADED,
                "the regions you may use are overloaded; retry after Retry-After \
                 (a create with the same Idempotency-Key)",
            )
            .with_retry_after(2));
        }
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::NO_REGION_AVAILABLE,
            "no region you may use is answering; retry shortly",
        )
        .with_retry_after(super::relay::RETRY_AFTER_S));
    }
    let scored: Vec<Candidate> = candidates
        .iter()
        .map(|r| Candidate {
            name: r.name.as_str(),
            capacity: r.capacity(&spec.gpu_type),
        })
        .collect();
    let chosen = choose(job_id, spec.gpus.max(0) as u32, &scored)
        .expect("candidates is not empty")
        .to_string();
    Ok((chosen, claims.unwrap_or(candidates)))
}

/// The region holding `tenant`'s job `id`, with its answer to a GET.
/// Asks every healthy region at once; a job nobody has is 404, unless a
/// region that might have it is not answering (503, retry).
async fn find_owner<'a>(
    state: &'a GlobalState,
    tenant: &str,
    id: Uuid,
) -> Result<(&'a Region, Answer), ApiError> {
    ask_every_region(
        state,
        Method::GET,
        &format!("/v1/jobs/{id}"),
        Who::Tenant(tenant),
        "job",
    )
    .await
}

/// Get a job
///
/// Its state, spec, region and workers, from the region that owns it.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    operation_id = "get_job",
    tag = "jobs",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The job.", body = Job),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::JobNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn get(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    JobId(id): JobId,
) -> Result<Response, ApiError> {
    let (_, answer) = find_owner(&state, &caller.tenant, id).await?;
    Ok(relay(answer))
}

async fn forward_to_owner(
    state: &GlobalState,
    tenant: &str,
    id: Uuid,
    method: Method,
    suffix: &str,
) -> Result<Response, ApiError> {
    let (region, _) = find_owner(state, tenant, id).await?;
    let answer = state
        .regions
        .call(
            region,
            method,
            &format!("/v1/jobs/{id}/{suffix}"),
            Call {
                tenant: Some(tenant),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}

/// Cancel a job
///
/// Stops its workers; the job moves to `cancelling`, then `cancelled`.
/// Cancelling a job that has ended (or is ending) changes nothing.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    operation_id = "cancel_job",
    tag = "jobs",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The job after the request.", body = Job),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::JobNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn cancel(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    JobId(id): JobId,
) -> Result<Response, ApiError> {
    forward_to_owner(&state, &caller.tenant, id, Method::POST, "cancel").await
}

/// A job's timeline
///
/// Queued, placed, started, worker exits, cancel requests, finished: oldest first.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/events",
    operation_id = "job_events",
    tag = "jobs",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The events.", body = gangway_shared::api::JobEvents),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::JobNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn events(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    JobId(id): JobId,
) -> Result<Response, ApiError> {
    forward_to_owner(&state, &caller.tenant, id, Method::GET, "events").await
}

/// Why a job is where it is
///
/// For a queued job: over quota, no capacity, or placed by the next pass.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/explain",
    operation_id = "explain_job",
    tag = "jobs",
    security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The explanation.", body = gangway_shared::api::Explanation),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 404, response = responses::JobNotFound),
        (status = 429, response = responses::RateLimited),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn explain(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    JobId(id): JobId,
) -> Result<Response, ApiError> {
    forward_to_owner(&state, &caller.tenant, id, Method::GET, "explain").await
}

/// Filters and paging of `GET /v1/jobs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // checked here, read by the regions
pub struct ListParams {
    /// Only jobs in this state.
    #[param(value_type = Option<JobState>)]
    state: Option<String>,
    /// Only jobs with exactly this name.
    name: Option<String>,
    /// Most jobs on one page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Only jobs in this region (the one that has them now).
    region: Option<String>,
}

const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 500;

/// List jobs
///
/// Lists the tenant's jobs across every region (or the one named), newest first, with a cursor
/// that works across regions (creation time, then id). Regions that do not
/// answer are named in `unavailable_regions` rather than failing the call.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    operation_id = "list_jobs",
    tag = "jobs",
    security(("bearer" = [])),
    params(ListParams),
    responses(
        (status = 200, description = "A page of jobs.", body = JobList),
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
pub async fn list(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Query(params): Query<ListParams>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            format!("limit must be between 1 and {MAX_PAGE}"),
        ));
    }
    if let Some(c) = &params.cursor {
        if Cursor::decode(c).is_none() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_QUERY,
                "malformed cursor; pass back the next_cursor of the previous page",
            ));
        }
    }
    if let Some(name) = &params.region {
        if state.regions.get(name).is_none() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!("no region named {name:?}; `gangway regions` lists them"),
            ));
        }
    }
    let tenant = caller.tenant;
    // The regions take the rest of the query as it is; which region is
    // this tier's choice.
    let query = (raw.unwrap_or_default().split('&'))
        .filter(|p| !p.starts_with("region="))
        .collect::<Vec<_>>()
        .join("&");
    let state = &state;
    let only = params.region.as_deref();
    let asks = (state.regions.list.iter())
        .filter(|r| only.is_none_or(|n| n == r.name))
        .map(|r| {
            let (tenant, query) = (&tenant, &query);
            async move {
                let a = state
                    .regions
                    .call(
                        r,
                        Method::GET,
                        "/v1/jobs",
                        Call {
                            tenant: Some(tenant),
                            query: Some(query),
                            ..Default::default()
                        },
                    )
                    .await;
                (r, a)
            }
        });
    let mut jobs: Vec<Job> = Vec::new();
    let mut more = false;
    let mut unavailable_regions = BTreeSet::new();
    for (region, answer) in join_all(asks).await {
        match answer {
            Ok(a) if a.status == StatusCode::OK => match serde_json::from_slice::<JobList>(&a.body)
            {
                Ok(page) => {
                    more |= page.next_cursor.is_some();
                    jobs.extend(page.jobs);
                }
                Err(_) => {
                    unavailable_regions.insert(region.name.clone());
                }
            },
            // The region refused the query itself: the same for all; pass it on.
            Ok(a) if a.status.is_client_error() => return Ok(relay(a)),
            _ => {
                unavailable_regions.insert(region.name.clone());
            }
        }
    }
    // A job that moved between regions (adopted, or handed over by an
    // evacuation or a fail back) has a released copy where it was: only
    // the copy that owns it is listed (not moved away, highest epoch).
    let owner = |j: &Job| (j.moved_to.is_none(), j.epoch);
    let mut best: std::collections::BTreeMap<Uuid, (bool, i32)> = Default::default();
    for j in &jobs {
        let e = best.entry(j.id).or_insert(owner(j));
        *e = (*e).max(owner(j));
    }
    let mut kept = BTreeSet::new();
    jobs.retain(|j| best.get(&j.id) == Some(&owner(j)) && kept.insert(j.id));
    jobs.sort_by_key(|j| std::cmp::Reverse(Cursor::of(j)));
    if jobs.len() > limit as usize {
        jobs.truncate(limit as usize);
        more = true;
    }
    let next_cursor = if more {
        jobs.last().map(|j| Cursor::of(j).encode())
    } else {
        None
    };
    Ok(axum::Json(JobList {
        jobs,
        next_cursor,
        unavailable_regions: unavailable_regions.into_iter().collect(),
    })
    .into_response())
}

/// List regions
///
/// Each region's health and, by GPU type, its capacity, as this replica last
/// saw them.
#[utoipa::path(
    get,
    path = "/v1/regions",
    operation_id = "list_regions",
    tag = "regions",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The regions.", body = RegionList),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn regions(
    State(state): State<GlobalState>,
    _caller: TenantCaller,
) -> axum::Json<RegionList> {
    // Leases and replication lag are the operators' (`/v1/admin/regions`).
    let mut regions = state.regions.infos();
    for status in regions.iter_mut().filter_map(|r| r.status.as_mut()) {
        status.peers.clear();
        status.lease_s = None;
        status.replication_lag_s = None;
    }
    axum::Json(RegionList { regions })
}

/// What a create would do now, without creating anything: the region it
/// would go to, and that region's answer (placement, or why it would wait
/// and until when, or the 429 a create over the tenant's admission limits
/// would get).
#[utoipa::path(
    post,
    path = "/v1/jobs/dry-run",
    operation_id = "dry_run_job",
    tag = "jobs",
    security(("bearer" = [])),
    request_body(content = JobSpec, content_type = "application/json"),
    responses(
        (status = 200, description = "What the submit would do.", body = gangway_shared::api::DryRun),
        (status = 400, description = responses::errors("The body is not JSON.", &[codes::MALFORMED_JSON]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 413, response = responses::PayloadTooLarge),
        (status = 415, response = responses::UnsupportedMediaType),
        (status = 422, description = responses::errors(
            "The spec is invalid or can never run.",
            &[codes::INVALID_SPEC, codes::INVALID_GPUS, codes::INVALID_MIN_GPUS,
              codes::UNKNOWN_GPU_TYPE, codes::EXCEEDS_REGION_CAPACITY,
              codes::UNSATISFIABLE_TOPOLOGY, codes::WRONG_REGION, codes::INVALID_RESERVATION,
              codes::INVALID_CLUSTER]),
            body = ErrorBody),
        (status = 429, response = responses::CreateRefused),
        (status = 503, response = responses::RegionUnavailable),
    )
)]
pub async fn dry_run(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let spec: JobSpec = job_spec(body)?;
    let routed = to_home_region(&state, &caller.tenant, &spec).await?;
    let routing = routed.as_ref().unwrap_or(&spec);
    let (chosen, _) = pick_region(&state, &caller.tenant, routing, Uuid::new_v4())?;
    let region = state
        .regions
        .get(&chosen)
        .expect("pick_region returns a configured region");
    let body = serde_json::to_vec(&spec).expect("a JobSpec serializes");
    let answer = state
        .regions
        .call(
            region,
            Method::POST,
            "/v1/jobs/dry-run",
            Call {
                tenant: Some(&caller.tenant),
                body: Some(body.into()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| unavailable(&e))?;
    Ok(relay(answer))
}
