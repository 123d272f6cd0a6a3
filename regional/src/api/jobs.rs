//! The job endpoints under `/v1`.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gangway_shared::api::{Cursor, JobEvents, JobList, JobSpec, JobState, PeerLease, RegionStatus};
use gangway_shared::client::{CLAIM_ELSEWHERE, CLAIM_HEADER, CLAIM_HELD, CLAIM_HERE};
use gangway_shared::error::codes;
use gangway_shared::http::{idempotency_key, job_spec};
use gangway_shared::ids::job_id_for_key;
use serde::Deserialize;
use tracing::instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{JobId, Json, Query, Tenant};
use super::AppState;
use std::collections::BTreeMap;

use crate::api::validate::check_fits;
use crate::replication::hand_over;
use crate::store::replicas::Intent;
use crate::store::{job_pool, retry_races, ListFilter, NewJob, StoreError, SubmitOutcome};

/// `Retry-After` of a create no buddy region took yet: a beat or two.
const INTENT_RETRY_AFTER_S: u64 = 1;

const DEFAULT_PAGE: i64 = 50;
const MAX_PAGE: i64 = 500;

#[instrument(skip_all, fields(region = %state.store.region(), tenant = %tenant))]
pub async fn submit(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    turn: Option<axum::Extension<super::shed::Turn>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let key = idempotency_key(&headers)?;
    let spec: JobSpec = job_spec(body)?;
    if let Some(pinned) = spec.region.as_deref() {
        if pinned != state.store.region() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                codes::WRONG_REGION,
                format!(
                    "the job is pinned to region {pinned:?}, but this is {:?}",
                    state.store.region()
                ),
            ));
        }
    }
    let id = match &key {
        Some(k) => job_id_for_key(&tenant, k),
        None => Uuid::new_v4(),
    };
    let (fleet_version, held_for) = state.store.before_create(id, key.is_some()).await?;
    let fleet = state.fleet_shape_at(fleet_version).await?;
    fits_its_partition(&state, &tenant, &spec, &fleet).await?;

    if state.peers.is_fenced() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!(
                "region {} is cut off from a majority of regions (fenced) and takes no new \
                 jobs; retry (with the same Idempotency-Key): the global tier sends it to \
                 another region",
                state.store.region()
            ),
        ));
    }
    if state.is_evacuating() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            format!(
                "region {} is being evacuated by its operators and takes no new jobs; retry \
                 (with the same Idempotency-Key): the global tier sends it to another region",
                state.store.region()
            ),
        ));
    }
    // A keyed create of a job whose intent this region holds for its home:
    // the job is that region's (alive or not) and must not be made twice.
    if key.is_some() {
        if let Some(home) = held_for {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::REGION_UNAVAILABLE,
                format!(
                    "this job was accepted by region {home}, which does not answer now; it is \
                     kept, and runs here once that region is declared dead: retry with the \
                     same Idempotency-Key"
                ),
            ));
        }
    }
    let new = NewJob::from_spec(id, &tenant, key.clone(), spec);
    let checked = std::time::Instant::now();
    phase("checks", started, checked);
    // The global tier's claim of the key, made here in the create's commit.
    let claim_here = key.is_some()
        && (headers.get(CLAIM_HEADER)).is_some_and(|v| v.as_bytes() == CLAIM_HERE.as_bytes());
    let submitted = if claim_here {
        state.store.submit_claiming(&new).await
    } else {
        state.store.submit(&new).await.map(|o| (o, false))
    };
    let (outcome, claim_held) = match submitted.inspect_err(|e| {
        let limit = match e {
            StoreError::QueuedJobsLimit { .. } => "queued_jobs",
            StoreError::RequestedGpusLimit { .. } => "requested_gpus",
            _ => return,
        };
        metrics::counter!("gangway_admission_refusals_total", "limit" => limit).increment(1);
    }) {
        Err(StoreError::ClaimedElsewhere) => {
            let mut resp = ApiError::from(StoreError::ClaimedElsewhere).into_response();
            (resp.headers_mut()).insert(CLAIM_HEADER, HeaderValue::from_static(CLAIM_ELSEWHERE));
            return Ok(resp);
        }
        done => done?,
    };
    let (job, replayed) = match outcome {
        SubmitOutcome::Created(job) => {
            metrics::counter!("gangway_jobs_submitted_total").increment(1);
            (job, false)
        }
        SubmitOutcome::Replayed(job) => {
            // A copy that moved to another region says so, so the global
            // tier answers with the owner's.
            let here = state.store.get_job(&tenant, id).await?;
            (if here.moved_to.is_some() { here } else { job }, true)
        }
    };
    let inserted = std::time::Instant::now();
    phase("insert", checked, inserted);
    // Acknowledged only once a buddy region holds the job's intent: a new
    // job's goes with the other creates waiting for the same buddy (group
    // commit, `replication::intents`); a retried one's is read back.
    if state.store.replicating() && (!replayed || state.store.awaits_buddy(id).await?) {
        let intent = if replayed {
            state.store.intent_of(id).await?
        } else {
            Intent {
                job_id: id,
                home: state.store.region().to_string(),
                tenant: tenant.clone(),
                idempotency_key: key.clone(),
                spec: new.spec.clone(),
                created_at: job.created_at,
                // A new job's first epoch (the column's default).
                epoch: 1,
            }
        };
        // The wait holds no database connection: the turn goes back.
        if let Some(axum::Extension(turn)) = &turn {
            turn.give_back();
        }
        let held = hand_over(state.link(), intent).await;
        if !matches!(held, Ok(Some(_))) {
            if key.is_none() {
                // Never acknowledged, so never run: a client retrying
                // without a key must not find it running twice.
                state.store.drop_unacknowledged(id).await?;
            }
            return Err(match held {
                // The region's own database went away under the create (a
                // failover): unavailable, as any request would be now.
                Err(e) if e.is_unavailable() => ApiError::from(e),
                refused => {
                    if let Err(e) = refused {
                        tracing::warn!(error = %e, job_id = %id, "marking a new job's intent held failed");
                    }
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        codes::REGION_UNAVAILABLE,
                        format!(
                            "no other region took this job's intent, so it is not accepted \
                             yet; retry in {INTENT_RETRY_AFTER_S} s with the same Idempotency-Key"
                        ),
                    )
                    .with_retry_after(INTENT_RETRY_AFTER_S)
                }
            });
        }
    }
    phase("intent", inserted, std::time::Instant::now());
    if !replayed {
        state.wake_scheduler_for_new_jobs();
    }
    let mut resp = (StatusCode::CREATED, axum::Json(job)).into_response();
    if replayed {
        resp.headers_mut().insert(
            "idempotent-replayed",
            "true".parse().expect("static header"),
        );
    }
    if claim_held {
        (resp.headers_mut()).insert(CLAIM_HEADER, HeaderValue::from_static(CLAIM_HELD));
    }
    Ok(resp)
}

/// Time a create spent in one of its phases (`gangway_submit_phase_seconds`:
/// `checks` before the insert, `insert`, and `intent`, the wait for a
/// buddy to hold it; docs/benchmarks.md "Global tier").
fn phase(name: &'static str, from: std::time::Instant, to: std::time::Instant) {
    metrics::histogram!("gangway_submit_phase_seconds", "phase" => name)
        .record((to - from).as_secs_f64());
}

/// Whether the job could ever fit where it would run: its GPU type's
/// shared pool, or (checked first, so its errors say so) the tenant's
/// dedicated cluster it names.
async fn fits_its_partition(
    state: &AppState,
    tenant: &str,
    spec: &JobSpec,
    fleet: &BTreeMap<String, Vec<crate::store::FleetShape>>,
) -> Result<(), ApiError> {
    if spec.cluster.is_some() {
        state.store.check_job_cluster(tenant, spec).await?;
    }
    let shape = fleet.get(&job_pool(spec)).map(Vec::as_slice).unwrap_or(&[]);
    match (check_fits(spec, shape), spec.cluster) {
        (Err(e), Some(c)) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_CLUSTER,
            format!(
                "the job cannot fit on cluster {c} as it is now: {}",
                e.message
            ),
        )),
        (r, _) => Ok(r?),
    }
}

pub async fn get(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    JobId(id): JobId,
) -> Result<axum::Json<gangway_shared::api::Job>, ApiError> {
    Ok(axum::Json(state.store.get_job(&tenant, id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    state: Option<String>,
    name: Option<String>,
    limit: Option<i64>,
    cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<JobList>, ApiError> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m);
    let job_state = params
        .state
        .as_deref()
        .map(str::parse::<JobState>)
        .transpose()
        .map_err(bad)?;
    let limit = params.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let after = params
        .cursor
        .as_deref()
        .map(|c| Cursor::decode(c).ok_or_else(|| bad("malformed cursor".into())))
        .transpose()?;
    let filter = ListFilter {
        state: job_state,
        name: params.name,
        after,
        limit,
    };
    let (jobs, next) = state.store.list_jobs(&tenant, &filter).await?;
    Ok(axum::Json(JobList {
        jobs,
        next_cursor: next.map(|c| c.encode()),
        unavailable_regions: Vec::new(),
    }))
}

pub async fn cancel(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    JobId(id): JobId,
) -> Result<axum::Json<gangway_shared::api::Job>, ApiError> {
    let job = retry_races(|| state.store.cancel_job(&tenant, id))
        .await
        .map_err(|e| match e {
            // Being handed to another region this moment: retry, and the
            // global tier finds it there.
            StoreError::Conflict { code, message } if code == codes::REGION_UNAVAILABLE => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
            }
            e => e.into(),
        })?;
    // Its agents stop its workers now, not at their next sync.
    (state.store.agent_wakes()).wake(job.workers.iter().filter_map(|w| w.node.as_deref()));
    state.wake_scheduler();
    Ok(axum::Json(job))
}

pub async fn events(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    JobId(id): JobId,
) -> Result<axum::Json<JobEvents>, ApiError> {
    let events = state.store.job_events(&tenant, id).await?;
    Ok(axum::Json(JobEvents { job_id: id, events }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    rank: Option<u32>,
    attempt: Option<i32>,
    /// A `LogCursor`: this region's entry is where to read on from.
    #[serde(default)]
    after: String,
}

/// `GET /v1/jobs/{id}/logs`: the job's output after `after`.
pub async fn logs(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    JobId(id): JobId,
    Query(q): Query<LogsQuery>,
) -> Result<axum::Json<gangway_shared::api::JobLogs>, ApiError> {
    let after: gangway_shared::api::LogCursor = q.after.parse().map_err(|e: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            format!("after: {e}"),
        )
    })?;
    let after = after.get(state.store.region());
    let logs = (state.store)
        .job_logs(&tenant, id, q.rank, q.attempt, after)
        .await?;
    Ok(axum::Json(logs))
}

pub async fn region(State(state): State<AppState>) -> Result<axum::Json<RegionStatus>, ApiError> {
    // One read at a time, and one per STATUS_TTL (on 10,000 GPUs the read
    // covers every node). A stale answer is given at once while a read
    // runs in the background: a busy region's status (what the global
    // tier polls every second to tell a live region from a dead one) never
    // waits for a database connection.
    let cache = state.status.clone();
    let (capacity, queued, running, generation) = match cache.fresh() {
        Some((true, c)) => c,
        Some((false, c)) => {
            // Unless a read is under way already (it re-checks, so two
            // callers racing here cost one read).
            if !cache.is_reading() {
                let (cache, state) = (cache.clone(), state.clone());
                tokio::spawn(async move {
                    if let Err(e) = cache.refresh(&state).await {
                        tracing::debug!(error = %e, "cannot read the region's capacity");
                    }
                });
            }
            c
        }
        None => cache.refresh(&state).await?,
    };
    let (leases, replication_lag_s) = state.peers.lease_view();
    Ok(axum::Json(RegionStatus {
        region: state.store.region().to_string(),
        leader: state.is_leader(),
        generation,
        queued_jobs: queued,
        running_jobs: running,
        capacity,
        fenced: state.peers.is_fenced(),
        evacuating: state.is_evacuating(),
        peers: leases
            .into_iter()
            .map(|(region, age)| PeerLease {
                region,
                round_trip_age_s: age,
            })
            .collect(),
        lease_s: (!state.peers.config.peers.is_empty())
            .then(|| state.peers.config.lease.as_secs_f64()),
        replication_lag_s,
    }))
}

pub async fn explain(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    JobId(id): JobId,
) -> Result<axum::Json<gangway_shared::api::Explanation>, ApiError> {
    let e = crate::scheduling::explain(&state.store, &tenant, id, &state.config.planning()).await?;
    Ok(axum::Json(e))
}

#[derive(Debug, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub job_id: Uuid,
    pub tenant: String,
    pub region: String,
}

/// The global tier claims which region a keyed create goes to.
pub async fn claim(
    State(state): State<AppState>,
    Json(req): Json<ClaimRequest>,
) -> Result<axum::Json<ClaimRequest>, ApiError> {
    if !gangway_shared::ids::valid_tenant(&req.tenant) || req.region.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            "a claim needs a valid tenant and a region",
        ));
    }
    let region = state
        .store
        .claim(req.job_id, &req.tenant, &req.region)
        .await?;
    Ok(axum::Json(ClaimRequest { region, ..req }))
}

/// `POST /v1/jobs/dry-run`: what a submit would do, without creating it.
pub async fn dry_run(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
    Json(body): Json<serde_json::Value>,
) -> Result<axum::Json<gangway_shared::api::DryRun>, ApiError> {
    let spec: JobSpec = job_spec(body)?;
    let fleet = state.fleet_shape().await?;
    fits_its_partition(&state, &tenant, &spec, &fleet).await?;
    // A submit over the tenant's limits, or naming a reservation it cannot
    // run in, would be refused: say so the same way.
    state
        .store
        .check_admission(
            &tenant,
            if spec.reservation.is_some() || spec.cluster.is_some() {
                0
            } else {
                spec.gpus.max(0) as u64
            },
        )
        .await?;
    state.store.check_job_reservation(&tenant, &spec).await?;
    let d =
        crate::scheduling::dry_run(&state.store, &tenant, &spec, &state.config.planning()).await?;
    Ok(axum::Json(d))
}
