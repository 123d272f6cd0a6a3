//! The usage ledger the database writes from the allocation intervals
//! (docs/billing.md), its credits, both replicated to each job's buddy; a
//! tenant's usage read from them; and what reconciliation compares them
//! with.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::api::{Granularity, UsageGroup, UsageRow};
use gangway_shared::billing::{
    AllocatedUsage, CommitmentKind, CommitmentRecord, CommitmentRecords, CreditRecord,
    CreditRecords, LivePlacement, TenantAllocated, UsageRecord, UsageRecords,
};
use uuid::Uuid;

use super::{Result, Store};

/// A tenant's GPU time in [from, to) per origin (the region that ran it),
/// period and key, from this region's ledger — its own rows and those it
/// holds for its peers — and its credits; plus, for its own live
/// placements, the time their rows do not hold yet (since the end of their
/// newest row, or their start), up to now. Ledger rows and credits lie
/// within one clock hour, so each falls in the period of its start; the
/// pending time is cut at period boundaries. One statement: one snapshot.
const USAGE_SQL: &str = "
WITH me AS (SELECT coalesce((SELECT name FROM region_meta), $7) AS name),
u AS (
    SELECT l.region AS origin, l.job_id, l.gpu_type, date_trunc($4, l.started_at, 'UTC') AS ps,
           (CASE WHEN l.started_at >= $2 AND l.ended_at <= $3 THEN l.gpu_seconds
                 ELSE l.gpus * extract(epoch FROM least(l.ended_at, $3)
                                                  - greatest(l.started_at, $2)) END)::float8 AS used,
           0::float8 AS credited, 0::float8 AS pending
    FROM (SELECT region, job_id, gpu_type, started_at, ended_at, gpus, gpu_seconds, tenant
          FROM usage_ledger
          UNION ALL
          -- A dead home's placements its adopter closed (V22): only ever
          -- of a peer, so only in what is held for it.
          SELECT region, job_id, gpu_type, started_at, ended_at, gpus, gpu_seconds, tenant
          FROM usage_closings) l
    WHERE l.tenant = $1 AND l.ended_at > $2 AND l.started_at < $3
      AND ($6::uuid IS NULL OR l.job_id = $6)
), cx AS (
    SELECT c.region, c.job_id, c.gpu_type, date_trunc($4, c.started_at, 'UTC') AS ps,
           c.cause = 'correction' AS correction,
           (CASE WHEN c.started_at >= $2 AND c.ended_at <= $3 THEN c.gpu_seconds
                 ELSE c.gpus * extract(epoch FROM least(c.ended_at, $3)
                                                  - greatest(c.started_at, $2)) END)::float8 AS s
    FROM (SELECT region, job_id, gpu_type, started_at, ended_at, gpus, gpu_seconds, tenant,
                 cause
          FROM usage_credits
          UNION ALL
          SELECT region, job_id, gpu_type, started_at, ended_at, gpus, gpu_seconds, tenant,
                 cause
          FROM usage_closing_credits) c
    WHERE c.tenant = $1 AND c.ended_at > $2 AND c.started_at < $3
      AND ($6::uuid IS NULL OR c.job_id = $6)
), c AS (
    -- A credit moves time from billed to credited; a correction (V20) is
    -- time the row counted that the placement did not hold.
    SELECT region, job_id, gpu_type, ps,
           CASE WHEN correction THEN -s ELSE 0 END::float8,
           CASE WHEN correction THEN 0 ELSE s END::float8,
           0::float8
    FROM cx
), live AS (
    SELECT a.job_id, min(a.gpu_type) AS gpu_type, count(*)::int AS gpus,
           greatest(a.allocated_at, $2, coalesce((
               SELECT max(l.ended_at) FROM usage_ledger l, me
               WHERE l.job_id = a.job_id AND l.rank = a.rank AND l.attempt = a.attempt
                 AND l.started_at >= a.allocated_at AND l.region = me.name), a.allocated_at)) AS s,
           least(now(), $3) AS e
    FROM allocations a
    WHERE a.tenant = $1 AND a.released_at IS NULL AND a.allocated_at < $3
      AND ($6::uuid IS NULL OR a.job_id = $6)
    GROUP BY a.job_id, a.rank, a.attempt, a.allocated_at
), p AS (
    SELECT me.name, live.job_id, live.gpu_type, ps, 0::float8, 0::float8,
           (live.gpus * extract(epoch FROM least(live.e, ps + ('1 ' || $4)::interval)
                                           - greatest(live.s, ps)))::float8
    FROM me, live,
         generate_series(date_trunc($4, live.s, 'UTC'), live.e, ('1 ' || $4)::interval) AS ps
    WHERE live.e > live.s AND least(live.e, ps + ('1 ' || $4)::interval) > greatest(live.s, ps)
), rows AS (
    SELECT * FROM u UNION ALL SELECT * FROM c UNION ALL SELECT * FROM p
)
SELECT origin, ps AS period_start,
       CASE $5 WHEN 'job' THEN job_id::text WHEN 'gpu_type' THEN gpu_type ELSE origin END AS key,
       sum(used)::float8 AS used, sum(credited)::float8 AS credited,
       sum(pending)::float8 AS pending
FROM rows
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3";

/// A tenant's usage as one region holds it: its own rows, and per peer
/// the rows it holds for that peer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegionUsage {
    pub own: Vec<UsageRow>,
    pub held_for: BTreeMap<String, Vec<UsageRow>>,
}

impl Store {
    /// `tenant`'s GPU time in [from, to) (of `job` only, if given), per
    /// period and key, from the ledger (docs/billing.md).
    pub async fn usage(
        &self,
        tenant: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        granularity: Granularity,
        group_by: UsageGroup,
        job: Option<Uuid>,
    ) -> Result<RegionUsage> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                USAGE_SQL,
                &[
                    &tenant,
                    &from,
                    &to,
                    &granularity.as_str(),
                    &group_by.as_str(),
                    &job,
                    &self.region(),
                ],
            )
            .await?;
        let mut out = RegionUsage::default();
        for r in &rows {
            let origin: String = r.get("origin");
            let (used, credited, pending): (f64, f64, f64) =
                (r.get("used"), r.get("credited"), r.get("pending"));
            let row = UsageRow {
                period_start: r.get("period_start"),
                key: r.get("key"),
                gpu_seconds: used + pending,
                billed_gpu_seconds: used - credited,
                credited_gpu_seconds: credited,
                pending_gpu_seconds: pending,
            };
            if origin == self.region() {
                out.own.push(row);
            } else {
                out.held_for.entry(origin).or_default().push(row);
            }
        }
        Ok(out)
    }
}

impl Store {
    /// Goodput per tenant: the allocated GPU time of all its jobs, and how
    /// much of it was lost to restarts (`jobs.lost_gpu_s`).
    pub async fn goodput_by_tenant(&self) -> Result<gangway_shared::api::GoodputList> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT j.tenant, coalesce(sum(a.s), 0)::float8, coalesce(sum(j.lost_gpu_s), 0)::float8
                 FROM jobs j
                 LEFT JOIN LATERAL (
                     SELECT sum(extract(epoch FROM coalesce(x.released_at, now()) - x.allocated_at)) AS s
                     FROM allocations x WHERE x.job_id = j.job_id
                 ) a ON true
                 GROUP BY j.tenant ORDER BY j.tenant",
                &[],
            )
            .await?;
        Ok(gangway_shared::api::GoodputList {
            tenants: rows
                .iter()
                .map(|r| {
                    let allocated: f64 = r.get::<_, f64>(1).max(0.0);
                    let lost: f64 = r.get::<_, f64>(2).clamp(0.0, allocated);
                    gangway_shared::api::TenantGoodput {
                        tenant: r.get(0),
                        allocated_gpu_s: allocated,
                        lost_gpu_s: lost,
                        goodput: super::rows::goodput(allocated, lost),
                    }
                })
                .collect(),
        })
    }
}

/// The ledger's columns, in [`record`]'s order.
pub(super) const RECORD_COLUMNS: &str =
    "usage_id, job_id, epoch, attempt, rank, tenant, region, gpu_type,
    priority, gpus, started_at, ended_at, gpu_seconds, ended_by, cause, checkpointed_at,
    reservation_id, cluster_id";

/// A page of `items` read with `LIMIT limit + 1`: cut to `limit`, and the
/// cursor of the next page (its last item's `key`), when there is one.
fn page<T, K>(items: &mut Vec<T>, limit: i64, key: impl Fn(&T) -> K) -> Option<K> {
    if items.len() as i64 <= limit {
        return None;
    }
    items.truncate(limit as usize);
    items.last().map(key)
}

pub(super) fn record(r: &tokio_postgres::Row) -> UsageRecord {
    UsageRecord {
        usage_id: r.get(0),
        job_id: r.get(1),
        epoch: r.get(2),
        attempt: r.get(3),
        rank: r.get(4),
        tenant: r.get(5),
        region: r.get(6),
        gpu_type: r.get(7),
        priority: r.get(8),
        gpus: r.get(9),
        started_at: r.get(10),
        ended_at: r.get(11),
        gpu_seconds: r.get(12),
        ended_by: r.get(13),
        cause: r.get(14),
        checkpointed_at: r.get(15),
        reservation_id: r.get(16),
        cluster_id: r.get(17),
    }
}

/// The ledger (docs/billing.md): rows are written by the database itself —
/// by the trigger on `allocations` when a placement's GPUs are released,
/// and by [`Store::meter_usage`] for the hours live placements complete.
impl Store {
    /// Writes the hours every live placement has completed since `since`
    /// (the release writes the rest), and moves the region's watermark
    /// (`region_meta.metered_until`) to this clock hour in the same
    /// transaction: every live placement has its rows for every hour
    /// before it. Looks back to the last watermark when that is older than
    /// `since` (a region down for long), so no hour is skipped. Returns how
    /// many rows are new.
    pub async fn meter_usage(&self, since: DateTime<Utc>) -> Result<i64> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        // The live allocations it meters are locked (shared) until it
        // commits, so that a release of one waits and then sees the rows
        // written here (and corrects those past a back-dated end: V20);
        // those a release has locked already are skipped — that release
        // writes every hour of its placement itself. Never waiting, the
        // meter cannot deadlock with a release.
        let locked: Vec<i64> = tx
            .query(
                "SELECT alloc_id FROM allocations
                 WHERE released_at IS NULL AND allocated_at < date_trunc('hour', now(), 'UTC')
                 FOR SHARE SKIP LOCKED",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let row = tx
            .query_one(
                "SELECT coalesce(sum(record_placement(job_id, rank, attempt, allocated_at, gpus,
                                                      tenant, gpu_type, now(), NULL, s.since)), 0)::bigint
                 FROM (SELECT least($1::timestamptz, coalesce(max(metered_until), $1)) AS since
                       FROM region_meta) s,
                      (SELECT job_id, rank, attempt, allocated_at, min(tenant) AS tenant,
                              min(gpu_type) AS gpu_type, count(*)::int AS gpus
                       FROM allocations WHERE released_at IS NULL
                         AND allocated_at < date_trunc('hour', now(), 'UTC')
                       GROUP BY 1, 2, 3, 4
                       HAVING bool_and(alloc_id = ANY($2))) live",
                &[&since, &locked],
            )
            .await?;
        tx.execute(
            "UPDATE region_meta
             SET metered_until = greatest(coalesce(metered_until, '-infinity'),
                                          date_trunc('hour', now(), 'UTC'))",
            &[],
        )
        .await?;
        tx.commit().await?;
        Ok(row.get(0))
    }

    /// Up to when every live placement is metered (`None`: not since V19).
    pub async fn metered_until(&self) -> Result<Option<DateTime<Utc>>> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt("SELECT metered_until FROM region_meta", &[])
            .await?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// Ledger rows overlapping [from, to), of `tenant` or every tenant,
    /// this region's and those it holds for its peers, in id order after
    /// `after`, at most `limit`.
    pub async fn usage_records(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<UsageRecords> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {RECORD_COLUMNS} FROM usage_ledger
                     WHERE ended_at > $1 AND started_at < $2
                       AND ($3::text IS NULL OR tenant = $3)
                       AND ($4::uuid IS NULL OR usage_id > $4)
                     ORDER BY usage_id LIMIT $5"
                ),
                &[&from, &to, &tenant, &after, &(limit + 1)],
            )
            .await?;
        let mut records: Vec<UsageRecord> = rows.iter().map(record).collect();
        let next = page(&mut records, limit, |r| r.usage_id);
        Ok(UsageRecords {
            records,
            next,
            next_start: None,
        })
    }

    /// Ledger rows overlapping [from, to), as [`Store::usage_records`]
    /// reads them, in (`started_at`, `usage_id`) order after `after` (the
    /// previous page's last row's start and id), at most `limit`: every
    /// row lies within one clock hour, so time order gives the rows hour
    /// by hour, which the billing export prices as it reads them
    /// (`usage_ledger_by_start`, V21).
    pub async fn usage_records_by_time(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<UsageRecords> {
        let conn = self.conn().await?;
        let select = |cursor: &str| {
            format!(
                "SELECT {RECORD_COLUMNS} FROM usage_ledger
                 WHERE ended_at > $1 AND started_at < $2
                   AND ($3::text IS NULL OR tenant = $3){cursor}
                 ORDER BY started_at, usage_id LIMIT $4"
            )
        };
        // The cursor as an index condition on (started_at, usage_id).
        let rows = match after {
            Some((start, id)) => {
                let sql = select(" AND (started_at, usage_id) > ($5, $6)");
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                    [&from, &to, &tenant, &(limit + 1), &start, &id];
                conn.query(&sql, &params).await?
            }
            None => (conn.query(&select(""), &[&from, &to, &tenant, &(limit + 1)])).await?,
        };
        let mut records: Vec<UsageRecord> = rows.iter().map(record).collect();
        let last = page(&mut records, limit, |r| (r.started_at, r.usage_id));
        let (next_start, next) = last.unzip();
        Ok(UsageRecords {
            records,
            next,
            next_start,
        })
    }

    /// A peer's rows, held for it (its buddy's copy): a row held already
    /// changes nothing. Returns how many are new.
    pub async fn hold_usage(&self, rows: &[UsageRecord]) -> Result<u64> {
        let conn = self.conn().await?;
        let col = |f: fn(&UsageRecord) -> String| rows.iter().map(f).collect::<Vec<String>>();
        let ids: Vec<Uuid> = rows.iter().map(|r| r.usage_id).collect();
        let jobs: Vec<Uuid> = rows.iter().map(|r| r.job_id).collect();
        let ints = |f: fn(&UsageRecord) -> i32| rows.iter().map(f).collect::<Vec<i32>>();
        let priorities: Vec<i16> = rows.iter().map(|r| r.priority).collect();
        let starts: Vec<DateTime<Utc>> = rows.iter().map(|r| r.started_at).collect();
        let ends: Vec<DateTime<Utc>> = rows.iter().map(|r| r.ended_at).collect();
        let seconds: Vec<f64> = rows.iter().map(|r| r.gpu_seconds).collect();
        let causes: Vec<Option<String>> = rows.iter().map(|r| r.cause.clone()).collect();
        let checkpointed: Vec<Option<DateTime<Utc>>> =
            rows.iter().map(|r| r.checkpointed_at).collect();
        let reservations: Vec<Option<Uuid>> = rows.iter().map(|r| r.reservation_id).collect();
        let clusters: Vec<Option<Uuid>> = rows.iter().map(|r| r.cluster_id).collect();
        let n = conn
            .execute(
                &format!(
                    "INSERT INTO usage_ledger ({RECORD_COLUMNS})
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[],
                                          $5::int[], $6::text[], $7::text[], $8::text[],
                                          $9::smallint[], $10::int[], $11::timestamptz[],
                                          $12::timestamptz[], $13::float8[], $14::text[],
                                          $15::text[], $16::timestamptz[], $17::uuid[],
                                          $18::uuid[])
                     ON CONFLICT (usage_id) DO NOTHING"
                ),
                &[
                    &ids,
                    &jobs,
                    &ints(|r| r.epoch),
                    &ints(|r| r.attempt),
                    &ints(|r| r.rank),
                    &col(|r| r.tenant.clone()),
                    &col(|r| r.region.clone()),
                    &col(|r| r.gpu_type.clone()),
                    &priorities,
                    &ints(|r| r.gpus),
                    &starts,
                    &ends,
                    &seconds,
                    &col(|r| r.ended_by.clone()),
                    &causes,
                    &checkpointed,
                    &reservations,
                    &clusters,
                ],
            )
            .await?;
        Ok(n)
    }

    /// Per buddy, rows of our jobs it does not hold yet (at most `limit`).
    pub(crate) async fn usage_unsent(
        &self,
        limit: i64,
    ) -> Result<BTreeMap<String, Vec<UsageRecord>>> {
        let conn = self.conn().await?;
        let cols = RECORD_COLUMNS.replace("usage_id", "l.usage_id");
        let rows = conn
            .query(
                &format!(
                    "SELECT {cols}, o.buddy FROM usage_outbox o JOIN usage_ledger l USING (usage_id)
                     ORDER BY l.recorded_at LIMIT $1"
                ),
                &[&limit],
            )
            .await?;
        let mut out: BTreeMap<String, Vec<UsageRecord>> = BTreeMap::new();
        for r in &rows {
            out.entry(r.get(18)).or_default().push(record(r));
        }
        Ok(out)
    }

    /// The buddy holds these rows now.
    pub(crate) async fn usage_sent(&self, ids: &[Uuid]) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute("DELETE FROM usage_outbox WHERE usage_id = ANY($1)", &[&ids])
            .await?;
        Ok(())
    }

    /// Seconds since the oldest row or credit a buddy does not hold yet
    /// was written.
    pub async fn usage_replication_lag(&self) -> Result<f64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(extract(epoch FROM now() - least(
                     (SELECT min(l.recorded_at) FROM usage_outbox o JOIN usage_ledger l USING (usage_id)),
                     (SELECT min(c.recorded_at) FROM usage_credit_outbox o
                      JOIN usage_credits c USING (credit_id)))), 0)::float8",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }
}

/// The credits' columns, in [`credit`]'s order.
pub(super) const CREDIT_COLUMNS: &str =
    "credit_id, usage_id, usage_started_at, job_id, epoch, attempt,
    rank, tenant, region, gpu_type, priority, gpus, started_at, ended_at, gpu_seconds, ended_by,
    cause, checkpointed_at, issued_at";

pub(super) fn credit(r: &tokio_postgres::Row) -> CreditRecord {
    CreditRecord {
        credit_id: r.get(0),
        usage_id: r.get(1),
        usage_started_at: r.get(2),
        job_id: r.get(3),
        epoch: r.get(4),
        attempt: r.get(5),
        rank: r.get(6),
        tenant: r.get(7),
        region: r.get(8),
        gpu_type: r.get(9),
        priority: r.get(10),
        gpus: r.get(11),
        started_at: r.get(12),
        ended_at: r.get(13),
        gpu_seconds: r.get(14),
        ended_by: r.get(15),
        cause: r.get(16),
        checkpointed_at: r.get(17),
        issued_at: r.get(18),
    }
}

/// Credits (docs/billing.md): written by the database with the usage rows
/// of a placement that ended with a credited cause (`record_placement`,
/// V19), replicated to the job's buddy like them.
impl Store {
    /// Credits whose lost time overlaps [from, to) or that were issued in
    /// it, of `tenant` or every tenant, this region's and those it holds
    /// for its peers, in id order after `after`, at most `limit`.
    pub async fn usage_credits(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<CreditRecords> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {CREDIT_COLUMNS} FROM usage_credits
                     WHERE ((ended_at > $1 AND started_at < $2)
                            OR (issued_at >= $1 AND issued_at < $2))
                       AND ($3::text IS NULL OR tenant = $3)
                       AND ($4::uuid IS NULL OR credit_id > $4)
                     ORDER BY credit_id LIMIT $5"
                ),
                &[&from, &to, &tenant, &after, &(limit + 1)],
            )
            .await?;
        let mut credits: Vec<CreditRecord> = rows.iter().map(credit).collect();
        let next = page(&mut credits, limit, |c| c.credit_id);
        Ok(CreditRecords { credits, next })
    }

    /// A peer's credits, held for it: a credit held already changes
    /// nothing. Returns how many are new.
    pub async fn hold_credits(&self, credits: &[CreditRecord]) -> Result<u64> {
        let conn = self.conn().await?;
        let text = |f: fn(&CreditRecord) -> String| credits.iter().map(f).collect::<Vec<String>>();
        let uuids = |f: fn(&CreditRecord) -> Uuid| credits.iter().map(f).collect::<Vec<Uuid>>();
        let ints = |f: fn(&CreditRecord) -> i32| credits.iter().map(f).collect::<Vec<i32>>();
        let times =
            |f: fn(&CreditRecord) -> DateTime<Utc>| credits.iter().map(f).collect::<Vec<_>>();
        let priorities: Vec<i16> = credits.iter().map(|c| c.priority).collect();
        let seconds: Vec<f64> = credits.iter().map(|c| c.gpu_seconds).collect();
        let checkpointed: Vec<Option<DateTime<Utc>>> =
            credits.iter().map(|c| c.checkpointed_at).collect();
        let n = conn
            .execute(
                &format!(
                    "INSERT INTO usage_credits ({CREDIT_COLUMNS})
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::timestamptz[], $4::uuid[],
                                          $5::int[], $6::int[], $7::int[], $8::text[],
                                          $9::text[], $10::text[], $11::smallint[], $12::int[],
                                          $13::timestamptz[], $14::timestamptz[], $15::float8[],
                                          $16::text[], $17::text[], $18::timestamptz[],
                                          $19::timestamptz[])
                     ON CONFLICT (credit_id) DO NOTHING"
                ),
                &[
                    &uuids(|c| c.credit_id),
                    &uuids(|c| c.usage_id),
                    &times(|c| c.usage_started_at),
                    &uuids(|c| c.job_id),
                    &ints(|c| c.epoch),
                    &ints(|c| c.attempt),
                    &ints(|c| c.rank),
                    &text(|c| c.tenant.clone()),
                    &text(|c| c.region.clone()),
                    &text(|c| c.gpu_type.clone()),
                    &priorities,
                    &ints(|c| c.gpus),
                    &times(|c| c.started_at),
                    &times(|c| c.ended_at),
                    &seconds,
                    &text(|c| c.ended_by.clone()),
                    &text(|c| c.cause.clone()),
                    &checkpointed,
                    &times(|c| c.issued_at),
                ],
            )
            .await?;
        Ok(n)
    }

    /// Per buddy, credits of our jobs it does not hold yet (at most
    /// `limit`).
    pub(crate) async fn credits_unsent(
        &self,
        limit: i64,
    ) -> Result<BTreeMap<String, Vec<CreditRecord>>> {
        let conn = self.conn().await?;
        let cols = CREDIT_COLUMNS.replace("credit_id", "c.credit_id");
        let rows = conn
            .query(
                &format!(
                    "SELECT {cols}, o.buddy FROM usage_credit_outbox o
                     JOIN usage_credits c USING (credit_id)
                     ORDER BY c.recorded_at LIMIT $1"
                ),
                &[&limit],
            )
            .await?;
        let mut out: BTreeMap<String, Vec<CreditRecord>> = BTreeMap::new();
        for r in &rows {
            out.entry(r.get(19)).or_default().push(credit(r));
        }
        Ok(out)
    }

    /// The buddy holds these credits now.
    pub(crate) async fn credits_sent(&self, ids: &[Uuid]) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute(
            "DELETE FROM usage_credit_outbox WHERE credit_id = ANY($1)",
            &[&ids],
        )
        .await?;
        Ok(())
    }
}

/// Reconciliation (docs/billing.md): what the allocations held, to
/// compare with the ledger.
impl Store {
    /// Per tenant, the GPU-seconds this region's allocations held in
    /// [from, to) — a live placement up to the meter's watermark — and the
    /// placements live now, all in one snapshot.
    pub async fn allocated_usage(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<AllocatedUsage> {
        let mut conn = self.conn().await?;
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        // The first statement takes the snapshot; its clock is read after.
        let meta = tx
            .query_one(
                "SELECT clock_timestamp(), (SELECT metered_until FROM region_meta)",
                &[],
            )
            .await?;
        let as_of: DateTime<Utc> = meta.get(0);
        let metered_until: Option<DateTime<Utc>> = meta.get(1);
        let tenants = tx
            .query(
                "WITH iv AS (
                     SELECT tenant, released_at IS NULL AS live,
                            greatest(allocated_at, $1) AS s,
                            least(coalesce(released_at, $3), $2) AS e
                     FROM allocations
                     WHERE allocated_at < $2 AND coalesce(released_at, $3) > $1
                 )
                 SELECT tenant,
                        coalesce(sum(extract(epoch FROM e - s)), 0)::float8,
                        coalesce(sum(extract(epoch FROM e - s)) FILTER (WHERE live), 0)::float8
                 FROM iv WHERE e > s GROUP BY tenant ORDER BY tenant",
                &[&from, &to, &metered_until],
            )
            .await?
            .iter()
            .map(|r| TenantAllocated {
                tenant: r.get(0),
                gpu_seconds: r.get(1),
                live_gpu_seconds: r.get(2),
            })
            .collect();
        let live = tx
            .query(
                "SELECT DISTINCT job_id, attempt, rank, allocated_at FROM allocations
                 WHERE released_at IS NULL AND allocated_at < $1
                 ORDER BY 1, 2, 3, 4",
                &[&to],
            )
            .await?
            .iter()
            .map(|r| LivePlacement {
                job_id: r.get(0),
                attempt: r.get(1),
                rank: r.get(2),
                started_at: r.get(3),
            })
            .collect();
        tx.commit().await?;
        Ok(AllocatedUsage {
            region: self.region().to_string(),
            from,
            to,
            as_of,
            metered_until,
            tenants,
            live,
        })
    }
}

/// What each tenant had committed in [from, to), per commitment and clock
/// hour (`GET /v1/admin/usage/commitments`, docs/billing.md): the versions
/// of `commitment_history` (V20) in force then — a reservation's within
/// its window — cut at clock hours; one still in force, up to now. `$6`:
/// the region's name.
const COMMITMENTS_SQL: &str = "
WITH me AS (SELECT coalesce($7::text, (SELECT name FROM region_meta), $6) AS name),
versions AS (
    -- Ours (no `$7`), or those a peer sent us (`$7`, V22): a version still
    -- in force there counts to when we last heard from it.
    SELECT kind, commitment_id, tenant, gpu_type, gpus, window_start, window_end, valid_from,
           coalesce(valid_until, now()) AS valid_until
    FROM commitment_history WHERE $7::text IS NULL
    UNION ALL
    SELECT kind, commitment_id, tenant, gpu_type, gpus, window_start, window_end, valid_from,
           coalesce(valid_until, greatest(valid_from, least(now(),
               (SELECT last_heard_at FROM peer_leases WHERE peer = $7))))
    FROM held_commitments WHERE home = $7
), spans AS (
    SELECT kind, commitment_id, tenant, gpu_type, gpus,
           greatest(valid_from, coalesce(window_start, valid_from), $1) AS s,
           least(valid_until, coalesce(window_end, 'infinity'), $2) AS e
    FROM versions
    WHERE valid_from < $2 AND valid_until > $1
      AND ($3::text IS NULL OR tenant = $3)
), pieces AS (
    SELECT kind, commitment_id, tenant, gpu_type, gpus, h,
           greatest(s, h) AS ps, least(e, h + interval '1 hour') AS pe
    FROM spans, generate_series(date_trunc('hour', s, 'UTC'), e, interval '1 hour') AS h
    WHERE e > s
), facts AS (
    SELECT md5(me.name || '/' || kind || '/' || commitment_id || '/'
               || extract(epoch FROM h)::text)::uuid AS record_id,
           kind, commitment_id, tenant, me.name AS region, gpu_type, h AS hour,
           min(ps) AS started_at, max(pe) AS ended_at, max(gpus) AS gpus,
           sum(gpus * extract(epoch FROM pe - ps))::float8 AS gpu_seconds
    FROM pieces, me
    WHERE pe > ps
    GROUP BY me.name, kind, commitment_id, tenant, gpu_type, h
)
SELECT record_id, kind, commitment_id, tenant, region, gpu_type, hour, started_at, ended_at,
       gpus, gpu_seconds
FROM facts
WHERE ($4::uuid IS NULL OR record_id > $4)
ORDER BY record_id LIMIT $5";

/// Committed capacity (docs/billing.md): what the triggers of V20 keep of
/// guaranteed quotas, reservations and dedicated clusters.
impl Store {
    /// This region's commitments in [from, to), of `tenant` or every
    /// tenant, one record per commitment and clock hour, in id order after
    /// `after`, at most `limit`.
    pub async fn usage_commitments(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<CommitmentRecords> {
        self.commitments_of(None, from, to, tenant, after, limit)
            .await
    }

    /// The commitments peer `home` sent us (V22), read as
    /// [`Store::usage_commitments`] reads ours — the same records, ids
    /// and all — but that a version still in force there ends when we
    /// last heard from it: what `home` is billed from when it does not
    /// come back.
    pub async fn held_usage_commitments(
        &self,
        home: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<CommitmentRecords> {
        self.commitments_of(Some(home), from, to, tenant, after, limit)
            .await
    }

    async fn commitments_of(
        &self,
        home: Option<&str>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<CommitmentRecords> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                COMMITMENTS_SQL,
                &[
                    &from,
                    &to,
                    &tenant,
                    &after,
                    &(limit + 1),
                    &self.region(),
                    &home,
                ],
            )
            .await?;
        let mut commitments = Vec::with_capacity(rows.len());
        for r in &rows {
            let kind: String = r.get(1);
            let Some(kind) = CommitmentKind::parse(&kind) else {
                continue; // the table's CHECK allows no other
            };
            commitments.push(CommitmentRecord {
                record_id: r.get(0),
                kind,
                commitment_id: r.get(2),
                tenant: r.get(3),
                region: r.get(4),
                gpu_type: r.get(5),
                hour: r.get(6),
                started_at: r.get(7),
                ended_at: r.get(8),
                gpus: r.get(9),
                gpu_seconds: r.get(10),
            });
        }
        let next = page(&mut commitments, limit, |c| c.record_id);
        let heard_at = match home {
            None => None,
            Some(home) => conn
                .query_opt(
                    "SELECT last_heard_at FROM peer_leases WHERE peer = $1",
                    &[&home],
                )
                .await?
                .and_then(|r| r.get(0)),
        };
        Ok(CommitmentRecords {
            commitments,
            next,
            heard_at,
        })
    }
}
