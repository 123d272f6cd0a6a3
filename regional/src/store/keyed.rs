//! Idempotency keys of the objects tenants create and then change with
//! keyed requests (capacity reservations, dedicated clusters): a keyed
//! create's id is derived from (tenant, key) and the accepted request is
//! kept on the object; keyed resizes and deletes are recorded in a
//! requests table (key, object, operation, request). A retry with the same
//! key and body is answered without doing anything again; a key reused for
//! anything else is [`StoreError::KeyReused`]. Keys are per tenant, and one
//! key names one request, whatever its kind.

use tokio_postgres::Transaction;
use uuid::Uuid;

use super::{Result, StoreError};

/// Where one kind of object keeps its keyed creates and later requests.
pub(super) struct Keyed {
    /// The objects' table: `tenant`, `idempotency_key`, `request` and the
    /// id column.
    pub objects: &'static str,
    /// The requests' table: `tenant`, `idempotency_key`, the id column,
    /// `op`, `request`.
    pub requests: &'static str,
    pub id: &'static str,
}

pub(super) const RESERVATIONS: Keyed = Keyed {
    objects: "capacity_reservations",
    requests: "reservation_requests",
    id: "reservation_id",
};

pub(super) const CLUSTERS: Keyed = Keyed {
    objects: "clusters",
    requests: "cluster_requests",
    id: "cluster_id",
};

impl Keyed {
    /// For a keyed create of `id` (derived from `tenant` and `key`):
    /// `true` when an earlier create with this key and body made it (a
    /// retry), `false` when neither it nor the key was used before.
    pub async fn earlier_create(
        &self,
        tx: &Transaction<'_>,
        id: Uuid,
        tenant: &str,
        key: &str,
        request: &serde_json::Value,
    ) -> Result<bool> {
        let earlier = tx
            .query_opt(
                &format!(
                    "SELECT tenant, idempotency_key, request FROM {} WHERE {} = $1",
                    self.objects, self.id
                ),
                &[&id],
            )
            .await?;
        if let Some(row) = earlier {
            let same = row.get::<_, &str>(0) == tenant
                && row.get::<_, Option<&str>>(1) == Some(key)
                && row.get::<_, serde_json::Value>(2) == *request;
            return if same {
                Ok(true)
            } else {
                Err(StoreError::KeyReused)
            };
        }
        let used = tx
            .query_opt(
                &format!(
                    "SELECT 1 FROM {} WHERE tenant = $1 AND idempotency_key = $2",
                    self.requests
                ),
                &[&tenant, &key],
            )
            .await?;
        if used.is_some() {
            return Err(StoreError::KeyReused);
        }
        Ok(false)
    }

    /// For a keyed change (`op` on `id`): `true` when `key` already named
    /// this very one (a retry), `false` when it is new.
    pub async fn earlier_change(
        &self,
        tx: &Transaction<'_>,
        tenant: &str,
        key: &str,
        id: Uuid,
        op: &str,
        request: &serde_json::Value,
    ) -> Result<bool> {
        let created = tx
            .query_opt(
                &format!(
                    "SELECT 1 FROM {} WHERE tenant = $1 AND idempotency_key = $2",
                    self.objects
                ),
                &[&tenant, &key],
            )
            .await?;
        if created.is_some() {
            return Err(StoreError::KeyReused);
        }
        let Some(row) = tx
            .query_opt(
                &format!(
                    "SELECT {}, op, request FROM {} WHERE tenant = $1 AND idempotency_key = $2",
                    self.id, self.requests
                ),
                &[&tenant, &key],
            )
            .await?
        else {
            return Ok(false);
        };
        let same = row.get::<_, Uuid>(0) == id
            && row.get::<_, &str>(1) == op
            && row.get::<_, serde_json::Value>(2) == *request;
        if same {
            Ok(true)
        } else {
            Err(StoreError::KeyReused)
        }
    }

    /// Records a keyed change, so its retries are answered.
    pub async fn record(
        &self,
        tx: &Transaction<'_>,
        tenant: &str,
        key: Option<&str>,
        id: Uuid,
        op: &str,
        request: &serde_json::Value,
    ) -> Result<()> {
        if let Some(key) = key {
            tx.execute(
                &format!(
                    "INSERT INTO {} (tenant, idempotency_key, {}, op, request)
                     VALUES ($1, $2, $3, $4, $5)",
                    self.requests, self.id
                ),
                &[&tenant, &key, &id, &op, request],
            )
            .await?;
        }
        Ok(())
    }
}
