//! Rolling maintenance plans: what an operator starts and what it shows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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
