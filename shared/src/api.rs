//! The job API: what tenants send and what they get back.
//!
//! Field names here are part of the public contract (see the brief): `name`,
//! `gpus`, `gpu_type`, `priority`, `estimated_duration_s`, `command` in a
//! spec; `id`, `state`, `region` in a job.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

pub use crate::cluster::{
    Cluster, ClusterEvent, ClusterList, ClusterNode, ClusterResize, ClusterSpec, ClusterState,
};
pub use crate::reservation::{
    Reservation, ReservationList, ReservationResize, ReservationSpec, ReservationState,
};

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

/// GPUs of one type in a region, as its agents registered them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuTypeCapacity {
    pub gpu_type: String,
    pub nodes: u32,
    /// GPUs on nodes that may take work now (not on a rack reporting
    /// thermal throttling).
    pub schedulable: u32,
    pub allocated: u32,
    /// Schedulable GPUs not allocated, and no more on a rack than its power
    /// budget can still feed.
    pub free: u32,
    /// GPUs on spare nodes (held back for replacements).
    pub spare: u32,
    /// GPUs asked by the shared pool's jobs of this type waiting to be
    /// placed (`queued`): the backlog the global tier weighs when no
    /// region has room for a new job.
    #[serde(default)]
    pub queued: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegionStatus {
    pub region: String,
    /// Whether this replica currently holds the scheduling leadership.
    pub leader: bool,
    pub generation: i64,
    pub queued_jobs: u64,
    pub running_jobs: u64,
    pub capacity: Vec<GpuTypeCapacity>,
    /// Cut off from a majority of regions: it places nothing and takes no
    /// new jobs (docs/failover.md).
    #[serde(default)]
    pub fenced: bool,
    /// Being evacuated by its operators (evacuating or evacuated): it takes
    /// no new jobs and places nothing, and its jobs move to other regions
    /// (docs/failover.md, "Planned evacuation and fail back"). The global
    /// tier routes creates around it.
    #[serde(default)]
    pub evacuating: bool,
}

/// Where a region's planned evacuation stands (docs/failover.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvacuationState {
    /// Not evacuated: the region takes and runs work.
    None,
    /// Refusing new jobs, placing nothing, handing its live jobs over to
    /// other regions through a checkpoint.
    Evacuating,
    /// As `evacuating`, with nothing left to hand over.
    Evacuated,
    /// Taking work again; the jobs moved away come back the same way.
    FailingBack,
}

impl EvacuationState {
    pub fn as_str(self) -> &'static str {
        match self {
            EvacuationState::None => "none",
            EvacuationState::Evacuating => "evacuating",
            EvacuationState::Evacuated => "evacuated",
            EvacuationState::FailingBack => "failing_back",
        }
    }

    /// Whether the region refuses new jobs and places nothing.
    pub fn is_evacuating(self) -> bool {
        matches!(
            self,
            EvacuationState::Evacuating | EvacuationState::Evacuated
        )
    }
}

impl FromStr for EvacuationState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(EvacuationState::None),
            "evacuating" => Ok(EvacuationState::Evacuating),
            "evacuated" => Ok(EvacuationState::Evacuated),
            "failing_back" => Ok(EvacuationState::FailingBack),
            other => Err(format!("unknown evacuation state {other:?}")),
        }
    }
}

/// A region's evacuation and its progress (`GET /v1/admin/region/evacuation`;
/// also the answer to `…/evacuate` and `…/failback`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Evacuation {
    pub region: String,
    pub state: EvacuationState,
    /// When the operator asked for the current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// Who asked, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Jobs still to move: while evacuating, this region's live jobs not
    /// handed over yet; while failing back, the jobs moved away from it
    /// that other regions still run (as they last said) and those coming
    /// back now.
    pub jobs_left: u64,
    /// Jobs handed over since `since`: away (evacuating, evacuated) or
    /// back here (failing back).
    pub moved: u64,
    /// Jobs that cannot leave the region (pinned to it, or in one of its
    /// capacity reservations or dedicated clusters): checkpointed, stopped
    /// and kept here until the fail back.
    pub held: u64,
    /// The jobs in flight, moved and held, one per entry.
    pub jobs: Vec<EvacuationJob>,
}

/// One job of an evacuation or a fail back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EvacuationJob {
    pub job_id: Uuid,
    pub tenant: String,
    pub name: String,
    /// `waiting` (its intent is not at another region yet), `stopping`
    /// (asked to checkpoint and stop), `moving` (stopped: its checkpoint
    /// and its move go to the target), `moved` (handed over), `held`
    /// (cannot leave this region).
    pub step: String,
    /// The region it goes to (or went to, or came from, for one moved
    /// back here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Its ownership epoch (after the move, once moved).
    pub epoch: i32,
    /// The checkpoint it resumes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    /// Why it is held, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Largest GPU count a quota accepts (larger is a typo).
pub const MAX_QUOTA_GPUS: i64 = 10_000_000;
/// Largest fair-share weight a quota accepts.
pub const MAX_QUOTA_WEIGHT: f64 = 1000.0;

/// A tenant's terms for one GPU type in a region: GPUs it is guaranteed, its
/// fair-share weight, and an optional hard cap.
///
/// Capacity a tenant does not use is lent to others; a tenant holding fewer
/// GPUs than its guarantee takes lent GPUs back by preempting tenants that
/// hold more than theirs. Among tenants beyond their guarantees, weighted
/// fair share (with past usage decayed) decides who goes first. A tenant
/// with no quota is guaranteed nothing, has weight 1 and no cap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Quota {
    pub tenant: String,
    pub gpu_type: String,
    /// GPUs of the type the tenant is guaranteed.
    pub guaranteed_gpus: u32,
    /// The most GPUs of the type the tenant may hold at once, borrowing
    /// included; `null` = no cap.
    pub max_gpus: Option<u32>,
    /// Fair-share weight (1.0 = an equal share); kept to thousandths.
    pub weight: f64,
}

/// Body of `PUT /v1/admin/quotas/{tenant}/{gpu_type}`: replaces the
/// tenant's terms for the GPU type.
///
/// Only a JSON object is accepted (serde would otherwise take `[8]` as
/// `{"guaranteed_gpus": 8}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "serde_json::Map<String, serde_json::Value>")]
pub struct QuotaUpdate {
    /// GPUs guaranteed (0 – 10,000,000).
    #[schema(minimum = 0, maximum = 10000000)]
    pub guaranteed_gpus: i64,
    /// The cap, at least `guaranteed_gpus`; absent or `null` = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_gpus: Option<i64>,
    /// Fair-share weight, above 0 and at most 1000, kept to thousandths;
    /// absent = 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// The fields of a [`QuotaUpdate`] as they are decoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaUpdateFields {
    guaranteed_gpus: i64,
    #[serde(default)]
    max_gpus: Option<i64>,
    #[serde(default)]
    weight: Option<f64>,
}

impl TryFrom<serde_json::Map<String, serde_json::Value>> for QuotaUpdate {
    type Error = serde_json::Error;

    fn try_from(fields: serde_json::Map<String, serde_json::Value>) -> Result<Self, Self::Error> {
        let f: QuotaUpdateFields = serde_json::from_value(serde_json::Value::Object(fields))?;
        Ok(QuotaUpdate {
            guaranteed_gpus: f.guaranteed_gpus,
            max_gpus: f.max_gpus,
            weight: f.weight,
        })
    }
}

/// Why a [`QuotaUpdate`] was refused: a stable code from
/// [`crate::error::codes`] and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRefused {
    pub code: &'static str,
    pub message: String,
}

/// A checked [`QuotaUpdate`], in the units the region stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaTerms {
    pub guaranteed_gpus: u32,
    pub max_gpus: Option<u32>,
    /// In thousandths (1000 = 1.0), at least 1.
    pub weight_milli: u32,
}

impl QuotaUpdate {
    /// Checks the numbers: GPU counts in 0 … [`MAX_QUOTA_GPUS`]
    /// (`invalid_gpus`), a cap no lower than the guarantee and a weight in
    /// (0, [`MAX_QUOTA_WEIGHT`]] that is at least 0.001 (`invalid_quota`).
    pub fn check(&self) -> Result<QuotaTerms, QuotaRefused> {
        use crate::error::codes;
        let gpus = |what: &str, n: i64| {
            if (0..=MAX_QUOTA_GPUS).contains(&n) {
                Ok(n as u32)
            } else {
                Err(QuotaRefused {
                    code: codes::INVALID_GPUS,
                    message: format!("{what} must be between 0 and {MAX_QUOTA_GPUS}, not {n}"),
                })
            }
        };
        let guaranteed = gpus("guaranteed_gpus", self.guaranteed_gpus)?;
        let max = self.max_gpus.map(|m| gpus("max_gpus", m)).transpose()?;
        if let Some(m) = max {
            if m < guaranteed {
                return Err(QuotaRefused {
                    code: codes::INVALID_QUOTA,
                    message: format!(
                        "max_gpus ({m}) is below guaranteed_gpus ({guaranteed}): a cap must \
                         leave room for the guarantee"
                    ),
                });
            }
        }
        let weight = self.weight.unwrap_or(1.0);
        let milli = (weight * 1000.0).round();
        if !weight.is_finite() || weight <= 0.0 || weight > MAX_QUOTA_WEIGHT || milli < 1.0 {
            return Err(QuotaRefused {
                code: codes::INVALID_QUOTA,
                message: format!(
                    "weight must be at least 0.001 and at most {MAX_QUOTA_WEIGHT}, not {weight}"
                ),
            });
        }
        Ok(QuotaTerms {
            guaranteed_gpus: guaranteed,
            max_gpus: max,
            weight_milli: milli as u32,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    pub quotas: Vec<Quota>,
}

/// Largest value an admission limit accepts (larger is a typo).
pub const MAX_TENANT_LIMIT: i64 = 10_000_000;

/// A tenant's admission limits in a region: checked when a job is
/// submitted, so a tenant over one is refused at once (429
/// `queued_jobs_limit` or `requested_gpus_limit`, nothing created) rather
/// than accepted and left to starve. Quotas, by contrast, decide what
/// accepted jobs may hold once they run. A tenant with no limits has none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantLimits {
    pub tenant: String,
    /// The most of the tenant's jobs that may wait in state `queued` in the
    /// region at once; `null` = no limit.
    pub max_queued_jobs: Option<u32>,
    /// The most GPUs the tenant's unfinished jobs in the region (every
    /// state but `succeeded`, `failed` and `cancelled`) may ask for
    /// together, a new job's included; `null` = no limit.
    pub max_gpus: Option<u32>,
    /// When an operator last set them.
    pub updated_at: DateTime<Utc>,
}

/// Body of `PUT /v1/admin/limits/{tenant}`: replaces the tenant's limits.
/// A field left out or `null` is no limit on that dimension; at least one
/// must be set (to remove both, DELETE the limits).
///
/// Only a JSON object is accepted, and no field besides these two.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "serde_json::Map<String, serde_json::Value>")]
pub struct LimitsUpdate {
    /// Queued jobs at most (0 – 10,000,000); absent or `null` = no limit.
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_queued_jobs: Option<i64>,
    /// GPUs of unfinished jobs at most (0 – 10,000,000); absent or `null`
    /// = no limit.
    #[schema(minimum = 0, maximum = 10000000)]
    pub max_gpus: Option<i64>,
}

/// The fields of a [`LimitsUpdate`] as they are decoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsUpdateFields {
    #[serde(default)]
    max_queued_jobs: Option<i64>,
    #[serde(default)]
    max_gpus: Option<i64>,
}

impl TryFrom<serde_json::Map<String, serde_json::Value>> for LimitsUpdate {
    type Error = serde_json::Error;

    fn try_from(fields: serde_json::Map<String, serde_json::Value>) -> Result<Self, Self::Error> {
        let f: LimitsUpdateFields = serde_json::from_value(serde_json::Value::Object(fields))?;
        Ok(LimitsUpdate {
            max_queued_jobs: f.max_queued_jobs,
            max_gpus: f.max_gpus,
        })
    }
}

/// A checked [`LimitsUpdate`], in the units the region stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitTerms {
    pub max_queued_jobs: Option<u32>,
    pub max_gpus: Option<u32>,
}

/// Why a [`LimitsUpdate`] was refused (always `invalid_limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitsRefused {
    pub code: &'static str,
    pub message: String,
}

impl LimitsUpdate {
    /// Checks the numbers: each in 0 … [`MAX_TENANT_LIMIT`], and at least
    /// one set (`invalid_limits`).
    pub fn check(&self) -> Result<LimitTerms, LimitsRefused> {
        use crate::error::codes;
        let refused = |message: String| LimitsRefused {
            code: codes::INVALID_LIMITS,
            message,
        };
        let limit = |what: &str, n: Option<i64>| match n {
            None => Ok(None),
            Some(n) if (0..=MAX_TENANT_LIMIT).contains(&n) => Ok(Some(n as u32)),
            Some(n) => Err(refused(format!(
                "{what} must be between 0 and {MAX_TENANT_LIMIT} (or null for no limit), not {n}"
            ))),
        };
        let terms = LimitTerms {
            max_queued_jobs: limit("max_queued_jobs", self.max_queued_jobs)?,
            max_gpus: limit("max_gpus", self.max_gpus)?,
        };
        if terms.max_queued_jobs.is_none() && terms.max_gpus.is_none() {
            return Err(refused(
                "set max_queued_jobs, max_gpus or both; to remove a tenant's limits, \
                 DELETE them (gangway admin limits delete TENANT)"
                    .into(),
            ));
        }
        Ok(terms)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantLimitsList {
    /// Ordered by tenant.
    pub limits: Vec<TenantLimits>,
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
    /// expected free by `estimated_start`), `schedulable` (it would be
    /// placed by the next pass).
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

/// A region as the global tier sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegionInfo {
    pub name: String,
    pub healthy: bool,
    /// Milliseconds since the region last answered, if it ever did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RegionStatus>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegionList {
    pub regions: Vec<RegionInfo>,
}

/// How usage is bucketed in time.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Hour,
    #[default]
    Day,
    Month,
}

impl Granularity {
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Month => "month",
        }
    }

    /// The longest period one query may span at this granularity.
    pub fn max_span(self) -> chrono::Duration {
        match self {
            Granularity::Hour => chrono::Duration::days(31),
            Granularity::Day => chrono::Duration::days(366),
            Granularity::Month => chrono::Duration::days(5 * 366),
        }
    }
}

/// What usage rows are keyed by besides their period.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroup {
    Job,
    #[default]
    GpuType,
    Region,
}

impl UsageGroup {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageGroup::Job => "job",
            UsageGroup::GpuType => "gpu_type",
            UsageGroup::Region => "region",
        }
    }
}

/// GPU time of one tenant in one period, for one key, from the usage
/// ledger (docs/billing.md): `gpu_seconds` = `billed_gpu_seconds` +
/// `credited_gpu_seconds` + `pending_gpu_seconds`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// Start of the period (UTC, aligned to the granularity).
    pub period_start: DateTime<Utc>,
    /// The job id, GPU type or region name (the region that ran it).
    pub key: String,
    /// GPU-seconds held in the period (one GPU held one second = 1).
    pub gpu_seconds: f64,
    /// Of which charged: ledger rows less their credits.
    #[serde(default)]
    pub billed_gpu_seconds: f64,
    /// Of which credited: lost to provider-caused events (a node lost, a
    /// drain or maintenance, a region failure, …), not charged.
    #[serde(default)]
    pub credited_gpu_seconds: f64,
    /// Of which held by placements still running and not metered yet (the
    /// ledger gets them once their clock hour ends, or they do).
    #[serde(default)]
    pub pending_gpu_seconds: f64,
}

impl UsageRow {
    /// Adds `other`'s GPU-seconds to this row's.
    pub fn add(&mut self, other: &UsageRow) {
        self.gpu_seconds += other.gpu_seconds;
        self.billed_gpu_seconds += other.billed_gpu_seconds;
        self.credited_gpu_seconds += other.credited_gpu_seconds;
        self.pending_gpu_seconds += other.pending_gpu_seconds;
    }
}

/// A tenant's GPU time, from the usage ledger of every region (each
/// ledger row counted once, whichever regions hold it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub granularity: Granularity,
    pub group_by: UsageGroup,
    pub rows: Vec<UsageRow>,
    pub total_gpu_seconds: f64,
    #[serde(default)]
    pub total_billed_gpu_seconds: f64,
    #[serde(default)]
    pub total_credited_gpu_seconds: f64,
    #[serde(default)]
    pub total_pending_gpu_seconds: f64,
    /// Regions that did not answer. Their usage comes from the copies their
    /// buddies hold (`replicated_regions`), which may lag a little.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_regions: Vec<String>,
    /// Regions whose usage was read from other regions' copies of their
    /// ledger rows (they did not answer): without their live placements'
    /// time not metered yet, and without rows not replicated yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicated_regions: Vec<String>,
    /// In a region's answer to the global tier only: the rows it holds for
    /// its peers, by the region that ran them (`rows` are its own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_for: BTreeMap<String, Vec<UsageRow>>,
}

impl Usage {
    /// A usage of these rows, with their totals.
    pub fn of(
        (from, to, granularity, group_by): (DateTime<Utc>, DateTime<Utc>, Granularity, UsageGroup),
        rows: Vec<UsageRow>,
    ) -> Usage {
        let mut total = UsageRow::default();
        for r in &rows {
            total.add(r);
        }
        Usage {
            from,
            to,
            granularity,
            group_by,
            rows,
            total_gpu_seconds: total.gpu_seconds,
            total_billed_gpu_seconds: total.billed_gpu_seconds,
            total_credited_gpu_seconds: total.credited_gpu_seconds,
            total_pending_gpu_seconds: total.pending_gpu_seconds,
            unavailable_regions: Vec::new(),
            replicated_regions: Vec::new(),
            held_for: BTreeMap::new(),
        }
    }
}

/// The query of `GET /v1/usage`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the period (RFC 3339); default: 7 days before `to`.
    pub from: Option<DateTime<Utc>>,
    /// End of the period, exclusive (RFC 3339); default: now.
    pub to: Option<DateTime<Utc>>,
    /// `hour` (periods up to 31 days), `day` (default; up to 366 days) or
    /// `month` (up to 5 years).
    pub granularity: Option<Granularity>,
    /// `gpu_type` (default), `job` or `region`.
    pub group_by: Option<UsageGroup>,
    /// Only this job's usage (one of the tenant's own: another tenant's
    /// job has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Uuid>,
}

impl UsageQuery {
    /// The window and grouping asked for, checked; the error says what to
    /// fix.
    pub fn resolve(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(DateTime<Utc>, DateTime<Utc>, Granularity, UsageGroup), String> {
        let to = self.to.unwrap_or(now);
        let from = self.from.unwrap_or(to - chrono::Duration::days(7));
        let granularity = self.granularity.unwrap_or_default();
        if from >= to {
            return Err("`from` must be before `to`".into());
        }
        if to - from > granularity.max_span() {
            return Err(format!(
                "a {} breakdown covers at most {} days; narrow the period or use a coarser granularity",
                granularity.as_str(),
                granularity.max_span().num_days()
            ));
        }
        Ok((from, to, granularity, self.group_by.unwrap_or_default()))
    }
}

// ---------------------------------------------------------------------------
// Fleet operations (issue 5): nodes as operators see them, node actions,
// injected faults and the audit log.

/// The header in which the global tier names the operator (the admin
/// token's subject) on calls to a region's admin endpoints; the region
/// writes it into the audit log.
pub const ACTOR_HEADER: &str = "x-gangway-actor";

/// Most characters in an operator's `reason`.
pub const MAX_REASON_LEN: usize = 500;

/// Longest drain deadline accepted: a week.
pub const MAX_DRAIN_DEADLINE_S: i64 = 7 * 24 * 3600;

/// How a drain moves a node's jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    /// Ask the jobs to checkpoint now; each is stopped once its checkpoint
    /// is written (or the deadline passes) and restarts elsewhere from it.
    #[default]
    Checkpoint,
    /// Let the jobs finish; those still running at the deadline are then
    /// checkpointed and moved.
    Wait,
}

impl DrainMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainMode::Checkpoint => "checkpoint",
            DrainMode::Wait => "wait",
        }
    }
}

/// `POST /v1/admin/nodes/{id}/drain`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Default `checkpoint`.
    #[serde(default)]
    pub mode: DrainMode,
    /// Seconds until the jobs must be off the node: in `checkpoint` mode
    /// the most a job gets to write its checkpoint (capped by the region's
    /// checkpoint deadline), in `wait` mode how long they may run on before
    /// they are checkpointed and moved. Default: the region's checkpoint
    /// deadline (checkpoint), one hour (wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604800)]
    pub deadline_s: Option<i64>,
    /// Why, for the audit log and the node's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/admin/nodes/{id}/cordon` and `/uncordon`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeActionRequest {
    /// Why, for the audit log and the node's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A fault to inject into a simulated node (`POST
/// /v1/admin/nodes/{id}/faults`): the region applies it as if the node's
/// agent had reported it. Refused for nodes of real agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// An XID event on a GPU (79: fallen off the bus; 48: double-bit ECC;
    /// 13: an application's fault, ignored; …).
    Xid { gpu: u32, code: u32 },
    /// ECC error counts since boot.
    Ecc {
        gpu: u32,
        #[serde(default)]
        single_bit: u64,
        #[serde(default)]
        double_bit: u64,
    },
    /// Row-remap state: a pending remap quarantines the GPU until a reset, a
    /// failed one sends the node to repair.
    Remap {
        gpu: u32,
        #[serde(default)]
        pending: bool,
        #[serde(default)]
        failed: bool,
    },
    /// A temperature reading (default 95 °C, throttling); send a cool one
    /// (`"celsius": 60, "throttled": false`) to end it.
    Thermal {
        gpu: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        celsius: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        throttled: Option<bool>,
    },
    /// NVLink errors since boot (default: the policy's limit, which drains
    /// the node).
    Nvlink {
        gpu: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errors: Option<u64>,
    },
    /// The node dies: lost (its jobs requeue from their checkpoints) until
    /// it reboots.
    NodeDown,
    /// The node's link to the region drops for `silent_s` seconds (default:
    /// just past the policy's suspect limit) and comes back; repeated, it
    /// flaps and is held down.
    LinkFlap {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        silent_s: Option<u64>,
    },
    /// The node reboots: a new boot id, which clears GPU quarantines, node
    /// faults and a death.
    Reboot,
    /// The node's rack (its leaf) reports thermal throttling (default
    /// `throttled: true`): no node of the rack takes new work, running jobs
    /// stay. `"throttled": false` ends it.
    RackThermal {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        throttled: Option<bool>,
    },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Xid { .. } => "xid",
            Fault::Ecc { .. } => "ecc",
            Fault::Remap { .. } => "remap",
            Fault::Thermal { .. } => "thermal",
            Fault::Nvlink { .. } => "nvlink",
            Fault::NodeDown => "node_down",
            Fault::LinkFlap { .. } => "link_flap",
            Fault::Reboot => "reboot",
            Fault::RackThermal { .. } => "rack_thermal",
        }
    }

    /// The GPU it concerns, if any.
    pub fn gpu(&self) -> Option<u32> {
        match self {
            Fault::Xid { gpu, .. }
            | Fault::Ecc { gpu, .. }
            | Fault::Remap { gpu, .. }
            | Fault::Thermal { gpu, .. }
            | Fault::Nvlink { gpu, .. } => Some(*gpu),
            Fault::NodeDown
            | Fault::LinkFlap { .. }
            | Fault::Reboot
            | Fault::RackThermal { .. } => None,
        }
    }
}

/// One event of a node's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `health` (a health effect), `admin` (an operator's action),
    /// `fault_injected`, `evacuate` (jobs asked to move), `lost` (jobs
    /// requeued from a lost node), `state` (observed state changed).
    pub kind: String,
    pub message: String,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// A node as operators see it: both axes, and what they add up to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub node_id: String,
    pub region: String,
    pub agent_id: String,
    /// `real` or `sim`.
    pub executor: String,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub gpu_type: String,
    pub spare: bool,
    pub gpus: u32,
    /// What operators asked: `active`, `cordoned`, `draining`,
    /// `maintenance`, `repair`.
    pub admin_state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_reason: Option<String>,
    /// While draining: `checkpoint` or `wait`, and the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_mode: Option<DrainMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline: Option<DateTime<Utc>>,
    /// What agents observe: `healthy`, `degraded`, `suspect`, `lost`,
    /// `failed`, `damped`, `needs_repair`.
    pub observed: String,
    /// The observed state with its details (quarantined and throttled
    /// GPUs, the fault and since when, …).
    #[schema(value_type = Object)]
    pub observed_detail: serde_json::Value,
    /// May new work be placed on it?
    pub schedulable: bool,
    /// GPUs new work may use.
    pub usable_gpus: Vec<u32>,
    /// GPUs held by jobs now.
    pub allocated_gpus: Vec<u32>,
    /// Jobs with workers on it now.
    pub jobs: Vec<Uuid>,
    /// Why it takes no (or less) new work, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Its rack (leaf) reports thermal throttling, by this node's or
    /// another node's report: no node of the rack takes new work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rack_throttled: bool,
    /// Watts one allocated GPU of the node draws, as its agent registered
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_w: Option<u32>,
    /// Its rack's power budget for GPU draw (watts), as its agent
    /// registered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_power_budget_w: Option<u64>,
    /// Draining and empty: safe to take down.
    pub drained: bool,
    /// The machine's boot id as last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<DateTime<Utc>>,
    /// The newest events, newest last (`GET /v1/admin/nodes/{id}` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<NodeEvent>,
}

/// `GET /v1/admin/nodes` in one region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
    /// Machines that tried to join and are not in the region's inventory:
    /// refused (`unknown_node`), they take no work until an operator admits
    /// them (`POST /v1/admin/nodes/{id}/admit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<UnknownNode>,
}

/// A machine that tried to join the region and was refused because the
/// region's inventory does not have it. `state` is always `unknown`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UnknownNode {
    pub node_id: String,
    /// `unknown`.
    pub state: String,
    pub agent_id: String,
    /// `real` or `sim`.
    pub executor: String,
    pub gpu_type: String,
    pub gpus: u32,
    pub address: String,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
}

/// Where a machine sits in the region's topology: the body of
/// `POST /v1/admin/nodes/{id}/admit` (a machine seen as `unknown`) and of
/// `PUT /v1/admin/inventory/{id}` (`gangway admin node add`: any machine,
/// before it first registers). Audited (`node.admit`, `node.add`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InventoryEntry {
    /// Its spine (pod), as the region's other nodes name theirs.
    pub spine: String,
    /// Its leaf switch (rack).
    pub leaf: String,
    /// Its NVLink domain; default: the node itself (HGX). Name the leaf for
    /// a rack-scale domain (GB200 NVL72).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// Held in the spare pool rather than scheduled.
    #[serde(default)]
    pub spare: bool,
    /// The GPU type it must report; default: whatever it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// The agent that may serve it (its token's subject); default: an
    /// agent named as the node, the machine's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Its rack's power budget for GPU draw, in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_power_budget_w: Option<u64>,
    /// Why, for the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/admin/maintenance`: reboot a set of nodes in capacity-aware
/// waves. Name at least one target: `all`, a `leaf`, a `gpu_type` or
/// `nodes` (together they narrow each other).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MaintenanceStart {
    /// Every (non-spare) node of the region.
    #[serde(default)]
    pub all: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// At most this many nodes of one leaf out at once (K; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_leaf: Option<u32>,
    /// At most this percentage of the region's nodes out at once, other
    /// outages counted (M; default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One node of a maintenance plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MaintenanceNode {
    pub node_id: String,
    /// `pending`, `draining`, `rebooting`, `checking`, `done`, `skipped`,
    /// `cancelled`.
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Why the plan skipped it (step `skipped`): out of service for a
    /// reason outside the plan when its turn came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A pending node out of service for a passing reason at its turn:
    /// since when the plan waits for it (it is skipped if it stays out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<DateTime<Utc>>,
}

/// A node a maintenance plan skipped, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SkippedNode {
    pub node_id: String,
    /// Why: `node lost: …`, `cordoned by an operator: …`, `in repair: …`,
    /// or a passing outage that lasted too long.
    pub reason: String,
    /// When the plan skipped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
}

/// A maintenance plan and its progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MaintenancePlan {
    pub plan_id: Uuid,
    pub region: String,
    /// `running`, `done` or `cancelled`.
    pub state: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What it was asked to cover.
    pub targets: MaintenanceStart,
    pub per_leaf: u32,
    pub region_percent: u32,
    /// Nodes in the plan.
    pub total: u32,
    /// Nodes per step (`skipped`: left out, see `skipped`).
    pub steps: BTreeMap<String, u32>,
    /// Nodes the plan skipped, with why: each was out of service for a
    /// reason outside the plan when its turn came (lost, failed, in repair,
    /// cordoned or drained by an operator; or suspect or held down for
    /// longer than the plan waits). A plan whose nodes are all done or
    /// skipped is `done`. In every view, also without `nodes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedNode>,
    /// Why no more nodes start now, when some wait (the last tick's):
    /// `region_cap`, `leaf_cap`, `gang_on_node_out`, or `node_out` (waiting
    /// for a node out for a passing reason at its turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<serde_json::Value>,
    /// Every node with its step (`GET …/{id}` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<MaintenanceNode>,
}

/// `GET /v1/admin/maintenance` in one region, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MaintenancePlanList {
    pub plans: Vec<MaintenancePlan>,
}

/// One tenant's goodput in a region: useful over allocated GPU time of all
/// its jobs (`GET /v1/admin/goodput`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantGoodput {
    pub tenant: String,
    pub allocated_gpu_s: f64,
    pub lost_gpu_s: f64,
    /// (allocated − lost) / allocated; absent when nothing was allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
}

/// `GET /v1/admin/goodput` in one region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GoodputList {
    pub tenants: Vec<TenantGoodput>,
}

/// One entry of the append-only audit log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who: the operator's token subject (as the global tier names it).
    pub actor: String,
    /// What: `node.cordon`, `node.uncordon`, `node.drain`, `node.fault`,
    /// `quota.set`, `quota.delete`, `job.preempt`, …
    pub action: String,
    /// On what: a node id, a job id, `tenant/gpu_type`.
    pub target: String,
    /// Why, as the operator said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// A page of the audit log, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    pub entries: Vec<AuditEntry>,
    /// Pass as `before` for the next (older) page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// The query of `GET /v1/admin/audit` (a region's).
#[derive(Clone, Debug, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Entries older than this id (paging).
    pub before: Option<i64>,
    /// Only this action.
    pub action: Option<String>,
    /// Only this target.
    pub target: Option<String>,
    /// 1–1000, default 100.
    pub limit: Option<i64>,
}
