//! Jobs: submit, read, list, cancel, and the job-level state machine that
//! worker exits drive.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::api::{
    Cursor, Job, JobEvent, JobMode, JobSpec, JobState, TopologyLevel, Worker, WorkerState,
};
use serde_json::json;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Transaction};
use uuid::Uuid;

use super::rows::{event_from_row, job_from_row, worker_from_row, JOB_COLUMNS, WORKER_COLUMNS};
use super::{Result, Store, StoreError};

/// A validated job, ready to store.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub id: Uuid,
    pub tenant: String,
    pub idempotency_key: Option<String>,
    /// The spec as accepted (returned verbatim, compared on retries).
    pub spec: JobSpec,
    pub name: String,
    pub mode: JobMode,
    pub gpu_type: String,
    pub gpus: i32,
    pub gpus_per_worker: i32,
    pub workers: i32,
    pub priority: i16,
    pub required: TopologyLevel,
    pub preferred: TopologyLevel,
}

impl NewJob {
    /// The job a validated `spec` makes, with this id and key.
    pub fn from_spec(
        id: Uuid,
        tenant: &str,
        idempotency_key: Option<String>,
        spec: JobSpec,
    ) -> NewJob {
        NewJob {
            id,
            tenant: tenant.to_string(),
            idempotency_key,
            name: spec.name.clone(),
            mode: spec.mode,
            gpu_type: spec.gpu_type.clone(),
            gpus: spec.gpus as i32,
            gpus_per_worker: spec.gpus_per_worker() as i32,
            workers: spec.workers() as i32,
            priority: spec.priority.rank() as i16,
            required: spec.topology.required(),
            preferred: spec.topology.preferred(),
            spec,
        }
    }
}

#[derive(Clone, Debug)]
pub enum SubmitOutcome {
    Created(Job),
    /// A retry of an earlier create with the same key and spec.
    Replayed(Job),
}

#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub state: Option<JobState>,
    /// Only jobs with exactly this name.
    pub name: Option<String>,
    /// Only jobs after this position in the newest-first order.
    pub after: Option<Cursor>,
    pub limit: i64,
}

fn mode_str(mode: JobMode) -> &'static str {
    match mode {
        JobMode::Gang => "gang",
        JobMode::Array => "array",
    }
}

impl Store {
    /// The region's unfinished work by tenant and GPU type: jobs and GPUs
    /// queued and placed, and the oldest queued job's submission (the
    /// `jobs_active` index: finished jobs are not read).
    pub async fn queue_summary(&self) -> Result<Vec<gangway_shared::api::QueueRow>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT tenant, gpu_type,
                        count(*) FILTER (WHERE state = 'queued'),
                        coalesce(sum(gpus) FILTER (WHERE state = 'queued'), 0)::bigint,
                        count(*) FILTER (WHERE state <> 'queued'),
                        coalesce(sum(gpus) FILTER (WHERE state <> 'queued'), 0)::bigint,
                        min(created_at) FILTER (WHERE state = 'queued')
                 FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')
                 GROUP BY tenant, gpu_type ORDER BY tenant, gpu_type",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| gangway_shared::api::QueueRow {
                tenant: r.get(0),
                gpu_type: r.get(1),
                queued_jobs: r.get::<_, i64>(2) as u64,
                queued_gpus: r.get::<_, i64>(3) as u64,
                active_jobs: r.get::<_, i64>(4) as u64,
                active_gpus: r.get::<_, i64>(5) as u64,
                oldest_queued_at: r.get(6),
            })
            .collect())
    }

    /// Stores a new job with its workers and its first event, or returns the
    /// job an earlier create with the same idempotency key made. A tenant
    /// with admission limits (`limits.rs`) is refused with
    /// [`StoreError::QueuedJobsLimit`] or [`StoreError::RequestedGpusLimit`]
    /// when the job would put it over one, and nothing is written; a retry
    /// of a create it already accepted still gets that job back.
    ///
    /// A job naming a capacity reservation or a dedicated cluster is
    /// checked against it first ([`Store::check_job_reservation`],
    /// [`Store::check_job_cluster`]; [`StoreError::Invalid`] when it cannot
    /// run there); a job naming neither takes the one-statement path alone.
    #[tracing::instrument(level = "debug", target = "gangway::db", name = "db", skip_all, fields(db.system = "postgresql", db.operation = "submit"))]
    pub async fn submit(&self, job: &NewJob) -> Result<SubmitOutcome> {
        Ok(self.submit_checked(job, true, false).await?.0)
    }

    /// [`Store::submit`] of a keyed create that also records the key's
    /// claim for this region (`idempotency_claims`, as [`Store::claim`]
    /// does), in the same statement and commit: the global tier asks for it
    /// when this region is both the one the job goes to and the first of
    /// the job's claim order, saving a round trip and a commit. The job is
    /// made only if the claim is this region's: one another region's claim
    /// holds (committed before, or concurrently) is
    /// [`StoreError::ClaimedElsewhere`], and nothing is written. Also
    /// returns whether the claim was checked (false only for a retry
    /// answered before the statement, which a caller settles with a claim
    /// of its own).
    pub async fn submit_claiming(&self, job: &NewJob) -> Result<(SubmitOutcome, bool)> {
        self.submit_checked(job, true, true).await
    }

    /// [`Store::submit`] without the tenant's admission limits: a job
    /// another region accepted and this one adopts (`replicas.rs`).
    pub(super) async fn submit_adopted(&self, job: &NewJob) -> Result<SubmitOutcome> {
        Ok(self.submit_checked(job, false, false).await?.0)
    }

    async fn submit_checked(
        &self,
        job: &NewJob,
        limits: bool,
        claim: bool,
    ) -> Result<(SubmitOutcome, bool)> {
        let spec = serde_json::to_value(&job.spec).expect("a JobSpec always serializes");
        let mut conn = self.conn().await?;
        // A job naming a reservation or a cluster must be able to run in it.
        let check = match (job.spec.cluster, job.spec.reservation) {
            (Some(cluster), _) => {
                let (region, tenant) = (self.region(), &job.tenant);
                super::clusters::check_job_cluster(&**conn, region, tenant, &job.spec, cluster)
                    .await
            }
            (None, Some(reservation)) => {
                super::reservations::check_job_reservation(
                    &**conn,
                    self.region(),
                    &job.tenant,
                    &job.spec,
                    reservation,
                )
                .await
            }
            (None, None) => Ok(()),
        };
        if let Err(e) = check {
            // A retry of a create accepted before the reservation or
            // cluster went away still gets its job.
            if job.idempotency_key.is_some() {
                if let Some(existing) = job_row(&**conn, &job.tenant, job.id).await? {
                    return Ok((self.replay(job, &spec, existing)?, false));
                }
            }
            return Err(e);
        }
        // One statement, so one round trip and one implicit transaction: the
        // key's lock, the job, its workers and its first event. The lock is
        // held until the statement ends; a concurrent request with the same
        // key is told to retry rather than left to wait. Foreign keys are
        // checked at the end of the statement, after the job row exists.
        //
        // A tenant with a limits row gets nothing inserted here (`lim`), only
        // that answer: its submit is done again in a transaction that checks
        // the limits first, with `$20` saying they were checked.
        //
        // With `$24` the key's claim for this region (`$25`) is recorded
        // too (`cl`), and the job is made only if the claim is ours: just
        // inserted, or one committed before that names us. A claim for
        // another region, or one committed by a concurrent claimer while
        // the insert waited for it (not in this statement's snapshot),
        // makes nothing (`claimed` false).
        let submit = conn
            .prepare_cached(
                "WITH lim AS MATERIALIZED (
                     SELECT NOT $20::bool
                            AND EXISTS (SELECT 1 FROM tenant_limits WHERE tenant = $2) AS limited),
                 lock AS MATERIALIZED (
                     SELECT CASE WHEN $15 THEN pg_try_advisory_xact_lock($16) ELSE true END AS got),
                 cl AS (
                     INSERT INTO idempotency_claims (job_id, tenant, region)
                     SELECT $1::uuid, $2::text, $25::text FROM lock, lim
                     WHERE $24::bool AND lock.got AND NOT lim.limited
                     ON CONFLICT (job_id) DO NOTHING
                     RETURNING region),
                 claimed AS MATERIALIZED (
                     SELECT NOT $24::bool
                            OR EXISTS (SELECT 1 FROM cl)
                            OR EXISTS (SELECT 1 FROM idempotency_claims
                                       WHERE job_id = $1 AND tenant = $2 AND region = $25)
                            AS ok),
                 job AS (
                     INSERT INTO jobs (job_id, tenant, idempotency_key, spec, name, mode, gpu_type,
                                       gpus, gpus_per_worker, workers, priority,
                                       required_level, preferred_level, estimated_duration_s,
                                       min_workers, reservation_id, cluster_id)
                     SELECT $1::uuid, $2::text, $3::text, $4::jsonb, $5::text, $6::text::job_mode,
                            $7::text, $8::int, $9::int, $10::int, $11::smallint,
                            $12::text::topology_level, $13::text::topology_level, $14::bigint,
                            $19::int, $21::uuid, $22::uuid
                     FROM lock, lim, claimed WHERE lock.got AND NOT lim.limited AND claimed.ok
                     ON CONFLICT DO NOTHING
                     RETURNING job_id, created_at),
                 aw AS (
                     INSERT INTO jobs_awaiting_buddy (job_id, created_at)
                     SELECT job_id, created_at FROM job WHERE $23::bool),
                 w AS (
                     INSERT INTO workers (job_id, rank)
                     SELECT job.job_id, r FROM job, generate_series(0, $10::int - 1) AS r),
                 e AS (
                     INSERT INTO job_events (job_id, kind, message, detail)
                     SELECT job.job_id, 'queued', $17::text, $18::jsonb FROM job)
                 SELECT (SELECT got FROM lock), (SELECT created_at FROM job),
                        (SELECT limited FROM lim), (SELECT ok FROM claimed)",
            )
            .await?;
        let message = format!(
            "queued: {} × {} GPU worker(s) of {} ({} GPUs, {})",
            job.workers,
            job.gpus_per_worker,
            job.gpu_type,
            job.gpus,
            mode_str(job.mode)
        );
        // An elastic gang's minimum comes from its spec (validated).
        let min_workers: Option<i32> = match job.mode {
            JobMode::Gang => job.spec.min_workers().map(|m| m as i32),
            JobMode::Array => None,
        };
        let message = match min_workers {
            Some(m) if m < job.workers => format!(
                "{message}; elastic: starts with {m} to {} worker(s)",
                job.workers
            ),
            _ => message,
        };
        let mut detail =
            json!({"gpus": job.gpus, "gpu_type": job.gpu_type, "workers": job.workers});
        if let Some(m) = min_workers {
            detail["min_workers"] = json!(m);
        }
        let keyed = job.idempotency_key.is_some();
        let lock_key = key_lock(job.id);
        // `$20`: the limits were checked (or do not apply).
        let (unchecked, checked) = (!limits, true);
        let replicating = self.replicating;
        let here = self.region();
        let mut params: [&(dyn ToSql + Sync); 25] = [
            &job.id,
            &job.tenant,
            &job.idempotency_key,
            &spec,
            &job.name,
            &mode_str(job.mode),
            &job.gpu_type,
            &job.gpus,
            &job.gpus_per_worker,
            &job.workers,
            &job.priority,
            &job.required.as_str(),
            &job.preferred.as_str(),
            &job.spec.estimated_duration_s,
            &keyed,
            &lock_key,
            &message,
            &detail,
            &min_workers,
            &unchecked,
            &job.spec.reservation,
            &job.spec.cluster,
            &replicating,
            &claim,
            &here,
        ];
        let row = conn.query_one(&submit, &params).await?;
        if row.get::<_, bool>(2) {
            params[19] = &checked;
            return self
                .submit_limited(&mut conn, &submit, &params, job, &spec)
                .await
                .map(|(o, ran)| (o, claim && ran));
        }
        let outcome = self.submit_outcome(&**conn, &row, job, &spec).await?;
        Ok((outcome, claim))
    }

    /// A limited tenant's submit: in one transaction, the key's lock (a
    /// concurrent request with the key is told to retry), the job an
    /// earlier create with the key made (returned even at the limit), the
    /// tenant's lock and the limits' check, then the same insert. Also
    /// returns whether the insert ran (not for a retry answered first).
    async fn submit_limited(
        &self,
        conn: &mut deadpool_postgres::Object,
        submit: &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
        job: &NewJob,
        spec: &serde_json::Value,
    ) -> Result<(SubmitOutcome, bool)> {
        let tx = conn.transaction().await?;
        if job.idempotency_key.is_some() {
            let got: bool = tx
                .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&key_lock(job.id)])
                .await?
                .get(0);
            if !got {
                return Err(StoreError::InFlight);
            }
            if let Some(existing) = job_row(&*tx, &job.tenant, job.id).await? {
                return Ok((self.replay(job, spec, existing)?, false));
            }
        }
        // A job in a capacity reservation or on a dedicated cluster asks
        // nothing of the shared pool.
        let asks = if job.spec.reservation.is_some() || job.spec.cluster.is_some() {
            0
        } else {
            job.gpus.max(0) as u64
        };
        super::limits::admit_in_tx(&tx, self.region(), &job.tenant, asks).await?;
        // The key's lock is held already (advisory locks are re-entrant).
        let row = tx.query_one(submit, params).await?;
        let outcome = self.submit_outcome(&*tx, &row, job, spec).await?;
        tx.commit().await?;
        Ok((outcome, true))
    }

    /// What the submit statement's answer (`got`, `created_at`) means.
    async fn submit_outcome<C: GenericClient + Sync>(
        &self,
        client: &C,
        row: &tokio_postgres::Row,
        job: &NewJob,
        spec: &serde_json::Value,
    ) -> Result<SubmitOutcome> {
        if !row.get::<_, bool>(0) {
            return Err(StoreError::InFlight);
        }
        if !row.get::<_, bool>(3) {
            return Err(StoreError::ClaimedElsewhere);
        }
        let Some(created_at) = row.get::<_, Option<DateTime<Utc>>>(1) else {
            // The id is derived from (tenant, key), so a conflict is a retry
            // of the same key, or (astronomically unlikely) a collision.
            let existing = job_row(client, &job.tenant, job.id)
                .await?
                .ok_or(StoreError::NotFound)?;
            return self.replay(job, spec, existing);
        };
        // Everything a new job's JSON holds is known here: no read back.
        Ok(SubmitOutcome::Created(self.as_created(job, created_at)))
    }

    /// The answer to a create whose id is taken by `existing`: the same
    /// answer as the first time (Stripe's rule) when it is a retry with the
    /// same key and spec — the job as it was created; its current state is
    /// a GET away.
    fn replay(
        &self,
        job: &NewJob,
        spec: &serde_json::Value,
        existing: (Option<String>, serde_json::Value, DateTime<Utc>),
    ) -> Result<SubmitOutcome> {
        let same_key = existing.0.as_deref() == job.idempotency_key.as_deref();
        if same_key && existing.1 == *spec {
            return Ok(SubmitOutcome::Replayed(self.as_created(job, existing.2)));
        }
        Err(StoreError::KeyReused)
    }

    /// The job as its create answered it.
    fn as_created(&self, job: &NewJob, created_at: DateTime<Utc>) -> Job {
        Job {
            id: job.id,
            tenant: job.tenant.clone(),
            region: self.region().to_string(),
            name: job.name.clone(),
            state: JobState::Queued,
            spec: job.spec.clone(),
            created_at,
            started_at: None,
            finished_at: None,
            reason: None,
            workers: (0..job.workers as u32)
                .map(|rank| Worker {
                    rank,
                    state: WorkerState::Pending,
                    node: None,
                    gpus: Vec::new(),
                    exit_code: None,
                })
                .collect(),
            run_workers: None,
            preemptions: 0,
            node_moves: 0,
            allocated_gpu_s: 0.0,
            lost_gpu_s: 0.0,
            goodput: None,
            restore_from: None,
            epoch: 1,
            moved_to: None,
            adopted_from: None,
            checkpoint: None,
        }
    }

    /// A tenant's job. Another tenant's job is [`StoreError::NotFound`].
    #[tracing::instrument(level = "debug", target = "gangway::db", name = "db", skip_all, fields(db.system = "postgresql", db.operation = "get_job"))]
    pub async fn get_job(&self, tenant: &str, id: Uuid) -> Result<Job> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                &format!("SELECT {JOB_COLUMNS} FROM jobs j WHERE j.job_id = $1 AND j.tenant = $2"),
                &[&id, &tenant],
            )
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut workers = self.load_workers(&conn, &[id]).await?;
        Ok(job_from_row(
            &row,
            self.region(),
            workers.remove(&id).unwrap_or_default(),
        ))
    }

    async fn load_workers(
        &self,
        conn: &tokio_postgres::Client,
        ids: &[Uuid],
    ) -> Result<BTreeMap<Uuid, Vec<Worker>>> {
        let rows = conn
            .query(
                &format!(
                    "SELECT {WORKER_COLUMNS} FROM workers w WHERE w.job_id = ANY($1)
                     ORDER BY w.job_id, w.rank"
                ),
                &[&ids],
            )
            .await?;
        let mut out: BTreeMap<Uuid, Vec<Worker>> = BTreeMap::new();
        for row in &rows {
            let (job, worker) = worker_from_row(row);
            out.entry(job).or_default().push(worker);
        }
        Ok(out)
    }

    /// A page of a tenant's jobs, newest first (creation time, then id), and
    /// the cursor of the next page when there may be more.
    #[tracing::instrument(level = "debug", target = "gangway::db", name = "db", skip_all, fields(db.system = "postgresql", db.operation = "list_jobs"))]
    pub async fn list_jobs(
        &self,
        tenant: &str,
        filter: &ListFilter,
    ) -> Result<(Vec<Job>, Option<Cursor>)> {
        let conn = self.conn().await?;
        let state = filter.state.map(|s| s.as_str());
        let after_at = filter.after.map(|c| c.created_at);
        let after_id = filter.after.map(|c| c.id);
        let rows = conn
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS} FROM jobs j
                     WHERE j.tenant = $1
                       AND ($2::text IS NULL OR j.state = $2::text::job_state)
                       AND ($3::text IS NULL OR j.name = $3)
                       AND ($4::timestamptz IS NULL OR (j.created_at, j.job_id) < ($4, $5))
                     ORDER BY j.created_at DESC, j.job_id DESC LIMIT $6"
                ),
                &[
                    &tenant,
                    &state,
                    &filter.name,
                    &after_at,
                    &after_id,
                    &filter.limit,
                ],
            )
            .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.get("job_id")).collect();
        let mut workers = self.load_workers(&conn, &ids).await?;
        let jobs: Vec<Job> = rows
            .iter()
            .map(|r| {
                let id: Uuid = r.get("job_id");
                job_from_row(r, self.region(), workers.remove(&id).unwrap_or_default())
            })
            .collect();
        let next = if jobs.len() as i64 == filter.limit {
            jobs.last().map(Cursor::of)
        } else {
            None
        };
        Ok((jobs, next))
    }

    #[tracing::instrument(level = "debug", target = "gangway::db", name = "db", skip_all, fields(db.system = "postgresql", db.operation = "job_events"))]
    pub async fn job_events(&self, tenant: &str, id: Uuid) -> Result<Vec<JobEvent>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT e.event_id, e.at, e.kind, e.message, e.detail
                 FROM job_events e JOIN jobs j USING (job_id)
                 WHERE e.job_id = $1 AND j.tenant = $2 ORDER BY e.event_id",
                &[&id, &tenant],
            )
            .await?;
        if rows.is_empty() {
            // Every stored job has its `queued` event: no rows means no job.
            return Err(StoreError::NotFound);
        }
        Ok(rows.iter().map(event_from_row).collect())
    }

    /// Asks for a job to stop. Queued work is cancelled at once; placed
    /// workers are told to stop and the job ends when their agents report
    /// them gone (so their GPUs are free for real). Cancelling a finished
    /// job changes nothing.
    pub async fn cancel_job(&self, tenant: &str, id: Uuid) -> Result<Job> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT state::text FROM jobs WHERE job_id = $1 AND tenant = $2 FOR UPDATE",
                &[&id, &tenant],
            )
            .await?
            .ok_or(StoreError::NotFound)?;
        let state: String = row.get(0);
        // A job past the point of no return of a planned handover (its move
        // is recorded here, and goes to a majority) is the other region's
        // in a moment: the cancel must reach that copy, not this one.
        let moving = tx
            .query_opt(
                "SELECT m.to_region FROM jobs j JOIN job_moves m USING (job_id)
                 WHERE j.job_id = $1 AND j.handover_to IS NOT NULL AND j.moved_to IS NULL
                   AND m.epoch > j.epoch",
                &[&id],
            )
            .await?;
        if let Some(to) = moving {
            let to: String = to.get(0);
            return Err(StoreError::Conflict {
                code: gangway_shared::error::codes::REGION_UNAVAILABLE,
                message: format!(
                    "the job is being handed over to region {to} right now; retry in a moment \
                     (it is then cancelled there)"
                ),
            });
        }
        if !matches!(
            state.as_str(),
            "succeeded" | "failed" | "cancelled" | "cancelling"
        ) {
            cancel_in_tx(&tx, id, "cancel requested").await?;
        }
        tx.commit().await?;
        drop(conn);
        self.get_job(tenant, id).await
    }
}

/// Cancels an unfinished job (`why` opens its event): workers not placed
/// yet are cancelled, running ones told to stop. The caller holds the
/// job's lock and has checked it is not finished or cancelling.
pub(super) async fn cancel_in_tx(tx: &Transaction<'_>, id: Uuid, why: &str) -> Result<()> {
    tx.execute(
        "UPDATE jobs SET state = 'cancelling', reason = 'cancelled' WHERE job_id = $1",
        &[&id],
    )
    .await?;
    tx.execute(
        "UPDATE workers SET state = 'cancelled', finished_at = now(),
                message = 'cancelled before it was placed'
         WHERE job_id = $1 AND state = 'pending'",
        &[&id],
    )
    .await?;
    let stopping = tx
        .execute(
            "UPDATE workers SET state = 'stopping'
             WHERE job_id = $1 AND state IN ('assigned', 'running', 'checkpointing')",
            &[&id],
        )
        .await?;
    insert_event(
        tx,
        id,
        "cancel_requested",
        &format!("{why}; stopping {stopping} worker(s)"),
        json!({"stopping_workers": stopping}),
    )
    .await?;
    settle_job(tx, id).await
}

/// (idempotency_key, spec, created_at) of a tenant's job, if it has it.
async fn job_row<C: GenericClient + Sync>(
    client: &C,
    tenant: &str,
    id: Uuid,
) -> Result<Option<(Option<String>, serde_json::Value, DateTime<Utc>)>> {
    let row = client
        .query_opt(
            "SELECT idempotency_key, spec, created_at FROM jobs
             WHERE job_id = $1 AND tenant = $2",
            &[&id, &tenant],
        )
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// The advisory lock key of a keyed create (from its derived job id).
fn key_lock(job_id: Uuid) -> i64 {
    let b = job_id.as_bytes();
    i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Locks jobs' rows in id order (the one lock order; see `agents.rs`).
pub(super) async fn lock_jobs(tx: &Transaction<'_>, ids: &[Uuid]) -> Result<()> {
    if !ids.is_empty() {
        // Sent with its parameter's type: one round trip, not two
        // (`apply.rs`, `apply_plan`, says why that matters).
        tx.query_typed(
            "SELECT 1 FROM jobs WHERE job_id = ANY($1) ORDER BY job_id FOR UPDATE",
            &[(&ids, Type::UUID_ARRAY)],
        )
        .await?;
    }
    Ok(())
}

pub(super) async fn insert_event(
    tx: &Transaction<'_>,
    job_id: Uuid,
    kind: &str,
    message: &str,
    detail: serde_json::Value,
) -> Result<()> {
    tx.execute_typed(
        "INSERT INTO job_events (job_id, kind, message, detail) VALUES ($1, $2, $3, $4)",
        &[
            (&job_id, Type::UUID),
            (&kind, Type::TEXT),
            (&message, Type::TEXT),
            (&detail, Type::JSONB),
        ],
    )
    .await?;
    Ok(())
}

/// [`settle_job`] for many jobs at once (an agent's sync touches hundreds
/// in a burst): one read of their workers' counts, and the common moves —
/// starting → running, and a run's end (succeeded, failed, cancelled) —
/// written in a statement each with their events; a job in any other case
/// (being preempted, a gang with a failed worker) is settled on its own.
pub(super) async fn settle_jobs(tx: &Transaction<'_>, jobs: &[Uuid]) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let rows = tx
        .query_typed(
            "SELECT j.job_id, j.state::text AS state, j.mode::text AS mode, j.reason,
                    count(*) FILTER (WHERE w.state = 'pending')    AS pending,
                    count(*) FILTER (WHERE w.state = 'assigned')   AS assigned,
                    count(*) FILTER (WHERE w.state = 'running')    AS running,
                    count(*) FILTER (WHERE w.state = 'stopping')   AS stopping,
                    count(*) FILTER (WHERE w.state = 'checkpointing') AS checkpointing,
                    count(*) FILTER (WHERE w.state = 'succeeded')  AS succeeded,
                    count(*) FILTER (WHERE w.state = 'failed')     AS failed,
                    count(*) AS total
             FROM jobs j JOIN workers w USING (job_id)
             WHERE j.job_id = ANY($1)
               AND (j.run_workers IS NULL OR w.rank < j.run_workers)
             GROUP BY j.job_id",
            &[(&jobs, Type::UUID_ARRAY)],
        )
        .await?;
    let mut one_by_one = Vec::new();
    let (mut run_ids, mut late_ids, mut unheld) = (Vec::new(), Vec::new(), Vec::new());
    let (mut end_ids, mut end_states, mut end_reasons) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ev_jobs, mut ev_kinds, mut ev_messages, mut ev_details) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in &rows {
        let job: Uuid = row.get("job_id");
        let state: String = row.get("state");
        let mode: String = row.get("mode");
        let reason: Option<String> = row.get("reason");
        let n = |c: &str| row.get::<_, i64>(c);
        let (running, succeeded, failed, total) =
            (n("running"), n("succeeded"), n("failed"), n("total"));
        let active = n("pending") + n("assigned") + running + n("stopping") + n("checkpointing");
        if matches!(state.as_str(), "succeeded" | "failed" | "cancelled") {
            continue;
        }
        // Asked to stop, but every worker had already ended by itself,
        // successfully (the request crossed the exits on their way): the
        // job is done, not requeued to run again.
        let done_before_stop = state == "preempting" && active == 0 && succeeded == total;
        if (state == "preempting" && !done_before_stop)
            || (mode == "gang" && failed > 0 && reason.is_none() && state != "cancelling")
        {
            one_by_one.push(job);
            continue;
        }
        if active == 0 {
            if state == "starting" && succeeded + failed > 0 {
                late_ids.push(job);
                ev_jobs.push(job);
                ev_kinds.push("started");
                ev_messages
                    .push("started (its workers ended before the agent's next report)".to_string());
                ev_details.push(json!({"running": 0}));
            }
            let (final_state, final_reason) = if state == "cancelling" {
                ("cancelled", "cancelled".to_string())
            } else if failed > 0 {
                ("failed", reason.unwrap_or_else(|| "worker_failed".into()))
            } else {
                ("succeeded", "succeeded".to_string())
            };
            if done_before_stop {
                unheld.push(job);
            }
            ev_jobs.push(job);
            ev_kinds.push("finished");
            ev_messages.push(format!(
                "{final_state} ({final_reason}): {succeeded} of {total} worker(s) succeeded, \
                 {failed} failed{}",
                if done_before_stop {
                    " (they ended by themselves before the request to stop reached them)"
                } else {
                    ""
                }
            ));
            ev_details.push(json!({"state": final_state, "reason": final_reason,
                                   "succeeded": succeeded, "failed": failed}));
            end_ids.push(job);
            end_states.push(final_state);
            end_reasons.push(final_reason);
            continue;
        }
        let started = match mode.as_str() {
            "gang" => running == total,
            _ => running > 0 || succeeded + failed > 0,
        };
        if state == "starting" && started {
            run_ids.push(job);
            ev_jobs.push(job);
            ev_kinds.push("started");
            ev_messages.push(format!("started: {running} worker(s) running"));
            ev_details.push(json!({"running": running}));
        }
    }
    // The writes, each sent with its parameters' types and all at once,
    // run in this order; the answers are taken in the same order.
    let late = async {
        if late_ids.is_empty() {
            return Ok(0);
        }
        tx.execute_typed(
            "UPDATE jobs SET started_at = now() WHERE job_id = ANY($1)",
            &[(&late_ids, Type::UUID_ARRAY)],
        )
        .await
    };
    let run = async {
        if run_ids.is_empty() {
            return Ok(0);
        }
        tx.execute_typed(
            "UPDATE jobs SET state = 'running', started_at = now() WHERE job_id = ANY($1)",
            &[(&run_ids, Type::UUID_ARRAY)],
        )
        .await
    };
    let end = async {
        if end_ids.is_empty() {
            return Ok(0);
        }
        tx.execute_typed(
            "UPDATE jobs j SET state = x.state::job_state, reason = x.reason, finished_at = now(),
                    preempted_for = NULL
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS x(job_id, state, reason)
             WHERE j.job_id = x.job_id",
            &[
                (&end_ids, Type::UUID_ARRAY),
                (&end_states, Type::TEXT_ARRAY),
                (&end_reasons, Type::TEXT_ARRAY),
            ],
        )
        .await
    };
    let unhold = async {
        if unheld.is_empty() {
            return Ok(0);
        }
        // GPUs held for a move onto a spare go back.
        tx.execute_typed(
            "DELETE FROM gpu_holds WHERE job_id = ANY($1)",
            &[(&unheld, Type::UUID_ARRAY)],
        )
        .await
    };
    let events = async {
        if ev_jobs.is_empty() {
            return Ok(0);
        }
        // In the order they happened: a late start before its end.
        tx.execute_typed(
            "INSERT INTO job_events (job_id, kind, message, detail)
             SELECT job_id, kind, message, detail
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[])
                  WITH ORDINALITY AS x(job_id, kind, message, detail, i)
             ORDER BY i",
            &[
                (&ev_jobs, Type::UUID_ARRAY),
                (&ev_kinds, Type::TEXT_ARRAY),
                (&ev_messages, Type::TEXT_ARRAY),
                (&ev_details, Type::JSONB_ARRAY),
            ],
        )
        .await
    };
    let (late, run, end, unhold, events) = tokio::join!(late, run, end, unhold, events);
    for written in [late, run, end, unhold, events] {
        written?;
    }
    for job in one_by_one {
        settle_special(tx, job).await?;
    }
    Ok(())
}

/// Moves a job to the state its workers imply. Idempotent: call it after any
/// change to a job's workers, inside the same transaction.
///
/// Only the workers of the current run count: for a gang placed with
/// `run_workers` of its ranks (an elastic gang may start with fewer than
/// all), ranks from `run_workers` on are not part of the run and stay
/// `pending`; the run succeeds, fails or requeues with the others.
pub(super) async fn settle_job(tx: &Transaction<'_>, job_id: Uuid) -> Result<()> {
    settle_jobs(tx, &[job_id]).await
}

/// The cases of [`settle_jobs`] settled job by job: a job being preempted
/// (requeued once every worker is down) and a gang one of whose workers
/// failed (the rest stop).
async fn settle_special(tx: &Transaction<'_>, job_id: Uuid) -> Result<()> {
    let row = tx
        .query_one(
            "SELECT j.state::text AS state, j.mode::text AS mode, j.reason, j.run_workers,
                    count(*) FILTER (WHERE w.state IN ('assigned', 'running', 'stopping',
                                                       'checkpointing')) AS up,
                    count(*) FILTER (WHERE w.state = 'failed') AS failed
             FROM jobs j JOIN workers w USING (job_id)
             WHERE j.job_id = $1
               AND (j.run_workers IS NULL OR w.rank < j.run_workers)
             GROUP BY j.job_id",
            &[&job_id],
        )
        .await?;
    let state: String = row.get("state");
    let mode: String = row.get("mode");
    let reason: Option<String> = row.get("reason");
    // Ranks from here on are not part of the current run.
    let run_end: i32 = row.get::<_, Option<i32>>("run_workers").unwrap_or(i32::MAX);
    let (up, failed) = (row.get::<_, i64>("up"), row.get::<_, i64>("failed"));
    if matches!(state.as_str(), "succeeded" | "failed" | "cancelled") {
        return Ok(());
    }

    // A preempted job goes back to the queue once every worker is down.
    if state == "preempting" {
        if up == 0 {
            if mode == "gang" {
                // A gang restarts whole: a rank that ended by itself while
                // the others were being stopped runs again with them.
                tx.execute(
                    "UPDATE workers SET state = 'pending', node_id = NULL, gpus = '{}',
                            local_rank = NULL
                     WHERE job_id = $1 AND state = 'succeeded' AND rank < $2",
                    &[&job_id, &run_end],
                )
                .await?;
            }
            // Work lost to this restart: what the run's GPUs held after the
            // last checkpoint (a lost node's share was counted when it was
            // lost).
            tx.execute(
                "UPDATE jobs j SET lost_gpu_s = lost_gpu_s + coalesce((
                     SELECT sum(greatest(0, extract(epoch FROM a.released_at
                                - greatest(a.allocated_at, coalesce(j.checkpointed_at, a.allocated_at)))))
                     FROM allocations a
                     WHERE a.job_id = j.job_id AND a.released_at IS NOT NULL
                       AND a.release_reason IS DISTINCT FROM 'node_lost'
                       AND a.placement_seq = (SELECT max(placement_seq) FROM allocations
                                           WHERE job_id = j.job_id)), 0)::float8
                 WHERE j.job_id = $1",
                &[&job_id],
            )
            .await?;
            let restore: Option<String> = tx
                .query_one(
                    "UPDATE jobs SET state = 'queued', preempted_for = NULL, run_workers = NULL
                     WHERE job_id = $1
                     RETURNING restore_from",
                    &[&job_id],
                )
                .await?
                .get(0);
            let message = match &restore {
                Some(r) => format!("requeued; resumes from checkpoint {r}"),
                None => "requeued; no checkpoint, so it starts over".to_string(),
            };
            insert_event(
                tx,
                job_id,
                "requeued",
                &message,
                json!({"restore_from": restore}),
            )
            .await?;
            // A gang moving onto a spare is placed onto its held GPUs now.
            super::spares::place_held(tx, job_id).await?;
        }
        return Ok(());
    }

    // A gang lives and dies together: one failed worker stops the rest.
    if mode == "gang" && failed > 0 && reason.is_none() && state != "cancelling" {
        tx.execute(
            "UPDATE jobs SET reason = 'worker_failed' WHERE job_id = $1",
            &[&job_id],
        )
        .await?;
        tx.execute(
            "UPDATE workers SET state = 'stopping' WHERE job_id = $1 AND state IN ('assigned', 'running')",
            &[&job_id],
        )
        .await?;
        tx.execute(
            "UPDATE workers SET state = 'cancelled', finished_at = now(),
                    message = 'gang stopped: another worker failed'
             WHERE job_id = $1 AND state = 'pending' AND rank < $2",
            &[&job_id, &run_end],
        )
        .await?;
        return Box::pin(settle_job(tx, job_id)).await;
    }

    Ok(())
}

/// Who asked for a preemption, and why.
#[derive(Clone, Debug)]
pub(crate) enum PreemptBy<'a> {
    /// An operator (or, later, a drain): `why` is for the timeline.
    Operator { why: &'a str },
    /// A node's own state moves the job: `cause` is `drain`,
    /// `maintenance`, `repair`, `health` or `node_lost`; `why` is the node's.
    Node {
        cause: &'a str,
        node: &'a str,
        why: &'a str,
    },
    /// The region itself: `cause` is `fenced` (cut off from a majority of
    /// regions), `evacuating` (its operators evacuate it) or
    /// `failing_back` (the job goes back to the region it came from).
    Region { cause: &'a str, why: &'a str },
    /// The scheduler, to make room for `for_job`.
    Scheduler {
        for_job: &'a str,
        cause: gangway_sched::PreemptCause,
        at_risk_gpu_s: u64,
        gpus: u64,
    },
}

/// Asks a running job to checkpoint, stop and requeue, inside `tx` (the
/// caller holds, or takes here, the job's row lock). Returns false, and
/// changes nothing, when the job is not starting or running.
pub(crate) async fn preempt_in_tx(
    tx: &Transaction<'_>,
    id: Uuid,
    by: &PreemptBy<'_>,
) -> Result<bool> {
    let Some(row) = tx
        .query_opt(
            "SELECT state::text FROM jobs WHERE job_id = $1 FOR UPDATE",
            &[&id],
        )
        .await?
    else {
        return Err(StoreError::NotFound);
    };
    let state: String = row.get(0);
    if !matches!(state.as_str(), "starting" | "running") {
        return Ok(false);
    }
    let workers = tx
        .execute(
            "UPDATE workers SET state = 'checkpointing'
             WHERE job_id = $1 AND state IN ('assigned', 'running')",
            &[&id],
        )
        .await?;
    let for_job = match by {
        PreemptBy::Operator { .. } | PreemptBy::Node { .. } | PreemptBy::Region { .. } => "",
        PreemptBy::Scheduler { for_job, .. } => for_job,
    };
    // A restart to grow counts as a preemption, but not against the cap on
    // priority preemptions (`grows`).
    let grow = matches!(
        by,
        PreemptBy::Scheduler {
            cause: gangway_sched::PreemptCause::Grow,
            ..
        }
    );
    // A move for a node's sake (drain, health, lost, maintenance, fenced)
    // is counted, but not against that cap either (`node_moves`).
    let node_move = matches!(by, PreemptBy::Node { .. } | PreemptBy::Region { .. });
    let cause = match by {
        PreemptBy::Operator { .. } => "operator",
        PreemptBy::Node { cause, .. } | PreemptBy::Region { cause, .. } => cause,
        PreemptBy::Scheduler { cause, .. } => cause.as_str(),
    };
    tx.execute(
        "UPDATE jobs SET state = 'preempting', preemptions = preemptions + 1, preempted_for = $2,
                grows = grows + CASE WHEN $3 THEN 1 ELSE 0 END,
                node_moves = node_moves + CASE WHEN $4 THEN 1 ELSE 0 END,
                preempt_cause = $5
         WHERE job_id = $1",
        &[&id, &for_job, &grow, &node_move, &cause],
    )
    .await?;
    let (message, detail) = match by {
        PreemptBy::Operator { why } => (
            format!("preempted ({why}): {workers} worker(s) asked to checkpoint and stop"),
            json!({"why": why, "cause": "operator", "workers": workers}),
        ),
        PreemptBy::Region { cause, why } => (
            format!("preempted ({cause}: {why}): {workers} worker(s) asked to checkpoint and stop"),
            json!({"why": why, "cause": cause, "workers": workers}),
        ),
        PreemptBy::Node { cause, node, why } => (
            format!(
                "preempted ({cause}: node {node}: {why}): {workers} worker(s) asked to \
                 checkpoint and move"
            ),
            json!({"why": why, "cause": cause, "node": node, "workers": workers}),
        ),
        PreemptBy::Scheduler {
            for_job,
            cause,
            at_risk_gpu_s,
            gpus,
        } => {
            let why = match cause {
                gangway_sched::PreemptCause::Priority => {
                    format!("to make room for higher-priority job {for_job}")
                }
                gangway_sched::PreemptCause::Reclaim => format!(
                    "its tenant borrows beyond its guarantee, and job {for_job}'s tenant takes \
                     its guaranteed GPUs back"
                ),
                gangway_sched::PreemptCause::Grow => {
                    "to restart larger: idle GPUs can hold more of its elastic workers".to_string()
                }
                gangway_sched::PreemptCause::Defrag => format!(
                    "moved to defragment: reserved gang {for_job} needs whole nodes, and there \
                     is room for this job elsewhere"
                ),
                gangway_sched::PreemptCause::Reservation => format!(
                    "it borrowed GPUs of a capacity reservation, and the reservation's job \
                     {for_job} needs them"
                ),
            };
            (
                format!(
                    "preempted by the scheduler ({why}): {workers} worker(s) asked to \
                     checkpoint and stop; {at_risk_gpu_s} GPU-seconds since the last \
                     checkpoint at risk"
                ),
                json!({"why": why, "cause": cause.as_str(), "for_job": for_job,
                       "workers": workers, "gpus": gpus, "at_risk_gpu_s": at_risk_gpu_s}),
            )
        }
    };
    insert_event(tx, id, "preempted", &message, detail).await?;
    settle_job(tx, id).await?;
    Ok(true)
}

impl Store {
    /// Asks a running job to checkpoint, stop and requeue (operators;
    /// drains). Returns false when the job is not running or starting.
    pub async fn preempt_job(&self, id: Uuid, why: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let done = preempt_in_tx(&tx, id, &PreemptBy::Operator { why }).await?;
        if done {
            tx.commit().await?;
        }
        Ok(done)
    }
}
