//! Usage: a tenant's allocated GPU time, from the allocation intervals;
//! and the usage ledger the database writes from them (docs/billing.md),
//! replicated to each job's buddy.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::api::{Granularity, UsageGroup, UsageRow};
use gangway_shared::billing::{UsageRecord, UsageRecords};
use uuid::Uuid;

use super::{Result, Store};

/// Every live or released allocation (one row = one GPU) clipped to
/// [from, to), cut at period boundaries, summed per period and key. A live
/// allocation counts up to now.
const USAGE_SQL: &str = "
WITH iv AS (
    SELECT a.job_id, a.gpu_type,
           greatest(a.allocated_at, $2) AS s,
           least(coalesce(a.released_at, now()), $3) AS e
    FROM allocations a
    WHERE a.tenant = $1
      AND a.allocated_at < $3
      AND coalesce(a.released_at, now()) > $2
), cut AS (
    SELECT iv.job_id, iv.gpu_type, iv.s, iv.e, p AS ps, p + ('1 ' || $4)::interval AS pe
    FROM iv,
         generate_series(date_trunc($4, iv.s, 'UTC'), iv.e, ('1 ' || $4)::interval) AS p
)
SELECT ps AS period_start,
       CASE $5 WHEN 'job' THEN job_id::text WHEN 'gpu_type' THEN gpu_type ELSE $6 END AS key,
       sum(extract(epoch FROM least(e, pe) - greatest(s, ps)))::float8 AS gpu_seconds
FROM cut
WHERE least(e, pe) > greatest(s, ps)
GROUP BY 1, 2
ORDER BY 1, 2";

impl Store {
    /// `tenant`'s GPU-seconds in [from, to), per period and key.
    pub async fn usage(
        &self,
        tenant: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        granularity: Granularity,
        group_by: UsageGroup,
    ) -> Result<Vec<UsageRow>> {
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
                    &self.region(),
                ],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| UsageRow {
                period_start: r.get("period_start"),
                key: r.get("key"),
                gpu_seconds: r.get("gpu_seconds"),
            })
            .collect())
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
const RECORD_COLUMNS: &str = "usage_id, job_id, epoch, attempt, rank, tenant, region, gpu_type,
    priority, gpus, started_at, ended_at, gpu_seconds, ended_by, cause, checkpointed_at";

fn record(r: &tokio_postgres::Row) -> UsageRecord {
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
    }
}

/// The ledger (docs/billing.md): rows are written by the database itself —
/// by the trigger on `allocations` when a placement's GPUs are released,
/// and by [`Store::meter_usage`] for the hours live placements complete.
impl Store {
    /// Writes the hours every live placement has completed since `since`
    /// (the release writes the rest). Returns how many rows are new.
    pub async fn meter_usage(&self, since: DateTime<Utc>) -> Result<i64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(sum(record_placement(job_id, rank, attempt, allocated_at, gpus,
                                                      tenant, gpu_type, now(), NULL, $1)), 0)::bigint
                 FROM (SELECT job_id, rank, attempt, allocated_at, min(tenant) AS tenant,
                              min(gpu_type) AS gpu_type, count(*)::int AS gpus
                       FROM allocations WHERE released_at IS NULL
                         AND allocated_at < date_trunc('hour', now(), 'UTC')
                       GROUP BY 1, 2, 3, 4) live",
                &[&since],
            )
            .await?;
        Ok(row.get(0))
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
        let next = if records.len() as i64 > limit {
            records.truncate(limit as usize);
            records.last().map(|r| r.usage_id)
        } else {
            None
        };
        Ok(UsageRecords { records, next })
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
        let n = conn
            .execute(
                &format!(
                    "INSERT INTO usage_ledger ({RECORD_COLUMNS})
                     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::int[],
                                          $5::int[], $6::text[], $7::text[], $8::text[],
                                          $9::smallint[], $10::int[], $11::timestamptz[],
                                          $12::timestamptz[], $13::float8[], $14::text[],
                                          $15::text[], $16::timestamptz[])
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
                ],
            )
            .await?;
        Ok(n)
    }

    /// Per buddy, rows of our jobs it does not hold yet (at most `limit`).
    async fn usage_unsent(&self, limit: i64) -> Result<BTreeMap<String, Vec<UsageRecord>>> {
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
            out.entry(r.get(16)).or_default().push(record(r));
        }
        Ok(out)
    }

    /// The buddy holds these rows now.
    async fn usage_sent(&self, ids: &[Uuid]) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute("DELETE FROM usage_outbox WHERE usage_id = ANY($1)", &[&ids])
            .await?;
        Ok(())
    }

    /// Seconds since the oldest row a buddy does not hold yet was written.
    pub async fn usage_replication_lag(&self) -> Result<f64> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT coalesce(extract(epoch FROM now() - min(l.recorded_at)), 0)::float8
                 FROM usage_outbox o JOIN usage_ledger l USING (usage_id)",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }
}

/// Sends every buddy the ledger rows of our jobs it does not hold
/// (`POST /internal/v1/replicas/usage`), so that an adopter — and the
/// billing export, which merges every region's ledger — has them when
/// this region is gone.
pub async fn flush_usage(state: &crate::api::AppState) {
    let unsent = match state.store.usage_unsent(1000).await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the usage rows to replicate");
            return;
        }
    };
    for (buddy, rows) in unsent {
        let sent: std::result::Result<serde_json::Value, _> = state
            .peers
            .post(&buddy, "/internal/v1/replicas/usage", &rows)
            .await;
        match sent {
            Ok(_) => {
                let ids: Vec<Uuid> = rows.iter().map(|r| r.usage_id).collect();
                if let Err(e) = state.store.usage_sent(&ids).await {
                    tracing::warn!(error = %e, "cannot record the usage rows a buddy holds");
                }
            }
            Err(e) => tracing::debug!(error = %e, buddy, "a buddy was not sent its usage rows"),
        }
    }
}
