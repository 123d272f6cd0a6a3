//! One task per worker, real or simulated.
//!
//! A worker task owns its process (or its timer) from start to exit and
//! returns an [`Exit`]; nobody else signals or reaps the process. It is told
//! what to do through its [`Control`]: `stop` asks for SIGTERM and SIGKILL
//! after the worker's grace period; `kill` cuts the grace short.

pub(crate) mod isolation;
pub(crate) mod real;
pub(crate) use real::reap_orphans;
pub(crate) mod sim;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gangway_shared::agent::{Assignment, WorkerReport, WorkerStatus};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::checkpoints::Checkpoints;
use crate::config::ExecutorKind;

/// A worker's identity within a boot: the region never reuses it for a
/// different worker, so the agent never launches the same key twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct WorkerKey {
    pub job_id: Uuid,
    pub rank: u32,
    pub attempt: i32,
}

impl WorkerKey {
    pub fn of(a: &Assignment) -> Self {
        WorkerKey {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
        }
    }

    /// The worker a report is about.
    pub fn reported(r: &WorkerReport) -> Self {
        WorkerKey {
            job_id: r.job_id,
            rank: r.rank,
            attempt: r.attempt,
        }
    }
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/rank-{}/attempt-{}",
            self.job_id, self.rank, self.attempt
        )
    }
}

/// Everything an executor needs to run one worker, with durations already
/// scaled for the executor.
#[derive(Clone, Debug)]
pub(crate) struct WorkerSpec {
    pub key: WorkerKey,
    /// Whose job it is: the worker runs as that tenant's user.
    pub tenant: String,
    pub node_id: String,
    pub gpus: Vec<u32>,
    pub world_size: u32,
    pub local_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Sim only: how long the worker runs before it exits 0.
    pub run_for: Duration,
    /// Stop the worker after this long.
    pub max_duration: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The checkpoint to resume from: a checkpoint store key (fetched to a
    /// local directory for `GANGWAY_RESTORE_FROM`), else passed as it is.
    pub restore_from: Option<String>,
    /// How long a worker asked to checkpoint has before it is stopped.
    pub checkpoint_deadline: Duration,
    /// The job's ownership epoch: its checkpoints are uploaded under it.
    pub epoch: i32,
}

impl WorkerSpec {
    /// The spec for `a`; for the sim executor, durations are multiplied by
    /// `time_factor` (the real executor runs in real time).
    pub fn from_assignment(a: &Assignment, kind: ExecutorKind, time_factor: f64) -> Self {
        let factor = match kind {
            ExecutorKind::Real => 1.0,
            ExecutorKind::Sim => time_factor,
        };
        WorkerSpec {
            key: WorkerKey::of(a),
            tenant: a.tenant.clone(),
            node_id: a.node_id.clone(),
            gpus: a.gpus.clone(),
            world_size: a.world_size,
            local_rank: a.local_rank,
            master_addr: a.master_addr.clone(),
            master_port: a.master_port,
            command: a.command.clone(),
            env: a.env.clone(),
            run_for: scaled_secs(a.estimated_duration_s, factor),
            max_duration: a.max_duration_s.map(|s| scaled_secs(s, factor)),
            grace: Duration::from_secs(a.grace_period_s),
            restore_from: a.restore_from.clone(),
            checkpoint_deadline: Duration::from_secs(a.checkpoint_deadline_s),
            epoch: a.epoch,
        }
    }
}

/// `secs * factor` as a duration; negative becomes zero, overflow a century.
fn scaled_secs(secs: i64, factor: f64) -> Duration {
    let scaled = (secs.max(0) as f64) * factor;
    Duration::try_from_secs_f64(scaled).unwrap_or(Duration::from_secs(100 * 365 * 86_400))
}

/// How a worker ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub message: Option<String>,
    /// The newest complete checkpoint when it ended.
    pub checkpoint: Option<String>,
}

impl Exit {
    pub fn status(&self) -> WorkerStatus {
        WorkerStatus::Exited {
            exit_code: self.exit_code,
            signal: self.signal,
            message: self.message.clone(),
        }
    }
}

/// Why the agent ends a worker that has not ended by itself.
pub(crate) const STOPPED: &str = "stopped";
pub(crate) const MAX_DURATION_EXCEEDED: &str = "max_duration_exceeded";
pub(crate) const CHECKPOINTED: &str = "checkpointed and stopped";
pub(crate) const CHECKPOINT_DEADLINE: &str = "checkpoint deadline passed; stopped";

/// How the agent tells a worker task to end.
#[derive(Clone, Debug, Default)]
pub(crate) struct Control {
    /// SIGTERM now, SIGKILL after the grace period.
    pub stop: CancellationToken,
    /// SIGKILL now (after a SIGTERM, if none was sent yet).
    pub kill: CancellationToken,
    /// Checkpoint (SIGUSR1), wait for it or the deadline, then stop.
    pub checkpoint: CancellationToken,
    /// The deadline the region gave with its checkpoint request, in
    /// milliseconds (a drain may give less than the launch-time deadline);
    /// 0 = the worker spec's.
    pub checkpoint_deadline_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Control {
    /// Asks for a checkpoint within `deadline` (when given).
    pub fn checkpoint_within(&self, deadline: Option<Duration>) {
        if let Some(d) = deadline {
            self.checkpoint_deadline_ms.store(
                (d.as_millis() as u64).max(1),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        self.checkpoint.cancel();
    }

    /// The checkpoint deadline: the region's with its request, else `spec`'s.
    pub fn checkpoint_deadline(&self, spec: Duration) -> Duration {
        match self
            .checkpoint_deadline_ms
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => spec,
            ms => Duration::from_millis(ms),
        }
    }
}

/// A worker task that has been started.
#[derive(Debug)]
pub(crate) struct WorkerHandle {
    pub control: Control,
    pub task: JoinHandle<Exit>,
}

/// Where and how worker tasks run.
#[derive(Clone, Debug)]
pub(crate) struct Executor {
    pub kind: ExecutorKind,
    pub time_factor: f64,
    pub work_dir: PathBuf,
    pub agent_id: String,
    /// Notified whenever a worker ends, so its exit is reported promptly.
    pub exited: Arc<Notify>,
    /// Real only: the region's checkpoint store, where rank 0's
    /// checkpoints are uploaded and restores come from.
    pub checkpoints: Option<Arc<Checkpoints>>,
    /// Real only: what workers run as and may touch.
    pub isolation: Arc<isolation::Isolation>,
}

impl Executor {
    pub fn spec(&self, a: &Assignment) -> WorkerSpec {
        WorkerSpec::from_assignment(a, self.kind, self.time_factor)
    }

    /// The newest complete checkpoint of a running job's workers (real
    /// executor; the simulated one checkpoints only when asked).
    pub fn running_checkpoint(&self, job_id: Uuid) -> Option<String> {
        match self.kind {
            ExecutorKind::Real => {
                real::newest_checkpoint(&real::job_checkpoint_dir(&self.work_dir, job_id))
            }
            ExecutorKind::Sim => None,
        }
    }

    /// Starts `spec` on its own task, in its own root span.
    pub fn launch(&self, spec: WorkerSpec) -> WorkerHandle {
        let control = Control::default();
        let span = tracing::info_span!(
            parent: None,
            "worker",
            agent_id = %self.agent_id,
            job_id = %spec.key.job_id,
            rank = spec.key.rank,
            attempt = spec.key.attempt,
            node_id = %spec.node_id,
            executor = %self.kind,
        );
        let task = {
            let control = control.clone();
            let exited = self.exited.clone();
            let kind = self.kind;
            let work_dir = self.work_dir.clone();
            let checkpoints = self.checkpoints.clone();
            let isolation = self.isolation.clone();
            tokio::spawn(
                async move {
                    tracing::info!("worker starting");
                    let exit = match kind {
                        ExecutorKind::Real => {
                            real::run(&spec, &work_dir, &control, checkpoints.as_ref(), &isolation)
                                .await
                        }
                        ExecutorKind::Sim => sim::run(&spec, &control).await,
                    };
                    tracing::info!(
                        exit_code = ?exit.exit_code,
                        signal = ?exit.signal,
                        message = exit.message.as_deref().unwrap_or(""),
                        "worker exited"
                    );
                    exited.notify_one();
                    exit
                }
                .instrument(span),
            )
        };
        WorkerHandle { control, task }
    }
}

/// Sleeps for `d`, or forever when there is no limit.
pub(crate) async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn spec(command: &[&str]) -> WorkerSpec {
        WorkerSpec {
            key: WorkerKey {
                job_id: Uuid::new_v4(),
                rank: 1,
                attempt: 0,
            },
            tenant: "acme".into(),
            node_id: "node-a".into(),
            gpus: vec![2, 3],
            world_size: 4,
            local_rank: 1,
            master_addr: "10.0.0.7".into(),
            master_port: 29500,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            run_for: Duration::from_secs(1),
            max_duration: None,
            grace: Duration::from_secs(5),
            restore_from: None,
            checkpoint_deadline: Duration::from_secs(5),
            epoch: 1,
        }
    }
}
