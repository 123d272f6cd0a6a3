//! The audit log: every operator action, append-only (a trigger refuses
//! updates and deletes), written in the same transaction as the action.

use gangway_shared::api::{
    AuditEntry, AuditList, AuditQuery, LimitTerms, QuotaTerms, TenantLimits,
};
use serde_json::json;
use uuid::Uuid;

use super::jobs::{preempt_in_tx, PreemptBy};
use super::limits::{limits_from_row, LIMITS_COLUMNS};
use super::nodes::insert_audit;
use super::{Result, Store};

/// Who changes a tenant's reservation or dedicated cluster: the tenant
/// (only its own), or an operator (any tenant's, audited in the change's
/// transaction).
#[derive(Clone, Copy, Debug)]
pub enum Who<'a> {
    Tenant(&'a str),
    Operator(&'a str),
}

impl Who<'_> {
    /// The tenant whose objects it may see (`None`: every tenant's).
    pub(super) fn tenant(&self) -> Option<&str> {
        match self {
            Who::Tenant(t) => Some(t),
            Who::Operator(_) => None,
        }
    }

    /// An operator's action, written to the audit log in `tx` (a tenant's
    /// own changes are not operator actions).
    pub(super) async fn audit(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        action: &str,
        target: Uuid,
        detail: serde_json::Value,
    ) -> Result<()> {
        if let Who::Operator(actor) = self {
            insert_audit(tx, actor, action, &target.to_string(), None, detail).await?;
        }
        Ok(())
    }
}

impl Store {
    /// [`Store::set_quota`], audited: `quota.set` on `tenant/gpu_type`.
    pub async fn set_quota_as(
        &self,
        actor: &str,
        tenant: &str,
        gpu_type: &str,
        terms: &QuotaTerms,
    ) -> Result<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let max = terms.max_gpus.map(|m| m as i32);
        tx.execute(
            "INSERT INTO quotas (tenant, gpu_type, guaranteed_gpus, max_gpus, weight)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (tenant, gpu_type) DO UPDATE
               SET guaranteed_gpus = EXCLUDED.guaranteed_gpus, max_gpus = EXCLUDED.max_gpus,
                   weight = EXCLUDED.weight",
            &[
                &tenant,
                &gpu_type,
                &(terms.guaranteed_gpus as i32),
                &max,
                &(terms.weight_milli as i32),
            ],
        )
        .await?;
        insert_audit(
            &tx,
            actor,
            "quota.set",
            &format!("{tenant}/{gpu_type}"),
            None,
            json!({"guaranteed_gpus": terms.guaranteed_gpus, "max_gpus": terms.max_gpus,
                   "weight": f64::from(terms.weight_milli) / 1000.0}),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// [`Store::delete_quota`], audited (`quota.delete`) when there was one.
    pub async fn delete_quota_as(&self, actor: &str, tenant: &str, gpu_type: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = tx
            .execute(
                "DELETE FROM quotas WHERE tenant = $1 AND gpu_type = $2",
                &[&tenant, &gpu_type],
            )
            .await?;
        if n > 0 {
            insert_audit(
                &tx,
                actor,
                "quota.delete",
                &format!("{tenant}/{gpu_type}"),
                None,
                json!({}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Sets (replaces) a tenant's admission limits, as checked by
    /// [`gangway_shared::api::LimitsUpdate::check`], audited:
    /// `limits.set` on the tenant. Returns them as stored.
    pub async fn set_limits_as(
        &self,
        actor: &str,
        tenant: &str,
        terms: &LimitTerms,
    ) -> Result<TenantLimits> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let queued = terms.max_queued_jobs.map(|m| m as i32);
        let gpus = terms.max_gpus.map(|m| m as i32);
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO tenant_limits (tenant, max_queued_jobs, max_gpus, updated_at)
                     VALUES ($1, $2, $3, now())
                     ON CONFLICT (tenant) DO UPDATE
                       SET max_queued_jobs = EXCLUDED.max_queued_jobs,
                           max_gpus = EXCLUDED.max_gpus, updated_at = EXCLUDED.updated_at
                     RETURNING {LIMITS_COLUMNS}"
                ),
                &[&tenant, &queued, &gpus],
            )
            .await?;
        insert_audit(
            &tx,
            actor,
            "limits.set",
            tenant,
            None,
            json!({"max_queued_jobs": terms.max_queued_jobs, "max_gpus": terms.max_gpus}),
        )
        .await?;
        tx.commit().await?;
        Ok(limits_from_row(&row))
    }

    /// Removes a tenant's admission limits, audited (`limits.delete`) when
    /// it had some; returns whether it had.
    pub async fn delete_limits_as(&self, actor: &str, tenant: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let n = tx
            .execute("DELETE FROM tenant_limits WHERE tenant = $1", &[&tenant])
            .await?;
        if n > 0 {
            insert_audit(&tx, actor, "limits.delete", tenant, None, json!({})).await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    /// [`Store::preempt_job`], audited (`job.preempt`) when it preempted.
    pub async fn preempt_job_as(&self, actor: &str, id: Uuid, why: &str) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let done = preempt_in_tx(&tx, id, &PreemptBy::Operator { why }).await?;
        if done {
            insert_audit(
                &tx,
                actor,
                "job.preempt",
                &id.to_string(),
                Some(why),
                json!({}),
            )
            .await?;
            tx.commit().await?;
        }
        Ok(done)
    }

    /// A page of the audit log, newest first.
    pub async fn audit_log(&self, q: &AuditQuery) -> Result<AuditList> {
        let limit = q.limit.unwrap_or(100).clamp(1, 1000);
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT audit_id, at, actor, action, target, reason, detail FROM audit_log
                 WHERE ($1::bigint IS NULL OR audit_id < $1)
                   AND ($2::text IS NULL OR action = $2)
                   AND ($3::text IS NULL OR target = $3)
                 ORDER BY audit_id DESC LIMIT $4",
                &[&q.before, &q.action, &q.target, &limit],
            )
            .await?;
        let entries: Vec<AuditEntry> = rows
            .iter()
            .map(|r| AuditEntry {
                id: r.get("audit_id"),
                at: r.get("at"),
                actor: r.get("actor"),
                action: r.get("action"),
                target: r.get("target"),
                reason: r.get("reason"),
                detail: r.get("detail"),
            })
            .collect();
        let next_before = if entries.len() as i64 == limit {
            entries.last().map(|e| e.id)
        } else {
            None
        };
        Ok(AuditList {
            entries,
            next_before,
        })
    }
}
