//! Usage: a tenant's allocated GPU time, from the allocation intervals.

use chrono::{DateTime, Utc};
use gangway_shared::api::{Granularity, UsageGroup, UsageRow};

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
