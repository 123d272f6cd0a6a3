//! Committed capacity replicated to every peer (V22, docs/billing.md, "A
//! region that does not come back"): each version of `commitment_history`
//! records its last change (`change_seq`, and the transaction,
//! `change_xid`); `crate::replication::outbox::Commitments` sends each peer the versions
//! changed by transactions that ended since it was last sent
//! (`commitment_peers.sent_xmin`), and a peer holds them in
//! `held_commitments`, from which [`Store::held_usage_commitments`] reads
//! the home's records exactly as the home reads its own.

use chrono::{DateTime, Utc};
use gangway_shared::billing::CommitmentKind;
use serde::{Deserialize, Serialize};

use super::{Result, Store};

/// One version of a commitment, as its region keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitmentVersion {
    pub version_id: i64,
    pub kind: CommitmentKind,
    pub commitment_id: String,
    pub tenant: String,
    pub gpu_type: String,
    pub gpus: i32,
    pub window_start: Option<DateTime<Utc>>,
    pub window_end: Option<DateTime<Utc>>,
    pub valid_from: DateTime<Utc>,
    pub valid_until: Option<DateTime<Utc>>,
    pub change_seq: i64,
}

/// What a home sends a peer: its versions changed since the peer's last
/// acknowledgement, oldest change first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitmentCopies {
    pub home: String,
    pub versions: Vec<CommitmentVersion>,
}

/// Most versions sent at once.
pub const MAX_VERSIONS: usize = 500;

impl Store {
    /// Our versions changed by transactions that ended since `peer` was
    /// last sent (at most `limit`, in (transaction, change) order), and
    /// where the next sending starts once these are held: after the last
    /// one read, or — when that was all — at the oldest transaction
    /// running now. Nothing changed: nothing to send, and no cursor (it
    /// may stay where it is).
    pub(crate) async fn commitments_unsent(
        &self,
        peer: &str,
        limit: i64,
    ) -> Result<Option<(Vec<CommitmentVersion>, (String, i64))>> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "WITH upto AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x),
                 sent AS (SELECT coalesce((SELECT sent_xid FROM commitment_peers
                                           WHERE peer = $1), '0'::xid8) AS x,
                                 coalesce((SELECT sent_seq FROM commitment_peers
                                           WHERE peer = $1), 0) AS s)
                 SELECT version_id, kind, commitment_id, tenant, gpu_type, gpus, window_start,
                        window_end, valid_from, valid_until, change_seq,
                        change_xid::text, upto.x::text
                 FROM commitment_history, upto, sent
                 WHERE (change_xid > sent.x OR (change_xid = sent.x AND change_seq > sent.s))
                   AND change_xid < upto.x
                 ORDER BY change_xid, change_seq LIMIT $2",
                &[&peer, &limit],
            )
            .await?;
        let next = match rows.last() {
            None => return Ok(None),
            Some(r) if rows.len() as i64 == limit => (r.get(11), r.get(10)),
            Some(r) => (r.get(12), 0),
        };
        let versions = rows
            .iter()
            .filter_map(|r| {
                Some(CommitmentVersion {
                    version_id: r.get(0),
                    kind: CommitmentKind::parse(r.get(1))?,
                    commitment_id: r.get(2),
                    tenant: r.get(3),
                    gpu_type: r.get(4),
                    gpus: r.get(5),
                    window_start: r.get(6),
                    window_end: r.get(7),
                    valid_from: r.get(8),
                    valid_until: r.get(9),
                    change_seq: r.get(10),
                })
            })
            .collect();
        Ok(Some((versions, next)))
    }

    /// `peer` holds every change before `next` (transaction, change).
    pub(crate) async fn commitments_sent(&self, peer: &str, next: &(String, i64)) -> Result<()> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO commitment_peers (peer, sent_xid, sent_seq)
             VALUES ($1, $2::text::xid8, $3)
             ON CONFLICT (peer) DO UPDATE
               SET sent_xid = EXCLUDED.sent_xid, sent_seq = EXCLUDED.sent_seq
               WHERE (EXCLUDED.sent_xid, EXCLUDED.sent_seq)
                   > (commitment_peers.sent_xid, commitment_peers.sent_seq)",
            &[&peer, &next.0, &next.1],
        )
        .await?;
        Ok(())
    }

    /// Holds a peer's versions: a version held already takes a later
    /// change only. Returns how many changed.
    pub async fn hold_commitments(&self, c: &CommitmentCopies) -> Result<u64> {
        let conn = self.conn().await?;
        let mut n = 0;
        for v in &c.versions {
            n += conn
                .execute(
                    "INSERT INTO held_commitments (home, version_id, kind, commitment_id, tenant,
                                                   gpu_type, gpus, window_start, window_end,
                                                   valid_from, valid_until, change_seq)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                     ON CONFLICT (home, version_id) DO UPDATE
                       SET kind = EXCLUDED.kind, commitment_id = EXCLUDED.commitment_id,
                           tenant = EXCLUDED.tenant, gpu_type = EXCLUDED.gpu_type,
                           gpus = EXCLUDED.gpus, window_start = EXCLUDED.window_start,
                           window_end = EXCLUDED.window_end, valid_from = EXCLUDED.valid_from,
                           valid_until = EXCLUDED.valid_until,
                           change_seq = EXCLUDED.change_seq
                       WHERE held_commitments.change_seq < EXCLUDED.change_seq",
                    &[
                        &c.home,
                        &v.version_id,
                        &v.kind.as_str(),
                        &v.commitment_id,
                        &v.tenant,
                        &v.gpu_type,
                        &v.gpus,
                        &v.window_start,
                        &v.window_end,
                        &v.valid_from,
                        &v.valid_until,
                        &v.change_seq,
                    ],
                )
                .await?;
        }
        Ok(n)
    }
}
