//! Scheduling leadership through a PostgreSQL advisory lock.
//!
//! The lock lives on one dedicated connection: if the process dies or the
//! connection breaks, PostgreSQL releases it and another replica takes over.
//! Leadership is an optimisation, not the safety net: two leaders for a
//! moment would only waste work, because every plan commits against the
//! scheduling generation.
//!
//! The lock dies with its session, and a session dies with its server: when
//! the database fails over to a standby (Patroni, docs/operations.md), the
//! old primary's sessions end and nobody holds the lock on the new one. So
//! a leader stops leading the moment its lock connection ends
//! ([`Leadership::lost`], cancelled by the connection's own driver, not at
//! the next check), and competes again on a new connection, which the
//! multi-host URL takes to the new primary; one replica wins there.

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::store::PgTarget;

/// Advisory lock key of the scheduling leader ("gangway-leader").
const LEADER_LOCK_KEY: i64 = 0x6761_6e67_6c65_6164;

pub struct Leadership {
    client: Client,
    held: bool,
    /// Cancelled when the lock's connection ends.
    lost: CancellationToken,
}

impl Leadership {
    /// Opens the dedicated connection (not yet leader), over TLS when the
    /// URL asks (`store/pg_tls.rs`), like the store's pools.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, lost) = PgTarget::parse(url)?.connect("leader").await?;
        Ok(Leadership {
            client,
            held: false,
            lost,
        })
    }

    /// Tries to become leader; returns whether this replica now leads.
    pub async fn try_acquire(&mut self) -> Result<bool, tokio_postgres::Error> {
        if self.held {
            return self.still_held().await;
        }
        let row = self
            .client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK_KEY])
            .await?;
        self.held = row.get(0);
        Ok(self.held)
    }

    /// Cancelled the moment the lock's connection ends, and with it the
    /// lock (whatever was leading under it must stop).
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// Checks that the connection holding the lock is alive.
    pub async fn still_held(&mut self) -> Result<bool, tokio_postgres::Error> {
        if self.client.is_closed() || self.lost.is_cancelled() {
            self.held = false;
            return Ok(false);
        }
        self.client.simple_query("SELECT 1").await?;
        Ok(self.held)
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.lost.is_cancelled()
    }

    /// Gives leadership up (on shutdown), so a peer takes over at once.
    pub async fn release(&mut self) {
        if self.held {
            let _ = self
                .client
                .execute("SELECT pg_advisory_unlock($1)", &[&LEADER_LOCK_KEY])
                .await;
            self.held = false;
        }
    }
}
