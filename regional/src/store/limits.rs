//! Per-tenant admission limits (`tenant_limits`): how many of a tenant's
//! jobs may be queued, and how many GPUs its unfinished jobs may ask for,
//! in this region. A submission over a limit is refused before anything
//! is written.
//!
//! A tenant with no limits row submits in one statement (`jobs.rs`), which
//! also says whether it has one. A limited tenant's submission runs in a
//! transaction that takes the tenant's advisory lock, counts and only then
//! inserts: submissions of one limited tenant are serialised, so two
//! concurrent ones cannot both pass the check on the same count. The
//! transaction is READ COMMITTED, so the count (a statement after the lock
//! is granted) sees every submission that held the lock before.
//!
//! Only admission is limited: a preempted job that requeues, or a job
//! admitted while the limit was being set, may leave a tenant above its
//! limit for a while; its next submissions are refused until it is back
//! under it.

use gangway_shared::api::{LimitTerms, TenantLimits, TenantLimitsList};
use tokio_postgres::Transaction;

use super::{Result, Store, StoreError};

/// The class (first key) of the two-key advisory lock a limited tenant's
/// submissions take; the second is `hashtext(tenant)`. Two-key locks are
/// a space apart from the one-key locks of idempotency keys, leadership,
/// maintenance and migrations. Two tenants whose names hash alike only
/// wait for each other.
pub(super) const ADMISSION_LOCK_CLASS: i32 = 0x6c69_6d74; // "limt"

/// A limited tenant's limits, with what it has now: queued jobs and GPUs
/// of unfinished jobs (those running in a capacity reservation or on a
/// dedicated cluster, on GPUs of their own, not counted). No row: no limits.
const ADMISSION: &str = "
    SELECT l.max_queued_jobs, l.max_gpus, c.queued, c.gpus
    FROM tenant_limits l,
         LATERAL (SELECT count(*) FILTER (WHERE j.state = 'queued') AS queued,
                         coalesce(sum(j.gpus) FILTER (WHERE j.reservation_id IS NULL
                                                    AND j.cluster_id IS NULL), 0)::bigint
                             AS gpus
                  FROM jobs j
                  WHERE j.tenant = $1
                    AND j.state NOT IN ('succeeded', 'failed', 'cancelled')) c
    WHERE l.tenant = $1";

/// A tenant's limits and its counts, as [`ADMISSION`] reads them.
#[derive(Clone, Copy, Debug)]
struct Standing {
    limits: LimitTerms,
    queued: u64,
    unfinished_gpus: u64,
}

fn standing_from_row(r: &tokio_postgres::Row) -> Standing {
    let limit = |c: &str| r.get::<_, Option<i32>>(c).map(|v| v.max(0) as u32);
    Standing {
        limits: LimitTerms {
            max_queued_jobs: limit("max_queued_jobs"),
            max_gpus: limit("max_gpus"),
        },
        queued: r.get::<_, i64>("queued").max(0) as u64,
        unfinished_gpus: r.get::<_, i64>("gpus").max(0) as u64,
    }
}

/// Whether a job of `job_gpus` GPUs may be admitted (it would be queued,
/// and its GPUs added to the unfinished ones). The queued-jobs limit is
/// checked first.
fn admit(region: &str, s: &Standing, job_gpus: u64) -> Result<()> {
    if let Some(limit) = s.limits.max_queued_jobs {
        if s.queued + 1 > u64::from(limit) {
            return Err(StoreError::QueuedJobsLimit {
                region: region.to_string(),
                limit,
                queued: s.queued,
            });
        }
    }
    if let Some(limit) = s.limits.max_gpus {
        if job_gpus > 0 && s.unfinished_gpus + job_gpus > u64::from(limit) {
            return Err(StoreError::RequestedGpusLimit {
                region: region.to_string(),
                limit,
                unfinished_gpus: s.unfinished_gpus,
                job_gpus,
            });
        }
    }
    Ok(())
}

/// Inside a limited tenant's submit transaction: waits for the tenant's
/// advisory lock (held until the transaction ends), then refuses the job
/// if it would put the tenant over a limit. Limits deleted meanwhile
/// admit it.
pub(super) async fn admit_in_tx(
    tx: &Transaction<'_>,
    region: &str,
    tenant: &str,
    job_gpus: u64,
) -> Result<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&ADMISSION_LOCK_CLASS, &tenant],
    )
    .await?;
    match tx.query_opt(ADMISSION, &[&tenant]).await? {
        Some(row) => admit(region, &standing_from_row(&row), job_gpus),
        None => Ok(()),
    }
}

/// A `tenant_limits` row (its [`LIMITS_COLUMNS`]) as the API shows it.
pub(super) fn limits_from_row(r: &tokio_postgres::Row) -> TenantLimits {
    let limit = |c: &str| r.get::<_, Option<i32>>(c).map(|v| v.max(0) as u32);
    TenantLimits {
        tenant: r.get("tenant"),
        max_queued_jobs: limit("max_queued_jobs"),
        max_gpus: limit("max_gpus"),
        updated_at: r.get("updated_at"),
    }
}

/// The columns [`limits_from_row`] reads.
pub(super) const LIMITS_COLUMNS: &str = "tenant, max_queued_jobs, max_gpus, updated_at";

impl Store {
    /// Whether a job of `job_gpus` GPUs from `tenant` would be admitted
    /// now: the check a submit makes, without its lock (a dry run's).
    pub async fn check_admission(&self, tenant: &str, job_gpus: u64) -> Result<()> {
        let conn = self.conn().await?;
        match conn.query_opt(ADMISSION, &[&tenant]).await? {
            Some(row) => admit(self.region(), &standing_from_row(&row), job_gpus),
            None => Ok(()),
        }
    }

    /// Every tenant's limits, ordered by tenant.
    pub async fn list_limits(&self) -> Result<TenantLimitsList> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!("SELECT {LIMITS_COLUMNS} FROM tenant_limits ORDER BY tenant"),
                &[],
            )
            .await?;
        Ok(TenantLimitsList {
            limits: rows.iter().map(limits_from_row).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(q: Option<u32>, g: Option<u32>, queued: u64, gpus: u64) -> Standing {
        Standing {
            limits: LimitTerms {
                max_queued_jobs: q,
                max_gpus: g,
            },
            queued,
            unfinished_gpus: gpus,
        }
    }

    #[test]
    fn a_job_is_admitted_up_to_each_limit_and_refused_past_it() {
        assert!(admit("r", &standing(Some(2), None, 1, 100), 8).is_ok());
        assert!(matches!(
            admit("r", &standing(Some(2), None, 2, 0), 1),
            Err(StoreError::QueuedJobsLimit {
                limit: 2,
                queued: 2,
                ..
            })
        ));
        assert!(admit("r", &standing(None, Some(16), 9, 8), 8).is_ok());
        assert!(matches!(
            admit("r", &standing(None, Some(16), 0, 9), 8),
            Err(StoreError::RequestedGpusLimit {
                limit: 16,
                unfinished_gpus: 9,
                job_gpus: 8,
                ..
            })
        ));
        // Zero admits nothing; both limits unset admit anything.
        assert!(admit("r", &standing(Some(0), None, 0, 0), 1).is_err());
        assert!(admit("r", &standing(None, None, 1000, 1000), 1000).is_ok());
        // Both over: the queued-jobs limit is the one reported.
        assert!(matches!(
            admit("r", &standing(Some(1), Some(1), 1, 1), 1),
            Err(StoreError::QueuedJobsLimit { .. })
        ));
    }
}
