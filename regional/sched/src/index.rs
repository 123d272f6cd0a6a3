//! Per-pass indexes: the topology tree of one GPU type with free counts that
//! placements update incrementally.
//!
//! Built once per pass, only for the GPU types the queue asks for. Nodes are
//! sorted into topology order (spine, leaf, NVLink domain, node id), so every
//! domain's members are one contiguous range and, inside a parent, children
//! are in id order. Each domain keeps:
//! - `free`: its free GPUs;
//! - `hist`: how many of its nodes have exactly `f` free GPUs, so its
//!   capacity for any worker size is `Σ hist[f] · ⌊f / gpus_per_worker⌋`
//!   without touching the nodes;
//! - an entry `(free, rank, dom)` in its level's `by_free` set, so the best
//!   fit (fewest free GPUs, then lowest id) that can hold `need` GPUs is the
//!   first entry of `by_free.range((need, 0, 0)..)` whose capacity suffices.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;

use crate::types::{Level, Node};

/// One schedulable node of the indexed type.
pub(crate) struct Slot<'a> {
    pub node: &'a Node,
    /// Usable free GPU indices: sorted, unique, below `node.gpus`.
    pub free: Cow<'a, [u32]>,
    /// How many of `free` (from the front) this pass has handed out.
    pub taken: u32,
    /// Its NVLink domain (index into the Nvlink level).
    pub parent: u32,
}

impl Slot<'_> {
    pub fn free_count(&self) -> u32 {
        self.free.len() as u32 - self.taken
    }
}

/// All domains of one level.
#[derive(Default)]
pub(crate) struct Domains<'a> {
    pub ids: Vec<&'a str>,
    /// Index of the parent domain one level up (unused for Region).
    pub parent: Vec<u32>,
    /// Children one level down (for Nvlink: node slots), a contiguous range.
    pub children: Vec<Range<u32>>,
    pub free: Vec<u32>,
    /// Position of the domain in (id, index) order across the level.
    pub rank: Vec<u32>,
    /// `hist[d * stride + f]` = nodes of domain `d` with `f` free GPUs.
    pub hist: Vec<u32>,
    pub by_free: BTreeSet<(u32, u32, u32)>,
}

impl Domains<'_> {
    fn len(&self) -> usize {
        self.ids.len()
    }

    fn push(&mut self, parent: u32, first_child: u32) {
        self.parent.push(parent);
        self.children.push(first_child..first_child);
    }
}

/// The topology tree of one GPU type.
pub(crate) struct TypeIndex<'a> {
    /// Histogram width: the largest free list + 1.
    pub stride: usize,
    pub slots: Vec<Slot<'a>>,
    /// Indexed by [`Level::index`].
    pub levels: [Domains<'a>; 4],
}

/// Removes repeats and out-of-range indices from a free list, borrowing it
/// when it is already clean (the usual case).
fn clean_free(node: &Node) -> Cow<'_, [u32]> {
    let free = &node.free;
    let clean = free.windows(2).all(|w| w[0] < w[1]) && free.last().is_none_or(|&g| g < node.gpus);
    if clean {
        Cow::Borrowed(free.as_slice())
    } else {
        let mut v: Vec<u32> = free.iter().copied().filter(|&g| g < node.gpus).collect();
        v.sort_unstable();
        v.dedup();
        Cow::Owned(v)
    }
}

/// Which entries of `nodes` count: the first entry of each id.
pub(crate) fn first_of_each_id(nodes: &[Node]) -> Vec<bool> {
    let mut keep = vec![true; nodes.len()];
    if nodes.windows(2).all(|w| w[0].id < w[1].id) {
        return keep;
    }
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[a].id.cmp(&nodes[b].id).then(a.cmp(&b)));
    for w in order.windows(2) {
        if nodes[w[0]].id == nodes[w[1]].id {
            keep[w[1]] = false;
        }
    }
    keep
}

impl<'a> TypeIndex<'a> {
    /// Builds the tree from the schedulable nodes of one type (any order).
    pub fn build(mut nodes: Vec<&'a Node>) -> TypeIndex<'a> {
        // Adaptive sort: near-linear when the nodes arrive in id order.
        nodes.sort_by(|a, b| {
            (&a.spine, &a.leaf, &a.nvlink_domain, &a.id).cmp(&(
                &b.spine,
                &b.leaf,
                &b.nvlink_domain,
                &b.id,
            ))
        });
        let mut levels: [Domains<'a>; 4] = Default::default();
        let mut slots: Vec<Slot<'a>> = Vec::with_capacity(nodes.len());
        let mut prev: Option<&Node> = None;
        levels[Level::Region.index()].ids.push("");
        levels[Level::Region.index()].push(0, 0);
        for node in nodes {
            let new_spine = prev.is_none_or(|p| p.spine != node.spine);
            let new_leaf = new_spine || prev.is_some_and(|p| p.leaf != node.leaf);
            let new_nvlink = new_leaf || prev.is_some_and(|p| p.nvlink_domain != node.nvlink_domain);
            if new_spine {
                let n = levels[Level::Leaf.index()].len() as u32;
                let d = &mut levels[Level::Spine.index()];
                d.ids.push(&node.spine);
                d.push(0, n);
            }
            if new_leaf {
                let parent = levels[Level::Spine.index()].len() as u32 - 1;
                let n = levels[Level::Nvlink.index()].len() as u32;
                let d = &mut levels[Level::Leaf.index()];
                d.ids.push(&node.leaf);
                d.push(parent, n);
            }
            if new_nvlink {
                let parent = levels[Level::Leaf.index()].len() as u32 - 1;
                let d = &mut levels[Level::Nvlink.index()];
                d.ids.push(&node.nvlink_domain);
                d.push(parent, slots.len() as u32);
            }
            slots.push(Slot {
                node,
                free: clean_free(node),
                taken: 0,
                parent: levels[Level::Nvlink.index()].len() as u32 - 1,
            });
            prev = Some(node);
        }
        // Close the child ranges: each domain's children end where the next begins.
        let counts = [
            slots.len(),
            levels[0].len(),
            levels[1].len(),
            levels[2].len(),
        ];
        for (l, &end) in counts.iter().enumerate() {
            let d = &mut levels[l];
            for i in 0..d.children.len() {
                let next = d.children.get(i + 1).map_or(end as u32, |r| r.start);
                d.children[i].end = next;
            }
        }
        let stride = slots.iter().map(|s| s.free.len()).max().unwrap_or(0) + 1;
        for d in &mut levels {
            d.hist = vec![0; d.len() * stride];
            d.free = vec![0; d.len()];
        }
        for slot in &slots {
            let f = slot.free.len() as u32;
            let mut dom = slot.parent;
            for (l, d) in levels.iter_mut().enumerate() {
                d.hist[dom as usize * stride + f as usize] += 1;
                d.free[dom as usize] += f;
                dom = if l < 2 { d.parent[dom as usize] } else { 0 };
            }
        }
        for d in &mut levels {
            let mut order: Vec<u32> = (0..d.len() as u32).collect();
            if !d.ids.windows(2).all(|w| w[0] < w[1]) {
                order.sort_by(|&a, &b| d.ids[a as usize].cmp(d.ids[b as usize]).then(a.cmp(&b)));
            }
            d.rank = vec![0; d.len()];
            for (r, &dom) in order.iter().enumerate() {
                d.rank[dom as usize] = r as u32;
            }
            d.by_free = (0..d.len() as u32).map(|i| (d.free[i as usize], d.rank[i as usize], i)).collect();
        }
        TypeIndex {
            stride,
            slots,
            levels,
        }
    }

    /// Free GPUs of this type in the region.
    pub fn region_free(&self) -> u32 {
        self.levels[Level::Region.index()].free[0]
    }

    /// Workers of `gpw` GPUs each that domain `dom` of `level` can take.
    pub fn capacity(&self, level: Level, dom: u32, gpw: u32) -> u64 {
        let d = &self.levels[level.index()];
        let base = dom as usize * self.stride;
        let hist = &d.hist[base..base + self.stride];
        let gpw = gpw as usize;
        (gpw..self.stride)
            .map(|f| u64::from(hist[f]) * (f / gpw) as u64)
            .sum()
    }

    /// The best-fit domain of `level` that can take `workers` workers of `gpw`
    /// GPUs: the fewest free GPUs, then the lowest id.
    pub fn best_fit(&self, level: Level, workers: u64, gpw: u32) -> Option<u32> {
        let need = u32::try_from(workers * u64::from(gpw)).ok()?;
        let d = &self.levels[level.index()];
        d.by_free
            .range((need, 0, 0)..)
            .map(|&(_, _, dom)| dom)
            .find(|&dom| self.capacity(level, dom, gpw) >= workers)
    }

    /// Splits `workers` workers over the nodes of domain `dom` of `level`,
    /// appending `(slot, workers on it)` to `out`. Best fit at every level: a
    /// child that can take all that remains takes it (the smallest such);
    /// otherwise the largest child is filled and the rest goes on.
    pub fn distribute(&self, level: Level, dom: u32, workers: u64, gpw: u32, out: &mut Vec<(u32, u64)>) {
        let range = self.levels[level.index()].children[dom as usize].clone();
        let child_level = match level {
            Level::Nvlink => None,
            Level::Leaf => Some(Level::Nvlink),
            Level::Spine => Some(Level::Leaf),
            Level::Region => Some(Level::Spine),
        };
        // (capacity, child) ascending; child index order is id order here.
        let mut caps: Vec<(u64, u32)> = range
            .map(|c| {
                let cap = match child_level {
                    None => u64::from(self.slots[c as usize].free_count() / gpw),
                    Some(l) => self.capacity(l, c, gpw),
                };
                (cap, c)
            })
            .filter(|&(cap, _)| cap > 0)
            .collect();
        caps.sort_unstable();
        let mut left = workers;
        while left > 0 && !caps.is_empty() {
            let fits = caps.partition_point(|&(cap, _)| cap < left);
            let (take, child) = if fits < caps.len() {
                (left, caps[fits].1)
            } else {
                let largest = caps[caps.len() - 1].0;
                let first = caps.partition_point(|&(cap, _)| cap < largest);
                let (cap, child) = caps.remove(first);
                (cap, child)
            };
            match child_level {
                None => out.push((child, take)),
                Some(l) => self.distribute(l, child, take, gpw, out),
            }
            left -= take;
        }
    }

    /// Hands out `workers · gpw` GPUs on each listed slot (sorted by slot) and
    /// updates every domain above them.
    pub fn take(&mut self, picks: &[(u32, u64)], gpw: u32) {
        // Domains touched at each level; picks are in slot order, so each
        // level's touched domains are non-decreasing and dedupe by neighbour.
        let mut touched: [Vec<u32>; 4] = Default::default();
        for &(slot, _) in picks {
            let mut dom = self.slots[slot as usize].parent;
            for (l, t) in touched.iter_mut().enumerate() {
                if t.last() != Some(&dom) {
                    t.push(dom);
                }
                dom = if l < 2 { self.levels[l].parent[dom as usize] } else { 0 };
            }
        }
        for (l, t) in touched.iter().enumerate() {
            let d = &mut self.levels[l];
            for &dom in t {
                d.by_free.remove(&(d.free[dom as usize], d.rank[dom as usize], dom));
            }
        }
        let stride = self.stride;
        for &(slot, workers) in picks {
            let s = &mut self.slots[slot as usize];
            let old = s.free_count();
            let gpus = (workers * u64::from(gpw)) as u32;
            s.taken += gpus;
            let new = old - gpus;
            let mut dom = s.parent;
            for (l, d) in self.levels.iter_mut().enumerate() {
                let base = dom as usize * stride;
                d.hist[base + old as usize] -= 1;
                d.hist[base + new as usize] += 1;
                d.free[dom as usize] -= gpus;
                dom = if l < 2 { d.parent[dom as usize] } else { 0 };
            }
        }
        for (l, t) in touched.iter().enumerate() {
            let d = &mut self.levels[l];
            for &dom in t {
                d.by_free.insert((d.free[dom as usize], d.rank[dom as usize], dom));
            }
        }
    }
}
