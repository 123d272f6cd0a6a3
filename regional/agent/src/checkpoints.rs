//! The agent's side of the checkpoint store: uploading the checkpoints its
//! real workers write, reporting them to the region, and fetching the one a
//! restarted worker resumes from.
//!
//! - **Whose checkpoint counts.** A job's checkpoint is rank 0's: only the
//!   agent running rank 0 uploads the job's checkpoint directory, and a
//!   restart hands every rank the same checkpoint. (Sharded checkpoints
//!   written by every rank are not collected; docs/jobs.md.)
//! - **Upload.** A watcher per rank-0 worker polls its checkpoint directory
//!   and uploads each new complete checkpoint (the newest non-dot
//!   directory, as the job renames it into place when whole) on the
//!   worker's task, in the background: a slow upload holds up no sync. The
//!   manifest goes last: the commit point. A committed checkpoint waits in
//!   the outbox until a sync carrying it succeeds.
//! - **Sequence numbers.** Per job, above every seq this agent knows (the
//!   checkpoint the worker was restored from and those it uploaded); the
//!   directory's `step-N` when that is higher, else the highest + 1.
//! - **Restore.** A worker whose assignment restores from a store key gets
//!   the checkpoint fetched to `work_dir/restore/{job}/…/{name}` and
//!   verified file by file before it starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gangway_checkpoint::{parse_key, step_of_name, CheckpointStore, Manifest, Upload};
use gangway_shared::agent::CheckpointRecord;
use uuid::Uuid;

/// The agent's checkpoint store and what it uploaded.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    pub store: CheckpointStore,
    pub agent_id: String,
    /// Committed checkpoints the region has not yet accepted.
    outbox: Mutex<Vec<CheckpointRecord>>,
    /// The highest seq known per job.
    seqs: Mutex<BTreeMap<Uuid, u64>>,
}

impl Checkpoints {
    pub fn new(store: CheckpointStore, agent_id: &str) -> Self {
        Checkpoints {
            store,
            agent_id: agent_id.to_string(),
            outbox: Mutex::new(Vec::new()),
            seqs: Mutex::new(BTreeMap::new()),
        }
    }

    /// What the next sync reports.
    pub fn pending(&self) -> Vec<CheckpointRecord> {
        self.outbox.lock().expect("outbox lock").clone()
    }

    /// The region accepted a sync carrying `sent`: they need not be sent
    /// again (the region recorded each, or refused it for good).
    pub fn accepted(&self, sent: &[CheckpointRecord]) {
        self.outbox
            .lock()
            .expect("outbox lock")
            .retain(|r| !sent.iter().any(|s| s.key == r.key));
    }

    /// Notes a seq this job's checkpoints must stay above (the one it was
    /// restored from).
    pub fn know_seq(&self, job_id: Uuid, seq: u64) {
        let mut seqs = self.seqs.lock().expect("seqs lock");
        let known = seqs.entry(job_id).or_default();
        *known = (*known).max(seq);
    }

    /// The seq for a new checkpoint of `job_id` named `name`, reserved.
    fn next_seq(&self, job_id: Uuid, name: &str) -> u64 {
        let mut seqs = self.seqs.lock().expect("seqs lock");
        let known = seqs.entry(job_id).or_default();
        let seq = match step_of_name(name) {
            Some(step) if step > *known => step,
            _ => *known + 1,
        };
        *known = seq;
        seq
    }

    /// Uploads the checkpoint directory `dir` of a worker and commits it;
    /// the record waits in the outbox for the next sync.
    pub async fn upload(&self, dir: &Path, who: &Uploader) -> Result<Manifest, String> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let seq = self.next_seq(who.job_id, &name);
        let up = Upload {
            job_id: who.job_id,
            epoch: who.epoch,
            seq,
            attempt: who.attempt,
            agent_id: self.agent_id.clone(),
            node_id: who.node_id.clone(),
            rank: who.rank,
            owner: who.owner,
        };
        let started = std::time::Instant::now();
        let manifest = self.store.upload(dir, &up).await.map_err(|e| {
            metrics::counter!("gangway_agent_checkpoint_upload_failures_total").increment(1);
            e.to_string()
        })?;
        metrics::histogram!("gangway_agent_checkpoint_upload_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("gangway_agent_checkpoint_upload_bytes_total")
            .increment(manifest.size_bytes);
        tracing::info!(
            key = %manifest.key,
            name = %manifest.name,
            size_bytes = manifest.size_bytes,
            files = manifest.files.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "checkpoint uploaded and committed"
        );
        self.outbox
            .lock()
            .expect("outbox lock")
            .push(manifest.record());
        Ok(manifest)
    }

    /// Fetches the checkpoint at `key` for a worker of `job_id` and returns
    /// the verified local directory (named as the job named it), reusing a
    /// copy already fetched on this machine.
    pub async fn restore(
        &self,
        work_dir: &Path,
        job_id: Uuid,
        key: &str,
    ) -> Result<PathBuf, String> {
        let parts = parse_key(key).ok_or_else(|| {
            format!("{key:?} is not a checkpoint key (jobs/{{job}}/epoch-{{e}}/seq-{{n}}-attempt-{{a}})")
        })?;
        if parts.job_id != job_id {
            return Err(format!("checkpoint {key} belongs to another job"));
        }
        let manifest = self.store.manifest(key).await.map_err(|e| e.to_string())?;
        let dest = restore_root(work_dir, job_id)
            .join(format!(
                "epoch-{}-seq-{}-attempt-{}",
                parts.epoch, parts.seq, parts.attempt
            ))
            .join(&manifest.name);
        let started = std::time::Instant::now();
        self.store
            .fetch(key, &dest)
            .await
            .map_err(|e| e.to_string())?;
        self.know_seq(job_id, parts.seq);
        tracing::info!(
            key,
            dir = %dest.display(),
            size_bytes = manifest.size_bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "checkpoint fetched and verified"
        );
        Ok(dest)
    }
}

/// Where restored checkpoints of a job go on this agent.
pub(crate) fn restore_root(work_dir: &Path, job_id: Uuid) -> PathBuf {
    work_dir.join("restore").join(job_id.to_string())
}

/// The worker an upload is for.
#[derive(Clone, Debug)]
pub(crate) struct Uploader {
    pub job_id: Uuid,
    pub epoch: i32,
    pub attempt: i32,
    pub node_id: String,
    pub rank: u32,
    /// The worker's user: only files it owns are uploaded.
    pub owner: Option<u32>,
}
