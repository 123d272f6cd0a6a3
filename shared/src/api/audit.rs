//! Goodput per tenant and the audit log.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

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
