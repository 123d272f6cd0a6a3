//! Fleet operations (issue 5): nodes as operators see them, node actions,
//! injected faults, and the inventory.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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
