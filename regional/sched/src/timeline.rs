//! When could a unit that does not fit now start, and on which GPUs?
//! [`earliest_start`] answers from expected ends.
//!
//! It replays the future: GPUs are handed back in order of the time they are
//! expected to free (running units at their expected end, or now if that has
//! passed; this pass's placements at now + estimate; earlier reservations at
//! their start + estimate), and after each instant it asks whether the unit
//! fits. The replay ([`Replay`]) keeps only what that question needs for the
//! unit's shape: each touched node's free GPUs as a bitset, and each touched
//! domain's free GPUs and capacity in workers, with a count per level of the
//! domains that can hold the whole unit, so one release costs a few
//! additions and the question is a lookup. At the instant found, the chosen
//! domain's nodes are copied into the pass's [`TypeIndex`] so the placement
//! is the same best fit a start uses, and taken out again.
//!
//! A GPU promised to a reservation stays out of the replay until that
//! reservation is expected to end, whatever else frees it first.

use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::index::TypeIndex;
use crate::place;
use crate::types::{Level, Node, Request, Running};

/// What every type's timeline reads from the snapshot.
pub(crate) struct Known<'a> {
    pub now: u64,
    pub nodes: &'a [Node],
    pub running: &'a [Running],
    /// Node id → position, built on first use.
    ids: OnceCell<IdTable<'a>>,
}

impl<'a> Known<'a> {
    pub fn new(now: u64, nodes: &'a [Node], running: &'a [Running]) -> Known<'a> {
        Known {
            now,
            nodes,
            running,
            ids: OnceCell::new(),
        }
    }

    /// Position of the (first) schedulable node with this id.
    fn pos_of(&self, id: &str) -> Option<u32> {
        self.ids.get_or_init(|| IdTable::new(self.nodes)).get(id)
    }
}

/// Schedulable node id → position in the snapshot's node list: open
/// addressing on a fixed hash of the id (deterministic, and no sorted copy
/// of the ids needed). The first entry of a repeated id wins.
struct IdTable<'a> {
    nodes: &'a [Node],
    mask: usize,
    /// (high half of the hash, position + 1); position 0 = empty.
    entries: Vec<(u32, u32)>,
}

impl<'a> IdTable<'a> {
    fn hash(id: &str) -> u64 {
        let bytes = id.as_bytes();
        let mut h: u64 = bytes.len() as u64;
        let mut mix = |word: u64| h = (h.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            mix(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            mix(u64::from_le_bytes(word));
        }
        h ^ (h >> 29)
    }

    fn new(nodes: &'a [Node]) -> IdTable<'a> {
        let count = nodes.iter().filter(|n| n.schedulable).count();
        let size = (count + count / 2).next_power_of_two().max(16);
        let mut table = IdTable {
            nodes,
            mask: size - 1,
            entries: vec![(0, 0); size],
        };
        for (pos, node) in nodes.iter().enumerate().filter(|(_, n)| n.schedulable) {
            let h = Self::hash(&node.id);
            let tag = (h >> 32) as u32;
            let mut i = h as usize & table.mask;
            loop {
                let (etag, ep) = table.entries[i];
                if ep == 0 {
                    table.entries[i] = (tag, pos as u32 + 1);
                    break;
                }
                if etag == tag && nodes[ep as usize - 1].id == node.id {
                    break;
                }
                i = (i + 1) & table.mask;
            }
        }
        table
    }

    fn get(&self, id: &str) -> Option<u32> {
        let h = Self::hash(id);
        let tag = (h >> 32) as u32;
        let mut i = h as usize & self.mask;
        loop {
            let (etag, ep) = self.entries[i];
            if ep == 0 {
                return None;
            }
            if etag == tag && self.nodes[ep as usize - 1].id == id {
                return Some(ep - 1);
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// `u64::MAX` as an expected end: no known end.
pub(crate) const NO_END: u64 = u64::MAX;

/// When a unit that starts now with this estimate ends (`None`: unknown, never).
pub(crate) fn end_of(now: u64, estimated_duration_s: u64) -> Option<u64> {
    match estimated_duration_s {
        0 => None,
        d => now.checked_add(d).filter(|&e| e != NO_END),
    }
}

/// GPUs of one slot: (slot, indices).
pub(crate) type SlotGpus = (u32, Vec<u32>);

/// GPUs of one slot as the snapshot lists them.
type SlotRef<'a> = (u32, &'a [u32]);

/// The future of one GPU type as far as the snapshot and this pass know it.
pub(crate) struct Timeline<'a> {
    /// Running units of this type with a known end: (when they free their
    /// GPUs, index into `Known::running`).
    running: Vec<(u64, u32)>,
    /// Their GPUs, resolved to slots on first use (parallel to `running`).
    resolved: Vec<Option<Vec<SlotRef<'a>>>>,
    /// Snapshot position → slot of this type (`u32::MAX`: none).
    slot_at: Vec<u32>,
    /// This pass's placements with a known end: (end, range of `placed_slots`).
    placed: Vec<(u64, u32, u32)>,
    /// (slot, range of `placed_gpus`), so recording a placement allocates nothing.
    placed_slots: Vec<(u32, u32, u32)>,
    placed_gpus: Vec<u32>,
    /// GPUs promised to reservations of this round: (slot, GPU, when that
    /// reservation is expected to end (`NO_END`: unknown)). A GPU promised to
    /// several (one after the other) is listed once per reservation.
    pub reserved: Vec<(u32, u32, u64)>,
}

impl<'a> Timeline<'a> {
    pub fn new(ty: &str, known: &Known<'a>, index: &TypeIndex) -> Timeline<'a> {
        let running: Vec<(u64, u32)> = known
            .running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.gpu_type == ty && r.expected_end != NO_END)
            .map(|(i, r)| (r.expected_end.max(known.now), i as u32))
            .collect();
        let mut slot_at = vec![u32::MAX; known.nodes.len()];
        for (i, s) in index.slots.iter().enumerate() {
            slot_at[s.pos as usize] = i as u32;
        }
        Timeline {
            resolved: vec![None; running.len()],
            running,
            slot_at,
            placed: Vec::new(),
            placed_slots: Vec::new(),
            placed_gpus: Vec::new(),
            reserved: Vec::new(),
        }
    }

    /// Per slot of the type's `slots`, when the last running unit on it is
    /// expected to end (`NO_END` when one has no known end; 0 when nothing
    /// runs on it).
    pub fn horizons(&self, known: &Known<'a>, ty: &str, slots: usize) -> Vec<u64> {
        let mut at = vec![0; slots];
        for r in known.running.iter().filter(|r| r.gpu_type == ty) {
            for (node, _) in &r.gpus {
                let slot = known
                    .pos_of(node)
                    .map_or(u32::MAX, |p| self.slot_at[p as usize]);
                if let Some(h) = at.get_mut(slot as usize) {
                    *h = (*h).max(r.expected_end);
                }
            }
        }
        at
    }

    /// Records a placement about to be carried out (`picks` on `index`, each
    /// slot's lowest free GPUs) as freeing its GPUs at `end`.
    pub fn record_placed(&mut self, end: u64, index: &TypeIndex, picks: &[(u32, u64)], gpw: u32) {
        let first = self.placed_slots.len() as u32;
        for &(slot, n) in picks {
            let gpus = &index.slots[slot as usize].free_now()[..(n * u64::from(gpw)) as usize];
            let at = self.placed_gpus.len() as u32;
            self.placed_gpus.extend_from_slice(gpus);
            self.placed_slots.push((slot, at, gpus.len() as u32));
        }
        self.placed.push((end, first, picks.len() as u32));
    }

    fn resolve(&mut self, known: &Known<'a>, at: usize) -> &[SlotRef<'a>] {
        let (_, i) = self.running[at];
        let slot_at = &self.slot_at;
        self.resolved[at].get_or_insert_with(|| {
            known.running[i as usize]
                .gpus
                .iter()
                .filter_map(|(node, gpus)| {
                    let pos = known.pos_of(node)?;
                    let slot = slot_at[pos as usize];
                    (slot != u32::MAX).then_some((slot, gpus.as_slice()))
                })
                .collect()
        })
    }
}

/// Where and when a unit can start.
pub(crate) struct Found {
    pub start: u64,
    pub level: Level,
    pub gpus: Vec<SlotGpus>,
    /// The first instant the unit fit at any level up to `required`
    /// (at most `start`).
    pub first_any: u64,
}

/// What to look for.
pub(crate) struct Ask<'r> {
    pub req: &'r Request,
    /// Stop at the first instant the unit fits at this level or below;
    /// when no instant ever does, take the first instant at which it fits at
    /// the lowest level it ever reaches (up to `req.required`).
    pub stop: Level,
    /// Per level, the most workers one domain could ever take.
    pub ever: [u64; 4],
}

/// Per level, "not yet copied from the index".
const UNSET: u64 = u64::MAX;

/// The hypothetical state of one type at a later instant, as far as a unit
/// of `workers` workers of `gpw` GPUs cares. Starts equal to the index (the
/// state now) and only grows by releases (or shrinks back by rewinding).
struct Replay<'i, 'a> {
    index: &'i TypeIndex<'a>,
    workers: u64,
    gpw: u32,
    /// u64 words per slot in `bits`.
    words: usize,
    /// Free GPUs of each touched slot (`seen`), `words` words each.
    bits: Vec<u64>,
    seen: Vec<bool>,
    touched_slots: Vec<u32>,
    /// Per level and domain: free GPUs and capacity in workers (`UNSET`
    /// until the domain is touched; then the index's figure plus releases).
    free: [Vec<u64>; 4],
    cap: [Vec<u64>; 4],
    touched: [Vec<u32>; 4],
    /// Per level: domains whose capacity reaches `workers`.
    fits: [u32; 4],
    /// (time, slot, word, bits added), to rewind.
    journal: Vec<(u64, u32, u32, u64)>,
}

impl<'i, 'a> Replay<'i, 'a> {
    fn new(index: &'i TypeIndex<'a>, workers: u64, gpw: u32) -> Replay<'i, 'a> {
        let most = (0..index.slots.len() as u32)
            .map(|s| index.limit(s))
            .max()
            .unwrap_or(0);
        let words = (most as usize).div_ceil(64).max(1);
        let per_level = |l: usize| vec![UNSET; index.levels[l].ids.len()];
        Replay {
            index,
            workers,
            gpw,
            words,
            bits: vec![0; index.slots.len() * words],
            seen: vec![false; index.slots.len()],
            touched_slots: Vec::new(),
            free: [per_level(0), per_level(1), per_level(2), per_level(3)],
            cap: [per_level(0), per_level(1), per_level(2), per_level(3)],
            touched: Default::default(),
            fits: [0; 4],
            journal: Vec::new(),
        }
    }

    fn slot_bits(&mut self, slot: u32) -> &mut [u64] {
        let at = slot as usize * self.words;
        if !self.seen[slot as usize] {
            self.seen[slot as usize] = true;
            self.touched_slots.push(slot);
            for &g in self.index.slots[slot as usize].free_now() {
                if (g as usize) < self.words * 64 {
                    self.bits[at + g as usize / 64] |= 1 << (g % 64);
                }
            }
        }
        &mut self.bits[at..at + self.words]
    }

    /// Frees `gpus` of `slot` at time `t`, except those in `skip` (bits).
    fn release(&mut self, t: u64, slot: u32, gpus: &[u32], skip: Option<&[u64]>) -> bool {
        let limit = self.index.limit(slot).min((self.words * 64) as u32);
        if self.words == 1 {
            // Every node has at most 64 GPUs (the usual case): one word.
            let mut add = 0u64;
            for &g in gpus {
                if g < limit {
                    add |= 1 << g;
                }
            }
            if let Some(skip) = skip {
                add &= !skip[0];
            }
            let bits = self.slot_bits(slot)[0];
            let new = add & !bits;
            if new == 0 {
                return false;
            }
            self.bits[slot as usize] = bits | new;
            self.journal.push((t, slot, 0, new));
            self.recount(slot, bits.count_ones(), (bits | new).count_ones());
            return true;
        }
        let words = self.words;
        let mut add = [0u64; 16];
        let add = &mut add[..words.min(16)];
        for &g in gpus {
            if g < limit && (g as usize) < add.len() * 64 {
                add[g as usize / 64] |= 1 << (g % 64);
            }
        }
        if let Some(skip) = skip {
            for (a, s) in add.iter_mut().zip(skip) {
                *a &= !s;
            }
        }
        let old: u32 = self.slot_bits(slot).iter().map(|w| w.count_ones()).sum();
        let at = slot as usize * words;
        let mut changed = false;
        for (w, a) in add.iter().enumerate() {
            let b = &mut self.bits[at + w];
            let new = a & !*b;
            if new != 0 {
                *b |= new;
                changed = true;
                self.journal.push((t, slot, w as u32, new));
            }
        }
        if changed {
            let new: u32 = self.slot_bits(slot).iter().map(|w| w.count_ones()).sum();
            self.recount(slot, old, new);
        }
        changed
    }

    /// Undoes every release after time `t`.
    fn rewind_after(&mut self, t: u64) {
        while let Some(&(when, slot, w, added)) = self.journal.last() {
            if when <= t {
                break;
            }
            self.journal.pop();
            let bits = self.slot_bits(slot);
            let old: u32 = bits.iter().map(|w| w.count_ones()).sum();
            bits[w as usize] &= !added;
            self.recount(slot, old, old - added.count_ones());
        }
    }

    /// Moves slot `slot` from `old` to `new` free GPUs in every domain above it.
    fn recount(&mut self, slot: u32, old: u32, new: u32) {
        let gpw = self.gpw;
        let (dfree, dcap) = (
            i64::from(new) - i64::from(old),
            i64::from(new / gpw) - i64::from(old / gpw),
        );
        let nv = self.index.slots[slot as usize].parent;
        let leaf = self.index.levels[0].parent[nv as usize];
        let spine = self.index.levels[1].parent[leaf as usize];
        for (level, dom) in Level::ALL.into_iter().zip([nv, leaf, spine, 0]) {
            let l = level.index();
            let d = dom as usize;
            if self.free[l][d] == UNSET {
                self.free[l][d] = u64::from(self.index.levels[l].free[d]);
                self.cap[l][d] = self.index.capacity(level, dom, gpw);
                self.touched[l].push(dom);
            }
            self.free[l][d] = self.free[l][d].wrapping_add_signed(dfree);
            if dcap != 0 {
                let before = self.cap[l][d];
                let after = before.wrapping_add_signed(dcap);
                self.cap[l][d] = after;
                match (before >= self.workers, after >= self.workers) {
                    (false, true) => self.fits[l] += 1,
                    (true, false) => self.fits[l] -= 1,
                    _ => {}
                }
            }
        }
    }

    /// The best-fit domain of `level` in the replayed state: the fewest free
    /// GPUs, then the lowest id, among those that hold the unit (as
    /// [`TypeIndex::best_fit`] orders them). Only touched domains can.
    fn best_fit(&self, level: Level) -> Option<u32> {
        let l = level.index();
        let d = &self.index.levels[l];
        self.touched[l]
            .iter()
            .copied()
            .filter(|&dom| self.cap[l][dom as usize] >= self.workers)
            .min_by_key(|&dom| (self.free[l][dom as usize], d.rank[dom as usize], dom))
    }

    /// The free GPUs of touched slot `slot` that the index does not have free.
    fn extra(&self, slot: u32) -> Vec<u32> {
        let at = slot as usize * self.words;
        let now = self.index.slots[slot as usize].free_now();
        (0..self.words * 64)
            .filter(|&g| self.bits[at + g / 64] & (1 << (g % 64)) != 0)
            .map(|g| g as u32)
            .filter(|g| now.binary_search(g).is_err())
            .collect()
    }
}

/// The first instant the unit fits as `ask` says, and the best-fit placement
/// at that instant on the GPUs free then; `None` if it never fits given the
/// known ends. The unit must not fit now. Leaves `index` as it found it.
pub(crate) fn earliest_start<'a>(
    index: &mut TypeIndex<'a>,
    tl: &mut Timeline<'a>,
    known: &Known<'a>,
    ask: &Ask,
) -> Option<Found> {
    let req = ask.req;
    let workers = req.ranks.len() as u64;
    let gpw = req.gpus_per_worker;

    // A reserved GPU frees when the last reservation holding it ends;
    // reservations end in groups: (until, GPUs).
    let mut last: Vec<(u32, u32, u64)> = tl.reserved.clone();
    last.sort_unstable();
    last.dedup_by(|later, earlier| {
        (later.0, later.1) == (earlier.0, earlier.1) && {
            earlier.2 = earlier.2.max(later.2);
            true
        }
    });
    let mut groups: BTreeMap<u64, Vec<(u32, u32)>> = BTreeMap::new();
    for &(slot, gpu, until) in &last {
        if until != NO_END {
            groups.entry(until).or_default().push((slot, gpu));
        }
    }
    let groups: Vec<(u64, Vec<(u32, u32)>)> = groups.into_iter().collect();
    // Reserved GPUs per slot, as bits, which other releases skip.
    let mut skip: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut events: Vec<Reverse<(u64, u8, u32)>> =
        Vec::with_capacity(tl.running.len() + tl.placed.len() + groups.len());
    events.extend(
        tl.running
            .iter()
            .enumerate()
            .map(|(i, &(t, _))| Reverse((t, 0, i as u32))),
    );
    events.extend(
        tl.placed
            .iter()
            .enumerate()
            .map(|(i, &(t, _, _))| Reverse((t, 1, i as u32))),
    );
    events.extend(
        groups
            .iter()
            .enumerate()
            .map(|(i, (t, _))| Reverse((*t, 2, i as u32))),
    );
    let mut heap = BinaryHeap::from(events);

    let mut replay = Replay::new(index, workers, gpw);
    for &(slot, gpu, _) in &last {
        let words = skip.entry(slot).or_insert_with(|| vec![0; replay.words]);
        if (gpu as usize) < words.len() * 64 {
            words[gpu as usize / 64] |= 1 << (gpu % 64);
        }
    }
    let mut lowest: Option<Level> = None;
    let mut first_at = [u64::MAX; 4];
    let mut gpus: Vec<u32> = Vec::new();
    while let Some(&Reverse((t, _, _))) = heap.peek() {
        let mut changed = false;
        while let Some(&Reverse((when, kind, i))) = heap.peek() {
            if when != t {
                break;
            }
            heap.pop();
            match kind {
                0 => {
                    for &(slot, list) in tl.resolve(known, i as usize) {
                        let sk = skip.get(&slot).map(Vec::as_slice);
                        changed |= replay.release(t, slot, list, sk);
                    }
                }
                1 => {
                    let (_, first, n) = tl.placed[i as usize];
                    for &(slot, at, len) in &tl.placed_slots[first as usize..(first + n) as usize] {
                        let list = &tl.placed_gpus[at as usize..(at + len) as usize];
                        let sk = skip.get(&slot).map(Vec::as_slice);
                        changed |= replay.release(t, slot, list, sk);
                    }
                }
                _ => {
                    for chunk in groups[i as usize].1.chunk_by(|a, b| a.0 == b.0) {
                        gpus.clear();
                        gpus.extend(chunk.iter().map(|&(_, g)| g));
                        changed |= replay.release(t, chunk[0].0, &gpus, None);
                    }
                }
            }
        }
        if !changed {
            continue;
        }
        // Only a lower level than the one already reached can be news.
        let top = match lowest {
            None => Some(req.required),
            Some(Level::Nvlink) => None,
            Some(l) => Some(Level::ALL[l.index() - 1]),
        };
        if let Some(top) = top {
            let now_fits = Level::ALL
                .into_iter()
                .filter(|&l| l <= top)
                .find(|&l| ask.ever[l.index()] >= workers && replay.fits[l.index()] > 0);
            if let Some(level) = now_fits {
                lowest = Some(level);
                for l in Level::ALL.into_iter().filter(|&l| l >= level) {
                    first_at[l.index()] = first_at[l.index()].min(t);
                }
            }
        }
        if lowest.is_some_and(|l| l <= ask.stop) {
            break;
        }
    }

    let level = lowest?;
    let start = first_at[level.index()];
    let first_any = first_at[req.required.index()].min(start);
    replay.rewind_after(start);
    let dom = replay.best_fit(level)?;
    // Copy the domain's replayed nodes into the index, place, and undo.
    let mut copied: Vec<(u32, Vec<u32>)> = replay
        .touched_slots
        .iter()
        .copied()
        .filter(|&s| index.ancestor(s, level) == dom)
        .map(|s| (s, replay.extra(s)))
        .filter(|(_, g)| !g.is_empty())
        .collect();
    let sets = index.detach_search();
    for (slot, gpus) in &mut copied {
        *gpus = index.give(*slot, gpus);
    }
    let found = place::picks(index, level, dom, workers, gpw).map(|picks| Found {
        start,
        level,
        gpus: place::gpus_of(index, &picks, gpw),
        first_any,
    });
    for (slot, gpus) in &copied {
        index.remove(*slot, gpus);
    }
    index.attach_search(sets);
    found
}
