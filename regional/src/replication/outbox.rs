//! What a region keeps its peers told of, so that they can carry on without
//! it (docs/failover.md): one shape, five kinds. Each kind reads from the
//! database what a peer has not been sent, POSTs it to the peer, and
//! records it sent once the peer took it; what fails is read again on the
//! next beat (the peers' endpoints take a batch twice without harm). The
//! SQL of each kind stays in `store/` (its `*_unsent` and `*_sent`); this
//! is the one loop that moves them, run by the leader on the peers' beat
//! (`loops/beat.rs`).
//!
//! | kind | endpoint | to |
//! |---|---|---|
//! | [`Updates`] (a job ended, a newer checkpoint) | `/internal/v1/replicas/updates` | the job's buddy |
//! | [`UsageRows`] (the usage ledger) | `/internal/v1/replicas/usage` | the job's buddy |
//! | [`Credits`] (usage credits) | `/internal/v1/replicas/usage/credits` | the job's buddy |
//! | [`Placements`] (open and closed placements) | `/internal/v1/replicas/placements` | the job's buddy |
//! | [`Commitments`] (reservations', clusters', quotas' versions) | `/internal/v1/replicas/commitments` | every peer |

use std::future::Future;

use serde::Serialize;
use uuid::Uuid;

use crate::replication::{copy_checkpoint, Link};
use crate::store::closings::{PlacementNote, MAX_NOTES};
use crate::store::commitment_copies::{CommitmentCopies, MAX_VERSIONS};
use crate::store::replicas::Update;
use crate::store::Result;

/// Per peer, a batch and what records it sent.
pub type Unsent<O> = Vec<(String, <O as Outbox>::Batch, <O as Outbox>::Sent)>;

/// One kind of record this region sends its peers.
pub trait Outbox {
    /// What the logs call it.
    const WHAT: &'static str;
    /// The peer endpoint that takes a batch.
    const PATH: &'static str;
    /// What is sent.
    type Batch: Serialize + Send + Sync;
    /// What records a batch as sent once the peer took it.
    type Sent: Send;
    /// Per peer, a batch it has not been sent yet.
    fn unsent(link: Link<'_>) -> impl Future<Output = Result<Unsent<Self>>> + Send;
    /// `peer` took a batch.
    fn sent(
        link: Link<'_>,
        peer: &str,
        sent: Self::Sent,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// Sends every peer what `O` says it has not been sent.
pub async fn flush<O: Outbox>(link: Link<'_>) {
    let unsent = match O::unsent(link).await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, what = O::WHAT, "cannot read what to replicate");
            return;
        }
    };
    for (peer, batch, sent) in unsent {
        let took: std::result::Result<serde_json::Value, _> =
            link.peers.post(&peer, O::PATH, &batch).await;
        match took {
            Ok(_) => {
                if let Err(e) = O::sent(link, &peer, sent).await {
                    tracing::warn!(error = %e, what = O::WHAT, peer, "cannot record what a peer holds");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, what = O::WHAT, peer, "a peer was not sent its share")
            }
        }
    }
}

/// Sends every kind, in the order a peer needs them (a job's updates
/// before the ledger rows and placements that name its epoch).
pub async fn flush_all(link: Link<'_>) {
    flush::<Updates>(link).await;
    flush::<UsageRows>(link).await;
    flush::<Credits>(link).await;
    flush::<Placements>(link).await;
    flush::<Commitments>(link).await;
}

/// A job's buddy is told when the job ends or has a newer checkpoint; a
/// new checkpoint reaches the buddy's store first (one whose copy fails
/// waits for the next beat, and so does its update).
pub struct Updates;

impl Outbox for Updates {
    const WHAT: &'static str = "updates";
    const PATH: &'static str = "/internal/v1/replicas/updates";
    type Batch = Vec<Update>;
    type Sent = Vec<(Update, String)>;

    async fn unsent(link: Link<'_>) -> Result<Unsent<Self>> {
        let mut out = Vec::new();
        for (buddy, updates) in link.store.dirty(500).await? {
            let mut held = Vec::with_capacity(updates.len());
            for (u, st) in updates {
                match &u.checkpoint {
                    Some(key) if gangway_checkpoint::is_store_key(key) => {
                        match copy_checkpoint(link, &buddy, key).await {
                            Ok(()) => held.push((u, st)),
                            Err(e) => {
                                tracing::debug!(error = %e, buddy, key, "checkpoint not copied yet")
                            }
                        }
                    }
                    _ => held.push((u, st)),
                }
            }
            if !held.is_empty() {
                let wire = held.iter().map(|(u, _)| u.clone()).collect();
                out.push((buddy, wire, held));
            }
        }
        Ok(out)
    }

    async fn sent(link: Link<'_>, _peer: &str, sent: Self::Sent) -> Result<()> {
        link.store.told(&sent).await
    }
}

/// The usage ledger's rows of our jobs, so that an adopter — and the
/// billing export, which merges every region's ledger — has them when
/// this region is gone.
pub struct UsageRows;

impl Outbox for UsageRows {
    const WHAT: &'static str = "usage rows";
    const PATH: &'static str = "/internal/v1/replicas/usage";
    type Batch = Vec<gangway_shared::billing::UsageRecord>;
    type Sent = Vec<Uuid>;

    async fn unsent(link: Link<'_>) -> Result<Unsent<Self>> {
        Ok((link.store.usage_unsent(1000).await?)
            .into_iter()
            .map(|(buddy, rows)| {
                let ids = rows.iter().map(|r| r.usage_id).collect();
                (buddy, rows, ids)
            })
            .collect())
    }

    async fn sent(link: Link<'_>, _peer: &str, ids: Vec<Uuid>) -> Result<()> {
        link.store.usage_sent(&ids).await
    }
}

/// The credits against our jobs' ledger rows, as [`UsageRows`].
pub struct Credits;

impl Outbox for Credits {
    const WHAT: &'static str = "credits";
    const PATH: &'static str = "/internal/v1/replicas/usage/credits";
    type Batch = Vec<gangway_shared::billing::CreditRecord>;
    type Sent = Vec<Uuid>;

    async fn unsent(link: Link<'_>) -> Result<Unsent<Self>> {
        Ok((link.store.credits_unsent(1000).await?)
            .into_iter()
            .map(|(buddy, credits)| {
                let ids = credits.iter().map(|c| c.credit_id).collect();
                (buddy, credits, ids)
            })
            .collect())
    }

    async fn sent(link: Link<'_>, _peer: &str, ids: Vec<Uuid>) -> Result<()> {
        link.store.credits_sent(&ids).await
    }
}

/// Our jobs' placements, open and closed, so that an adopter can close
/// them if this region never comes back (`store/closings.rs`).
pub struct Placements;

impl Outbox for Placements {
    const WHAT: &'static str = "placements";
    const PATH: &'static str = "/internal/v1/replicas/placements";
    type Batch = Vec<PlacementNote>;
    type Sent = Vec<(PlacementNote, i64)>;

    async fn unsent(link: Link<'_>) -> Result<Unsent<Self>> {
        Ok((link.store.placements_unsent(MAX_NOTES as i64).await?)
            .into_iter()
            .map(|(buddy, queued)| {
                let notes = queued.iter().map(|(n, _)| n.clone()).collect();
                (buddy, notes, queued)
            })
            .collect())
    }

    async fn sent(link: Link<'_>, _peer: &str, sent: Self::Sent) -> Result<()> {
        link.store.placements_sent(&sent).await
    }
}

/// The versions of our commitments (capacity reservations, dedicated
/// clusters, quotas) changed by transactions that ended since each peer
/// was last sent them: every peer, not only a buddy.
pub struct Commitments;

impl Outbox for Commitments {
    const WHAT: &'static str = "commitments";
    const PATH: &'static str = "/internal/v1/replicas/commitments";
    type Batch = CommitmentCopies;
    type Sent = (String, i64);

    async fn unsent(link: Link<'_>) -> Result<Unsent<Self>> {
        let mut out = Vec::new();
        for peer in &link.peers.config.peers {
            let unsent = (link.store)
                .commitments_unsent(&peer.name, MAX_VERSIONS as i64)
                .await?;
            if let Some((versions, next)) = unsent {
                let copies = CommitmentCopies {
                    home: link.store.region().to_string(),
                    versions,
                };
                out.push((peer.name.clone(), copies, next));
            }
        }
        Ok(out)
    }

    async fn sent(link: Link<'_>, peer: &str, next: (String, i64)) -> Result<()> {
        link.store.commitments_sent(peer, &next).await
    }
}
