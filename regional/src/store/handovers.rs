//! Planned moves of jobs between regions (docs/failover.md, "Planned
//! evacuation and fail back", "Balancing queued work"): an operator
//! evacuates this region (every live job is handed to its buddy), or fails
//! it back (the jobs moved away from it are handed back); or a queued job
//! that waited here goes to its buddy, which has room for it now
//! ([`Store::balance_candidates`], [`Store::mark_balancing`],
//! [`Store::unmark_balancing`]). The protocol is driven from
//! `crate::loops::evacuation`; this is its durable side.
//!
//! - `region_evacuation`: what the operator asked, one row (survives
//!   restarts).
//! - `jobs.handover_to` / `handover_cause`: the marker of a job being
//!   handed over, set once and advanced step by step by the leader; while
//!   it is set the job is never placed here (`plans.rs`, `spares.rs`).
//! - [`Store::commit_planned_move`]: the point of no return. Under the
//!   job's row lock it checks the job is still stopped and marked, and
//!   records the move in our own `job_moves` before any witness hears of
//!   it; from then on a tenant's cancel here is answered "retry" (it must
//!   reach the new owner), and the job never runs here at this epoch again.
//! - [`Store::take_handover`]: the target's side: the job becomes ours at
//!   the next epoch, from the intent we hold — or our released copy of it
//!   comes back to life, for a job that once moved away from here.
//! - [`Store::release_handed_over`]: the home's copy is released (cancelled,
//!   `moved_to` set) once the target has it.
//! - `handovers`: what moved out and in, that progress is counted from.

use chrono::{DateTime, Utc};
use gangway_shared::api::{Evacuation, EvacuationJob, EvacuationState, JobSpec};
use gangway_shared::error::codes;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::jobs::{cancel_in_tx, insert_event, lock_jobs, preempt_in_tx, PreemptBy};
use super::nodes::insert_audit;
use super::replicas::{record_move_in_tx, Intent, Move};
use super::{NewJob, Result, Store, StoreError, SubmitOutcome};

/// Why a job is handed over: this region is evacuated, or the job goes
/// back to the region it came from.
pub const EVACUATING: &str = "evacuating";
pub const FAILING_BACK: &str = "failing_back";
/// A queued job that waited here while another region has room for it now
/// (`crate::loops::evacuation`, "Balancing").
pub const BALANCING: &str = "balancing";

/// A queued job that may be handed to a region with room for it
/// ([`Store::balance_candidates`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub job_id: Uuid,
    pub gpu_type: String,
    pub gpus: u32,
    /// Seconds since it was submitted.
    pub waited_s: u64,
    /// The region holding its intent: the only one it may go to, as that
    /// one is kept told of it (an intent handed to any other region would
    /// go stale there if the move were called off).
    pub buddy: String,
}

const LIVE: &str = "('queued', 'starting', 'running', 'preempting')";
const TERMINAL: &[&str] = &["succeeded", "failed", "cancelled"];

/// Which live jobs can leave the region: not pinned to it, not in one of
/// its capacity reservations or dedicated clusters (`$1`: this region).
const MOVABLE: &str = "j.cluster_id IS NULL AND j.reservation_id IS NULL
     AND coalesce(j.spec->>'region', '') <> $1";

/// A region asks another to take a job it hands over
/// (`POST /internal/v1/replicas/take`), once the move is recorded at a
/// majority.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Take {
    pub job_id: Uuid,
    /// The region handing it over (the job's owner until now).
    pub from_home: String,
    /// The epoch it is taken at: one more than its owner's.
    pub epoch: i32,
    /// The checkpoint it resumes from (already in the taker's store, and
    /// the taker was told of it).
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// [`EVACUATING`] or [`FAILING_BACK`].
    pub cause: String,
}

/// The taker's answer: whether it took the job now (false: it had it at
/// that epoch already, a replayed take).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Taken {
    pub taken: bool,
}

/// A failing-back region asks each peer to hand back its jobs
/// (`POST /internal/v1/replicas/handback`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Handback {
    pub home: String,
}

/// How many of the home's jobs the peer still runs (marked to go back).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HandbackAnswer {
    pub away: u64,
}

/// A job with a handover marker, as the leader's beat advances it.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    pub job_id: Uuid,
    pub to: String,
    pub cause: String,
    pub state: String,
    pub epoch: i32,
    pub moved_to: Option<String>,
    pub restore_from: Option<String>,
}

/// The evacuation row.
#[derive(Clone, Debug, PartialEq)]
pub struct EvacuationRow {
    pub state: EvacuationState,
    pub since: Option<DateTime<Utc>>,
    pub actor: Option<String>,
    pub reason: Option<String>,
    pub away: i32,
}

fn parse_state(s: &str) -> Result<EvacuationState> {
    s.parse()
        .map_err(|e: String| StoreError::Migration(format!("region_evacuation: {e}")))
}

impl Store {
    /// What the operator asked of this region.
    pub async fn evacuation_row(&self) -> Result<EvacuationRow> {
        let conn = self.conn().await?;
        let r = conn
            .query_one(
                "SELECT state, since, actor, reason, away FROM region_evacuation WHERE id = 1",
                &[],
            )
            .await?;
        Ok(EvacuationRow {
            state: parse_state(r.get(0))?,
            since: r.get(1),
            actor: r.get(2),
            reason: r.get(3),
            away: r.get(4),
        })
    }

    pub async fn evacuation_state(&self) -> Result<EvacuationState> {
        Ok(self.evacuation_row().await?.state)
    }

    /// An operator evacuates the region (audited, `region.evacuate`).
    /// Returns whether the state changed (evacuating again changes
    /// nothing).
    pub async fn start_evacuation(&self, actor: &str, reason: Option<&str>) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = tx
            .execute(
                "UPDATE region_evacuation
                 SET state = 'evacuating', since = now(), actor = $1, reason = $2, away = 0,
                     updated_at = now()
                 WHERE id = 1 AND state NOT IN ('evacuating', 'evacuated')",
                &[&actor, &reason],
            )
            .await?;
        if n > 0 {
            insert_audit(
                &tx,
                actor,
                "region.evacuate",
                self.region(),
                reason,
                json!({}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    /// An operator fails the region back (audited, `region.failback`): it
    /// takes work again, and its jobs moved away come back. Handovers of
    /// the evacuation not past their point of no return are called off
    /// (those jobs stay and run here). Returns whether the state changed,
    /// and how many handovers were called off.
    pub async fn start_failback(&self, actor: &str, reason: Option<&str>) -> Result<(bool, usize)> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = tx
            .execute(
                "UPDATE region_evacuation
                 SET state = 'failing_back', since = now(), actor = $1, reason = $2,
                     updated_at = now()
                 WHERE id = 1 AND state <> 'failing_back'",
                &[&actor, &reason],
            )
            .await?;
        let mut called_off = 0;
        if n > 0 {
            insert_audit(
                &tx,
                actor,
                "region.failback",
                self.region(),
                reason,
                json!({}),
            )
            .await?;
            let jobs: Vec<Uuid> = (tx
                .query(
                    "SELECT job_id FROM jobs
                     WHERE handover_to IS NOT NULL AND handover_cause = $1 AND moved_to IS NULL
                     ORDER BY job_id FOR UPDATE",
                    &[&EVACUATING],
                )
                .await?)
                .iter()
                .map(|r| r.get(0))
                .collect();
            for job in jobs {
                // Locked: a move not recorded here now is recorded nowhere
                // (the home records it first), so calling it off is safe.
                let committed = tx
                    .query_opt(
                        "SELECT 1 FROM jobs j JOIN job_moves m USING (job_id)
                         WHERE j.job_id = $1 AND m.epoch > j.epoch",
                        &[&job],
                    )
                    .await?;
                if committed.is_none() {
                    tx.execute(
                        "UPDATE jobs SET handover_to = NULL, handover_cause = NULL
                         WHERE job_id = $1",
                        &[&job],
                    )
                    .await?;
                    insert_event(
                        &tx,
                        job,
                        "handover",
                        "handover called off: the region is failed back, so the job stays",
                        json!({"cause": FAILING_BACK}),
                    )
                    .await?;
                    called_off += 1;
                }
            }
        }
        tx.commit().await?;
        Ok((n > 0, called_off))
    }

    /// The beat's view of the evacuation moved on: `from` → `to` (only if
    /// it is still `from`: an operator's change meanwhile wins), with the
    /// jobs the peers last said are still away.
    pub async fn advance_evacuation(
        &self,
        from: EvacuationState,
        to: EvacuationState,
        away: i32,
    ) -> Result<bool> {
        let conn = self.conn().await?;
        let n = conn
            .execute(
                "UPDATE region_evacuation SET state = $2, away = $3, updated_at = now()
                 WHERE id = 1 AND state = $1 AND (state <> $2 OR away <> $3)",
                &[&from.as_str(), &to.as_str(), &away],
            )
            .await?;
        Ok(n > 0)
    }

    /// Marks every live job that can leave the region and is held by a
    /// buddy for a handover (cause `evacuating`) to the region `target`
    /// names for it (its buddy, given the job and its buddy; `None`: not
    /// yet). Returns the jobs marked now.
    pub async fn mark_evacuation(
        &self,
        target: &(dyn Fn(Uuid, Option<&str>) -> Option<String> + Sync),
    ) -> Result<Vec<(Uuid, String)>> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT j.job_id, j.buddy FROM jobs j
                     WHERE j.handover_to IS NULL AND j.moved_to IS NULL
                       AND NOT EXISTS (SELECT 1 FROM jobs_awaiting_buddy a WHERE a.job_id = j.job_id)
                       AND j.state IN {LIVE} AND {MOVABLE}
                     ORDER BY j.job_id LIMIT 500 FOR UPDATE"
                ),
                &[&self.region()],
            )
            .await?;
        let mut marked = Vec::new();
        for r in &rows {
            let job: Uuid = r.get(0);
            let buddy: Option<String> = r.get(1);
            let Some(to) = target(job, buddy.as_deref()) else {
                continue;
            };
            mark_in_tx(
                &tx,
                job,
                &to,
                EVACUATING,
                "for the evacuation of this region",
            )
            .await?;
            marked.push((job, to));
        }
        tx.commit().await?;
        Ok(marked)
    }

    /// A failing-back `home` asks us to hand back the live jobs we adopted
    /// from it (or took from it in its evacuation): each is marked (cause
    /// `failing_back`) unless it is being handed over already. Returns how
    /// many of them we still run.
    pub async fn mark_handback(&self, home: &str) -> Result<u64> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let jobs: Vec<Uuid> = (tx
            .query(
                &format!(
                    "SELECT job_id FROM jobs
                     WHERE adopted_from = $1 AND handover_to IS NULL AND moved_to IS NULL
                       AND NOT EXISTS (SELECT 1 FROM jobs_awaiting_buddy a
                                       WHERE a.job_id = jobs.job_id)
                       AND state IN {LIVE}
                       AND cluster_id IS NULL AND reservation_id IS NULL
                     ORDER BY job_id LIMIT 500 FOR UPDATE"
                ),
                &[&home],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect();
        for job in &jobs {
            let why = format!("to go back to region {home}, which is failed back");
            mark_in_tx(&tx, *job, home, FAILING_BACK, &why).await?;
        }
        let away: i64 = tx
            .query_one(
                &format!(
                    "SELECT count(*) FROM jobs
                     WHERE adopted_from = $1 AND moved_to IS NULL AND state IN {LIVE}"
                ),
                &[&home],
            )
            .await?
            .get(0);
        tx.commit().await?;
        Ok(away.max(0) as u64)
    }

    /// Evacuating: the live jobs that cannot leave (pinned here, in a
    /// reservation or a cluster of this region) are asked to checkpoint
    /// and stop; they stay queued here until the fail back. Returns how
    /// many were asked now.
    pub async fn stop_held(&self) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let jobs: Vec<Uuid> = (tx
            .query(
                &format!(
                    "SELECT j.job_id FROM jobs j
                     WHERE j.state IN ('starting', 'running') AND j.handover_to IS NULL
                       AND NOT ({MOVABLE})
                     ORDER BY j.job_id FOR UPDATE"
                ),
                &[&self.region()],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect();
        let by = PreemptBy::Region {
            cause: EVACUATING,
            why: "the region is evacuated and this job cannot leave it; it resumes here after \
                  the fail back",
        };
        let mut n = 0;
        for job in jobs {
            // Not placed again on a spare swap's held GPUs either.
            tx.execute("DELETE FROM gpu_holds WHERE job_id = $1", &[&job])
                .await?;
            if preempt_in_tx(&tx, job, &by).await? {
                n += 1;
            }
        }
        tx.commit().await?;
        if n > 0 {
            metrics::counter!("gangway_preemptions_total", "cause" => EVACUATING)
                .increment(n as u64);
        }
        Ok(n)
    }

    /// The jobs being handed over (at most `limit`).
    pub async fn handing_over(&self, limit: i64) -> Result<Vec<Handover>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT job_id, handover_to, coalesce(handover_cause, $2), state::text, epoch,
                        moved_to, restore_from
                 FROM jobs WHERE handover_to IS NOT NULL ORDER BY job_id LIMIT $1",
                &[&limit, &EVACUATING],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Handover {
                job_id: r.get(0),
                to: r.get(1),
                cause: r.get(2),
                state: r.get(3),
                epoch: r.get(4),
                moved_to: r.get(5),
                restore_from: r.get(6),
            })
            .collect())
    }

    /// A marked job that runs is asked to checkpoint and stop (a region
    /// preemption of cause `evacuating` or `failing_back`); it moves once
    /// its workers are down, with the checkpoint they just wrote. Returns
    /// whether it was asked now.
    pub async fn preempt_for_handover(&self, job: Uuid) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[job]).await?;
        let Some(row) = tx
            .query_opt(
                "SELECT handover_to, handover_cause FROM jobs
                 WHERE job_id = $1 AND handover_to IS NOT NULL",
                &[&job],
            )
            .await?
        else {
            return Ok(false);
        };
        let (to, cause): (String, Option<String>) = (row.get(0), row.get(1));
        let cause = match cause.as_deref() {
            Some(FAILING_BACK) => FAILING_BACK,
            _ => EVACUATING,
        };
        let why = format!("being handed over to region {to}");
        let by = PreemptBy::Region { cause, why: &why };
        let done = preempt_in_tx(&tx, job, &by).await?;
        tx.commit().await?;
        if done {
            metrics::counter!("gangway_preemptions_total", "cause" => cause).increment(1);
        }
        Ok(done)
    }

    /// The point of no return of a handover: under the job's row lock,
    /// checks it is still stopped (queued), marked for `m.to_region` and at
    /// the epoch before `m.epoch`, and records `m` in our own `job_moves`
    /// (before any witness hears of it). Returns false, changing nothing,
    /// when the job changed (cancelled, ended) or a conflicting move is
    /// recorded. Recording the same move again is a no-op that returns
    /// true.
    pub async fn commit_planned_move(&self, m: &Move) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[m.job_id]).await?;
        let ready = tx
            .query_opt(
                "SELECT 1 FROM jobs
                 WHERE job_id = $1 AND state = 'queued' AND handover_to = $2
                   AND moved_to IS NULL AND epoch = $3",
                &[&m.job_id, &m.to_region, &(m.epoch - 1)],
            )
            .await?;
        if ready.is_none() || !record_move_in_tx(&tx, m).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The target has the job: our copy is released (cancelled, `moved_to`
    /// the target, an event saying it was handed over), the marker cleared
    /// and the handover counted. Idempotent. Returns whether it changed
    /// now.
    pub async fn release_handed_over(&self, job: Uuid, to: &str, epoch: i32) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[job]).await?;
        let Some(row) = tx
            .query_opt(
                "SELECT state::text, moved_to, handover_cause FROM jobs WHERE job_id = $1",
                &[&job],
            )
            .await?
        else {
            return Ok(false);
        };
        let (state, moved, cause): (String, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let cause = cause.unwrap_or_else(|| EVACUATING.to_string());
        let changed = moved.is_none();
        if changed {
            tx.execute(
                "UPDATE jobs SET moved_to = $2 WHERE job_id = $1",
                &[&job, &to],
            )
            .await?;
            let why = match cause.as_str() {
                FAILING_BACK => {
                    format!("handed back to region {to} at epoch {epoch}, which is failed back")
                }
                BALANCING => format!(
                    "handed over to region {to} at epoch {epoch}, which had room for it sooner"
                ),
                _ => format!(
                    "handed over to region {to} at epoch {epoch} for the evacuation of this \
                     region"
                ),
            };
            if !TERMINAL.contains(&state.as_str()) && state != "cancelling" {
                cancel_in_tx(&tx, job, &why).await?;
            }
            insert_event(
                &tx,
                job,
                "handed_over",
                &format!("moved: {why}; this region's copy is released"),
                json!({"moved_to": to, "epoch": epoch, "cause": cause}),
            )
            .await?;
        }
        tx.execute(
            "UPDATE jobs SET handover_to = NULL, handover_cause = NULL WHERE job_id = $1",
            &[&job],
        )
        .await?;
        tx.execute(
            "INSERT INTO handovers (job_id, epoch, way, from_region, to_region, cause)
             VALUES ($1, $2, 'out', $3, $4, $5) ON CONFLICT DO NOTHING",
            &[&job, &epoch, &self.region(), &to, &cause],
        )
        .await?;
        tx.commit().await?;
        Ok(changed)
    }

    /// A marker that has nothing left to do: the job ended here before it
    /// moved, or another region took it another way.
    pub async fn drop_handover(&self, job: Uuid) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute(
            "UPDATE jobs SET handover_to = NULL, handover_cause = NULL WHERE job_id = $1",
            &[&job],
        )
        .await?;
        Ok(())
    }

    /// Queued jobs that could leave for their buddy (balancing): movable,
    /// not being handed over, acknowledged by a buddy, submitted
    /// at least `after` ago and not moved between regions within `after`
    /// (a job that just arrived is given its chance here first); oldest
    /// first, at most `limit`.
    pub async fn balance_candidates(
        &self,
        after: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<Waiting>> {
        let conn = self.conn().await?;
        let after_s = after.as_secs_f64();
        let rows = conn
            .query(
                &format!(
                    "SELECT j.job_id, j.gpu_type, j.gpus,
                            extract(epoch FROM now() - j.created_at)::float8, j.buddy
                     FROM jobs j
                     WHERE j.state = 'queued' AND j.handover_to IS NULL AND j.moved_to IS NULL
                       AND NOT EXISTS (SELECT 1 FROM jobs_awaiting_buddy a WHERE a.job_id = j.job_id)
                       AND j.buddy IS NOT NULL AND {MOVABLE}
                       AND j.created_at <= now() - make_interval(secs => $2)
                       AND NOT EXISTS (SELECT 1 FROM job_moves m WHERE m.job_id = j.job_id
                                         AND m.at > now() - make_interval(secs => $2))
                     ORDER BY j.created_at, j.job_id LIMIT $3"
                ),
                &[&self.region(), &after_s, &limit],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Waiting {
                job_id: r.get(0),
                gpu_type: r.get(1),
                gpus: r.get::<_, i32>(2).max(0) as u32,
                waited_s: r.get::<_, f64>(3).max(0.0) as u64,
                buddy: r.get(4),
            })
            .collect())
    }

    /// Marks a queued job for a handover to its buddy, which has room for
    /// it now (cause `balancing`), unless it changed meanwhile (placed,
    /// cancelled, marked). Returns whether it was marked.
    pub async fn mark_balancing(&self, w: &Waiting) -> Result<bool> {
        let to = w.buddy.as_str();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[w.job_id]).await?;
        let still = tx
            .query_opt(
                "SELECT 1 FROM jobs WHERE job_id = $1 AND state = 'queued'
                   AND handover_to IS NULL AND moved_to IS NULL AND buddy = $2",
                &[&w.job_id, &to],
            )
            .await?;
        if still.is_none() {
            return Ok(false);
        }
        let why = format!(
            "because it waited {} s here and that region has room for it now",
            w.waited_s
        );
        mark_in_tx(&tx, w.job_id, to, BALANCING, &why).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A balancing handover that cannot go on (the target is unreachable or
    /// refused, the job changed) is called off while its move is not
    /// recorded here yet: the job stays, schedulable here again. Returns
    /// whether it was called off.
    pub async fn unmark_balancing(&self, job: Uuid, why: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[job]).await?;
        let n = tx
            .execute(
                "UPDATE jobs j SET handover_to = NULL, handover_cause = NULL
                 WHERE j.job_id = $1 AND j.handover_cause = $2 AND j.moved_to IS NULL
                   AND NOT EXISTS (SELECT 1 FROM job_moves m
                                   WHERE m.job_id = j.job_id AND m.epoch > j.epoch)",
                &[&job, &BALANCING],
            )
            .await?;
        if n > 0 {
            insert_event(
                &tx,
                job,
                "handover",
                &format!("stays in this region: {why}"),
                json!({"cause": BALANCING, "called_off": true}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Takes a job another region hands over (`t`), resuming from
    /// `checkpoint` (one our store holds; `None`: the newest we were told
    /// of, if our store has it, else its start): it must be a job whose
    /// intent we hold, live, from `t.from_home` at the epoch before
    /// `t.epoch`. Returns false when it is ours at that epoch already (a
    /// replayed take).
    pub async fn take_handover(&self, t: &Take, checkpoint: Option<&str>) -> Result<bool> {
        let conn = self.conn().await?;
        let have: Option<i32> = (conn
            .query_opt("SELECT epoch FROM jobs WHERE job_id = $1", &[&t.job_id])
            .await?)
            .map(|r| r.get(0));
        if have.is_some_and(|e| e >= t.epoch) {
            return Ok(false);
        }
        let refuse = |why: String| StoreError::Conflict {
            code: codes::INVALID_SPEC,
            message: format!("job {} not taken at epoch {}: {why}", t.job_id, t.epoch),
        };
        let row = conn
            .query_opt(
                "SELECT home, tenant, idempotency_key, spec, created_at, epoch, state
                 FROM replica_jobs WHERE job_id = $1",
                &[&t.job_id],
            )
            .await?
            .ok_or_else(|| refuse("this region holds no intent of it".into()))?;
        let (home, epoch, state): (String, i32, String) = (row.get(0), row.get(5), row.get(6));
        if home != t.from_home || epoch != t.epoch - 1 || state != "live" {
            return Err(refuse(format!(
                "this region holds its intent from region {home} at epoch {epoch} ({state})"
            )));
        }
        let spec: JobSpec = serde_json::from_value(row.get(3))
            .map_err(|e| refuse(format!("its spec does not parse: {e}")))?;
        drop(conn);
        let intent = Intent {
            job_id: t.job_id,
            home: home.clone(),
            tenant: row.get(1),
            idempotency_key: row.get(2),
            spec,
            created_at: row.get(4),
            epoch,
        };
        let resumes = match checkpoint {
            Some(c) => format!("resumes from checkpoint {c}"),
            None => "no checkpoint, so it starts over".into(),
        };
        let message = match t.cause.as_str() {
            FAILING_BACK => format!(
                "handed back from region {home} at epoch {}, this region being failed back; \
                 {resumes}",
                t.epoch
            ),
            _ => format!(
                "handed over from region {home} at epoch {} for the evacuation of region \
                 {home}; {resumes}",
                t.epoch
            ),
        };
        let detail = json!({"adopted_from": home, "epoch": t.epoch, "restore_from": checkpoint,
                            "cause": t.cause, "planned": true});
        self.take_job(
            &intent,
            t.epoch,
            checkpoint,
            &message,
            detail,
            Some(&t.cause),
        )
        .await
    }

    /// Makes a job another region held ours at `epoch`: submitted here
    /// with its id, spec and key (accepted once already: no admission
    /// limits), or — for a job that once moved away from here, whose
    /// released copy we keep — that copy revived (queued again, its
    /// workers pending, `moved_to` cleared); at the front of its queue,
    /// resuming from `checkpoint` (else what it had); its intent goes to a
    /// buddy of ours before it is scheduled (`jobs_awaiting_buddy`). The replica
    /// is marked adopted and its idempotency claim names us. A handover
    /// (`cause`) is counted in `handovers`. Returns false when the job is
    /// ours at `epoch` or later already.
    pub(super) async fn take_job(
        &self,
        i: &Intent,
        epoch: i32,
        checkpoint: Option<&str>,
        message: &str,
        detail: serde_json::Value,
        cause: Option<&str>,
    ) -> Result<bool> {
        let new = NewJob::from_spec(
            i.job_id,
            &i.tenant,
            i.idempotency_key.clone(),
            i.spec.clone(),
        );
        match self.submit_adopted(&new).await? {
            SubmitOutcome::Created(_) | SubmitOutcome::Replayed(_) => {}
        }
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[i.job_id]).await?;
        let row = tx
            .query_one(
                "SELECT state::text, epoch, moved_to FROM jobs WHERE job_id = $1",
                &[&i.job_id],
            )
            .await?;
        let (state, have, moved): (String, i32, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let taken = have < epoch;
        if taken {
            if TERMINAL.contains(&state.as_str()) && moved.is_some() {
                // Our copy of a job that moved away from here: it lives
                // again, from where the other region got it.
                tx.execute(
                    "UPDATE workers SET state = 'pending', node_id = NULL, gpus = '{}',
                            local_rank = NULL, exit_code = NULL, signal = NULL, message = NULL,
                            started_at = NULL, finished_at = NULL
                     WHERE job_id = $1",
                    &[&i.job_id],
                )
                .await?;
                tx.execute(
                    "UPDATE jobs SET state = 'queued', reason = NULL, finished_at = NULL,
                            moved_to = NULL, run_workers = NULL, preempted_for = NULL, preempt_cause = NULL,
                            handover_to = NULL, handover_cause = NULL, buddy = NULL,
                            buddy_told_state = NULL, buddy_told_checkpoint = NULL,
                            buddy_dirty_since = NULL
                     WHERE job_id = $1",
                    &[&i.job_id],
                )
                .await?;
                // Queued again (its row changed what the queue shows: the
                // held queues re-read it and find it awaiting).
                tx.execute(
                    if self.replicating {
                        "INSERT INTO jobs_awaiting_buddy (job_id, created_at)
                         SELECT job_id, now() FROM jobs WHERE job_id = $1
                         ON CONFLICT DO NOTHING"
                    } else {
                        "DELETE FROM jobs_awaiting_buddy WHERE job_id = $1"
                    },
                    &[&i.job_id],
                )
                .await?;
            } else if state != "queued" {
                return Err(StoreError::Conflict {
                    code: codes::INVALID_SPEC,
                    message: format!(
                        "job {} is {state} here at epoch {have}: not taken at epoch {epoch}",
                        i.job_id
                    ),
                });
            }
            tx.execute(
                "UPDATE jobs SET epoch = $2, adopted_from = $3,
                        restore_from = coalesce($4, restore_from), requeue_front = true
                 WHERE job_id = $1",
                &[&i.job_id, &epoch, &i.home, &checkpoint],
            )
            .await?;
            insert_event(&tx, i.job_id, "requeued", message, detail).await?;
            if let Some(cause) = cause {
                tx.execute(
                    "INSERT INTO handovers (job_id, epoch, way, from_region, to_region, cause)
                     VALUES ($1, $2, 'in', $3, $4, $5) ON CONFLICT DO NOTHING",
                    &[&i.job_id, &epoch, &i.home, &self.region(), &cause],
                )
                .await?;
            }
        }
        tx.execute(
            "UPDATE replica_jobs SET state = 'adopted', updated_at = now() WHERE job_id = $1",
            &[&i.job_id],
        )
        .await?;
        tx.execute(
            "UPDATE idempotency_claims SET region = $2 WHERE job_id = $1",
            &[&i.job_id, &self.region()],
        )
        .await?;
        tx.commit().await?;
        Ok(taken)
    }

    /// Evacuating: how many jobs are left before the region is empty —
    /// handovers in flight, movable live jobs not marked yet (waiting for a
    /// buddy), and any job still running or stopping here.
    pub async fn evacuation_left(&self) -> Result<u64> {
        let conn = self.conn().await?;
        let n: i64 = conn
            .query_one(
                &format!(
                    "SELECT count(*) FROM jobs j
                     WHERE j.handover_to IS NOT NULL
                        OR (j.moved_to IS NULL AND j.state IN {LIVE} AND {MOVABLE})
                        OR (j.state IN ('starting', 'running', 'preempting', 'cancelling'))"
                ),
                &[&self.region()],
            )
            .await?
            .get(0);
        Ok(n.max(0) as u64)
    }

    /// The evacuation and its progress, for operators.
    pub async fn evacuation(&self) -> Result<Evacuation> {
        let row = self.evacuation_row().await?;
        let conn = self.conn().await?;
        let mut jobs = Vec::new();
        let job = |r: &tokio_postgres::Row, step: &str, to: Option<String>| EvacuationJob {
            job_id: r.get("job_id"),
            tenant: r.get("tenant"),
            name: r.get("name"),
            step: step.to_string(),
            to,
            epoch: r.get("epoch"),
            restore_from: r.get("restore_from"),
            why: None,
        };
        // In flight, whatever the state.
        for r in &conn
            .query(
                "SELECT job_id, tenant, name, state::text AS state, handover_to, epoch,
                        restore_from
                 FROM jobs WHERE handover_to IS NOT NULL ORDER BY created_at, job_id",
                &[],
            )
            .await?
        {
            let step = match r.get::<_, &str>("state") {
                "starting" | "running" | "preempting" => "stopping",
                _ => "moving",
            };
            jobs.push(job(r, step, r.get("handover_to")));
        }
        let in_flight = jobs.len() as u64;
        let (mut left, mut held, way) = (
            in_flight,
            0,
            if row.state.is_evacuating() {
                "out"
            } else {
                "in"
            },
        );
        if row.state.is_evacuating() {
            for r in &conn
                .query(
                    &format!(
                        "SELECT j.job_id, j.tenant, j.name, j.epoch, j.restore_from,
                                ({MOVABLE}) AS movable, j.state::text AS state
                         FROM jobs j
                         WHERE j.handover_to IS NULL AND j.moved_to IS NULL AND j.state IN {LIVE}
                         ORDER BY j.created_at, j.job_id"
                    ),
                    &[&self.region()],
                )
                .await?
            {
                if r.get::<_, bool>("movable") {
                    left += 1;
                    jobs.push(job(r, "waiting", None));
                } else {
                    held += 1;
                    if r.get::<_, &str>("state") != "queued" {
                        left += 1;
                    }
                    let mut j = job(r, "held", None);
                    j.why = Some(
                        "pinned to this region, or in one of its capacity reservations or \
                         dedicated clusters: checkpointed, stopped and kept here until the \
                         fail back"
                            .into(),
                    );
                    jobs.push(j);
                }
            }
        } else if row.state == EvacuationState::FailingBack {
            left += row.away.max(0) as u64;
        }
        let moved_rows = conn
            .query(
                "SELECT h.job_id, j.tenant, j.name, h.epoch, j.restore_from,
                        CASE WHEN h.way = 'out' THEN h.to_region ELSE h.from_region END AS peer
                 FROM handovers h JOIN jobs j USING (job_id)
                 WHERE h.way = $1 AND ($2::timestamptz IS NULL OR h.at >= $2)
                 ORDER BY h.at, h.job_id",
                &[&way, &row.since],
            )
            .await?;
        for r in &moved_rows {
            jobs.push(job(r, "moved", r.get("peer")));
        }
        Ok(Evacuation {
            region: self.region().to_string(),
            state: row.state,
            since: row.since,
            actor: row.actor,
            reason: row.reason,
            jobs_left: left,
            moved: moved_rows.len() as u64,
            held,
            jobs,
        })
    }
}

/// Marks `job` for a handover to `to` (the caller holds its row lock):
/// never placed here again, its held GPUs (a spare swap's) given back.
async fn mark_in_tx(
    tx: &tokio_postgres::Transaction<'_>,
    job: Uuid,
    to: &str,
    cause: &str,
    why: &str,
) -> Result<()> {
    tx.execute(
        "UPDATE jobs SET handover_to = $2, handover_cause = $3 WHERE job_id = $1",
        &[&job, &to, &cause],
    )
    .await?;
    tx.execute("DELETE FROM gpu_holds WHERE job_id = $1", &[&job])
        .await?;
    insert_event(
        tx,
        job,
        "handover",
        &format!(
            "being handed over to region {to} {why}: it checkpoints and stops if it runs, then \
             moves with its newest checkpoint"
        ),
        json!({"to": to, "cause": cause}),
    )
    .await?;
    Ok(())
}
