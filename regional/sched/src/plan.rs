//! One greedy planning pass: [`plan`].

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};

use crate::index::{first_of_each_id, TypeIndex};
use crate::types::{
    Level, Placement, Plan, Policy, Request, Snapshot, WaitReason, Waiting, WorkerPlacement,
};

/// The order units are considered in: priority (high first), then seq (old
/// first), then job id, then ranks; the remaining fields only make the order
/// total, so a permuted queue gives the same plan.
fn queue_order(a: &Request, b: &Request) -> Ordering {
    (
        Reverse(a.priority),
        a.seq,
        &a.job,
        a.ranks.first(),
        &a.ranks,
    )
        .cmp(&(
            Reverse(b.priority),
            b.seq,
            &b.job,
            b.ranks.first(),
            &b.ranks,
        ))
        .then_with(|| {
            (
                &a.tenant,
                &a.gpu_type,
                a.gpus_per_worker,
                a.required,
                a.preferred,
            )
                .cmp(&(
                    &b.tenant,
                    &b.gpu_type,
                    b.gpus_per_worker,
                    b.required,
                    b.preferred,
                ))
        })
}

/// Why a request can never be placed, if it cannot.
fn invalid(req: &Request) -> Option<String> {
    if req.ranks.is_empty() {
        return Some("it has no ranks".into());
    }
    if req.gpus_per_worker == 0 {
        return Some("gpus_per_worker is 0".into());
    }
    if req.ranks.len() > 1 {
        let mut ranks = req.ranks.clone();
        ranks.sort_unstable();
        if let Some(w) = ranks.windows(2).find(|w| w[0] == w[1]) {
            return Some(format!("rank {} appears twice", w[0]));
        }
    }
    None
}

/// Within one pass capacity only shrinks, so once `W` workers of a shape
/// found no domain at a level, `W` or more never will in this pass.
/// Key: (gpu type, gpus per worker); value: smallest failed W per level.
type FailMemo<'a> = BTreeMap<(&'a str, u32), [u64; 4]>;

/// Computes which queued units to start now and why the others wait.
///
/// Greedy in queue order; a unit that does not fit now waits and the pass
/// goes on. Pure and deterministic: the same snapshot gives the same plan.
pub fn plan(snapshot: &Snapshot, policy: &Policy) -> Plan {
    let mut order: Vec<&Request> = snapshot.queue.iter().collect();
    order.sort_by(|a, b| queue_order(a, b));

    // Index only the GPU types somebody asks for.
    let wanted: BTreeSet<&str> = order.iter().map(|r| r.gpu_type.as_str()).collect();
    let keep = first_of_each_id(&snapshot.nodes);
    let mut by_type: BTreeMap<&str, Vec<_>> = wanted.iter().map(|&t| (t, Vec::new())).collect();
    let only = match wanted.len() {
        1 => wanted.first().copied(),
        _ => None,
    };
    for (i, node) in snapshot.nodes.iter().enumerate() {
        if !node.schedulable || keep.as_ref().is_some_and(|k| !k[i]) {
            continue;
        }
        let ty = node.gpu_type.as_str();
        match only {
            // One type queued (the common case): no map lookup per node.
            Some(t) if t != ty => {}
            _ => {
                if let Some(v) = by_type.get_mut(ty) {
                    v.push(node);
                }
            }
        }
    }
    let mut indexes: BTreeMap<&str, TypeIndex> = by_type
        .into_iter()
        .map(|(t, nodes)| (t, TypeIndex::build(nodes)))
        .collect();

    let quotas: BTreeMap<(&str, &str), u32> = snapshot
        .quotas
        .iter()
        .map(|((t, g), &q)| ((t.as_str(), g.as_str()), q))
        .collect();
    let mut usage: BTreeMap<(&str, &str), u64> = snapshot
        .usage
        .iter()
        .map(|((t, g), &u)| ((t.as_str(), g.as_str()), u64::from(u)))
        .collect();
    let mut memo: FailMemo = BTreeMap::new();

    let mut out = Plan {
        reservations: Vec::new(),
        generation: snapshot.generation,
        placements: Vec::new(),
        waiting: Vec::new(),
    };
    let max = policy.max_placements.unwrap_or(usize::MAX);
    for req in order {
        if out.placements.len() >= max {
            break;
        }
        let wait = |reason| Waiting {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            reason,
        };
        if let Some(detail) = invalid(req) {
            out.waiting.push(wait(WaitReason::Invalid { detail }));
            continue;
        }
        let need = req.gpus();
        let key = (req.tenant.as_str(), req.gpu_type.as_str());
        let in_use = usage.get(&key).copied().unwrap_or(0);
        if let Some(&quota) = quotas.get(&key) {
            if in_use + need > u64::from(quota) {
                out.waiting.push(wait(WaitReason::OverQuota {
                    gpu_type: req.gpu_type.clone(),
                    quota,
                    in_use: sat(in_use),
                    requested: sat(need),
                }));
                continue;
            }
        }
        // Every queued type is indexed; a type no node has gets an empty tree.
        let placed = match indexes.get_mut(req.gpu_type.as_str()) {
            Some(index) => place(index, &mut memo, req).ok_or(index.region_free()),
            None => Err(0),
        };
        match placed {
            Ok(placement) => {
                *usage.entry(key).or_insert(0) += need;
                out.placements.push(placement);
            }
            Err(free_gpus) => out.waiting.push(wait(WaitReason::NoCapacity {
                required: req.required,
                free_gpus,
            })),
        }
    }
    out
}

fn sat(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Places one valid request whole, or returns `None` and leaves the index as it was.
fn place<'a>(
    index: &mut TypeIndex,
    memo: &mut FailMemo<'a>,
    req: &'a Request,
) -> Option<Placement> {
    let workers = req.ranks.len() as u64;
    let gpw = req.gpus_per_worker;
    let failed = memo
        .entry((req.gpu_type.as_str(), gpw))
        .or_insert([u64::MAX; 4]);
    // The whole region is the widest domain: if it cannot, nothing can.
    if index.capacity(Level::Region, 0, gpw) < workers {
        for f in failed.iter_mut() {
            *f = (*f).min(workers);
        }
        return None;
    }
    let mut chosen = None;
    for level in Level::ALL.into_iter().filter(|&l| l <= req.required) {
        if workers >= failed[level.index()] {
            continue;
        }
        match index.best_fit(level, workers, gpw) {
            Some(dom) => {
                chosen = Some((level, dom));
                break;
            }
            None => failed[level.index()] = workers,
        }
    }
    let (level, dom) = chosen?;
    let mut picks = Vec::new();
    index.distribute(level, dom, workers, gpw, &mut picks);
    let placed: u64 = picks.iter().map(|&(_, w)| w).sum();
    if placed != workers {
        debug_assert!(
            false,
            "domain capacity promised {workers} workers, found {placed}"
        );
        return None;
    }
    // Topology order, so ranks on one node (and one leaf, one spine) are contiguous.
    picks.sort_unstable();
    let slots = picks.iter().flat_map(|&(slot, n)| {
        let s = &index.slots[slot as usize];
        let start = s.taken as usize;
        let gpus = &s.free[start..start + (n * u64::from(gpw)) as usize];
        gpus.chunks(gpw as usize).map(move |chunk| (s, chunk))
    });
    let workers_out: Vec<WorkerPlacement> = req
        .ranks
        .iter()
        .zip(slots)
        .map(|(&rank, (s, chunk))| WorkerPlacement {
            rank,
            node: s.node.id.clone(),
            gpus: chunk.to_vec(),
        })
        .collect();
    index.take(&picks, gpw);
    Some(Placement {
        job: req.job.clone(),
        ranks: req.ranks.clone(),
        level,
        workers: workers_out,
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
