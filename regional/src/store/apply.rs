//! The scheduler's commit: a plan computed on a snapshot (`plans.rs`)
//! written in one transaction, only if the region generation and the
//! version of every pool it touches are still current, and every placement
//! still applies; otherwise nothing is written and the plan is stale.

use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::{Plan, PreemptCause};
use serde_json::json;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::jobs::{lock_jobs, preempt_in_tx, PreemptBy};
use super::{Result, Store, StoreError};

/// What a committed plan did.
#[derive(Clone, Debug, Default)]
pub struct ApplyOutcome {
    pub generation: i64,
    pub placed_workers: usize,
    /// The victims actually asked to checkpoint and stop, with why (a
    /// victim that was no longer running is skipped).
    pub preempted: Vec<(Uuid, PreemptCause)>,
}

/// (tenant, gpu_type) → decayed average GPUs held, in thousandths.
impl Store {
    /// Commits a plan in one transaction, only if the region generation it
    /// was computed at is still current, so is the partition version of
    /// every GPU type it places or preempts on, and every placement still
    /// applies. Otherwise nothing is written and [`StoreError::StalePlan`]
    /// returned. The versions of those types move forward; the region
    /// generation does not (only changes to what may be scheduled move it),
    /// so plans for other types stay valid.
    ///
    /// Locks: `sched_state` shared (a change to nodes, which takes it
    /// exclusively, waits or makes the plan stale), then the jobs in id
    /// order, then the partitions in type order.
    pub async fn apply_plan(&self, plan: &Plan) -> Result<ApplyOutcome> {
        // Each statement is sent with its parameters' types
        // (`query_typed`): parsed, bound and run in one round trip, where
        // a statement sent as text alone takes two (its parameters' types
        // asked first). On a busy machine each round trip waits for both
        // processes to be scheduled again; a commit of a dozen statements
        // took 0.45 s a pass on a 10,240-GPU region under a burst
        // (docs/benchmarks-history.md, "Session 31"), holding its jobs'
        // locks, which the agents' syncs then skip.
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let head = tx
            .query_typed_one(
                "SELECT generation FROM sched_state WHERE id = 1 FOR SHARE",
                &[],
            )
            .await?;
        let generation: i64 = head.get(0);
        if generation != plan.generation {
            return Err(StoreError::StalePlan(format!(
                "plan computed at generation {} is no longer current ({generation})",
                plan.generation
            )));
        }
        if plan.placements.is_empty() && plan.preemptions.is_empty() {
            tx.commit().await?;
            return Ok(ApplyOutcome {
                generation,
                ..ApplyOutcome::default()
            });
        }

        // Every job the plan touches, locked in id order (the one lock
        // order; see `agents.rs`).
        let placed: BTreeSet<Uuid> = plan
            .placements
            .iter()
            .map(|p| parse_job(&p.job))
            .collect::<Result<_>>()?;
        let victims: Vec<Uuid> = plan
            .preemptions
            .iter()
            .map(|p| parse_job(&p.job))
            .collect::<Result<_>>()?;
        // The jobs the victims make room for get the first claim on what
        // they free (V32): locked with the rest.
        let claims: Vec<(Uuid, i64)> = (plan.claims.iter())
            .map(|(job, &until)| Ok((parse_job(job)?, i64::try_from(until).unwrap_or(i64::MAX))))
            .collect::<Result<_>>()?;
        let locked: BTreeSet<Uuid> = (placed.iter().chain(&victims))
            .chain(claims.iter().map(|(j, _)| j))
            .copied()
            .collect();
        let locked: Vec<Uuid> = locked.into_iter().collect();
        lock_jobs(&tx, &locked).await?;
        bump_partitions(&tx, plan, &locked).await?;
        // Victims: asked to checkpoint and stop, exactly as an operator's
        // preemption, with the cause and the job they make room for. One no
        // longer running (it ended, was cancelled or is already being
        // preempted) is skipped: the next pass decides again.
        let mut preempted = Vec::new();
        let mut for_jobs: BTreeSet<Uuid> = BTreeSet::new();
        for (p, &victim) in plan.preemptions.iter().zip(&victims) {
            if placed.contains(&victim) || preempted.iter().any(|(v, _)| *v == victim) {
                continue;
            }
            let by = PreemptBy::Scheduler {
                for_job: &p.for_job,
                cause: p.cause,
                at_risk_gpu_s: p.at_risk_gpu_s,
                gpus: p.gpus,
            };
            match preempt_in_tx(&tx, victim, &by).await {
                Ok(true) => {
                    preempted.push((victim, p.cause));
                    if let Ok(for_job) = p.for_job.parse() {
                        for_jobs.insert(for_job);
                    }
                }
                Ok(false) | Err(StoreError::NotFound) => {
                    tracing::debug!(job_id = %victim, "planned victim no longer running; skipped");
                }
                Err(e) => return Err(e),
            }
        }
        // Only units some of whose victims were asked to stop claim: one
        // whose victims were all skipped is owed nothing.
        let claims: Vec<(Uuid, i64)> = (claims.into_iter())
            .filter(|(job, _)| for_jobs.contains(job))
            .collect();
        if !claims.is_empty() {
            let (ids, until): (Vec<Uuid>, Vec<i64>) = claims.into_iter().unzip();
            tx.execute_typed(
                "UPDATE jobs j SET claim_until = to_timestamp(c.until)
                 FROM unnest($1::uuid[], $2::bigint[]) AS c(id, until)
                 WHERE j.job_id = c.id",
                &[(&ids, Type::UUID_ARRAY), (&until, Type::INT8_ARRAY)],
            )
            .await?;
        }
        let placed_workers = if plan.placements.is_empty() {
            0
        } else {
            apply_placements(&tx, plan).await?
        };
        tx.commit().await?;
        Ok(ApplyOutcome {
            generation,
            placed_workers,
            preempted,
        })
    }
}

/// Moves the partition version of every GPU type among `jobs` forward,
/// checking it against the plan's ([`Plan::partitions`]; a plan that names
/// no version for one of them cannot be checked, and is stale).
async fn bump_partitions(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
    jobs: &[Uuid],
) -> Result<()> {
    let rows = tx
        .query_typed(
            "SELECT DISTINCT pool_of(gpu_type, cluster_id) AS pool
             FROM jobs WHERE job_id = ANY($1) ORDER BY pool",
            &[(&jobs, Type::UUID_ARRAY)],
        )
        .await?;
    for row in rows {
        let ty: String = row.get(0);
        let Some(seen) = plan.partitions.get(&ty).copied() else {
            return Err(StoreError::StalePlan(format!(
                "the plan names no version of the {ty} partition"
            )));
        };
        let bumped = tx
            .query_typed_opt(
                "INSERT INTO sched_partitions AS p (pool, version) VALUES ($1, 1)
                 ON CONFLICT (pool) DO UPDATE SET version = p.version + 1
                 WHERE p.version = $2
                 RETURNING version",
                &[(&ty, Type::TEXT), (&seen, Type::INT8)],
            )
            .await?;
        // A first commit for the type expects no row (version 0): the
        // insert happens, or a racing first commit made the row and the
        // update's check fails.
        let fresh = bumped.as_ref().is_some_and(|r| r.get::<_, i64>(0) == 1);
        if bumped.is_none() || (fresh && seen != 0) {
            return Err(StoreError::StalePlan(format!(
                "the {ty} partition moved on since version {seen}"
            )));
        }
    }
    Ok(())
}

/// Moves every placed worker `pending → assigned`, inserts one allocation
/// per GPU and a `placed` event per placement; returns the workers placed.
/// Any placement that no longer applies (a worker no longer pending, its
/// job marked for a handover) rejects the plan whole. The caller
/// holds the jobs' locks.
pub(super) async fn apply_placements(
    tx: &tokio_postgres::Transaction<'_>,
    plan: &Plan,
) -> Result<usize> {
    {
        // This commit's number: higher than every earlier placement's, so
        // a job's newest run is the one with the highest.
        let placement_seq: i64 = tx
            .query_typed_one("SELECT nextval('placement_seq')", &[])
            .await?
            .get(0);
        // Workers: pending → assigned, with their node, GPUs and local rank.
        let mut w_job = Vec::new();
        let mut w_rank = Vec::new();
        let mut w_node = Vec::new();
        let mut w_gpus = Vec::new();
        let mut w_local = Vec::new();
        let mut job_ids = Vec::new();
        for p in &plan.placements {
            let job = parse_job(&p.job)?;
            job_ids.push(job);
            let mut per_node: BTreeMap<&str, i32> = BTreeMap::new();
            for w in &p.workers {
                let local = per_node.entry(w.node.as_str()).or_insert(0);
                w_job.push(job);
                w_rank.push(w.rank as i32);
                w_node.push(w.node.as_str());
                w_gpus.push(format!(
                    "{{{}}}",
                    w.gpus
                        .iter()
                        .map(|g| g.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ));
                w_local.push(*local);
                *local += 1;
            }
        }
        // The workers moved and the placed jobs read (once: their tenant
        // and type for the allocations, their gang shape for
        // `run_workers`), sent together; the answers are taken in order.
        let distinct: Vec<Uuid> = job_ids
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let updating = async {
            tx.query_typed(
                "UPDATE workers w
                 SET state = 'assigned', attempt = w.attempt + 1, node_id = x.node,
                     gpus = x.gpus::int[], local_rank = x.local_rank
                 FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::int[])
                      AS x(job_id, rank, node, gpus, local_rank)
                 WHERE w.job_id = x.job_id AND w.rank = x.rank AND w.state = 'pending'
                 RETURNING w.job_id, w.rank, w.attempt",
                &[
                    (&w_job, Type::UUID_ARRAY),
                    (&w_rank, Type::INT4_ARRAY),
                    (&w_node, Type::TEXT_ARRAY),
                    (&w_gpus, Type::TEXT_ARRAY),
                    (&w_local, Type::INT4_ARRAY),
                ],
            )
            .await
        };
        let reading = async {
            tx.query_typed(
                "SELECT job_id, tenant, gpu_type, mode = 'gang', workers, min_workers,
                        coalesce(handover_to, moved_to)
                 FROM jobs WHERE job_id = ANY($1)",
                &[(&distinct, Type::UUID_ARRAY)],
            )
            .await
        };
        let (updated, meta_rows) = tokio::join!(updating, reading);
        let updated = updated?;
        if updated.len() != w_job.len() {
            return Err(StoreError::StalePlan(format!(
                "{} of {} placed workers are no longer pending",
                w_job.len() - updated.len(),
                w_job.len()
            )));
        }
        let attempts: BTreeMap<(Uuid, i32), i32> = updated
            .iter()
            .map(|r| ((r.get(0), r.get(1)), r.get(2)))
            .collect();

        let meta_rows = meta_rows?;
        // A job marked for a handover (evacuation, fail back, balancing)
        // after the plan read it is not placed here: once its move is
        // recorded it may run in the other region at any moment.
        if let Some(r) = (meta_rows.iter()).find(|r| r.get::<_, Option<String>>(6).is_some()) {
            let (job, to): (Uuid, String) = (r.get(0), r.get(6));
            return Err(StoreError::StalePlan(format!(
                "job {job} is being handed over to region {to}"
            )));
        }
        let meta: BTreeMap<Uuid, (String, String)> = meta_rows
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
        let gangs: BTreeMap<Uuid, (i32, Option<i32>)> = (meta_rows.iter())
            .filter(|r| r.get::<_, bool>(3))
            .map(|r| (r.get(0), (r.get(4), r.get(5))))
            .collect();
        let runs = gang_runs(plan, &job_ids, &gangs)?;

        // One allocation row per GPU; the unique index refuses a GPU that is
        // already held, whatever this code believes.
        let mut a_job = Vec::new();
        let mut a_rank = Vec::new();
        let mut a_attempt = Vec::new();
        let mut a_node = Vec::new();
        let mut a_gpu = Vec::new();
        let mut a_tenant = Vec::new();
        let mut a_type = Vec::new();
        for (p, &job) in plan.placements.iter().zip(&job_ids) {
            let (tenant, gpu_type) = meta
                .get(&job)
                .ok_or_else(|| StoreError::StalePlan(format!("job {job} vanished")))?;
            for w in &p.workers {
                for &g in &w.gpus {
                    a_job.push(job);
                    a_rank.push(w.rank as i32);
                    a_attempt.push(attempts[&(job, w.rank as i32)]);
                    a_node.push(w.node.as_str());
                    a_gpu.push(g as i32);
                    a_tenant.push(tenant.as_str());
                    a_type.push(gpu_type.as_str());
                }
            }
        }
        // The allocations, the jobs' rows and their events, sent together;
        // the answers are taken in order (the allocations' first: a GPU
        // already held makes the plan stale, and the rest fail with it).
        // One `placed` event per placement, in one statement.
        let mut e_job = Vec::with_capacity(plan.placements.len());
        let mut e_msg = Vec::with_capacity(plan.placements.len());
        let mut e_detail = Vec::with_capacity(plan.placements.len());
        for (p, &job) in plan.placements.iter().zip(&job_ids) {
            let mut nodes: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
            for w in &p.workers {
                nodes.entry(w.node.as_str()).or_default().extend(&w.gpus);
            }
            let gpus: usize = nodes.values().map(Vec::len).sum();
            let ranks = match runs.get(&job) {
                Some(&(run, of)) if run < of => format!("{run} of {of} workers (elastic)"),
                _ if p.ranks.len() == 1 => format!("worker {}", p.ranks[0]),
                _ => format!("{} workers", p.ranks.len()),
            };
            e_job.push(job);
            e_msg.push(format!(
                "placed {ranks}: {gpus} GPUs on {} node(s) within one {} domain",
                nodes.len(),
                p.level.as_str()
            ));
            let mut detail = json!({
                "level": p.level.as_str(),
                "ranks": p.ranks,
                "nodes": nodes.iter().map(|(n, g)| json!({"node": n, "gpus": g})).collect::<Vec<_>>(),
                // Named `generation` in the event since before it was
                // called what it is (clients may read it).
                "generation": placement_seq,
            });
            if let Some(&(run, _)) = runs.get(&job) {
                detail["world_size"] = json!(run);
            }
            e_detail.push(detail);
        }
        // Each placed job in one row update: a queued one is starting, a
        // gang runs with the workers placed, and it is no longer at the
        // front of the queue. (One new version of each row, not three: the
        // update of `state` is not HOT, so each version means an entry in
        // every index of `jobs`.)
        let run_n: Vec<Option<i32>> = (distinct.iter())
            .map(|j| runs.get(j).map(|&(n, _)| n))
            .collect();
        let marking = async {
            tx.execute_typed(
                "UPDATE jobs j
             SET state = CASE WHEN j.state = 'queued' THEN 'starting' ELSE j.state END,
                 run_workers = coalesce(x.n, j.run_workers),
                 requeue_front = false
             FROM unnest($1::uuid[], $2::int[]) AS x(job_id, n)
             WHERE j.job_id = x.job_id",
                &[(&distinct, Type::UUID_ARRAY), (&run_n, Type::INT4_ARRAY)],
            )
            .await
        };
        let inserting = async {
            tx.execute_typed(
                "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant,
                                          gpu_type, placement_seq)
                 SELECT j, r, a, n, g, t, ty, $8
                 FROM unnest($1::uuid[], $2::int[], $3::int[], $4::text[], $5::int[],
                             $6::text[], $7::text[]) AS x(j, r, a, n, g, t, ty)",
                &[
                    (&a_job, Type::UUID_ARRAY),
                    (&a_rank, Type::INT4_ARRAY),
                    (&a_attempt, Type::INT4_ARRAY),
                    (&a_node, Type::TEXT_ARRAY),
                    (&a_gpu, Type::INT4_ARRAY),
                    (&a_tenant, Type::TEXT_ARRAY),
                    (&a_type, Type::TEXT_ARRAY),
                    (&placement_seq, Type::INT8),
                ],
            )
            .await
        };
        let recording = async {
            tx.execute_typed(
            "INSERT INTO job_events (job_id, kind, message, detail)
             SELECT j, 'placed', m, d FROM unnest($1::uuid[], $2::text[], $3::jsonb[]) AS x(j, m, d)",
            &[
                (&e_job, Type::UUID_ARRAY),
                (&e_msg, Type::TEXT_ARRAY),
                (&e_detail, Type::JSONB_ARRAY),
            ],
        ).await
        };
        let (insert, marked, recorded) = tokio::join!(inserting, marking, recording);
        if let Err(e) = insert {
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION) {
                return Err(StoreError::StalePlan(
                    "a planned GPU is already allocated".to_string(),
                ));
            }
            return Err(e.into());
        }
        marked?;
        recorded?;
        Ok(w_job.len())
    }
}

/// How many workers each placed gang runs with (for `jobs.run_workers`):
/// per gang among `gangs` (its workers and minimum; `job_ids` are the
/// placements' jobs, in order), (workers placed,
/// workers of the job). A gang's placement must cover its ranks 0 … n−1:
/// all of them, or, for an elastic gang, at least its `min_workers`;
/// otherwise the plan is rejected whole.
fn gang_runs(
    plan: &Plan,
    job_ids: &[Uuid],
    gangs: &BTreeMap<Uuid, (i32, Option<i32>)>,
) -> Result<BTreeMap<Uuid, (i32, i32)>> {
    let mut runs = BTreeMap::new();
    for (p, &job) in plan.placements.iter().zip(job_ids) {
        let Some(&(workers, min)) = gangs.get(&job) else {
            continue; // an array worker
        };
        let n = p.ranks.len() as i32;
        let prefix = p.ranks.iter().enumerate().all(|(i, &r)| r as usize == i);
        if !prefix || n > workers || (n < workers && min.is_none_or(|m| n < m)) {
            return Err(StoreError::StalePlan(format!(
                "the placement of gang {job} covers ranks {:?}, not ranks 0 … n−1 of its \
                 {workers} with n at least its minimum",
                p.ranks
            )));
        }
        runs.insert(job, (n, workers));
    }
    Ok(runs)
}

/// A plan's job id. One that is not a UUID is a planner bug, not a lost
/// race: replanning would not mend it.
fn parse_job(id: &str) -> Result<Uuid> {
    Uuid::parse_str(id).map_err(|_| StoreError::Invalid {
        code: gangway_shared::error::codes::INTERNAL,
        message: format!("the plan names a job id that is not a UUID: {id:?}"),
    })
}

#[cfg(test)]
mod parse_job_tests {
    #[test]
    fn a_malformed_job_id_is_a_bug_not_a_stale_plan() {
        let id = uuid::Uuid::new_v4();
        assert_eq!(super::parse_job(&id.to_string()).unwrap(), id);
        match super::parse_job("job-1") {
            Err(super::StoreError::Invalid { code, message }) => {
                assert_eq!(code, gangway_shared::error::codes::INTERNAL);
                assert!(message.contains("job-1"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
