//! Where one unit goes on one [`TypeIndex`]: topology-aware best fit (the
//! Gangway and Slurm-like disciplines) and topology-blind first fit (FIFO).
//!
//! Finding a placement and carrying it out are separate steps, so the
//! reservation timeline can ask "where would it go at time t" without taking
//! anything.

use crate::index::TypeIndex;
use crate::types::{Level, Placement, Request, WorkerPlacement};

/// `(slot, workers on it)`.
pub(crate) type Picks = Vec<(u32, u64)>;

/// Within one view of the free GPUs capacity only shrinks during a pass, so
/// once `W` workers of a shape found no domain at a level, `W` or more never
/// will: the smallest failed `W` per level.
pub(crate) type Failed = [u64; 4];

pub(crate) const NEVER_FAILED: Failed = [u64::MAX; 4];

/// Whether `failed` already rules out `workers` at every level up to `cap`.
pub(crate) fn known_to_fail(failed: &Failed, workers: u64, cap: Level) -> bool {
    Level::ALL
        .into_iter()
        .filter(|&l| l <= cap)
        .all(|l| workers >= failed[l.index()])
}

/// The lowest level up to `cap` with a domain that holds `workers` workers
/// of `gpw` GPUs, and its best-fit domain. `failed` (when given) is read and
/// updated.
pub(crate) fn best_fit(
    index: &mut TypeIndex,
    workers: u64,
    gpw: u32,
    cap: Level,
    mut failed: Option<&mut Failed>,
) -> Option<(Level, u32)> {
    // The whole region is the widest domain: if it cannot, nothing can.
    if index.capacity(Level::Region, 0, gpw) < workers {
        if let Some(f) = failed {
            for x in f.iter_mut() {
                *x = (*x).min(workers);
            }
        }
        return None;
    }
    for level in Level::ALL.into_iter().filter(|&l| l <= cap) {
        if failed.as_ref().is_some_and(|f| workers >= f[level.index()]) {
            continue;
        }
        match index.best_fit(level, workers, gpw) {
            Some(dom) => return Some((level, dom)),
            None => {
                if let Some(f) = failed.as_deref_mut() {
                    f[level.index()] = workers;
                }
            }
        }
    }
    None
}

/// The workers per node for `workers` workers in domain `dom` of `level`,
/// sorted by slot (topology order).
pub(crate) fn picks(
    index: &TypeIndex,
    level: Level,
    dom: u32,
    workers: u64,
    gpw: u32,
) -> Option<Picks> {
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
    picks.sort_unstable();
    Some(picks)
}

/// The GPUs `picks` would take: the lowest free ones of each slot.
pub(crate) fn gpus_of(index: &TypeIndex, picks: &[(u32, u64)], gpw: u32) -> Vec<(u32, Vec<u32>)> {
    picks
        .iter()
        .map(|&(slot, n)| {
            let free = index.slots[slot as usize].free_now();
            (slot, free[..(n * u64::from(gpw)) as usize].to_vec())
        })
        .collect()
}

/// Carries out `picks` (in rank order: each slot once) for `req` and
/// describes it.
pub(crate) fn commit(
    index: &mut TypeIndex,
    req: &Request,
    level: Level,
    picks: &[(u32, u64)],
) -> Placement {
    let gpw = req.gpus_per_worker;
    let slots = picks.iter().flat_map(|&(slot, n)| {
        let s = &index.slots[slot as usize];
        let gpus = &s.free_now()[..(n * u64::from(gpw)) as usize];
        gpus.chunks(gpw as usize).map(move |chunk| (s, chunk))
    });
    let workers: Vec<WorkerPlacement> = req
        .ranks
        .iter()
        .zip(slots)
        .map(|(&rank, (s, chunk))| WorkerPlacement {
            rank,
            node: s.node.id.clone(),
            gpus: chunk.to_vec(),
        })
        .collect();
    if picks.is_sorted() {
        index.take(picks, gpw);
    } else {
        let mut sorted = picks.to_vec();
        sorted.sort_unstable();
        index.take(&sorted, gpw);
    }
    Placement {
        job: req.job.clone(),
        ranks: req.ranks.clone(),
        level,
        workers,
    }
}

/// First fit in node-id order, as a plain Kubernetes setup does it: a
/// max-segment tree over the nodes' free counts (in id order) finds the next
/// node with room for a worker in `O(log n)`.
pub(crate) struct FirstFit {
    /// Slots in node-id order.
    order: Vec<u32>,
    /// Position of each slot in `order`.
    at: Vec<u32>,
    /// Leaves from `size`: the free count of `order[i]`; inner nodes: max of children.
    tree: Vec<u32>,
    size: usize,
}

impl FirstFit {
    /// `id_sorted`: the index's slot positions already follow node ids.
    pub fn new(index: &TypeIndex, id_sorted: bool) -> FirstFit {
        let mut order: Vec<u32> = (0..index.slots.len() as u32).collect();
        if id_sorted {
            order.sort_by_key(|&s| index.slots[s as usize].pos);
        } else {
            order.sort_by(|&a, &b| {
                index.slots[a as usize]
                    .node
                    .id
                    .cmp(&index.slots[b as usize].node.id)
            });
        }
        let mut at = vec![0; order.len()];
        for (i, &s) in order.iter().enumerate() {
            at[s as usize] = i as u32;
        }
        let size = order.len().next_power_of_two().max(1);
        let mut tree = vec![0; 2 * size];
        for (i, &s) in order.iter().enumerate() {
            tree[size + i] = index.slots[s as usize].free_count();
        }
        for i in (1..size).rev() {
            tree[i] = tree[2 * i].max(tree[2 * i + 1]);
        }
        FirstFit {
            order,
            at,
            tree,
            size,
        }
    }

    /// The first position at or after `from` whose free count is at least `want`.
    fn next(&self, from: usize, want: u32) -> Option<usize> {
        self.descend(1, 0, self.size, from, want)
    }

    fn descend(&self, node: usize, lo: usize, hi: usize, from: usize, want: u32) -> Option<usize> {
        if hi <= from || self.tree[node] < want {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * node, lo, mid, from, want)
            .or_else(|| self.descend(2 * node + 1, mid, hi, from, want))
    }

    /// Walks the nodes in id order taking as many workers from each as fit,
    /// until `workers` are placed. `None` when the type has too few.
    pub fn find(&self, index: &TypeIndex, workers: u64, gpw: u32) -> Option<Picks> {
        if index.capacity(Level::Region, 0, gpw) < workers {
            return None;
        }
        let mut picks = Vec::new();
        let mut left = workers;
        let mut from = 0;
        while left > 0 {
            let i = self.next(from, gpw)?;
            let slot = self.order[i];
            let take = u64::from(index.slots[slot as usize].free_count() / gpw).min(left);
            picks.push((slot, take));
            left -= take;
            from = i + 1;
        }
        Some(picks)
    }

    /// Refreshes the free counts of `slots` after they changed.
    pub fn update(&mut self, index: &TypeIndex, slots: impl IntoIterator<Item = u32>) {
        for slot in slots {
            let mut i = self.size + self.at[slot as usize] as usize;
            self.tree[i] = index.slots[slot as usize].free_count();
            while i > 1 {
                i /= 2;
                self.tree[i] = self.tree[2 * i].max(self.tree[2 * i + 1]);
            }
        }
    }
}
