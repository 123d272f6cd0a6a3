//! The protocol between a region and its node agents.
//!
//! Agents pull: each `sync` reports what runs on the agent's nodes and gets
//! back what should run there. Both sides are idempotent: a lost or repeated
//! sync changes nothing, and an agent keeps reporting an exit until the
//! region stops listing that worker. Between syncs an agent may wait on
//! `changes` (a long poll) to hear that its assignments changed and sync at
//! once, rather than at its next interval.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One GPU of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentGpu {
    pub index: u32,
    /// The GPU's UUID (from NVML), or a stable synthetic one when simulated
    /// or declared.
    pub uuid: String,
    /// The model as NVML names it (`NVIDIA H100 80GB HBM3`); `None`:
    /// simulated, or an agent before identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its memory, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Where it sits on the PCI bus (`00000000:18:00.0`). Agents start
    /// workers with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so `index` is the index
    /// CUDA uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
}

/// A node as its agent describes it.
///
/// The node's place in the topology (`spine`, `leaf`, `nvlink_domain`,
/// `spare`) is the region's inventory's to say: a region ignores what an
/// agent sends there (a real agent sends nothing; a simulated one sends its
/// fleet file's view, as agents before the inventory did).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentNode {
    /// The machine's name (a real agent's is its hostname or
    /// `--node-name`): what the region's inventory knows it by.
    pub node_id: String,
    #[serde(default)]
    pub spine: String,
    #[serde(default)]
    pub leaf: String,
    #[serde(default)]
    pub nvlink_domain: String,
    pub gpu_type: String,
    /// Held in the spare pool rather than scheduled.
    #[serde(default)]
    pub spare: bool,
    /// Address other workers reach this node at (`MASTER_ADDR`).
    pub address: String,
    pub gpus: Vec<AgentGpu>,
    /// Watts one allocated GPU of this node draws: its enforced power
    /// limit (NVML on a real machine, else the fleet file's `[gpu_power_w]`).
    /// `None`: unknown, not counted against rack budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_w: Option<u32>,
    /// The power budget of the node's rack (leaf) for GPU draw, in watts
    /// (the fleet file's `power_budget_w`). `None`: no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_power_budget_w: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub agent_id: String,
    /// New on every agent start: tells the region the agent's workers from
    /// any earlier boot are gone.
    pub boot_id: Uuid,
    /// `real` or `sim`.
    pub executor: String,
    pub nodes: Vec<AgentNode>,
    /// Who claims the nodes: a hash of the machine's id and the agent's work
    /// directory, the same across restarts of one agent on one machine. A
    /// registration with a new boot id from another claimant while the
    /// nodes' agent is alive is refused (409 `node_claimed`); once its lease
    /// ran out, or an operator released it, it takes the nodes over
    /// (audited). `None`: an agent before identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub region: String,
    /// How often to sync, in milliseconds.
    pub sync_interval_ms: u64,
    /// The agent's lease, in milliseconds: an agent that has had no
    /// successful sync for this long *fences* itself — asks its workers to
    /// checkpoint, stops them, and starts nothing until it syncs again — so
    /// that it is quiet before the region declares its nodes lost and hands
    /// their GPUs to others. The region keeps it below its `lost_after_s`
    /// by at least [`RegisterResponse::fence_checkpoint_s`]. 0: the region
    /// names none (the agent uses its own `--fence-after-s`, if any).
    #[serde(default)]
    pub fence_after_ms: u64,
    /// Seconds a fenced worker has to write its checkpoint before it is
    /// stopped anyway. 0: the region names none.
    #[serde(default)]
    pub fence_checkpoint_s: u64,
}

/// What became of a worker, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum WorkerStatus {
    Running,
    Exited {
        /// The exit code, when the process exited by itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The signal that ended it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// Why it ended, in words (for the timeline).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    pub job_id: Uuid,
    pub rank: u32,
    /// The placement attempt this report is about; reports about an older
    /// attempt are ignored.
    pub attempt: i32,
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// The newest complete checkpoint of the worker's job the agent knows
    /// of (a directory under `GANGWAY_CHECKPOINT_DIR`, or the simulated
    /// executor's progress marker): where a restart resumes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// With an exit: the agent stopped the worker itself because it had
    /// lost the region for longer than its lease (it *fenced*), not because
    /// the worker ended or the region asked. The region moves the job as if
    /// its node were lost (checkpoint, requeue at the front) instead of
    /// counting the exit as a failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
    /// With an exit: the worker ended by itself before the agent passed on
    /// any request to stop or checkpoint it. An exit with code 0 so marked
    /// is the work done, even if the region has asked it to checkpoint
    /// since (the request crossed the exit on its way): the region does
    /// not requeue the job to run again. False from older agents.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unasked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    pub boot_id: Uuid,
    pub workers: Vec<WorkerReport>,
    /// Checkpoints the agent has uploaded to the region's checkpoint store
    /// (manifest written: committed) that the region has not yet accepted:
    /// each is sent until a sync carrying it succeeds. `Some` — even
    /// empty — says the agent uploads its workers' checkpoints, so its
    /// workers' [`WorkerReport::checkpoint`] paths are local to it and do
    /// not become the job's restore point; `None` from agents before the
    /// checkpoint store and from the simulated executor, whose reported
    /// `checkpoint` is the restore point, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<Vec<CheckpointRecord>>,
    /// Each served node's machine boot id and the health signals seen since
    /// the last sync the region accepted. A node left out counts as heard
    /// from, with the agent's `boot_id` as its machine boot id (agents from
    /// before health reporting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeReport>,
    /// Output its workers wrote since the last sync the region took logs
    /// from (the real executor's; bounded per sync): shipped off the node
    /// as it is written, so it outlives the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<LogChunk>,
}

/// A piece of one worker's standard output or error, at its byte offset in
/// that stream: the region keeps each (job, attempt, rank, stream, offset)
/// once, so a chunk sent again changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    pub job_id: Uuid,
    pub rank: u32,
    pub attempt: i32,
    pub stream: LogStream,
    pub offset: u64,
    /// The bytes as UTF-8 (invalid sequences replaced); whole characters.
    pub text: String,
    /// How many bytes of the stream this chunk covers (the text's length
    /// before replacement).
    pub len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    pub fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// A checkpoint committed to the region's checkpoint store: the summary of
/// its manifest (`{key}/manifest.json`, written last: the commit point), as
/// an agent reports it and the region records it. See docs/jobs.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub job_id: Uuid,
    /// The ownership epoch of the assignment the worker ran under: a region
    /// refuses a checkpoint of an epoch other than the job's current one
    /// (a stale worker of a superseded owner).
    pub epoch: i32,
    /// Monotonic per job within an epoch (the `step-N` of the checkpoint's
    /// directory name when it is above every seq known, else the highest
    /// known + 1).
    pub seq: u64,
    /// The placement attempt that wrote it (tells apart two uploads that
    /// picked the same seq, the later attempt winning).
    pub attempt: i32,
    /// Where it lies in the store: `jobs/{job}/epoch-{e}/seq-{n:08}-attempt-{a}`.
    pub key: String,
    /// The checkpoint directory's name as the job wrote it (`step-1200`);
    /// a restore recreates it under that name.
    pub name: String,
    pub size_bytes: u64,
    pub files: u32,
    /// SHA-256 over the manifest's file list (each file's path, size and
    /// SHA-256), hex.
    pub sha256: String,
    pub created_at: DateTime<Utc>,
    /// The node and rank whose agent uploaded it.
    pub node_id: String,
    pub rank: u32,
}

/// What an agent saw of one node's health since its last accepted sync.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub node_id: String,
    /// The machine's boot id (`/proc/sys/kernel/random/boot_id` on a real
    /// machine; one per agent start, or a flag, in a simulated fleet). A
    /// new one tells the region the machine rebooted, which clears what a
    /// reset clears.
    pub boot_id: String,
    /// Health signals since the last accepted sync (XID events, ECC and
    /// NVLink counters, remap state, temperature, and the rack's thermal
    /// state where a facility feed reports it); heartbeats are implied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<gangway_signals::Signal>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Desired {
    Run,
    Stop,
    /// Ask the worker to checkpoint (SIGUSR1), wait for a new complete
    /// checkpoint or the deadline, then stop it: preemption, drains and
    /// evacuations all use this.
    Checkpoint,
}

/// A worker the region wants on one of the agent's nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub job_id: Uuid,
    /// The job's tenant: the agent runs the worker as that tenant's
    /// unprivileged user (docs/jobs.md). Empty from regions before it.
    #[serde(default)]
    pub tenant: String,
    pub rank: u32,
    pub attempt: i32,
    pub desired: Desired,
    pub node_id: String,
    pub gpus: Vec<u32>,
    /// The number of workers of this run of the job (`WORLD_SIZE`,
    /// `GANGWAY_WORLD_SIZE`): an elastic gang may run with fewer than all of
    /// its ranks, and the next run may have another count.
    pub world_size: u32,
    pub local_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub estimated_duration_s: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_s: Option<i64>,
    /// Seconds between SIGTERM and SIGKILL when stopping.
    pub grace_period_s: u64,
    /// With `Checkpoint`: seconds the worker has to write its checkpoint
    /// before it is stopped anyway.
    #[serde(default)]
    pub checkpoint_deadline_s: u64,
    /// Set when the worker restarts from a checkpoint: a key in the
    /// region's checkpoint store (`jobs/…`), which the agent fetches and
    /// verifies before the start and hands over as a local directory in
    /// `GANGWAY_RESTORE_FROM`; or, from agents and jobs before the store,
    /// a path on the agent or a simulated executor's `sim:` marker, passed
    /// as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    /// The job's ownership epoch: the worker's checkpoints are uploaded
    /// under it. Moves when another region adopts the job (failover), so a
    /// stale owner's uploads are refused. 1 from regions before epochs.
    #[serde(default = "first_epoch")]
    pub epoch: i32,
    /// The region has recorded the worker running (it is past `assigned`):
    /// the agent need not report it running again, only what changes — its
    /// exit, a newer checkpoint. False from regions before it, which hear
    /// every running worker at every sync.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
}

/// The epoch every job starts in.
fn first_epoch() -> i32 {
    1
}

/// `POST /internal/v1/agents/{agent_id}/changes`: a long poll, answered
/// when a plan the region committed placed or preempted work on one of the
/// agent's nodes, or after `wait_ms` (the region caps it) with nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesRequest {
    pub wait_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangesResponse {
    /// Sync now: what should run on the agent's nodes changed.
    pub changed: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResponse {
    pub assignments: Vec<Assignment>,
    /// Some of the workers' reports were left for a later sync (another
    /// sync held their job: the agents of one gang that ended at once), so
    /// the agent should sync again soon rather than a whole interval later:
    /// until then the job's GPUs stay allocated to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub report_again: bool,
    /// The region kept the sync's log chunks (or had none to keep): the
    /// agent moves past them. Otherwise it sends them again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logs_kept: bool,
}
