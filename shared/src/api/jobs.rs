//! Jobs: what tenants send (the spec) and what they get back (the job,
//! its workers, events, pages of jobs), and why a job waits (explain, dry
//! run).
//!
//! Field names here are part of the public contract (see the brief): `name`,
//! `gpus`, `gpu_type`, `priority`, `estimated_duration_s`, `command` in a
//! spec; `id`, `state`, `region` in a job.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Most GPUs one job may ask for. Larger numbers are typos, not jobs.
pub const MAX_JOB_GPUS: i64 = 100_000;
/// Most GPUs one worker (one process on one node) may hold.
pub const MAX_GPUS_PER_WORKER: i64 = 72;
/// Longest `estimated_duration_s` / `max_duration_s` accepted: one year.
pub const MAX_DURATION_S: i64 = 366 * 24 * 3600;
/// Longest job name.
pub const MAX_NAME_LEN: usize = 200;
/// Most arguments in `command`, and most entries in `env`.
pub const MAX_ARGS: usize = 4096;

/// A job as submitted.
///
/// Numbers are signed on the wire so that a negative count is reported as
/// `invalid_gpus`, not as a generic decoding failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// A name for people (1–200 printable characters); not unique.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Total GPUs of the job (all workers together).
    #[schema(minimum = 1, maximum = 100000)]
    pub gpus: i64,
    /// The GPU model, for example `h100`; `GET /v1/regions` lists what each
    /// region has.
    #[schema(pattern = "^[a-z0-9-]{1,64}$")]
    pub gpu_type: String,
    /// Default `normal`.
    #[serde(default)]
    pub priority: Priority,
    /// The tenant's estimate of the run time, in seconds. The simulated
    /// executor runs this long (scaled by its time factor).
    #[schema(minimum = 1, maximum = 31622400)]
    pub estimated_duration_s: i64,
    /// Hard limit on the run time, in seconds; the job is stopped after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31622400)]
    pub max_duration_s: Option<i64>,
    /// The argv run once per worker.
    #[schema(min_items = 1, max_items = 4096)]
    pub command: Vec<String>,
    /// Extra environment variables of every worker. Names are
    /// `[A-Za-z_][A-Za-z0-9_]*`; `GANGWAY_*` and the variables Gangway sets
    /// (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
    /// `CUDA_VISIBLE_DEVICES`) are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// GPUs per worker (one process on one node). Default 1: one process per
    /// GPU, as `torchrun --nproc-per-node` would start them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 72)]
    pub gpus_per_worker: Option<i64>,
    /// Default `gang`.
    #[serde(default)]
    pub mode: JobMode,
    /// Makes a gang **elastic**: the fewest GPUs it may run with, a
    /// multiple of `gpus_per_worker` from `gpus_per_worker` to `gpus`. When
    /// all of `gpus` do not fit, it starts with the most workers that do (at
    /// least `min_gpus / gpus_per_worker`; ranks 0 … n−1, and `WORLD_SIZE`
    /// is n), and grows by a checkpointed restart when capacity frees; a
    /// preempted elastic job may restart smaller. Absent: all or nothing.
    /// Gang mode only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100000)]
    pub min_gpus: Option<i64>,
    /// Default: no requirement, closest placement preferred.
    #[serde(default)]
    pub topology: TopologySpec,
    /// Pin the job to this region; by default the global tier chooses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Run the job in this capacity reservation of the tenant's
    /// (`POST /v1/reservations`): it is placed only inside the
    /// reservation's domain, within its GPUs, ahead of other work and
    /// outside the tenant's quota, once the reservation has started. The
    /// reservation must be the tenant's, of the job's GPU type, not
    /// deleted or over, and hold at least the job's GPUs
    /// (`invalid_reservation` otherwise). It goes to the reservation's
    /// region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Uuid>,
    /// Run the job on this dedicated cluster of the tenant's
    /// (`POST /v1/clusters`): it is placed only on the cluster's nodes,
    /// with the same gang and topology rules, outside the tenant's quota.
    /// The cluster must be the tenant's, of the job's GPU type, not being
    /// deleted, and have room for the job's shape (`invalid_cluster`
    /// otherwise); not together with `reservation`. It goes to the
    /// cluster's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Uuid>,
}

impl JobSpec {
    pub fn gpus_per_worker(&self) -> i64 {
        self.gpus_per_worker.unwrap_or(1)
    }

    /// Workers the job runs (only meaningful once validated).
    pub fn workers(&self) -> i64 {
        let per = self.gpus_per_worker();
        if per > 0 {
            self.gpus / per
        } else {
            0
        }
    }

    /// The fewest workers an elastic job may run with (`min_gpus /
    /// gpus_per_worker`); `None` when it is not elastic. Only meaningful
    /// once validated.
    pub fn min_workers(&self) -> Option<i64> {
        let per = self.gpus_per_worker();
        match self.min_gpus {
            Some(m) if per > 0 => Some(m / per),
            _ => None,
        }
    }
}

/// How a job's workers start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobMode {
    /// All workers start together or none do (distributed training).
    #[default]
    Gang,
    /// Independent workers, each placed and run on its own as capacity
    /// allows; the job is done when all are.
    Array,
}

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }

    /// The scheduler's numeric priority (higher first).
    pub fn rank(self) -> i32 {
        match self {
            Priority::Low => 0,
            Priority::Normal => 1,
            Priority::High => 2,
        }
    }
}

impl FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "low" => Ok(Priority::Low),
            "normal" => Ok(Priority::Normal),
            "high" => Ok(Priority::High),
            _ => Err(format!("unknown priority {s:?} (low, normal, high)")),
        }
    }
}

/// A level of the fabric, from closest to widest.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TopologyLevel {
    /// One NVLink domain: a node, or a whole rack on NVL72-style systems.
    #[serde(alias = "node")]
    Nvlink,
    /// One leaf switch (rack or rail group).
    Leaf,
    /// One spine (pod).
    Spine,
    /// Anywhere in the region.
    Region,
}

impl TopologyLevel {
    pub const ALL: [TopologyLevel; 4] = [
        TopologyLevel::Nvlink,
        TopologyLevel::Leaf,
        TopologyLevel::Spine,
        TopologyLevel::Region,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TopologyLevel::Nvlink => "nvlink",
            TopologyLevel::Leaf => "leaf",
            TopologyLevel::Spine => "spine",
            TopologyLevel::Region => "region",
        }
    }
}

impl fmt::Display for TopologyLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TopologyLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nvlink" | "node" => Ok(TopologyLevel::Nvlink),
            "leaf" => Ok(TopologyLevel::Leaf),
            "spine" => Ok(TopologyLevel::Spine),
            "region" => Ok(TopologyLevel::Region),
            _ => Err(format!(
                "unknown topology level {s:?} (nvlink, leaf, spine, region)"
            )),
        }
    }
}

/// Where a job's workers may go. `required`: the whole gang must sit in one
/// domain of this level (the job waits rather than spread). `preferred`: the
/// level it would like; placement always tries the closest level first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<TopologyLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred: Option<TopologyLevel>,
}

impl TopologySpec {
    pub fn required(&self) -> TopologyLevel {
        self.required.unwrap_or(TopologyLevel::Region)
    }
    pub fn preferred(&self) -> TopologyLevel {
        self.preferred
            .unwrap_or(TopologyLevel::Nvlink)
            .min(self.required())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Accepted, waiting for GPUs.
    Queued,
    /// GPUs allocated, agents launching the workers.
    Starting,
    /// Every worker of the gang (or at least one worker of an array job)
    /// has started.
    Running,
    /// Asked to checkpoint and stop (preemption, drain); it requeues once
    /// its workers are down and resumes from its newest checkpoint.
    Preempting,
    /// Cancel requested; workers are being stopped.
    Cancelling,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Starting,
        JobState::Running,
        JobState::Preempting,
        JobState::Cancelling,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Preempting => "preempting",
            JobState::Cancelling => "cancelling",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown job state {s:?}"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Not placed yet (array jobs place workers one by one).
    Pending,
    /// GPUs allocated; the agent has not reported it started.
    Assigned,
    Running,
    /// Told to checkpoint and stop; it goes back to pending once down.
    Checkpointing,
    /// Told to stop; waiting for the agent to report the exit.
    Stopping,
    Succeeded,
    Failed,
    /// Stopped before or while running because of a cancel.
    Cancelled,
}

impl WorkerState {
    pub const ALL: [WorkerState; 8] = [
        WorkerState::Pending,
        WorkerState::Assigned,
        WorkerState::Running,
        WorkerState::Checkpointing,
        WorkerState::Stopping,
        WorkerState::Succeeded,
        WorkerState::Failed,
        WorkerState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Pending => "pending",
            WorkerState::Assigned => "assigned",
            WorkerState::Running => "running",
            WorkerState::Checkpointing => "checkpointing",
            WorkerState::Stopping => "stopping",
            WorkerState::Succeeded => "succeeded",
            WorkerState::Failed => "failed",
            WorkerState::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkerState::Succeeded | WorkerState::Failed | WorkerState::Cancelled
        )
    }
}

impl FromStr for WorkerState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WorkerState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown worker state {s:?}"))
    }
}

/// One worker: one process on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Worker {
    pub rank: u32,
    pub state: WorkerState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: Uuid,
    pub tenant: String,
    pub region: String,
    pub name: String,
    pub state: JobState,
    pub spec: JobSpec,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Why the job ended (or is ending): `succeeded`, `worker_failed`,
    /// `cancelled`, `max_duration_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub workers: Vec<Worker>,
    /// How many workers its current run was placed with (ranks 0 … n−1; the
    /// run's `WORLD_SIZE`), or its last run's once it ended; absent while it
    /// waits to be placed, and for array jobs. Below `gpus /
    /// gpus_per_worker` only for an elastic job (`min_gpus`): its other
    /// ranks stay `pending` and are not part of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_workers: Option<u32>,
    /// How often the job was preempted (checkpointed, stopped, requeued),
    /// elastic restarts to grow included.
    #[serde(default)]
    pub preemptions: u32,
    /// How many of `preemptions` were moves for a node's sake (a drain, a
    /// health action, a lost node, maintenance, a fenced agent); they do
    /// not count against the cap on priority preemptions.
    #[serde(default)]
    pub node_moves: u32,
    /// GPU-seconds its runs have held GPUs (every allocation interval so
    /// far).
    #[serde(default)]
    pub allocated_gpu_s: f64,
    /// GPU-seconds of that lost to restarts: work done after the last
    /// checkpoint by runs that were stopped and requeued.
    #[serde(default)]
    pub lost_gpu_s: f64,
    /// Useful GPU time over allocated GPU time, 0–1 (`(allocated_gpu_s −
    /// lost_gpu_s) / allocated_gpu_s`); absent before it held any GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
    /// The checkpoint its next start resumes from, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    /// Its ownership epoch: 1 in the region that accepted it, one more
    /// each time another region adopts it after its home was cut off
    /// (docs/failover.md). Work of an older epoch is refused.
    #[serde(default = "first_epoch")]
    pub epoch: i32,
    /// The region that adopted it while this region was cut off: this copy
    /// is cancelled and the job goes on there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
    /// The region it was adopted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_from: Option<String>,
    /// Its newest checkpoint in the region's checkpoint store (the highest
    /// (epoch, seq) recorded), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(inline)]
    pub checkpoint: Option<JobCheckpoint>,
}

/// A job's checkpoint, as committed to its region's checkpoint store
/// (docs/jobs.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobCheckpoint {
    /// Its key in the store (also the job's `restore_from`).
    pub key: String,
    /// The ownership epoch it was written under.
    pub epoch: i32,
    /// Its sequence number (the job's `step-N` when its directory was
    /// named so and that is above every earlier one).
    pub seq: i64,
    /// The directory name the job gave it.
    pub name: String,
    pub size_bytes: i64,
    pub files: i32,
    /// When its upload began.
    pub created_at: DateTime<Utc>,
}

fn first_epoch() -> i32 {
    1
}

/// One entry of a job's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `queued`, `placed`, `started`, `worker_exited`, `cancel_requested`,
    /// `preempted`, `requeued`, `finished`, `spare_swap`; for a planned
    /// move (docs/failover.md), `handover` (it is to move) and
    /// `handed_over` (this region's copy released, the job runs elsewhere).
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub detail: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvents {
    pub job_id: Uuid,
    pub events: Vec<JobEvent>,
}

/// A position in a newest-first listing of jobs: the (creation time, id) of
/// the last job of a page. Regions and the global tier use the same order,
/// so the global tier can merge regions' pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Cursor {
    pub fn of(job: &Job) -> Cursor {
        Cursor {
            created_at: job.created_at,
            id: job.id,
        }
    }

    /// An opaque string: `<microseconds since the epoch>_<id>`.
    pub fn encode(&self) -> String {
        format!("{}_{}", self.created_at.timestamp_micros(), self.id)
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let (micros, id) = s.split_once('_')?;
        Some(Cursor {
            created_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            id: Uuid::parse_str(id).ok()?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<Job>,
    /// Pass as `cursor` to get the next page; absent on the last page
    /// (see [`Cursor`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Regions that did not answer: their jobs are missing from this page.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_regions: Vec<String>,
}

/// Why a job is where it is, in words and a code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Explanation {
    pub job_id: Uuid,
    pub state: JobState,
    /// `running`, `finished`, `starting`, `cancelling`, `preempting` (it is
    /// being asked to checkpoint and stop; it requeues when its workers are
    /// down), `over_quota`, `no_capacity`, `reserved` (GPUs are set aside
    /// for it from `estimated_start`), `reserved_for_other` (the free GPUs
    /// are held for an earlier job), `waiting_for_preemption` (running jobs
    /// were asked to checkpoint and stop to make room for it; their GPUs are
    /// expected free by `estimated_start`), `beyond_window` (so many jobs
    /// queued ahead of it that scheduling passes do not consider it yet:
    /// each sees the first 2,000 queued units and every tenant's first 32),
    /// `schedulable` (it would be placed by the next pass).
    pub code: String,
    pub message: String,
    /// When the job is expected to start, where that can be computed (from
    /// running jobs' estimates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start: Option<DateTime<Utc>>,
}

/// What submitting a job would do now, computed without creating it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DryRun {
    /// The region that would take the job.
    pub region: String,
    /// `would_start` when it would be placed by the next pass; otherwise
    /// why it would wait (the codes of [`Explanation`]).
    pub code: String,
    pub message: String,
    /// The topology level its gang would span, when it would start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<TopologyLevel>,
    /// Nodes and GPUs it would get, when it would start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<DryRunNode>,
    /// When it would start, where that can be computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_start: Option<DateTime<Utc>>,
    /// Running jobs the scheduler would ask to checkpoint and stop to make
    /// room for it (lower-priority jobs, or borrowed capacity its tenant
    /// takes back); empty when it would preempt nothing.
    #[serde(default)]
    pub would_preempt: Vec<Uuid>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DryRunNode {
    pub node: String,
    pub gpus: Vec<u32>,
}

/// Most bytes of output a job keeps in each region that ran it (every
/// attempt, rank and stream there together); what its workers write after
/// that is counted in [`JobLogs::dropped_bytes`], not kept.
pub const JOB_LOG_LIMIT_BYTES: u64 = 16 * 1024 * 1024;

/// A piece of a worker's output, as `GET /v1/jobs/{id}/logs` gives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobLogChunk {
    /// The region that ran the attempt and keeps its output.
    pub region: String,
    /// Its place in the order that region received the job's output.
    pub seq: i64,
    /// The attempt in that region (a job that moved to another region
    /// counts its attempts there from 1 again).
    pub attempt: i32,
    pub rank: u32,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// Where the text starts in that stream, in bytes.
    pub offset: u64,
    pub text: String,
    /// When the region received it.
    pub at: DateTime<Utc>,
}

/// A job's output: its workers' standard output and error, for every
/// attempt in every region that ran one, in the order it was received.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobLogs {
    pub job_id: Uuid,
    pub chunks: Vec<JobLogChunk>,
    /// Pass as `after` to read on from here (also when there was nothing):
    /// a [`LogCursor`], opaque to readers.
    pub next_after: String,
    /// More chunks are there now than one answer holds: read on at once.
    pub more: bool,
    /// The job has ended: once a read is empty after it, its output is
    /// whole (but for a last piece its agent may still be sending).
    pub finished: bool,
    /// Bytes of output kept, and bytes not kept because the job reached
    /// [`JOB_LOG_LIMIT_BYTES`] (`limit_bytes`) in a region.
    pub kept_bytes: u64,
    pub dropped_bytes: u64,
    pub limit_bytes: u64,
    /// Regions that did not answer and may hold part of the output (an
    /// earlier attempt's, from before a failover): read again later.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions_unavailable: Vec<String>,
}

/// Where a reader of a job's output has got to: the last chunk read from
/// each region (`seq`), written `us-east:120,us-west:7` (empty: from the
/// start). A region reads its own entry; the global tier keeps every
/// region's, so one cursor follows a job across the regions it ran in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogCursor(pub BTreeMap<String, i64>);

impl LogCursor {
    /// The last chunk read from `region` (0: none yet).
    pub fn get(&self, region: &str) -> i64 {
        self.0.get(region).copied().unwrap_or(0)
    }

    pub fn set(&mut self, region: &str, seq: i64) {
        self.0.insert(region.to_string(), seq);
    }
}

impl fmt::Display for LogCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (region, seq)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{region}:{seq}")?;
        }
        Ok(())
    }
}

impl FromStr for LogCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let bad = || format!("{part:?} is not REGION:SEQ (pass a next_after as it was given)");
            let (region, seq) = part.rsplit_once(':').ok_or_else(bad)?;
            let seq: i64 = seq.parse().map_err(|_| bad())?;
            let named = !region.is_empty()
                && region.len() <= 64
                && (region.chars()).all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !named || seq < 0 || out.insert(region.to_string(), seq).is_some() {
                return Err(bad());
            }
        }
        Ok(LogCursor(out))
    }
}
