//! The region's copy of tenants' records and API keys (`identity_records`,
//! V30): the global tier writes each to every region and reads from a
//! majority, so all this keeps is the newest version it was sent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gangway_shared::api::IdentityRecord;

use super::nodes::insert_audit;
use super::{Result, Store};

fn record(r: &tokio_postgres::Row) -> IdentityRecord {
    IdentityRecord {
        version: r.get("version"),
        doc: r.get("doc"),
        last_used_at: r.get("last_used_at"),
    }
}

impl Store {
    /// Keeps `doc` as `kind`/`id` unless a newer version is kept already;
    /// audited as `action` by `actor` when it changed something. Whether
    /// it was kept.
    pub async fn put_identity(
        &self,
        kind: &str,
        id: &str,
        version: i64,
        doc: &serde_json::Value,
        actor: &str,
        action: &str,
    ) -> Result<bool> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let kept = tx
            .execute(
                "INSERT INTO identity_records (kind, id, version, doc) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (kind, id) DO UPDATE SET version = EXCLUDED.version, doc = EXCLUDED.doc
                 WHERE identity_records.version < EXCLUDED.version",
                &[&kind, &id, &version, doc],
            )
            .await?
            == 1;
        if kept {
            let target = format!("{kind}/{id}");
            insert_audit(&tx, actor, action, &target, None, doc.clone()).await?;
        }
        tx.commit().await?;
        Ok(kept)
    }

    pub async fn get_identity(&self, kind: &str, id: &str) -> Result<Option<IdentityRecord>> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                "SELECT version, doc, last_used_at FROM identity_records WHERE kind = $1 AND id = $2",
                &[&kind, &id],
            )
            .await?;
        Ok(row.as_ref().map(record))
    }

    /// Every record of `kind`, or of `kind` for one tenant, by id.
    pub async fn list_identity(
        &self,
        kind: &str,
        tenant: Option<&str>,
    ) -> Result<BTreeMap<String, IdentityRecord>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT id, version, doc, last_used_at FROM identity_records
                 WHERE kind = $1 AND ($2::text IS NULL OR doc ->> 'tenant' = $2)
                 ORDER BY id",
                &[&kind, &tenant],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get("id"), record(r))).collect())
    }

    /// Notes a use of a key (the latest use kept); false if no such record.
    pub async fn identity_used(&self, kind: &str, id: &str, at: DateTime<Utc>) -> Result<bool> {
        let conn = self.conn().await?;
        let n = conn
            .execute(
                "UPDATE identity_records SET last_used_at = greatest(last_used_at, $3)
                 WHERE kind = $1 AND id = $2",
                &[&kind, &id, &at],
            )
            .await?;
        Ok(n == 1)
    }
}
