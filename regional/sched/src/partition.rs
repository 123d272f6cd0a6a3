//! Scheduling partitions: one per GPU type.
//!
//! Units of one GPU type only ever run on nodes of that type, and a victim
//! is always of the type of the unit it makes room for, so each type's
//! pool can be planned on its own: a pass over the h100 pool never waits
//! for the a100 pool's, and the pools' passes may run at once. What a
//! partition sees of the others: every tenant's terms, usage and the
//! region's capacity of every type, so fair sharing's dominant shares
//! span types as in one pass — as of the snapshot (what the other pools'
//! concurrent passes start is seen by the next pass).

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::{plan, plan_in};
use crate::types::{Plan, Policy, Snapshot};

impl Snapshot {
    /// GPUs of each type in the region: [`Snapshot::capacity`], or when it
    /// is empty, counted from the nodes (each id once).
    pub(crate) fn gpus_by_type(&self) -> BTreeMap<&str, u64> {
        if !self.capacity.is_empty() {
            return (self.capacity.iter())
                .map(|(t, &n)| (t.as_str(), n))
                .collect();
        }
        let mut capacity: BTreeMap<&str, u64> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for n in &self.nodes {
            if seen.insert(n.id.as_str()) {
                *capacity.entry(n.gpu_type.as_str()).or_insert(0) += u64::from(n.gpus);
            }
        }
        capacity
    }

    /// The GPU types of this snapshot's nodes, queued and running units.
    pub fn gpu_types(&self) -> BTreeSet<&str> {
        let nodes = self.nodes.iter().map(|n| n.gpu_type.as_str());
        let queued = self.queue.iter().map(|r| r.gpu_type.as_str());
        let running = self.running.iter().map(|r| r.gpu_type.as_str());
        nodes.chain(queued).chain(running).collect()
    }

    /// What one GPU type's pass needs: the type's nodes, queued and running
    /// units, with every type's terms, usage and capacity (dominant shares
    /// span types).
    pub fn partition(&self, gpu_type: &str) -> Snapshot {
        let capacity = (self.gpus_by_type().into_iter())
            .map(|(t, n)| (t.to_string(), n))
            .collect();
        Snapshot {
            generation: self.generation,
            partitions: (self.partitions.iter())
                .filter(|(t, _)| *t == gpu_type)
                .map(|(t, &g)| (t.clone(), g))
                .collect(),
            nodes: (self.nodes.iter())
                .filter(|n| n.gpu_type == gpu_type)
                .cloned()
                .collect(),
            queue: (self.queue.iter())
                .filter(|r| r.gpu_type == gpu_type)
                .cloned()
                .collect(),
            quotas: self.quotas.clone(),
            shares: self.shares.clone(),
            usage: self.usage.clone(),
            now: self.now,
            running: (self.running.iter())
                .filter(|r| r.gpu_type == gpu_type)
                .cloned()
                .collect(),
            capacity,
            gpu_power_w: self.gpu_power_w.clone(),
            power_headroom_w: (self.power_headroom_w.iter())
                .filter(|((_, t), _)| t == gpu_type)
                .map(|(k, &w)| (k.clone(), w))
                .collect(),
            reserved: (self.reserved.iter())
                .filter(|r| r.gpu_type == gpu_type)
                .cloned()
                .collect(),
            claims: self.claims.clone(),
        }
    }
}

/// Plans every GPU type's partition at once, each on its own thread, and
/// joins the plans (placements, waits, reservations and preemptions of
/// each type in turn, types in name order). Each partition's decisions
/// are those [`plan`] makes on [`Snapshot::partition`] (computed on the
/// snapshot itself, without copying it).
pub fn plan_partitioned(snapshot: &Snapshot, policy: &Policy) -> Plan {
    let types = snapshot.gpu_types();
    if types.len() <= 1 {
        return plan(snapshot, policy);
    }
    let plans: Vec<Plan> = std::thread::scope(|scope| {
        let handles: Vec<_> = (types.iter())
            .map(|&t| scope.spawn(move || plan_in(snapshot, policy, Some(t))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("the planner does not panic"))
            .collect()
    });
    let mut out = Plan {
        generation: snapshot.generation,
        partitions: snapshot.partitions.clone(),
        ..Plan::default()
    };
    for p in plans {
        out.placements.extend(p.placements);
        out.waiting.extend(p.waiting);
        out.reservations.extend(p.reservations);
        out.preemptions.extend(p.preemptions);
        out.claims.extend(p.claims);
    }
    out
}
