//! Dedicated clusters: what tenants send and what they get back.
//!
//! A dedicated cluster is a set of whole nodes of one GPU type, bound to
//! one tenant, all inside one domain of a topology level of a region and
//! as tight inside it as the region can make them. Only the cluster's jobs
//! (those naming it in `JobSpec.cluster`) run on its nodes, and they run
//! nowhere else. The create is all or nothing: it either binds every node
//! (state `ready`) or is refused (409 `cluster_unavailable`) with nothing
//! bound. When a node of the cluster fails, the region swaps in a spare
//! from the cluster's domain (the failed node's leaf first) and records an
//! event the tenant reads on the cluster; with no spare there the cluster
//! is `degraded` until one is free.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::TopologyLevel;
use crate::error::codes;
use crate::validate::{invalid, Invalid};

/// The most nodes one cluster may hold.
pub const MAX_CLUSTER_NODES: i64 = 4096;

/// Body of `POST /v1/clusters`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// A name for people (the id is the cluster's handle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9-]{1,64}$")]
    pub name: Option<String>,
    /// The GPU model of its nodes, for example `h100`.
    #[schema(pattern = "^[a-z0-9-]{1,64}$")]
    pub gpu_type: String,
    /// Whole nodes, all bound at once.
    #[schema(minimum = 1, maximum = 4096)]
    pub nodes: i64,
    /// Every node lies inside one domain of this level (`node` is another
    /// name for `nvlink`); the region picks the tightest domain that has
    /// the nodes free. Spares that heal it and nodes that grow it come from
    /// the same domain. Default `spine`.
    #[serde(default = "spine_level")]
    pub level: TopologyLevel,
    /// The region to create it in (the global tier routes on it; a region
    /// refuses another region's name with `wrong_region`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

fn spine_level() -> TopologyLevel {
    TopologyLevel::Spine
}

/// Body of `PATCH /v1/clusters/{id}`: the new number of nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterResize {
    /// Growing binds free nodes of the cluster's domain at once (all or
    /// nothing), nearest the cluster's nodes first; shrinking releases the
    /// nodes that keep the rest tightest, idle ones first, after their
    /// running jobs are checkpointed and moved onto the nodes that stay.
    #[schema(minimum = 1, maximum = 4096)]
    pub nodes: i64,
}

/// Where a cluster stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    /// Every node it asks for is bound.
    Ready,
    /// A node failed and no spare of its domain was free: it runs with
    /// fewer nodes while the region keeps looking.
    Degraded,
    /// Shrinking: nodes it gives back still run its jobs, which are being
    /// checkpointed and moved onto the nodes that stay.
    Resizing,
    /// Deleted: its running jobs are being checkpointed and stopped; then
    /// its nodes go back to the region.
    Deleting,
    /// Gone: its nodes are back in the region.
    Deleted,
}

impl ClusterState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Ready => "ready",
            ClusterState::Degraded => "degraded",
            ClusterState::Resizing => "resizing",
            ClusterState::Deleting => "deleting",
            ClusterState::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ClusterState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "ready" => ClusterState::Ready,
            "degraded" => ClusterState::Degraded,
            "resizing" => ClusterState::Resizing,
            "deleting" => ClusterState::Deleting,
            "deleted" => ClusterState::Deleted,
            _ => return Err(format!("unknown cluster state {s:?}")),
        })
    }
}

/// One node of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterNode {
    pub node_id: String,
    pub spine: String,
    pub leaf: String,
    pub nvlink_domain: String,
    pub gpus: u32,
    /// GPUs its jobs hold now.
    pub in_use_gpus: u32,
    /// Being given back by a shrink (its jobs move off first).
    pub releasing: bool,
    /// Whether it takes the cluster's work now (not cordoned, draining,
    /// unhealthy or being given back).
    pub schedulable: bool,
}

/// Something that happened to a cluster: created, resized, a node lost
/// and a spare swapped in (or none free), deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterEvent {
    pub at: DateTime<Utc>,
    /// `created`, `resized`, `node_failed`, `spare_swapped`, `no_spare`,
    /// `node_released`, `deleting` or `deleted`.
    pub kind: String,
    pub message: String,
    /// What the event is about: `node`, `spare`, `domain`, …
    #[serde(default)]
    pub details: serde_json::Value,
}

/// A dedicated cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    pub id: Uuid,
    pub tenant: String,
    pub region: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub gpu_type: String,
    /// Nodes it asks for.
    pub nodes: u32,
    /// The level it was asked at, and the domain of that level its nodes
    /// lie in, from the region down (`[spine]`, `[spine, leaf]`, …; empty
    /// for the region).
    pub level: TopologyLevel,
    pub domain: Vec<String>,
    /// The tightest level holding every node it has now.
    pub placement_level: TopologyLevel,
    pub state: ClusterState,
    /// GPUs on its nodes, and how many its jobs hold now.
    pub gpus: u32,
    pub in_use_gpus: u32,
    /// Its nodes, by id.
    pub members: Vec<ClusterNode>,
    /// Its newest events, oldest first (only on `GET /v1/clusters/{id}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ClusterEvent>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The answer of `GET /v1/clusters`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterList {
    /// Newest first.
    pub clusters: Vec<Cluster>,
    /// Regions that did not answer (global tier); their clusters are
    /// missing from the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_regions: Vec<String>,
}

fn valid_name(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn check_nodes(nodes: i64) -> Result<u32, Invalid> {
    if (1..=MAX_CLUSTER_NODES).contains(&nodes) {
        Ok(nodes as u32)
    } else {
        Err(invalid(
            codes::INVALID_CLUSTER,
            format!("nodes must be between 1 and {MAX_CLUSTER_NODES}, got {nodes}"),
        ))
    }
}

impl ClusterSpec {
    /// The checks that need no fleet: spellings and the node count.
    pub fn check(&self) -> Result<(), Invalid> {
        if !valid_name(&self.gpu_type) {
            return Err(invalid(
                codes::INVALID_SPEC,
                "gpu_type must be 1–64 characters of a-z, 0-9 and '-'",
            ));
        }
        if self.name.as_deref().is_some_and(|n| !valid_name(n)) {
            return Err(invalid(
                codes::INVALID_SPEC,
                "name must be 1–64 characters of a-z, 0-9 and '-'",
            ));
        }
        check_nodes(self.nodes).map(|_| ())
    }
}

impl ClusterResize {
    pub fn check(&self) -> Result<(), Invalid> {
        check_nodes(self.nodes).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_defaults_to_the_spine_level_and_refuses_unknown_fields() {
        let s: ClusterSpec = serde_json::from_str(r#"{"gpu_type": "h100", "nodes": 4}"#).unwrap();
        assert_eq!(s.level, TopologyLevel::Spine);
        assert!(s.check().is_ok());
        assert!(serde_json::from_str::<ClusterSpec>(
            r#"{"gpu_type": "h100", "nodes": 4, "gpus": 8}"#
        )
        .is_err());
        for nodes in [0, -1, MAX_CLUSTER_NODES + 1] {
            let bad = ClusterSpec { nodes, ..s.clone() };
            assert_eq!(bad.check().unwrap_err().code, codes::INVALID_CLUSTER);
        }
        let bad = ClusterSpec {
            name: Some("Has Spaces".into()),
            ..s.clone()
        };
        assert_eq!(bad.check().unwrap_err().code, codes::INVALID_SPEC);
        assert_eq!(
            ClusterResize { nodes: 0 }.check().unwrap_err().code,
            codes::INVALID_CLUSTER
        );
    }

    #[test]
    fn states_read_back_what_they_write() {
        for s in [
            ClusterState::Ready,
            ClusterState::Degraded,
            ClusterState::Resizing,
            ClusterState::Deleting,
            ClusterState::Deleted,
        ] {
            assert_eq!(s.as_str().parse::<ClusterState>().unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
    }
}
