//! Rolling maintenance in capacity-aware waves: which nodes to take next.
//!
//! A maintenance plan reboots a set of nodes. Each node is drained first
//! (its jobs checkpointed and moved), rebooted, and returned only after its
//! agent comes back with a new boot id and passes a health check; the
//! region's executor persists that progress. This module is the pure part:
//! given where every node of the plan stands, [`next_wave`] says which
//! pending nodes may start now.
//!
//! # Limits
//! - at most [`WaveLimits::per_leaf`] nodes of one leaf out for the plan at
//!   once (a node failed in the leaf does not hold the leaf's turn forever);
//! - at most [`WaveLimits::region_percent`] of the region's nodes out at
//!   once, counting nodes out for any other reason (failed, cordoned,
//!   repair), so capacity never drops below the floor this sets;
//! - never more than one node of a running gang out for the plan at once
//!   (a gang on a failed node is the region's to recover), unless the gang
//!   is to be checkpointed and moved whole anyway ([`Node::moving`]): a gang
//!   losing one node can take a spare and resume from its checkpoint on the
//!   rest; losing two at once would need two.
//!
//! Nodes with no running work go first (nothing to drain), then nodes of
//! the leaves with the most nodes still to do (so the waves stay wide to the
//! end instead of a tail of a few leaves taking K nodes at a time), then
//! those with the least running GPUs, then by id, so a wave is cheap and
//! the order is reproducible.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How many nodes may be out at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveLimits {
    /// Per leaf (K); at least 1.
    pub per_leaf: u32,
    /// Of the region's nodes (M%), all causes counted; at least one node.
    pub region_percent: u32,
}

impl Default for WaveLimits {
    fn default() -> WaveLimits {
        WaveLimits {
            per_leaf: 1,
            region_percent: 10,
        }
    }
}

/// Where a node of the plan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Not started.
    Pending,
    /// Its jobs are checkpointing and moving.
    Draining,
    /// Told to reboot; waiting for a new boot id.
    Rebooting,
    /// Back with a new boot id; waiting for a healthy report.
    Checking,
    /// Returned to service.
    Done,
}

impl Step {
    /// Out of service for the plan.
    pub fn is_out(self) -> bool {
        matches!(self, Step::Draining | Step::Rebooting | Step::Checking)
    }
}

/// One node of the region, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    pub leaf: String,
    /// Its step in the plan; `None`: not in the plan.
    pub step: Option<Step>,
    /// Out of service for another reason (failed, cordoned, repair, lost).
    pub unavailable: bool,
    /// Running jobs with work on it, and their GPUs here.
    pub jobs: Vec<(String, u32)>,
    /// Jobs on it that will be checkpointed and moved whole anyway.
    pub moving: Vec<String>,
}

/// Why no (more) pending node could start now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Held {
    /// The region is at its cap of nodes out.
    RegionCap { out: u32, cap: u32 },
    /// Every leaf with pending nodes is at its cap.
    LeafCap,
    /// The remaining pending nodes each share a running gang with a node
    /// already out.
    GangOnNodeOut { job: String },
}

/// The wave: nodes to start now, and why others wait (when some do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    pub start: Vec<String>,
    pub held: Option<Held>,
}

/// The most nodes of `total` that may be out at once under `percent`.
pub fn region_cap(total: usize, percent: u32) -> u32 {
    ((total as u64 * u64::from(percent.min(100))) / 100).max(1) as u32
}

/// Which pending nodes may start now (see the module's limits).
pub fn next_wave(nodes: &[Node], limits: WaveLimits) -> Wave {
    let cap = region_cap(nodes.len(), limits.region_percent);
    let per_leaf = limits.per_leaf.max(1);
    let out = |n: &Node| n.unavailable || n.step.is_some_and(Step::is_out);
    let mut region_out = nodes.iter().filter(|n| out(n)).count() as u32;
    let mut leaf_out: BTreeMap<&str, u32> = BTreeMap::new();
    // Running gangs that already lost a node to the plan (or to a fault).
    let mut gangs_hit: BTreeSet<&str> = BTreeSet::new();
    // Only the plan's own nodes count here: a gang on a failed node is
    // the region's to recover (spare or requeue), and a failed node must
    // not hold its leaf's turn forever.
    for n in nodes.iter().filter(|n| n.step.is_some_and(Step::is_out)) {
        *leaf_out.entry(n.leaf.as_str()).or_insert(0) += 1;
        for (job, _) in &n.jobs {
            if !n.moving.contains(job) {
                gangs_hit.insert(job.as_str());
            }
        }
    }
    let mut pending: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.step == Some(Step::Pending) && !n.unavailable)
        .collect();
    // Leaves with the most nodes still to do first, so the per-leaf cap
    // does not leave a tail of a few leaves doing their nodes K at a time.
    let mut left_in_leaf: BTreeMap<&str, u32> = BTreeMap::new();
    for n in &pending {
        *left_in_leaf.entry(n.leaf.as_str()).or_insert(0) += 1;
    }
    pending.sort_by_key(|n| {
        let gpus: u32 = n.jobs.iter().map(|(_, g)| g).sum();
        (
            !n.jobs.is_empty(),
            std::cmp::Reverse(left_in_leaf[n.leaf.as_str()]),
            gpus,
            n.id.as_str(),
        )
    });
    let mut wave = Wave::default();
    for n in pending {
        if region_out >= cap {
            wave.held = Some(Held::RegionCap {
                out: region_out,
                cap,
            });
            break;
        }
        if leaf_out.get(n.leaf.as_str()).copied().unwrap_or(0) >= per_leaf {
            wave.held.get_or_insert(Held::LeafCap);
            continue;
        }
        let shared = (n.jobs.iter())
            .map(|(j, _)| j.as_str())
            .find(|j| gangs_hit.contains(j) && !n.moving.iter().any(|m| m == j));
        if let Some(job) = shared {
            wave.held
                .get_or_insert(Held::GangOnNodeOut { job: job.into() });
            continue;
        }
        region_out += 1;
        *leaf_out.entry(n.leaf.as_str()).or_insert(0) += 1;
        for (job, _) in &n.jobs {
            if !n.moving.contains(job) {
                gangs_hit.insert(job.as_str());
            }
        }
        wave.start.push(n.id.clone());
    }
    wave
}

/// Progress of a plan: nodes per step, for status and progress bars.
pub fn progress(nodes: &[Node]) -> BTreeMap<Step, u32> {
    let mut out = BTreeMap::new();
    for step in nodes.iter().filter_map(|n| n.step) {
        *out.entry(step).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
#[path = "maintenance_tests.rs"]
mod tests;
