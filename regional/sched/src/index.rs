//! Per-pass indexes: the topology tree of one GPU type with free counts that
//! placements update incrementally.
//!
//! Built once per pass, only for the GPU types the queue asks for. Nodes are
//! put in topology order (spine, leaf, NVLink domain, node id; sorted only
//! when they do not arrive so), so every domain's members are one contiguous
//! range and, inside a parent, children are in id order. A domain is known by
//! its whole path, so two spines may both name a leaf `rack-a`. Each domain
//! keeps:
//! - `free`: its free GPUs;
//! - `hist`: how many of its nodes have exactly `f` free GPUs, so its
//!   capacity for any worker size is `Σ hist[f] · ⌊f / gpus_per_worker⌋`
//!   without touching the nodes;
//! - an entry `(free, rank, dom)` in its level's `by_free` set, so the best
//!   fit (fewest free GPUs, then lowest id) that can hold `need` GPUs is the
//!   first entry of `by_free.range((need, 0, 0)..)` whose capacity suffices.
//!
//! Placements take the lowest free GPUs of a node ([`TypeIndex::take`]);
//! reservations and the timeline that computes them also hand arbitrary GPUs
//! back and forth ([`TypeIndex::give`], [`TypeIndex::remove`]), which keep
//! every count above the node exact, so one index serves the state now and
//! the hypothetical states of later times.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;

use crate::types::{Level, Node};

/// One schedulable node of the indexed type.
pub(crate) struct Slot<'a> {
    pub node: &'a Node,
    /// Where the node is in the snapshot's node list.
    pub pos: u32,
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

    /// The free GPU indices, ascending.
    pub fn free_now(&self) -> &[u32] {
        &self.free[self.taken as usize..]
    }

    /// The free list as an owned vector with nothing taken, for edits that
    /// are not "hand out the lowest".
    fn owned(&mut self) -> &mut Vec<u32> {
        let taken = self.taken as usize;
        self.taken = 0;
        let v = self.free.to_mut();
        v.drain(..taken);
        v
    }
}

/// The most GPUs a node may count as free in the histograms; indices at or
/// above it are never handed back (no real node has that many).
const MAX_NODE_GPUS: u32 = 1024;

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
    /// `(free, rank, dom)` of every domain; built on the first search of the
    /// level, since a pass may never search some levels.
    pub by_free: Option<BTreeSet<(u32, u32, u32)>>,
    /// Scratch for [`TypeIndex::take`]: the level's domains it touches.
    touched: Vec<u32>,
}

impl Domains<'_> {
    fn len(&self) -> usize {
        self.ids.len()
    }

    fn push(&mut self, parent: u32, first_child: u32) {
        self.parent.push(parent);
        self.children.push(first_child..first_child);
    }

    /// Fills `rank` once `ids` are complete. `ids_sorted`: the ids already
    /// increase with the index.
    fn rank_ids(&mut self, ids_sorted: bool) {
        let n = self.len() as u32;
        self.rank = (0..n).collect();
        if !ids_sorted {
            let mut order: Vec<u32> = (0..n).collect();
            order.sort_by(|&a, &b| {
                self.ids[a as usize]
                    .cmp(self.ids[b as usize])
                    .then(a.cmp(&b))
            });
            for (r, &dom) in order.iter().enumerate() {
                self.rank[dom as usize] = r as u32;
            }
        }
    }

    /// Builds `by_free` if no search has yet.
    fn ensure_by_free(&mut self) {
        if self.by_free.is_none() {
            self.by_free = Some(self.sorted_by_free());
        }
    }

    fn sorted_by_free(&self) -> BTreeSet<(u32, u32, u32)> {
        let n = self.len();
        let mut order = vec![0u32; n];
        for (dom, &r) in self.rank.iter().enumerate() {
            order[r as usize] = dom as u32;
        }
        // Counting sort by free GPUs (stable, so ranks stay in order); the
        // set then bulk-builds from sorted input in linear time.
        let max = self.free.iter().copied().max().unwrap_or(0) as usize;
        let mut entries: Vec<(u32, u32, u32)>;
        if max <= 4 * n + 1024 {
            let mut start = vec![0u32; max + 2];
            for &f in &self.free {
                start[f as usize + 1] += 1;
            }
            for i in 1..start.len() {
                start[i] += start[i - 1];
            }
            entries = vec![(0, 0, 0); n];
            for &dom in &order {
                let f = self.free[dom as usize];
                let at = &mut start[f as usize];
                entries[*at as usize] = (f, self.rank[dom as usize], dom);
                *at += 1;
            }
        } else {
            entries = order
                .iter()
                .map(|&d| (self.free[d as usize], self.rank[d as usize], d))
                .collect();
            entries.sort_unstable();
        }
        entries.into_iter().collect()
    }
}

/// The search sets of the four levels and the slots' [`ByEnd`], while
/// detached.
pub(crate) struct SearchSets {
    levels: [Option<BTreeSet<(u32, u32, u32)>>; 4],
    by_end: Option<ByEnd>,
}

/// What placing by end ([`crate::Policy::pack_by_end`]) searches: per slot,
/// when the last unit on it is expected to end (its horizon: running units
/// and this pass's placements at their expected ends, `NO_END` when one has
/// none, 0 when nothing is on it), and the busy slots (horizon > 0) by
/// their free GPUs.
pub(crate) struct ByEnd {
    horizon: Vec<u64>,
    /// `by_free[f]`: (horizon, slot) of the busy slots with `f` free GPUs.
    by_free: Vec<BTreeSet<(u64, u32)>>,
}

impl ByEnd {
    fn moved(&mut self, slot: u32, old: u32, new: u32) {
        let h = self.horizon[slot as usize];
        if h > 0 && old != new {
            self.by_free[old as usize].remove(&(h, slot));
            self.by_free[new as usize].insert((h, slot));
        }
    }

    /// Moves `slot` (with `free` free GPUs) to horizon `end` if that is later.
    fn extend(&mut self, slot: u32, free: u32, end: u64) {
        let h = &mut self.horizon[slot as usize];
        if end > *h {
            self.by_free[free as usize].remove(&(*h, slot));
            self.by_free[free as usize].insert((end, slot));
            *h = end;
        }
    }
}

/// The topology tree of one GPU type.
pub(crate) struct TypeIndex<'a> {
    /// Histogram width: the largest free list + 1.
    pub stride: usize,
    pub slots: Vec<Slot<'a>>,
    /// Indexed by [`Level::index`].
    pub levels: [Domains<'a>; 4],
    /// Built on first use by [`TypeIndex::track_ends`].
    by_end: Option<ByEnd>,
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

/// Which entries of `nodes` count: the first entry of each id. `None` when
/// all do (ids strictly increasing, the usual case).
pub(crate) fn first_of_each_id(nodes: &[Node]) -> Option<Vec<bool>> {
    if nodes.windows(2).all(|w| w[0].id < w[1].id) {
        return None;
    }
    let mut keep = vec![true; nodes.len()];
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| nodes[a].id.cmp(&nodes[b].id).then(a.cmp(&b)));
    for w in order.windows(2) {
        if nodes[w[0]].id == nodes[w[1]].id {
            keep[w[1]] = false;
        }
    }
    Some(keep)
}

/// Where `node` starts new domains after `prev`, in topology order: `None`
/// when it does not come strictly after `prev` (the input needs sorting);
/// else how many levels change, 3 = new spine, 2 = new leaf, 1 = new NVLink
/// domain, 0 = same NVLink domain.
fn boundary(prev: &Node, node: &Node) -> Option<u8> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let steps = [
        (&prev.spine, &node.spine),
        (&prev.leaf, &node.leaf),
        (&prev.nvlink_domain, &node.nvlink_domain),
        (&prev.id, &node.id),
    ];
    for (i, (a, b)) in steps.into_iter().enumerate() {
        match a.cmp(b) {
            Less => return Some(3u8.saturating_sub(i as u8)),
            Equal => {}
            Greater => return None,
        }
    }
    None
}

fn topology_order(a: &&Node, b: &&Node) -> std::cmp::Ordering {
    (&a.spine, &a.leaf, &a.nvlink_domain, &a.id).cmp(&(&b.spine, &b.leaf, &b.nvlink_domain, &b.id))
}

impl<'a> TypeIndex<'a> {
    /// Builds the tree from the schedulable nodes of one type (any order;
    /// ids unique). Nodes that already come in topology order, as fleet
    /// files and id-ordered queries give them, are not sorted.
    /// `nodes`: (position in the snapshot, node).
    pub fn build(mut nodes: Vec<(u32, &'a Node)>) -> TypeIndex<'a> {
        if let Some(index) = Self::build_sorted(&nodes) {
            return index;
        }
        nodes.sort_by(|a, b| topology_order(&a.1, &b.1));
        nodes.dedup_by(|a, b| a.1.id == b.1.id);
        Self::build_sorted(&nodes).unwrap_or_else(|| unreachable!("sorted nodes with unique ids"))
    }

    /// Builds the tree if `nodes` are strictly in topology order.
    fn build_sorted(nodes: &[(u32, &'a Node)]) -> Option<TypeIndex<'a>> {
        let mut levels: [Domains<'a>; 4] = Default::default();
        let mut slots: Vec<Slot<'a>> = Vec::with_capacity(nodes.len());
        let nv = &mut levels[Level::Nvlink.index()];
        nv.ids.reserve(nodes.len());
        nv.parent.reserve(nodes.len());
        nv.children.reserve(nodes.len());
        // Whether each level's ids increase with the domain index, so a
        // domain's rank is its index. Inside one parent they always do.
        let mut ids_sorted = [true; 4];
        levels[Level::Region.index()].ids.push("");
        levels[Level::Region.index()].push(0, 0);
        let mut prev: Option<&Node> = None;
        for &(pos, node) in nodes {
            let step = match prev {
                None => 3,
                Some(p) => boundary(p, node)?,
            };
            if step >= 3 {
                let n = levels[Level::Leaf.index()].len() as u32;
                let d = &mut levels[Level::Spine.index()];
                d.ids.push(&node.spine);
                d.push(0, n);
            }
            if step >= 2 {
                let parent = levels[Level::Spine.index()].len() as u32 - 1;
                let n = levels[Level::Nvlink.index()].len() as u32;
                let d = &mut levels[Level::Leaf.index()];
                if step >= 3 && d.ids.last().is_some_and(|&last| last >= node.leaf.as_str()) {
                    ids_sorted[Level::Leaf.index()] = false;
                }
                d.ids.push(&node.leaf);
                d.push(parent, n);
            }
            if step >= 1 {
                let parent = levels[Level::Leaf.index()].len() as u32 - 1;
                let d = &mut levels[Level::Nvlink.index()];
                if step >= 2
                    && d.ids
                        .last()
                        .is_some_and(|&last| last >= node.nvlink_domain.as_str())
                {
                    ids_sorted[Level::Nvlink.index()] = false;
                }
                d.ids.push(&node.nvlink_domain);
                d.push(parent, slots.len() as u32);
            }
            slots.push(Slot {
                node,
                pos,
                free: clean_free(node),
                taken: 0,
                parent: levels[Level::Nvlink.index()].len() as u32 - 1,
            });
            prev = Some(node);
        }
        // Close the child ranges: each domain's children end where the next begins.
        let ends = [
            slots.len(),
            levels[0].len(),
            levels[1].len(),
            levels[2].len(),
        ];
        for (d, &end) in levels.iter_mut().zip(&ends) {
            for i in 0..d.children.len() {
                d.children[i].end = d.children.get(i + 1).map_or(end as u32, |r| r.start);
            }
        }
        // Wide enough for every count a node can reach when GPUs are handed back.
        let stride = slots
            .iter()
            .map(|s| (s.free.len() as u32).max(s.node.gpus.min(MAX_NODE_GPUS)))
            .max()
            .unwrap_or(0) as usize
            + 1;
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
        for (d, sorted) in levels.iter_mut().zip(ids_sorted) {
            d.rank_ids(sorted);
        }
        Some(TypeIndex {
            stride,
            slots,
            levels,
            by_end: None,
        })
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
    pub fn best_fit(&mut self, level: Level, workers: u64, gpw: u32) -> Option<u32> {
        let need = u32::try_from(workers * u64::from(gpw)).ok()?;
        let d = &self.levels[level.index()];
        if d.by_free.is_none() && d.free.iter().all(|&f| f < need) {
            // No domain has the GPUs: no need for the search set (a
            // multi-node gang never builds the NVLink level's).
            return None;
        }
        self.levels[level.index()].ensure_by_free();
        let by_free = self.levels[level.index()].by_free.as_ref()?;
        by_free
            .range((need, 0, 0)..)
            .map(|&(_, _, dom)| dom)
            .find(|&dom| self.capacity(level, dom, gpw) >= workers)
    }

    /// Splits `workers` workers over the nodes of domain `dom` of `level`,
    /// appending `(slot, workers on it)` to `out`. Best fit at every level: a
    /// child that can take all that remains takes it (the smallest such);
    /// otherwise the largest child is filled and the rest goes on.
    pub fn distribute(
        &self,
        level: Level,
        dom: u32,
        workers: u64,
        gpw: u32,
        out: &mut Vec<(u32, u64)>,
    ) {
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
        let mut touched: [Vec<u32>; 4] = self.levels.each_mut().map(|d| {
            let mut t = std::mem::take(&mut d.touched);
            t.clear();
            t
        });
        for &(slot, _) in picks {
            let mut dom = self.slots[slot as usize].parent;
            for (l, t) in touched.iter_mut().enumerate() {
                if t.last() != Some(&dom) {
                    t.push(dom);
                }
                dom = if l < 2 {
                    self.levels[l].parent[dom as usize]
                } else {
                    0
                };
            }
        }
        for (l, t) in touched.iter().enumerate() {
            let d = &mut self.levels[l];
            if let Some(set) = &mut d.by_free {
                for &dom in t {
                    set.remove(&(d.free[dom as usize], d.rank[dom as usize], dom));
                }
            }
        }
        let stride = self.stride;
        for &(slot, workers) in picks {
            let s = &mut self.slots[slot as usize];
            let old = s.free_count();
            let gpus = (workers * u64::from(gpw)) as u32;
            s.taken += gpus;
            let new = old - gpus;
            if let Some(b) = &mut self.by_end {
                b.moved(slot, old, new);
            }
            let mut dom = s.parent;
            for (l, d) in self.levels.iter_mut().enumerate() {
                let base = dom as usize * stride;
                d.hist[base + old as usize] -= 1;
                d.hist[base + new as usize] += 1;
                d.free[dom as usize] -= gpus;
                dom = if l < 2 { d.parent[dom as usize] } else { 0 };
            }
        }
        for (d, t) in self.levels.iter_mut().zip(touched) {
            if let Some(set) = &mut d.by_free {
                for &dom in &t {
                    set.insert((d.free[dom as usize], d.rank[dom as usize], dom));
                }
            }
            d.touched = t;
        }
    }

    /// The most free GPUs slot `slot` may have (see [`MAX_NODE_GPUS`]).
    fn slot_limit(&self, slot: u32) -> u32 {
        self.slots[slot as usize]
            .node
            .gpus
            .min(self.stride as u32 - 1)
    }

    /// Hands `gpus` of slot `slot` back as free; returns the ones that were
    /// not free already (indices out of the node's range are ignored), so
    /// [`TypeIndex::remove`] can undo exactly this.
    pub fn give(&mut self, slot: u32, gpus: &[u32]) -> Vec<u32> {
        let limit = self.slot_limit(slot);
        let s = &mut self.slots[slot as usize];
        let old = s.free_count();
        let now = s.free_now();
        let mut added: Vec<u32> = gpus
            .iter()
            .copied()
            .filter(|&g| g < s.node.gpus && now.binary_search(&g).is_err())
            .collect();
        added.sort_unstable();
        added.dedup();
        added.truncate((limit.saturating_sub(old)) as usize);
        if added.is_empty() {
            return added;
        }
        let v = s.owned();
        let mut merged = Vec::with_capacity(v.len() + added.len());
        let (mut i, mut j) = (0, 0);
        while i < v.len() || j < added.len() {
            if j == added.len() || (i < v.len() && v[i] < added[j]) {
                merged.push(v[i]);
                i += 1;
            } else {
                merged.push(added[j]);
                j += 1;
            }
        }
        *v = merged;
        let new = v.len() as u32;
        self.recount(slot, old, new);
        added
    }

    /// Takes `gpus` of slot `slot` out of the free set (those not free are
    /// ignored).
    pub fn remove(&mut self, slot: u32, gpus: &[u32]) {
        let s = &mut self.slots[slot as usize];
        let old = s.free_count();
        if gpus.is_empty() || old == 0 {
            return;
        }
        let v = s.owned();
        v.retain(|g| !gpus.contains(g));
        let new = v.len() as u32;
        self.recount(slot, old, new);
    }

    /// Moves slot `slot` from `old` to `new` free GPUs in every domain above it.
    fn recount(&mut self, slot: u32, old: u32, new: u32) {
        if old == new {
            return;
        }
        if let Some(b) = &mut self.by_end {
            b.moved(slot, old, new);
        }
        let stride = self.stride;
        let mut dom = self.slots[slot as usize].parent;
        for (l, d) in self.levels.iter_mut().enumerate() {
            let i = dom as usize;
            if let Some(set) = &mut d.by_free {
                set.remove(&(d.free[i], d.rank[i], dom));
            }
            d.hist[i * stride + old as usize] -= 1;
            d.hist[i * stride + new as usize] += 1;
            d.free[i] = d.free[i] - old + new;
            if let Some(set) = &mut d.by_free {
                set.insert((d.free[i], d.rank[i], dom));
            }
            dom = if l < 2 { d.parent[i] } else { 0 };
        }
    }

    /// For each level, the most workers of `gpw` GPUs one domain could take
    /// if every GPU of its nodes were free: no domain of a level can ever
    /// hold more, whatever ends.
    pub fn static_capacity(&self, gpw: u32) -> [u64; 4] {
        let mut per: [Vec<u64>; 3] = [
            vec![0; self.levels[0].ids.len()],
            vec![0; self.levels[1].ids.len()],
            vec![0; self.levels[2].ids.len()],
        ];
        let mut best = [0u64; 4];
        for (i, s) in self.slots.iter().enumerate() {
            let cap = u64::from(self.slot_limit(i as u32) / gpw);
            let nv = s.parent as usize;
            let leaf = self.levels[0].parent[nv] as usize;
            let spine = self.levels[1].parent[leaf] as usize;
            per[0][nv] += cap;
            per[1][leaf] += cap;
            per[2][spine] += cap;
            best[3] += cap;
        }
        for (l, v) in per.iter().enumerate() {
            best[l] = v.iter().copied().max().unwrap_or(0);
        }
        best
    }

    /// The lowest level one domain of which contains every slot listed
    /// (`Nvlink` for none).
    pub fn spanned_level(&self, slots: impl IntoIterator<Item = u32>) -> Level {
        let mut first: Option<[u32; 3]> = None;
        let mut same = [true; 3];
        for slot in slots {
            let nv = self.slots[slot as usize].parent;
            let leaf = self.levels[0].parent[nv as usize];
            let spine = self.levels[1].parent[leaf as usize];
            let path = [nv, leaf, spine];
            match first {
                None => first = Some(path),
                Some(f) => {
                    for l in 0..3 {
                        same[l] &= f[l] == path[l];
                    }
                }
            }
        }
        match same {
            [true, ..] => Level::Nvlink,
            [_, true, _] => Level::Leaf,
            [_, _, true] => Level::Spine,
            _ => Level::Region,
        }
    }

    /// Takes the levels' search sets out, so a burst of [`TypeIndex::give`]
    /// and [`TypeIndex::remove`] that will be undone exactly does not
    /// maintain them; [`TypeIndex::attach_search`] puts them back. No
    /// [`TypeIndex::best_fit`] in between.
    pub fn detach_search(&mut self) -> SearchSets {
        SearchSets {
            levels: self.levels.each_mut().map(|d| d.by_free.take()),
            by_end: self.by_end.take(),
        }
    }

    /// Puts back what [`TypeIndex::detach_search`] took, once every count is
    /// as it was then.
    pub fn attach_search(&mut self, sets: SearchSets) {
        for (d, set) in self.levels.iter_mut().zip(sets.levels) {
            d.by_free = set;
        }
        self.by_end = sets.by_end;
    }

    /// Whether [`TypeIndex::track_ends`] has run.
    pub fn tracks_ends(&self) -> bool {
        self.by_end.is_some()
    }

    /// Starts keeping the slots' horizons (`horizon`, per slot) for
    /// [`TypeIndex::fit_by_end`].
    pub fn track_ends(&mut self, horizon: Vec<u64>) {
        debug_assert_eq!(horizon.len(), self.slots.len());
        let mut by_free = vec![BTreeSet::new(); self.stride];
        for (slot, (s, &h)) in self.slots.iter().zip(&horizon).enumerate() {
            if h > 0 {
                by_free[s.free_count() as usize].insert((h, slot as u32));
            }
        }
        self.by_end = Some(ByEnd { horizon, by_free });
    }

    /// Whether every busy slot sits in the set of its free count (and only
    /// busy slots do).
    fn by_end_agrees(&self, b: &ByEnd) -> bool {
        let listed: usize = b.by_free.iter().map(BTreeSet::len).sum();
        let busy = (self.slots.iter().zip(&b.horizon).enumerate())
            .filter(|(_, (_, &h))| h > 0)
            .map(|(slot, (s, &h))| b.by_free[s.free_count() as usize].contains(&(h, slot as u32)))
            .try_fold(0usize, |n, listed| listed.then_some(n + 1));
        busy == Some(listed)
    }

    /// Records that something on `slot` is expected to end at `end`, if the
    /// index keeps horizons.
    pub fn extend_end(&mut self, slot: u32, end: u64) {
        if let Some(b) = &mut self.by_end {
            b.extend(slot, self.slots[slot as usize].free_count(), end);
        }
    }

    /// The busy slot for one worker of `gpw` GPUs of a unit expected to end
    /// at `end` whose horizon it extends least (ends after `max(horizon,
    /// now)` by the least), then with the fewest free GPUs, then the
    /// earliest horizon, then the lowest slot; `None` when no busy slot has
    /// room (or horizons are not kept). `O(stride · log n)`.
    pub fn fit_by_end(&self, gpw: u32, now: u64, end: u64) -> Option<u32> {
        let b = self.by_end.as_ref()?;
        // (Checked where it is cheap: the core's tests' small fleets.)
        debug_assert!(
            self.slots.len() > 256 || self.by_end_agrees(b),
            "by_end's sets follow the free counts"
        );
        let sets = b.by_free.get(gpw as usize..)?;
        // Slots it does not extend at all: the fewest free GPUs first.
        if let Some(&(_, slot)) = sets.iter().find_map(|set| set.range((end, 0)..).next()) {
            return Some(slot);
        }
        // Else the latest horizon before its end (horizons before `now` all
        // count as `now`), then the fewest free GPUs.
        (sets.iter().enumerate())
            .filter_map(|(f, set)| {
                let &(h, slot) = set.range(..(end, 0)).next_back()?;
                Some((end.saturating_sub(h.max(now)), f, slot))
            })
            .min()
            .map(|(_, _, slot)| slot)
    }

    /// Domain `dom` of `level` above slot `slot`.
    pub fn ancestor(&self, slot: u32, level: Level) -> u32 {
        let nv = self.slots[slot as usize].parent;
        match level {
            Level::Nvlink => nv,
            Level::Leaf => self.levels[0].parent[nv as usize],
            Level::Spine => self.levels[1].parent[self.levels[0].parent[nv as usize] as usize],
            Level::Region => 0,
        }
    }

    /// The most GPUs slot `slot` may count as free.
    pub fn limit(&self, slot: u32) -> u32 {
        self.slot_limit(slot)
    }
}
