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
