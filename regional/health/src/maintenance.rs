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
//!
//! # Nodes already out
//! A pending node out of service for a reason outside the plan
//! ([`Outage`]: lost, failed, in repair, held by an operator, suspect, held
//! down) cannot start, and waiting for it could stall the plan forever. It
//! is looked at when its turn comes: when the wave reaching it in the
//! order above would start it if it were in service (its leaf has room, no
//! running gang of it is out, and the region's cap has room — its own
//! outage already counts there). Then:
//! - out for a **lasting** reason (lost, failed, needs repair, in repair,
//!   cordoned or drained by an operator): it is skipped
//!   ([`Step::Skipped`], with the reason) and the plan goes on;
//! - out for a **passing** reason (suspect: its agent silent for a few
//!   seconds; held down after flapping): the plan goes on with its other
//!   nodes and waits for it, and takes it as usual once it is back; it is
//!   skipped only once it has been out for [`WaveLimits::skip_after_s`]
//!   since the plan first found it out at its turn ([`Node::waited_s`],
//!   which the caller resets whenever it sees the node back in service).
//!
//! Nodes out of service come last in the order (they have the longest to
//! come back); until its turn such a node just stays pending (a cordon may
//! well be over by then). A skipped node still counts against the region's
//! cap while it is out, and the plan finishes (`done`) once every node is
//! done or skipped.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{Admin, Observed};

/// How long a plan waits, by default, for a node out for a passing reason
/// at its turn before it skips it (seconds).
pub const SKIP_AFTER_S: u64 = 600;

fn default_skip_after_s() -> u64 {
    SKIP_AFTER_S
}

/// How many nodes may be out at once, and how long a plan waits for a
/// node out for a passing reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveLimits {
    /// Per leaf (K); at least 1.
    pub per_leaf: u32,
    /// Of the region's nodes (M%), all causes counted; at least one node.
    pub region_percent: u32,
    /// A node out for a passing reason at its turn is skipped once it has
    /// been out this long since the plan first found it so (seconds).
    #[serde(default = "default_skip_after_s")]
    pub skip_after_s: u64,
}

impl Default for WaveLimits {
    fn default() -> WaveLimits {
        WaveLimits {
            per_leaf: 1,
            region_percent: 10,
            skip_after_s: SKIP_AFTER_S,
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
    /// Left out: out of service for a reason outside the plan at its turn
    /// (see the module's "Nodes already out").
    Skipped,
}

impl Step {
    /// Out of service for the plan.
    pub fn is_out(self) -> bool {
        matches!(self, Step::Draining | Step::Rebooting | Step::Checking)
    }

    /// Nothing more to do for the plan.
    pub fn is_finished(self) -> bool {
        matches!(self, Step::Done | Step::Skipped)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Pending => "pending",
            Step::Draining => "draining",
            Step::Rebooting => "rebooting",
            Step::Checking => "checking",
            Step::Done => "done",
            Step::Skipped => "skipped",
        }
    }
}

/// Why a node is out of service for a reason outside the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outage {
    /// It will not come back by itself soon (lost, failed, needs repair, in
    /// repair, held by an operator); otherwise it is passing (suspect, held
    /// down after flapping).
    pub lasting: bool,
    /// In words, for operators: `node lost: …`, `cordoned by an operator: …`.
    pub reason: String,
}

impl Outage {
    pub fn lasting(reason: impl Into<String>) -> Outage {
        Outage {
            lasting: true,
            reason: reason.into(),
        }
    }

    pub fn passing(reason: impl Into<String>) -> Outage {
        Outage {
            lasting: false,
            reason: reason.into(),
        }
    }

    /// Why a node is out of service, from both axes (as [`crate::decide`]
    /// sees them); `None` when it is in service (active, and healthy or
    /// degraded). `admin_reason` is the operator's reason as stored (a
    /// drain keeps its reason there). Lasting when either axis is.
    pub fn of(admin: &Admin, admin_reason: Option<&str>, observed: &Observed) -> Option<Outage> {
        let with = |what: &str, why: &str| {
            let why = why.trim();
            if why.is_empty() {
                what.to_string()
            } else {
                format!("{what}: {why}")
            }
        };
        let admin = match admin {
            Admin::Active => None,
            Admin::Cordoned { reason } => {
                Some(Outage::lasting(with("cordoned by an operator", reason)))
            }
            Admin::Draining { .. } => Some(Outage::lasting(with(
                "drained by an operator",
                admin_reason.unwrap_or_default(),
            ))),
            Admin::Maintenance { plan } => {
                Some(Outage::lasting(with("held by maintenance plan", plan)))
            }
            Admin::Repair { reason } => Some(Outage::lasting(with("in repair", reason))),
        };
        let observed = match observed {
            Observed::Healthy | Observed::Degraded { .. } => None,
            Observed::Suspect { silent_s } => Some(Outage::passing(format!(
                "suspect: its agent silent for {silent_s} s"
            ))),
            Observed::Lost => Some(Outage::lasting(
                "node lost: its agent is gone or the node is down",
            )),
            Observed::Failed { fault } => Some(Outage::lasting(format!(
                "node failed ({}): waiting for a reboot and a healthy report",
                fault.code
            ))),
            Observed::Damped { until } => Some(Outage::passing(format!(
                "flapping: held down until t={until}s"
            ))),
            Observed::NeedsRepair { fault } => {
                Some(Outage::lasting(format!("needs repair ({})", fault.code)))
            }
        };
        match (admin, observed) {
            (Some(a), Some(o)) => Some(Outage {
                lasting: a.lasting || o.lasting,
                reason: format!("{}; {}", a.reason, o.reason),
            }),
            (a, o) => a.or(o),
        }
    }
}

/// One node of the region, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    pub leaf: String,
    /// Its step in the plan; `None`: not in the plan.
    pub step: Option<Step>,
    /// Out of service for another reason than this plan (failed, cordoned,
    /// repair, lost, …), and why; `None` for a node the plan has out.
    pub outage: Option<Outage>,
    /// A pending node the plan found out of service at its turn: how long
    /// (seconds) since it first did, the node out ever since.
    pub waited_s: Option<u64>,
    /// Running jobs with work on it, and their GPUs here.
    pub jobs: Vec<(String, u32)>,
    /// Jobs on it that will be checkpointed and moved whole anyway.
    pub moving: Vec<String>,
}

impl Node {
    /// Out of service for another reason than this plan.
    pub fn unavailable(&self) -> bool {
        self.outage.is_some()
    }
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
    /// Nothing else holds the plan, but it waits for a node out of service
    /// for a passing reason at its turn: it takes the node once it is back,
    /// or skips it once it has waited `skip_after_s`.
    NodeOut {
        node: String,
        reason: String,
        waited_s: u64,
        skip_after_s: u64,
    },
}

/// A pending node the plan leaves out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skip {
    pub node: String,
    pub reason: String,
}

/// The wave: nodes to start now, nodes to skip, nodes waited for, and why
/// others wait (when some do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    pub start: Vec<String>,
    /// Pending nodes out of service at their turn that the plan leaves out.
    pub skip: Vec<Skip>,
    /// Pending nodes out of service for a passing reason at their turn,
    /// waited for (their wait starts now if it had not).
    pub waiting: Vec<String>,
    pub held: Option<Held>,
}

/// The most nodes of `total` that may be out at once under `percent`.
pub fn region_cap(total: usize, percent: u32) -> u32 {
    ((total as u64 * u64::from(percent.min(100))) / 100).max(1) as u32
}

/// Which pending nodes may start now, and which are skipped (see the
/// module's limits and "Nodes already out").
pub fn next_wave(nodes: &[Node], limits: WaveLimits) -> Wave {
    let cap = region_cap(nodes.len(), limits.region_percent);
    let per_leaf = limits.per_leaf.max(1);
    let out = |n: &Node| n.unavailable() || n.step.is_some_and(Step::is_out);
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
        .filter(|n| n.step == Some(Step::Pending))
        .collect();
    // Leaves with the most nodes still to do first, so the per-leaf cap
    // does not leave a tail of a few leaves doing their nodes K at a time.
    let mut left_in_leaf: BTreeMap<&str, u32> = BTreeMap::new();
    for n in pending.iter().filter(|n| !n.unavailable()) {
        *left_in_leaf.entry(n.leaf.as_str()).or_insert(0) += 1;
    }
    // Nodes out of service last: they have the longest to come back.
    pending.sort_by_key(|n| {
        let gpus: u32 = n.jobs.iter().map(|(_, g)| g).sum();
        (
            n.unavailable(),
            !n.jobs.is_empty(),
            std::cmp::Reverse(left_in_leaf.get(n.leaf.as_str()).copied().unwrap_or(0)),
            gpus,
            n.id.as_str(),
        )
    });
    let mut wave = Wave::default();
    let mut waiting_for: Option<Held> = None;
    for n in pending {
        let leaf_full = leaf_out.get(n.leaf.as_str()).copied().unwrap_or(0) >= per_leaf;
        let shared = (n.jobs.iter())
            .map(|(j, _)| j.as_str())
            .find(|j| gangs_hit.contains(j) && !n.moving.iter().any(|m| m == j));
        if let Some(outage) = &n.outage {
            // Its turn comes when it would start now were it in service
            // (its own outage already counts in `region_out`). Skipping it
            // takes nothing out, so it uses no room.
            if region_out > cap {
                wave.held = Some(Held::RegionCap {
                    out: region_out,
                    cap,
                });
            } else if leaf_full {
                wave.held.get_or_insert(Held::LeafCap);
            } else if let Some(job) = shared {
                wave.held
                    .get_or_insert(Held::GangOnNodeOut { job: job.into() });
            } else {
                let waited_s = n.waited_s.unwrap_or(0);
                if outage.lasting {
                    wave.skip.push(Skip {
                        node: n.id.clone(),
                        reason: outage.reason.clone(),
                    });
                } else if waited_s >= limits.skip_after_s {
                    wave.skip.push(Skip {
                        node: n.id.clone(),
                        reason: format!(
                            "{} (still out {waited_s} s after its turn came)",
                            outage.reason
                        ),
                    });
                } else {
                    wave.waiting.push(n.id.clone());
                    waiting_for.get_or_insert(Held::NodeOut {
                        node: n.id.clone(),
                        reason: outage.reason.clone(),
                        waited_s,
                        skip_after_s: limits.skip_after_s,
                    });
                }
            }
            continue;
        }
        if region_out >= cap {
            // Later nodes out of service may still have their turn.
            wave.held = Some(Held::RegionCap {
                out: region_out,
                cap,
            });
            continue;
        }
        if leaf_full {
            wave.held.get_or_insert(Held::LeafCap);
            continue;
        }
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
    if wave.held.is_none() {
        wave.held = waiting_for;
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
