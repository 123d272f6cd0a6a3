//! [`apply`]: the snapshot a plan leaves behind, for the simulator and tests.

use std::collections::BTreeMap;

use crate::types::{Elastic, Placement, Plan, Request, Running, Snapshot};

/// The snapshot after `plan` is carried out on `snapshot`: placed GPUs leave
/// their nodes' free lists, placed units leave the queue, join `running`
/// (expected to end at `now` + their estimate; `u64::MAX`, no known end,
/// when the estimate is 0) and their tenants' usage grows. Reservations are
/// not carried: the next pass recomputes them.
///
/// It models the regional commit: each placement is checked against the
/// state it meets (its unit still queued, every GPU still free on a node of
/// the snapshot) and is skipped whole when it does not fit, so a stale or
/// hand-made plan can never double-book a GPU. The generation goes up by one
/// when anything was applied.
pub fn apply(snapshot: &Snapshot, plan: &Plan) -> Snapshot {
    let mut next = snapshot.clone();
    // The first entry of each node id counts, as in `plan`.
    let mut node_at: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, node) in snapshot.nodes.iter().enumerate() {
        node_at.entry(node.id.as_str()).or_insert(i);
    }
    // Queued units by (job, ranks), oldest entry first.
    let mut queued: BTreeMap<(&str, &[u32]), Vec<usize>> = BTreeMap::new();
    for (i, req) in snapshot.queue.iter().enumerate().rev() {
        queued
            .entry((req.job.as_str(), req.ranks.as_slice()))
            .or_default()
            .push(i);
    }
    let mut placed = vec![false; snapshot.queue.len()];
    let mut applied = false;
    for placement in &plan.placements {
        let mut key = (placement.job.as_str(), placement.ranks.as_slice());
        if queued.get(&key).is_none_or(|v| v.is_empty()) {
            // An elastic unit started with a prefix of its ranks.
            if let Some(r) = snapshot.queue.iter().find(|r| {
                r.job == placement.job
                    && r.is_elastic()
                    && placement.ranks.len() >= r.min_workers as usize
                    && r.ranks.starts_with(&placement.ranks)
            }) {
                key = (r.job.as_str(), r.ranks.as_slice());
            }
        }
        let Some(slots) = queued.get_mut(&key) else {
            continue;
        };
        let Some(&q) = slots.last() else { continue };
        let req = &snapshot.queue[q];
        if !fits(&next, &node_at, req, placement) {
            continue;
        }
        slots.pop();
        placed[q] = true;
        applied = true;
        for w in &placement.workers {
            let node = &mut next.nodes[node_at[w.node.as_str()]];
            node.free.retain(|g| !w.gpus.contains(g));
        }
        let used = next
            .usage
            .entry((req.tenant.clone(), req.gpu_type.clone()))
            .or_insert(0);
        let took = placement.workers.len() as u64 * u64::from(req.gpus_per_worker);
        *used = used.saturating_add(u32::try_from(took).unwrap_or(u32::MAX));
        let mut gpus: Vec<(String, Vec<u32>)> = Vec::new();
        for w in &placement.workers {
            match gpus.last_mut() {
                Some((node, list)) if *node == w.node => list.extend(&w.gpus),
                _ => gpus.push((w.node.clone(), w.gpus.clone())),
            }
        }
        next.running.push(Running {
            job: req.job.clone(),
            tenant: req.tenant.clone(),
            gpu_type: req.gpu_type.clone(),
            priority: req.priority,
            gpus,
            expected_end: match req.estimated_duration_s {
                0 => u64::MAX,
                d => snapshot.now.saturating_add(d),
            },
            started: snapshot.now,
            elastic: req.is_elastic().then_some(Elastic {
                workers: placement.workers.len() as u32,
                max_workers: req.ranks.len() as u32,
                gpus_per_worker: req.gpus_per_worker,
                required: req.required,
            }),
            ..Default::default()
        });
    }
    let mut i = 0;
    next.queue.retain(|_| {
        i += 1;
        !placed[i - 1]
    });
    if applied {
        next.generation += 1;
    }
    next
}

/// Whether `placement` can be carried out on `state` for `req`: one worker per
/// rank, `gpus_per_worker` distinct free GPUs each, no GPU used twice.
fn fits(
    state: &Snapshot,
    node_at: &BTreeMap<&str, usize>,
    req: &Request,
    placement: &Placement,
) -> bool {
    let whole = placement.ranks == req.ranks;
    let prefix = req.is_elastic()
        && placement.ranks.len() >= req.min_workers as usize
        && req.ranks.starts_with(&placement.ranks);
    if !(whole || prefix) || placement.workers.len() != placement.ranks.len() {
        return false;
    }
    let mut used: Vec<(usize, u32)> = Vec::new();
    for w in &placement.workers {
        let Some(&n) = node_at.get(w.node.as_str()) else {
            return false;
        };
        if w.gpus.len() != req.gpus_per_worker as usize
            || !w.gpus.iter().all(|g| state.nodes[n].free.contains(g))
        {
            return false;
        }
        used.extend(w.gpus.iter().map(|&g| (n, g)));
    }
    used.sort_unstable();
    used.windows(2).all(|p| p[0] != p[1])
}
