//! Other regions' job intent, and our jobs' moves (docs/failover.md): the
//! database's side. What calls the peers for it — handing an intent over,
//! adoption, learning moves, copying checkpoints — is `crate::replication`.
//!
//! - **Intent.** A new job is written with a row in `jobs_awaiting_buddy`
//!   (not scheduled, not acknowledged); `replication::replicate_intent` hands it to the
//!   first peer of its rendezvous order that takes it (`replica_jobs`
//!   there), and only then is it acknowledged and scheduled. Later changes
//!   (it ended, a new checkpoint) are sent by
//!   `replication::outbox::Updates` from `buddy_dirty_since`.
//! - **Leases** (`peer_leases`): round trips we made, heartbeats we heard,
//!   and what each peer last heard of every region.
//! - **Adoption** (`replication::adopt_dead`): the live replicas of a region that a
//!   majority has not heard from for `adopt_after` become our jobs at the
//!   next epoch, from their newest checkpoint — each recorded first in
//!   `job_moves` at a majority of regions, every one of which refuses if it
//!   heard from the home since (so a home alive to a majority is never
//!   adopted).
//! - **Return** (`replication::learn_moves`): a region regaining a majority asks those
//!   regions which of its jobs moved, and cancels its copies before it
//!   places anything again.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::api::JobSpec;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::jobs::{cancel_in_tx, insert_event, lock_jobs, preempt_in_tx, PreemptBy};
use super::{Result, Store, StoreError};

/// A job's intent as its home hands it to its buddy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub job_id: Uuid,
    pub home: String,
    pub tenant: String,
    pub idempotency_key: Option<String>,
    pub spec: JobSpec,
    pub created_at: DateTime<Utc>,
    pub epoch: i32,
}

/// What a home tells its buddy about a job after its intent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Update {
    pub job_id: Uuid,
    pub home: String,
    pub epoch: i32,
    /// The job ended (succeeded, failed, cancelled): never adopt it.
    pub finished: bool,
    /// Its newest checkpoint's store key.
    pub checkpoint: Option<String>,
    /// When that checkpoint was committed (`jobs.checkpointed_at`): where
    /// the work an adopter's copy loses begins (docs/billing.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_at: Option<DateTime<Utc>>,
}

/// A move of a job from its home to another region, recorded at a
/// majority before the other region runs it: an adoption of a dead home's
/// job, or a planned handover (an evacuation or a fail back) that the home
/// itself asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Move {
    pub job_id: Uuid,
    pub from_home: String,
    pub to_region: String,
    pub epoch: i32,
    /// Asked for by the home itself (`loops/evacuation.rs`): witnesses record it
    /// while they hear the home. Absent on the wire: an adoption.
    #[serde(default)]
    pub planned: bool,
    /// When a witness recorded it (in a moves list): the job runs in its
    /// new region only after, so its old home bills its copy to then at
    /// most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The answer to a move: recorded, or refused because the home was heard
/// from within `adopt_after` (an adoption), or because a move of the job at
/// that epoch or later to another region is recorded already.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveAnswer {
    pub recorded: bool,
}

/// A returning home's question: which of my jobs moved?
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MovesQuery {
    pub home: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MovesList {
    pub moves: Vec<Move>,
}

const TERMINAL: &[&str] = &["succeeded", "failed", "cancelled"];

/// When a replica's newest checkpoint was committed, as its home told.
type Checkpointed = Option<DateTime<Utc>>;

/// What this region knows of its peers' leases, read at once.
#[derive(Clone, Debug, Default)]
pub struct Leases {
    /// Seconds since each peer was last heard from (by any replica of this
    /// region), at most this process's uptime: what the region could not
    /// have heard while it was down is not counted as silence.
    pub silent_s: BTreeMap<String, f64>,
    /// Seconds since the last round trip to each configured peer, in the
    /// peers' order (`None`: never).
    pub round_trip_s: Vec<Option<f64>>,
    /// What each peer last told us it hears of every region: seconds of
    /// silence, aged by the time since it told us.
    pub views: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Store {
    /// Everything `peer_leases` says of the configured `peers`, in one
    /// read (fencing, heartbeats and adoption decide from it); a peer never
    /// heard counts as silent for `uptime_s`, since this replica started.
    pub async fn leases(&self, peers: &[&str], uptime_s: f64) -> Result<Leases> {
        let conn = self.lease_conn().await?;
        let rows = conn
            .query(
                "SELECT peer, extract(epoch FROM now() - last_heard_at)::float8,
                        extract(epoch FROM now() - last_ok_at)::float8, silent_s,
                        coalesce(extract(epoch FROM now() - silent_at)::float8, 0)
                 FROM peer_leases",
                &[],
            )
            .await?;
        let uptime = uptime_s;
        let mut heard = BTreeMap::new();
        let mut ok = BTreeMap::new();
        let mut views = BTreeMap::new();
        for r in &rows {
            let peer: String = r.get(0);
            heard.insert(peer.clone(), r.get::<_, Option<f64>>(1));
            ok.insert(peer.clone(), r.get::<_, Option<f64>>(2));
            let aged: f64 = r.get(4);
            let view: BTreeMap<String, f64> = serde_json::from_value(r.get(3)).unwrap_or_default();
            views.insert(peer, view.into_iter().map(|(k, v)| (k, v + aged)).collect());
        }
        let names = peers.iter().copied();
        Ok(Leases {
            silent_s: (names.clone())
                .map(|n| {
                    let s = heard.get(n).copied().flatten().unwrap_or(f64::MAX);
                    (n.to_string(), s.min(uptime).max(0.0))
                })
                .collect(),
            round_trip_s: names.map(|n| ok.get(n).copied().flatten()).collect(),
            views,
        })
    }

    /// A heartbeat from `peer` arrived (and what it hears of everyone).
    pub async fn peer_heard(&self, peer: &str, silent_s: &BTreeMap<String, f64>) -> Result<()> {
        let conn = self.lease_conn().await?;
        conn.execute(
            "INSERT INTO peer_leases (peer, last_heard_at, silent_s, silent_at)
             VALUES ($1, now(), $2, now())
             ON CONFLICT (peer) DO UPDATE
               SET last_heard_at = now(), silent_s = $2, silent_at = now()",
            &[&peer, &json!(silent_s)],
        )
        .await?;
        Ok(())
    }

    /// `peer` answered our heartbeat (with what it hears of everyone).
    pub async fn peer_answered(&self, peer: &str, silent_s: &BTreeMap<String, f64>) -> Result<()> {
        let conn = self.lease_conn().await?;
        conn.execute(
            "INSERT INTO peer_leases (peer, last_ok_at, silent_s, silent_at)
             VALUES ($1, now(), $2, now())
             ON CONFLICT (peer) DO UPDATE SET last_ok_at = now(), silent_s = $2, silent_at = now()",
            &[&peer, &json!(silent_s)],
        )
        .await?;
        Ok(())
    }

    /// Fenced: asks every starting or running job to checkpoint and stop
    /// (they requeue, and are not placed while the region is fenced).
    /// Returns how many were asked now.
    pub async fn fence_jobs(&self) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let jobs: Vec<Uuid> = (tx
            .query(
                "SELECT job_id FROM jobs WHERE state IN ('starting', 'running') ORDER BY job_id",
                &[],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect();
        lock_jobs(&tx, &jobs).await?;
        let why = "the region lost its majority of peer regions and fenced itself";
        let by = PreemptBy::Region {
            cause: "fenced",
            why,
        };
        let mut n = 0;
        for job in jobs {
            if preempt_in_tx(&tx, job, &by).await? {
                tx.execute(
                    "UPDATE jobs SET requeue_front = true WHERE job_id = $1",
                    &[&job],
                )
                .await?;
                n += 1;
            }
        }
        tx.commit().await?;
        if n > 0 {
            metrics::counter!("gangway_preemptions_total", "cause" => "fenced").increment(n as u64);
        }
        Ok(n)
    }

    /// Seconds the oldest change not yet held by a buddy has waited (a
    /// job's intent, or a later update); 0 when there is none.
    pub async fn replication_lag(&self) -> Result<f64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(extract(epoch FROM now() - least(
                     (SELECT min(created_at) FROM jobs_awaiting_buddy),
                     (SELECT min(buddy_dirty_since) FROM jobs
                      WHERE buddy_dirty_since IS NOT NULL))), 0)::float8",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Holds another region's job intent (idempotent: the same intent again
    /// changes nothing; a higher epoch replaces a lower one).
    pub async fn hold_intent(&self, i: &Intent) -> Result<()> {
        self.hold_intents(std::slice::from_ref(i)).await
    }

    /// Holds a batch of other regions' job intents in one statement, so one
    /// commit (a home's group commit, `replication::intents`): each as
    /// [`Store::hold_intent`] would. A job twice in the batch is held at
    /// its highest epoch.
    pub async fn hold_intents(&self, intents: &[Intent]) -> Result<()> {
        let mut latest: BTreeMap<Uuid, &Intent> = BTreeMap::new();
        for i in intents {
            match latest.get(&i.job_id) {
                Some(have) if have.epoch >= i.epoch => {}
                _ => {
                    latest.insert(i.job_id, i);
                }
            }
        }
        let ids: Vec<Uuid> = latest.keys().copied().collect();
        let homes: Vec<&str> = latest.values().map(|i| i.home.as_str()).collect();
        let tenants: Vec<&str> = latest.values().map(|i| i.tenant.as_str()).collect();
        let keys: Vec<Option<&str>> = (latest.values())
            .map(|i| i.idempotency_key.as_deref())
            .collect();
        let specs: Vec<serde_json::Value> = (latest.values())
            .map(|i| serde_json::to_value(&i.spec).expect("a JobSpec serializes"))
            .collect();
        let created: Vec<DateTime<Utc>> = latest.values().map(|i| i.created_at).collect();
        let epochs: Vec<i32> = latest.values().map(|i| i.epoch).collect();
        let conn = self.conn().await?;
        // A keyed create retried while its home is gone reaches its buddy
        // first (the next region of the job's rendezvous order): the claim
        // says where the job is, so it is not made a second time here.
        let hold = conn
            .prepare_cached(
                "WITH i AS (
                     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[],
                                          $5::jsonb[], $6::timestamptz[], $7::int[])
                         AS i(job_id, home, tenant, idempotency_key, spec, created_at, epoch)),
                 r AS (
                     INSERT INTO replica_jobs (job_id, home, tenant, idempotency_key, spec,
                                               created_at, epoch)
                     SELECT job_id, home, tenant, idempotency_key, spec, created_at, epoch FROM i
                     ON CONFLICT (job_id) DO UPDATE
                       SET home = EXCLUDED.home, spec = EXCLUDED.spec, epoch = EXCLUDED.epoch,
                           state = 'live', updated_at = now()
                       WHERE replica_jobs.epoch < EXCLUDED.epoch),
                 c AS (
                     INSERT INTO idempotency_claims (job_id, tenant, region)
                     SELECT job_id, tenant, home FROM i WHERE idempotency_key IS NOT NULL
                     ON CONFLICT (job_id) DO NOTHING)
                 SELECT count(*) FROM i",
            )
            .await?;
        conn.execute(
            &hold,
            &[&ids, &homes, &tenants, &keys, &specs, &created, &epochs],
        )
        .await?;
        Ok(())
    }

    /// Applies a home's updates to the replicas it holds here (older epochs
    /// than the replica's are ignored; an adopted replica stays adopted).
    pub async fn apply_updates(&self, updates: &[Update]) -> Result<()> {
        let conn = self.conn().await?;
        for u in updates {
            conn.execute(
                "UPDATE replica_jobs
                 SET state = CASE WHEN $3 THEN 'finished' ELSE state END,
                     checkpoint = coalesce($4, checkpoint),
                     checkpointed_at = CASE WHEN $4::text IS NULL THEN checkpointed_at
                                            ELSE $5 END,
                     updated_at = now()
                 WHERE job_id = $1 AND epoch = $2 AND state = 'live'",
                &[
                    &u.job_id,
                    &u.epoch,
                    &u.finished,
                    &u.checkpoint,
                    &u.checkpointed_at,
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// Records a move another region asks us to witness. An adoption is
    /// refused if we heard from its home within `adopt_after` (then the
    /// home is alive to us); a planned move (the home's own) is not. Either
    /// is refused if a move of the job at that epoch or later is recorded
    /// here already, unless it is this very move (then it is recorded, and
    /// nothing changes): two moves at one epoch to different regions can
    /// never both reach a majority. Serialised with heartbeats from the
    /// home by the home's lease row, so a home that heard us before asking
    /// which of its jobs moved sees every adoption we witnessed.
    pub async fn witness_move(&self, m: &Move, adopt_after_s: f64) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        tx.execute(
            "INSERT INTO peer_leases (peer) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&m.from_home],
        )
        .await?;
        let silent: Option<f64> = tx
            .query_one(
                "SELECT extract(epoch FROM now() - last_heard_at)::float8 FROM peer_leases
                 WHERE peer = $1 FOR UPDATE",
                &[&m.from_home],
            )
            .await?
            .get(0);
        if !m.planned && silent.is_some_and(|s| s < adopt_after_s) {
            return Ok(false);
        }
        if !record_move_in_tx(&tx, m).await? {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The moves of `home`'s jobs this region has recorded.
    pub async fn moves_from(&self, home: &str) -> Result<Vec<Move>> {
        let conn = self.conn().await?;
        Ok((conn
            .query(
                "SELECT job_id, from_home, to_region, epoch, planned, at FROM job_moves
                 WHERE from_home = $1",
                &[&home],
            )
            .await?)
            .iter()
            .map(|r| Move {
                job_id: r.get(0),
                from_home: r.get(1),
                to_region: r.get(2),
                epoch: r.get(3),
                planned: r.get(4),
                at: r.get(5),
            })
            .collect())
    }

    /// Our copies of jobs another region adopted: cancelled (their workers
    /// stopped and GPUs released), with where they went. Returns how many
    /// changed now.
    pub async fn release_moved(&self, moves: &[Move]) -> Result<usize> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let ids: Vec<Uuid> = moves.iter().map(|m| m.job_id).collect();
        lock_jobs(&tx, &ids).await?;
        let mut n = 0;
        for m in moves {
            let Some(row) = tx
                .query_opt(
                    "SELECT state::text, epoch, moved_to FROM jobs WHERE job_id = $1",
                    &[&m.job_id],
                )
                .await?
            else {
                continue;
            };
            let (state, epoch, moved): (String, i32, Option<String>) =
                (row.get(0), row.get(1), row.get(2));
            if moved.is_some() || epoch >= m.epoch {
                continue;
            }
            tx.execute(
                "UPDATE jobs SET moved_to = $2 WHERE job_id = $1",
                &[&m.job_id, &m.to_region],
            )
            .await?;
            let why = if m.planned {
                format!(
                    "handed over to region {} at epoch {} (a planned move)",
                    m.to_region, m.epoch
                )
            } else {
                format!(
                    "adopted by region {} at epoch {} while this region was cut off",
                    m.to_region, m.epoch
                )
            };
            // Its GPUs here are released as of the move at the latest (its
            // workers were stopped by then; one placed since, say by a
            // rebooted agent, never ran): the usage ledger never counts
            // this copy's time and the new owner's twice.
            tx.execute(
                "UPDATE allocations
                 SET released_at = greatest(allocated_at, least(now(), coalesce($2, now()))),
                     release_reason = 'moved'
                 WHERE job_id = $1 AND released_at IS NULL",
                &[&m.job_id, &m.at],
            )
            .await?;
            if !TERMINAL.contains(&state.as_str()) && state != "cancelling" {
                cancel_in_tx(&tx, m.job_id, &why).await?;
            }
            // Nothing more of this copy goes to its buddy (a checkpoint of
            // the superseded epoch would be refused there, every beat).
            tx.execute(
                "UPDATE jobs SET buddy = NULL, buddy_dirty_since = NULL WHERE job_id = $1",
                &[&m.job_id],
            )
            .await?;
            insert_event(
                &tx,
                m.job_id,
                "finished",
                &format!("moved: {why}; this region's copy is released"),
                json!({"moved_to": m.to_region, "epoch": m.epoch}),
            )
            .await?;
            n += 1;
        }
        tx.commit().await?;
        Ok(n)
    }

    /// A job's intent is held by `buddy`: acknowledged, and schedulable.
    pub async fn replicated(&self, job: Uuid, buddy: &str) -> Result<()> {
        self.replicated_many(&[(job, buddy)]).await
    }

    /// [`Store::replicated`] for a batch of jobs (each with the buddy that
    /// holds it), in one statement: one commit for a group of creates.
    pub async fn replicated_many(&self, held: &[(Uuid, &str)]) -> Result<()> {
        let conn = self.conn().await?;
        // The intent told the buddy the job is queued: one cancelled while
        // it awaited is dirty at once (`jobs_buddy_dirty`), so the buddy
        // hears of it. (A job that awaited nothing, say marked again, keeps
        // what it was told.) Neither column is indexed: the update stays on
        // the row's page (HOT), with no index entries.
        //
        // Committed without waiting for its WAL to reach the disk
        // (`synchronous_commit` off for this transaction alone): the
        // buddy's commit is what makes the create durable twice over, and a
        // mark lost with a crash of this database leaves the job awaiting a
        // buddy, so its intent is handed over again (the buddy keeps one)
        // and marked then. Any later durable commit here flushes it too.
        if let [(job, buddy)] = held {
            // One job, the usual batch unless creates come faster than a
            // buddy answers: keyed by scalars, so its prepared statement
            // runs on a generic plan. PostgreSQL plans the array form
            // afresh on every call (its estimate for `unnest` of a bound
            // array is the array's length, always below the generic
            // plan's), which cost as much as running it.
            let mark = conn.prepare_cached(MARK_ONE).await?;
            conn.execute(&mark, &[job, buddy]).await?;
            return Ok(());
        }
        let (jobs, buddies): (Vec<Uuid>, Vec<&str>) = held.iter().copied().unzip();
        let mark = conn.prepare_cached(MARK_MANY).await?;
        conn.execute(&mark, &[&jobs, &buddies]).await?;
        Ok(())
    }

    /// Whether a job waits for a buddy to hold its intent.
    pub async fn awaits_buddy(&self, job: Uuid) -> Result<bool> {
        let conn = self.conn().await?;
        Ok((conn
            .query_opt(
                "SELECT 1 FROM jobs_awaiting_buddy WHERE job_id = $1",
                &[&job],
            )
            .await?)
            .is_some())
    }

    /// Jobs created but not yet held by a buddy (oldest first).
    pub async fn awaiting_buddy(&self, limit: i64) -> Result<Vec<Uuid>> {
        let conn = self.conn().await?;
        Ok((conn
            .query(
                "SELECT job_id FROM jobs_awaiting_buddy ORDER BY created_at LIMIT $1",
                &[&limit],
            )
            .await?)
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// A job's intent as its buddy holds it.
    pub async fn intent_of(&self, job: Uuid) -> Result<Intent> {
        let conn = self.conn().await?;
        let intent = conn
            .prepare_cached(
                "SELECT tenant, idempotency_key, spec, created_at, epoch FROM jobs
                 WHERE job_id = $1",
            )
            .await?;
        let row = (conn.query_opt(&intent, &[&job]).await?).ok_or(StoreError::NotFound)?;
        Ok(Intent {
            job_id: job,
            home: self.region().to_string(),
            tenant: row.get(0),
            idempotency_key: row.get(1),
            spec: serde_json::from_value(row.get(2)).map_err(|e| {
                StoreError::Migration(format!("job {job}'s stored spec does not parse: {e}"))
            })?,
            created_at: row.get(3),
            epoch: row.get(4),
        })
    }

    /// An unacknowledged, unkeyed job whose intent no buddy took: cancelled,
    /// so a client that was told to retry never finds it running twice.
    pub async fn drop_unacknowledged(&self, job: Uuid) -> Result<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        lock_jobs(&tx, &[job]).await?;
        cancel_in_tx(
            &tx,
            job,
            "not acknowledged: no other region took its intent",
        )
        .await?;
        tx.execute("DELETE FROM jobs_awaiting_buddy WHERE job_id = $1", &[&job])
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Per buddy, the updates it has not been told (at most `limit`), each
    /// with the state it was read in.
    pub(crate) async fn dirty(
        &self,
        limit: i64,
    ) -> Result<BTreeMap<String, Vec<(Update, String)>>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT job_id, buddy, epoch, state::text, restore_from, checkpointed_at FROM jobs
                 WHERE buddy_dirty_since IS NOT NULL ORDER BY buddy_dirty_since LIMIT $1",
                &[&limit],
            )
            .await?;
        let mut out: BTreeMap<String, Vec<(Update, String)>> = BTreeMap::new();
        for r in &rows {
            let state: String = r.get(3);
            let u = Update {
                job_id: r.get(0),
                home: self.region().to_string(),
                epoch: r.get(2),
                finished: TERMINAL.contains(&state.as_str()),
                checkpoint: r.get(4),
                checkpointed_at: r.get(5),
            };
            out.entry(r.get(1)).or_default().push((u, state));
        }
        Ok(out)
    }

    /// The buddy holds these updates now (what changed since they were
    /// read is dirty again: the trigger compares with what was sent).
    pub(crate) async fn told(&self, updates: &[(Update, String)]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        // One statement and one commit for the batch (a round trip and a
        // commit per job were 2,500 commits in 20 s of a busy cloud).
        let jobs: Vec<Uuid> = updates.iter().map(|(u, _)| u.job_id).collect();
        let states: Vec<&str> = updates.iter().map(|(_, s)| s.as_str()).collect();
        let checkpoints: Vec<Option<&str>> = updates
            .iter()
            .map(|(u, _)| u.checkpoint.as_deref())
            .collect();
        let conn = self.conn().await?;
        conn.execute(
            "UPDATE jobs j SET buddy_told_state = x.state, buddy_told_checkpoint = x.ckpt,
                    buddy_dirty_since = NULL
             FROM unnest($1::uuid[], $2::text[], $3::text[]) AS x(job_id, state, ckpt)
             WHERE j.job_id = x.job_id",
            &[&jobs, &states, &checkpoints],
        )
        .await?;
        Ok(())
    }

    /// `home`'s live replicas here (not finished, not adopted).
    pub(crate) async fn live_replicas(
        &self,
        home: &str,
    ) -> Result<Vec<(Intent, Option<String>, Checkpointed)>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT job_id, tenant, idempotency_key, spec, created_at, epoch, checkpoint,
                        checkpointed_at
                 FROM replica_jobs WHERE home = $1 AND state = 'live' ORDER BY created_at",
                &[&home],
            )
            .await?;
        let mut out = Vec::new();
        for r in &rows {
            let Ok(spec) = serde_json::from_value::<JobSpec>(r.get(3)) else {
                tracing::warn!(job_id = %r.get::<_, Uuid>(0), "a replica's spec does not parse");
                continue;
            };
            out.push((
                Intent {
                    job_id: r.get(0),
                    home: home.to_string(),
                    tenant: r.get(1),
                    idempotency_key: r.get(2),
                    spec,
                    created_at: r.get(4),
                    epoch: r.get(5),
                },
                r.get(6),
                r.get(7),
            ));
        }
        Ok(out)
    }

    /// Homes with live replicas here. Read on every beat: one index probe
    /// per home (a skip scan of `replica_jobs_live`), not a pass over every
    /// live replica (`SELECT DISTINCT` read them all: 63 ms a beat with a
    /// few hundred thousand held, issue 23).
    pub async fn replica_homes(&self) -> Result<Vec<String>> {
        let conn = self.conn().await?;
        let homes = conn
            .prepare_cached(
                "WITH RECURSIVE h(home) AS (
                     (SELECT home FROM replica_jobs WHERE state = 'live' ORDER BY home LIMIT 1)
                     UNION ALL
                     SELECT (SELECT r.home FROM replica_jobs r
                             WHERE r.state = 'live' AND r.home > h.home
                             ORDER BY r.home LIMIT 1)
                     FROM h WHERE h.home IS NOT NULL)
                 SELECT home FROM h WHERE home IS NOT NULL",
            )
            .await?;
        Ok((conn.query(&homes, &[]).await?)
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// What a create reads before it inserts, in one round trip: the
    /// fleet's version (`AppState::fleet_shape_at`) and, for a keyed
    /// create, [`Store::held_for_another`].
    pub async fn before_create(&self, job: Uuid, keyed: bool) -> Result<(i64, Option<String>)> {
        let conn = self.conn().await?;
        // The intent is found by its key alone, its state tested after: as
        // `job_id = $1 AND state = 'live'` the plan cached while the table
        // was empty (a fresh region) read the partial index of live intents
        // and filtered every one by id, 3.5 ms a create at 2,700 held.
        let read = conn
            .prepare_cached(
                "SELECT (SELECT fleet_version FROM sched_state WHERE id = 1),
                        (SELECT CASE WHEN state = 'live' THEN home END FROM replica_jobs
                         WHERE $2 AND job_id = $1)",
            )
            .await?;
        let row = conn.query_one(&read, &[&job, &keyed]).await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Whether a keyed create of `job` must wait: we hold its intent for a
    /// home that has not been adopted from (the job is that home's, alive
    /// or not; it must not be made again here).
    pub async fn held_for_another(&self, job: Uuid) -> Result<Option<String>> {
        Ok(self.before_create(job, true).await?.1)
    }

    /// Makes an adopted job ours: submitted here with its id, spec and key
    /// (or our released copy of it revived, for a job that once moved away
    /// from here), at the next epoch, resuming from the newest checkpoint
    /// we hold, and at the front of its queue; the replica is marked
    /// adopted.
    pub(crate) async fn adopt(&self, i: &Intent, checkpoint: Option<&str>) -> Result<()> {
        let message = format!(
            "adopted from region {} (silent to a majority of regions) at epoch {}; {}",
            i.home,
            i.epoch + 1,
            match checkpoint {
                Some(c) => format!("resumes from checkpoint {c}"),
                None => "no checkpoint was replicated, so it starts over".into(),
            }
        );
        let detail =
            json!({"adopted_from": i.home, "epoch": i.epoch + 1, "restore_from": checkpoint});
        self.take_job(i, i.epoch + 1, checkpoint, &message, detail, None)
            .await
            .map(|_| ())
    }
}

impl Store {
    /// The epoch and state of the job's intent held here, if any.
    pub async fn replica_epoch(&self, job: Uuid) -> Result<Option<(i32, String)>> {
        let conn = self.conn().await?;
        Ok((conn
            .query_opt(
                "SELECT epoch, state FROM replica_jobs WHERE job_id = $1",
                &[&job],
            )
            .await?)
            .map(|r| (r.get(0), r.get(1))))
    }
}

/// Records move `m` in `job_moves` inside `tx`, unless a move of the job at
/// that epoch or later is recorded already: then only this very move
/// (same region, same epoch) counts as recorded, and nothing changes.
/// Returns whether it is recorded. A later epoch replaces an earlier one
/// (whichever home it was from).
pub(super) async fn record_move_in_tx(
    tx: &tokio_postgres::Transaction<'_>,
    m: &Move,
) -> Result<bool> {
    let held = tx
        .query_opt(
            "SELECT to_region, epoch FROM job_moves WHERE job_id = $1 FOR UPDATE",
            &[&m.job_id],
        )
        .await?;
    if let Some(r) = held {
        let (to, epoch): (String, i32) = (r.get(0), r.get(1));
        if epoch > m.epoch || (epoch == m.epoch && to != m.to_region) {
            tracing::warn!(
                job_id = %m.job_id, to = %m.to_region, epoch = m.epoch, recorded_to = %to,
                recorded_epoch = epoch,
                "a move conflicts with one recorded already: refused"
            );
            return Ok(false);
        }
        if epoch == m.epoch {
            return Ok(true);
        }
    }
    tx.execute(
        "INSERT INTO job_moves (job_id, from_home, to_region, epoch, planned)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job_id) DO UPDATE
           SET from_home = EXCLUDED.from_home, to_region = EXCLUDED.to_region,
               epoch = EXCLUDED.epoch, planned = EXCLUDED.planned, at = now()",
        &[&m.job_id, &m.from_home, &m.to_region, &m.epoch, &m.planned],
    )
    .await?;
    Ok(true)
}

/// [`Store::replicated_many`] for one job: `$1` job, `$2` its buddy.
const MARK_ONE: &str = "WITH held AS (
         DELETE FROM jobs_awaiting_buddy
         WHERE job_id = $1
           AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
         RETURNING job_id)
     UPDATE jobs j SET buddy = $2,
            buddy_told_state = CASE WHEN EXISTS (SELECT 1 FROM held)
                                    THEN 'queued' ELSE j.state::text END
     WHERE j.job_id = $1";

/// [`Store::replicated_many`] for a batch: `$1` jobs, `$2` their buddies.
const MARK_MANY: &str =
    "WITH b AS (SELECT * FROM unnest($1::uuid[], $2::text[]) AS b(job_id, buddy)
                 WHERE (SELECT set_config('synchronous_commit', 'off', true)) = 'off'),
     held AS (
         DELETE FROM jobs_awaiting_buddy a USING b WHERE a.job_id = b.job_id
         RETURNING a.job_id)
     UPDATE jobs j SET buddy = b.buddy,
            buddy_told_state = CASE WHEN j.job_id IN (SELECT job_id FROM held)
                                    THEN 'queued' ELSE j.state::text END
     FROM b WHERE j.job_id = b.job_id";
