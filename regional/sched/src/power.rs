//! Rack power budgets.
//!
//! Each allocated GPU draws its type's power ([`Snapshot::gpu_power_w`],
//! its enforced power limit), and a rack (a leaf) may hold only so much:
//! [`Snapshot::power_headroom_w`] says, per (rack, GPU type), how many
//! watts this pass's placements of that type may still add there (the
//! rack's budget less what its allocated GPUs draw; where types share a
//! rack, the caller splits it). A rack with room for `k` more GPUs of a
//! type keeps only `k` of its free GPUs of that type visible to the pass,
//! hiding the others from the nodes with the fewest free first (so whole
//! nodes stay whole for gangs). Every start, reservation, victim search
//! and grow then sees only GPUs the budget can feed: a placement can
//! never take a rack over its budget, whatever the discipline.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::types::{Node, Snapshot};

/// The snapshot's nodes with the GPUs their racks' budgets cannot feed
/// taken out of their free lists (borrowed as they are when no budget
/// binds).
pub(crate) fn visible_nodes(snapshot: &Snapshot) -> Cow<'_, [Node]> {
    if snapshot.power_headroom_w.is_empty() {
        return Cow::Borrowed(&snapshot.nodes);
    }
    // Per (rack, type) with a budget and a draw: the free GPUs that can be
    // fed, and the nodes holding free GPUs, fewest free first.
    let mut groups: BTreeMap<(&str, &str), (u64, Vec<usize>)> = BTreeMap::new();
    for (i, n) in snapshot.nodes.iter().enumerate() {
        if !n.schedulable || n.free.is_empty() {
            continue;
        }
        let key = (n.leaf.as_str(), n.gpu_type.as_str());
        let Some(&room) = snapshot
            .power_headroom_w
            .get(&(n.leaf.clone(), n.gpu_type.clone()))
        else {
            continue;
        };
        let draw = snapshot.gpu_power_w.get(&n.gpu_type).copied().unwrap_or(0);
        if draw == 0 {
            continue;
        }
        let g = groups
            .entry(key)
            .or_insert_with(|| (room / u64::from(draw), Vec::new()));
        g.1.push(i);
    }
    let mut nodes: Option<Vec<Node>> = None;
    for (_, (fed, mut members)) in groups {
        let free: u64 = members
            .iter()
            .map(|&i| snapshot.nodes[i].free.len() as u64)
            .sum();
        if free <= fed {
            continue;
        }
        let nodes = nodes.get_or_insert_with(|| snapshot.nodes.clone());
        members.sort_by_key(|&i| (nodes[i].free.len(), i));
        let mut hide = free - fed;
        for i in members {
            if hide == 0 {
                break;
            }
            let n = &mut nodes[i];
            let k = (n.free.len() as u64).min(hide) as usize;
            let keep = n.free.len() - k;
            n.free.truncate(keep);
            hide -= k as u64;
        }
    }
    match nodes {
        Some(v) => Cow::Owned(v),
        None => Cow::Borrowed(&snapshot.nodes),
    }
}
