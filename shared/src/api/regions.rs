//! Regions: each one's capacity and status, as regions report them and
//! the global tier lists them, and a region's evacuation.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
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
    /// The region's lease: seconds since its last round trip to each peer
    /// (its heartbeats), as its last beat found them. A region fences when
    /// fewer than a majority are within `lease_s`. Operators' listing only
    /// (`GET /v1/admin/regions`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerLease>,
    /// The lease's length, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_s: Option<f64>,
    /// How long the oldest job intent or update not yet held by its buddy
    /// region has waited, seconds (0: none waits). Operators' listing only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_lag_s: Option<f64>,
}

/// One peer as a region's heartbeats see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PeerLease {
    pub region: String,
    /// Seconds since the last round trip to it; absent: none since this
    /// replica started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_age_s: Option<f64>,
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

/// A region as the global tier sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RegionList {
    pub regions: Vec<RegionInfo>,
}

/// Work of one tenant on one GPU type in a region: what waits and what
/// runs (`GET /v1/admin/queue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueRow {
    pub tenant: String,
    pub gpu_type: String,
    /// Jobs waiting to be placed, and the GPUs they ask.
    pub queued_jobs: u64,
    pub queued_gpus: u64,
    /// Jobs placed and not ended (starting, running, being preempted or
    /// cancelled), and the GPUs they asked.
    pub active_jobs: u64,
    pub active_gpus: u64,
    /// When the longest-waiting of its queued jobs was submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_at: Option<DateTime<Utc>>,
}

/// A region's queue by tenant and GPU type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueSummary {
    pub rows: Vec<QueueRow>,
}
