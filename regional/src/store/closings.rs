//! A dead region's last placements (docs/billing.md, "A region that does
//! not come back"; migration V22).
//!
//! - **Placements replicated.** A home tells its job's buddy of every
//!   placement as it opens and ends: triggers on `allocations` queue it in
//!   `placement_outbox`; `crate::replication::outbox::Placements` sends what the outbox names,
//!   read from `allocations` as it is then
//!   (`POST /internal/v1/replicas/placements`), and the buddy holds it in
//!   `replica_placements`.
//! - **Closed on adoption.** The buddy adopting a job closes the home's
//!   placements of it that it holds as open (`close_placements`, SQL): from
//!   the end of the newest ledger row held of each to the last time it
//!   heard from the home, per clock hour, with credits for the work after
//!   the checkpoint the job resumes from.
//! - **Read only for a home read from its copies** ([`Store::closings`],
//!   `GET /v1/admin/usage/closings`; the tenant API's copies): a home that
//!   answers bills its own placements.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::billing::Closings;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::usage::{credit, record, CREDIT_COLUMNS, RECORD_COLUMNS};
use super::{Result, Store};

/// One placement of a job (one worker's GPUs on one node, allocated
/// together) as its home tells its buddy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementNote {
    pub job_id: Uuid,
    /// The job's ownership epoch at its home.
    pub epoch: i32,
    pub attempt: i32,
    pub rank: i32,
    /// When its GPUs were allocated (`allocations.allocated_at`): with the
    /// above, what the ledger derives the placement's row ids from.
    pub started_at: DateTime<Utc>,
    pub home: String,
    pub tenant: String,
    pub gpu_type: String,
    pub priority: i16,
    pub gpus: i32,
    pub reservation_id: Option<Uuid>,
    pub cluster_id: Option<Uuid>,
    /// When its last GPU was released; absent while it holds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
}

/// A queued placement: its outbox key and version.
pub(crate) type Queued = (PlacementNote, i64);

impl Store {
    /// Per buddy, the placements it has not been told of as they are now
    /// (at most `limit`, oldest first), each with its outbox version.
    pub(crate) async fn placements_unsent(
        &self,
        limit: i64,
    ) -> Result<BTreeMap<String, Vec<Queued>>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT o.job_id, j.epoch, o.attempt, o.rank, o.allocated_at, min(a.tenant),
                        min(a.gpu_type), j.priority, count(a.alloc_id)::int, j.reservation_id,
                        j.cluster_id,
                        CASE WHEN bool_and(a.released_at IS NOT NULL) THEN max(a.released_at) END,
                        o.buddy, o.seq
                 FROM placement_outbox o
                 JOIN jobs j ON j.job_id = o.job_id
                 JOIN allocations a ON (a.job_id, a.rank, a.attempt, a.allocated_at)
                                     = (o.job_id, o.rank, o.attempt, o.allocated_at)
                 GROUP BY o.job_id, o.rank, o.attempt, o.allocated_at, o.buddy, o.seq,
                          j.epoch, j.priority, j.reservation_id, j.cluster_id
                 ORDER BY o.seq LIMIT $1",
                &[&limit],
            )
            .await?;
        let mut out: BTreeMap<String, Vec<Queued>> = BTreeMap::new();
        for r in &rows {
            let note = PlacementNote {
                job_id: r.get(0),
                epoch: r.get(1),
                attempt: r.get(2),
                rank: r.get(3),
                started_at: r.get(4),
                home: self.region().to_string(),
                tenant: r.get(5),
                gpu_type: r.get(6),
                priority: r.get(7),
                gpus: r.get(8),
                reservation_id: r.get(9),
                cluster_id: r.get(10),
                ended_at: r.get(11),
            };
            out.entry(r.get(12)).or_default().push((note, r.get(13)));
        }
        Ok(out)
    }

    /// The buddy was told of these placements: out of the outbox, unless
    /// queued again since (a newer version).
    pub(crate) async fn placements_sent(&self, sent: &[Queued]) -> Result<()> {
        let conn = self.conn().await?;
        let jobs: Vec<Uuid> = sent.iter().map(|(n, _)| n.job_id).collect();
        let ranks: Vec<i32> = sent.iter().map(|(n, _)| n.rank).collect();
        let attempts: Vec<i32> = sent.iter().map(|(n, _)| n.attempt).collect();
        let starts: Vec<DateTime<Utc>> = sent.iter().map(|(n, _)| n.started_at).collect();
        let seqs: Vec<i64> = sent.iter().map(|(_, s)| *s).collect();
        conn.execute(
            "DELETE FROM placement_outbox o
             USING unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[], $5::bigint[])
                   AS s(job_id, rank, attempt, allocated_at, seq)
             WHERE (o.job_id, o.rank, o.attempt, o.allocated_at, o.seq)
                 = (s.job_id, s.rank, s.attempt, s.allocated_at, s.seq)",
            &[&jobs, &ranks, &attempts, &starts, &seqs],
        )
        .await?;
        Ok(())
    }

    /// A peer's placements, held for it while they are open: a new one is
    /// held (its GPUs updated if told again); one that ended is dropped
    /// (an adopter closes only open ones, and an ended placement's rows
    /// are its home's to write), unless this region closed it already.
    /// Returns how many changed.
    pub async fn hold_placements(&self, notes: &[PlacementNote]) -> Result<u64> {
        let conn = self.conn().await?;
        let (ended, open): (Vec<&PlacementNote>, Vec<&PlacementNote>) =
            notes.iter().partition(|p| p.ended_at.is_some());
        let keys = |ps: &[&PlacementNote]| {
            (
                ps.iter().map(|p| p.job_id).collect::<Vec<Uuid>>(),
                ps.iter().map(|p| p.epoch).collect::<Vec<i32>>(),
                ps.iter().map(|p| p.attempt).collect::<Vec<i32>>(),
                ps.iter().map(|p| p.rank).collect::<Vec<i32>>(),
                ps.iter()
                    .map(|p| p.started_at)
                    .collect::<Vec<DateTime<Utc>>>(),
            )
        };
        let (jobs, epochs, attempts, ranks, starts) = keys(&ended);
        let dropped = conn
            .execute(
                "DELETE FROM replica_placements r
                 USING unnest($1::uuid[], $2::int[], $3::int[], $4::int[], $5::timestamptz[])
                       AS e(job_id, epoch, attempt, rank, started_at)
                 WHERE (r.job_id, r.epoch, r.attempt, r.rank, r.started_at)
                     = (e.job_id, e.epoch, e.attempt, e.rank, e.started_at)
                   AND r.closed_at IS NULL",
                &[&jobs, &epochs, &attempts, &ranks, &starts],
            )
            .await?;
        let (jobs, epochs, attempts, ranks, starts) = keys(&open);
        let text =
            |f: fn(&PlacementNote) -> &str| -> Vec<&str> { open.iter().map(|p| f(p)).collect() };
        let priorities: Vec<i16> = open.iter().map(|p| p.priority).collect();
        let gpus: Vec<i32> = open.iter().map(|p| p.gpus).collect();
        let reservations: Vec<Option<Uuid>> = open.iter().map(|p| p.reservation_id).collect();
        let clusters: Vec<Option<Uuid>> = open.iter().map(|p| p.cluster_id).collect();
        let held = conn
            .execute(
                "INSERT INTO replica_placements (job_id, epoch, attempt, rank, started_at, home,
                                                 tenant, gpu_type, priority, gpus,
                                                 reservation_id, cluster_id)
                 SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::int[],
                                      $5::timestamptz[], $6::text[], $7::text[], $8::text[],
                                      $9::smallint[], $10::int[], $11::uuid[], $12::uuid[])
                 ON CONFLICT (job_id, epoch, attempt, rank, started_at) DO UPDATE
                   SET gpus = EXCLUDED.gpus, told_at = now()",
                &[
                    &jobs,
                    &epochs,
                    &attempts,
                    &ranks,
                    &starts,
                    &text(|p| &p.home),
                    &text(|p| &p.tenant),
                    &text(|p| &p.gpu_type),
                    &priorities,
                    &gpus,
                    &reservations,
                    &clusters,
                ],
            )
            .await?;
        Ok(dropped + held)
    }

    /// Closes `home`'s placements of `job` (at the home's `epoch`) that we
    /// hold as open, as its adopter (the SQL function `close_placements`):
    /// up to the last time we heard from the home, the work after
    /// `resumed_from` (the time of the checkpoint the job resumes from
    /// here; `None`: it starts over) credited. Returns how many hours
    /// were closed.
    pub async fn close_placements(
        &self,
        job: Uuid,
        home: &str,
        epoch: i32,
        resumed_from: Option<DateTime<Utc>>,
    ) -> Result<i32> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT close_placements($1, $2, $3, $4, $5)",
                &[&job, &home, &epoch, &resumed_from, &self.region()],
            )
            .await?;
        Ok(row.get(0))
    }

    /// The hours we closed of our peers' placements overlapping [from,
    /// to) (of `home`'s only, if given), and their credits: those whose
    /// lost time overlaps the period or that were issued in it.
    pub async fn closings(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        home: Option<&str>,
    ) -> Result<Closings> {
        let conn = self.conn().await?;
        let records = conn
            .query(
                &format!(
                    "SELECT {RECORD_COLUMNS} FROM usage_closings
                     WHERE ended_at > $1 AND started_at < $2 AND ($3::text IS NULL OR region = $3)
                     ORDER BY usage_id"
                ),
                &[&from, &to, &home],
            )
            .await?;
        let credits = conn
            .query(
                &format!(
                    "SELECT {CREDIT_COLUMNS} FROM usage_closing_credits
                     WHERE ((ended_at > $1 AND started_at < $2)
                            OR (issued_at >= $1 AND issued_at < $2))
                       AND ($3::text IS NULL OR region = $3)
                     ORDER BY credit_id"
                ),
                &[&from, &to, &home],
            )
            .await?;
        Ok(Closings {
            records: records.iter().map(record).collect(),
            credits: credits.iter().map(credit).collect(),
        })
    }
}

/// Most placements told in one request.
pub const MAX_NOTES: usize = 1000;
