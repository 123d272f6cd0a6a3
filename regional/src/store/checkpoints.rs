//! Checkpoints: the manifests agents committed to the region's checkpoint
//! store and reported in their syncs (docs/jobs.md).
//!
//! A reported checkpoint is recorded once (the same key twice is one row)
//! if its key is the canonical one for its job, epoch, seq and attempt and
//! its epoch is the job's current one. One of an older epoch comes from a
//! worker of a superseded owner (the job was adopted elsewhere since) and
//! is refused, as is one of a newer epoch than the job has (no agent can
//! have been given it): logged and counted
//! (`gangway_checkpoints_refused_total`), and not reported back — the
//! agent drops it once the sync succeeds, as it would a recorded one, since
//! sending it again would change nothing.
//!
//! The job's newest checkpoint is its highest (epoch, seq, attempt);
//! `jobs.restore_from` follows it, and with it `checkpointed_at`, which
//! preemption counts work at risk from.

use std::collections::BTreeMap;

use gangway_shared::agent::CheckpointRecord;
use tokio_postgres::Transaction;
use uuid::Uuid;

use super::Result;

/// Why a reported checkpoint was not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its key is not the canonical one for its fields.
    BadKey,
    /// The region has no such job.
    UnknownJob,
    /// Older than the job's epoch: a superseded owner's.
    StaleEpoch,
    /// Newer than the job's epoch.
    FutureEpoch,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BadKey => "bad_key",
            Refusal::UnknownJob => "unknown_job",
            Refusal::StaleEpoch => "stale_epoch",
            Refusal::FutureEpoch => "future_epoch",
        }
    }
}

/// What recording a sync's checkpoints did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Keys newly recorded.
    pub recorded: Vec<String>,
    /// Keys refused, with why.
    pub refused: Vec<(String, Refusal)>,
}

/// Records `reports` (their jobs locked by the caller) and moves each
/// job's restore point to its newest checkpoint.
pub(super) async fn record(
    tx: &Transaction<'_>,
    agent_id: &str,
    reports: &[CheckpointRecord],
) -> Result<Recorded> {
    let mut out = Recorded::default();
    if reports.is_empty() {
        return Ok(out);
    }
    let ids: Vec<Uuid> = reports.iter().map(|r| r.job_id).collect();
    let epochs: BTreeMap<Uuid, i32> = tx
        .query(
            "SELECT job_id, epoch FROM jobs WHERE job_id = ANY($1)",
            &[&ids],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut moved = Vec::new();
    for r in reports {
        let canonical = gangway_checkpoint::key(r.job_id, r.epoch, r.seq, r.attempt);
        let refusal = match epochs.get(&r.job_id) {
            _ if r.key != canonical || r.seq > i64::MAX as u64 => Some(Refusal::BadKey),
            None => Some(Refusal::UnknownJob),
            Some(&e) if r.epoch < e => Some(Refusal::StaleEpoch),
            Some(&e) if r.epoch > e => Some(Refusal::FutureEpoch),
            Some(_) => None,
        };
        if let Some(why) = refusal {
            tracing::warn!(
                job_id = %r.job_id,
                key = %r.key,
                epoch = r.epoch,
                job_epoch = epochs.get(&r.job_id),
                agent_id,
                reason = why.as_str(),
                "checkpoint refused"
            );
            metrics::counter!("gangway_checkpoints_refused_total", "reason" => why.as_str())
                .increment(1);
            out.refused.push((r.key.clone(), why));
            continue;
        }
        let inserted = tx
            .execute(
                "INSERT INTO checkpoints (job_id, epoch, seq, attempt, key, name, size_bytes, files,
                                          sha256, created_at, reported_by)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT DO NOTHING",
                &[
                    &r.job_id,
                    &r.epoch,
                    &(r.seq as i64),
                    &r.attempt,
                    &r.key,
                    &r.name,
                    &(i64::try_from(r.size_bytes).unwrap_or(i64::MAX)),
                    &(i32::try_from(r.files).unwrap_or(i32::MAX)),
                    &r.sha256,
                    &r.created_at,
                    &format!("{agent_id}/{}/rank-{}", r.node_id, r.rank),
                ],
            )
            .await?;
        if inserted == 1 {
            metrics::counter!("gangway_checkpoints_recorded_total").increment(1);
            tracing::info!(job_id = %r.job_id, key = %r.key, size_bytes = r.size_bytes, "checkpoint recorded");
            out.recorded.push(r.key.clone());
            moved.push(r.job_id);
        }
    }
    moved.sort();
    moved.dedup();
    for job in moved {
        // The newest checkpoint is the restore point; when it moves, so
        // does the time preemption counts work at risk from (when the
        // upload began, not when it finished: the work after that is not
        // in it).
        tx.execute(
            "UPDATE jobs j SET restore_from = c.key,
                               checkpointed_at = least(now(), c.created_at)
             FROM (SELECT key, created_at FROM checkpoints WHERE job_id = $1
                   ORDER BY epoch DESC, seq DESC, attempt DESC LIMIT 1) c
             WHERE j.job_id = $1 AND j.restore_from IS DISTINCT FROM c.key",
            &[&job],
        )
        .await?;
    }
    Ok(out)
}
