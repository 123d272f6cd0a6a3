//! Reservations with backfill: how the Slurm-like and Gangway disciplines
//! decide one unit, on the state of its GPU type ([`TypeState`]).
//!
//! A reservation promises GPUs to a waiting unit from its expected start on.
//! Those of its GPUs that are free now are *held*: taken out of the index,
//! so placements do not see them. A later unit that is expected to end by a
//! reservation's start may use that reservation's held GPUs (it is given
//! them back for its search, and what it does not take is held again); one
//! that is not may not. Reserved GPUs that are busy now stay out of the
//! timeline of later reservations until the reservation is expected to end.

use std::collections::BTreeMap;

use crate::index::TypeIndex;
use crate::place::{self, Failed, FirstFit, NEVER_FAILED};
use crate::timeline::{self, earliest_start, Ask, Found, Known, SlotGpus, Timeline, NO_END};
use crate::types::{
    Level, Placement, PolicyKind, Request, ReservedCapacity, WaitReason, PREEMPTIBLE_PRIORITY,
};

/// How many waiting units per GPU type Gangway's discipline reserves for.
pub(crate) const GANGWAY_RESERVATIONS: usize = 4;

/// The most reservations of one type in a round (views are bit masks).
const MAX_HOLDS: usize = 24;

/// The most capacity reservations of one type a round holds GPUs for (the
/// earliest-starting first; views are 64-bit masks).
pub(crate) const MAX_CAPACITY_HOLDS: usize = 32;

/// The most reservations a discipline holds per GPU type.
pub(crate) fn max_reservations(kind: PolicyKind) -> usize {
    match kind {
        PolicyKind::Gangway => GANGWAY_RESERVATIONS,
        PolicyKind::SlurmBackfill => 1,
        PolicyKind::FifoFirstFit => 0,
    }
}

/// A reservation of this round, as the type's state keeps it.
struct Hold {
    job: String,
    start: u64,
    /// `Some(id)`: capacity reservation `id`'s GPUs (`reserved.rs`);
    /// `None`: a waiting unit's.
    capacity: Option<String>,
    /// Whether preemptible units may borrow them whenever they end: a
    /// capacity reservation's, when the policy lends them.
    lends: bool,
    /// Its GPUs that are free now, out of the index.
    held: Vec<SlotGpus>,
    count: u64,
}

/// What one pass knows and has decided about one GPU type.
pub(crate) struct TypeState<'a> {
    pub ty: &'a str,
    pub index: TypeIndex<'a>,
    /// FIFO's node-id order, built on first use.
    pub first_fit: Option<FirstFit>,
    /// Failed shapes per (GPUs per worker, view), a view being the set of
    /// holds (bit i = `holds[i]`) whose GPUs a unit may use.
    memo: BTreeMap<(u32, u64), Failed>,
    /// This round's reservations, in the order they were made.
    holds: Vec<Hold>,
    /// Built on the first placement or reservation that needs it.
    timeline: Option<Timeline<'a>>,
    /// Per GPUs per worker, [`TypeIndex::static_capacity`].
    ever: BTreeMap<u32, [u64; 4]>,
    /// Whether a unit started after a reservation of this round.
    pub backfilled: bool,
    /// [`crate::Policy::locality_patience_pct`].
    patience_pct: u32,
    /// Jobs with running units being preempted for them.
    pub victims_in_flight: std::collections::BTreeSet<&'a str>,
    /// GPUs that go back to capacity reservations when what holds them now
    /// ends: the timeline never frees them for waiting units' reservations.
    fenced: Vec<(u32, u32)>,
    /// Gangway's discipline: place one-worker units by when they end
    /// ([`TypeIndex::fit_by_end`]).
    pack_by_end: bool,
}

/// How [`TypeState::in_view`] carries a placement out.
#[derive(Clone, Copy)]
struct Start {
    /// The unit's expected end, recorded in the timeline (which must exist
    /// when it is known) and in the index's horizons; `None`: none known.
    end: Option<u64>,
    /// `Some(now)`: its node is chosen by [`TypeIndex::fit_by_end`]
    /// (horizons tracked).
    pack_at: Option<u64>,
}

/// How one unit's decision came out.
pub(crate) enum Outcome {
    Start(Placement),
    Reserve(Found),
    Wait(WaitReason),
}

/// A fit found in one view: where, and the GPUs it takes.
struct ViewFit {
    gpus: Vec<SlotGpus>,
    placement: Option<Placement>,
}

impl<'a> TypeState<'a> {
    pub fn new(
        ty: &'a str,
        index: TypeIndex<'a>,
        patience_pct: u32,
        pack_by_end: bool,
    ) -> TypeState<'a> {
        TypeState {
            ty,
            index,
            first_fit: None,
            memo: BTreeMap::new(),
            holds: Vec::new(),
            timeline: None,
            ever: BTreeMap::new(),
            backfilled: false,
            patience_pct,
            victims_in_flight: Default::default(),
            fenced: Vec::new(),
            pack_by_end,
        }
    }

    /// Free GPUs of the type now, held ones included.
    pub fn free_gpus(&self) -> u32 {
        let held: u64 = self.holds.iter().map(|h| h.count).sum();
        u32::try_from(u64::from(self.index.region_free()) + held).unwrap_or(u32::MAX)
    }

    /// The GPUs held now for `job`'s reservation, if it has one.
    pub fn held_for(&self, job: &str) -> Vec<SlotGpus> {
        (self.holds.iter())
            .filter(|h| h.capacity.is_none() && h.job == job)
            .flat_map(|h| h.held.iter().cloned())
            .collect()
    }

    /// The GPUs held now for capacity reservation `id`.
    pub fn held_for_capacity(&self, id: &str) -> Vec<SlotGpus> {
        (self.holds.iter())
            .filter(|h| h.capacity.as_deref() == Some(id))
            .flat_map(|h| h.held.iter().cloned())
            .collect()
    }

    /// Holds up to `protect` free GPUs inside `res`'s domain for it, whole
    /// nodes first (its units are often gangs), until the round ends. Units
    /// that end by its start may use them, and, when it `lends`, preemptible
    /// ones always ([`Self::allowed`]).
    ///
    /// What it cannot hold free now comes from the units running in its
    /// domain (`inside`: slot, GPUs, expected end), the first to end first:
    /// those GPUs are fenced, so the timeline does not promise them to
    /// waiting units when they free up.
    pub fn hold_capacity(
        &mut self,
        res: &ReservedCapacity,
        protect: u64,
        lends: bool,
        now: u64,
        inside_running: &[(&str, &[u32], u64)],
    ) {
        if protect == 0 {
            return;
        }
        let mut inside: Vec<(u32, u32)> = (self.index.slots.iter().enumerate())
            .filter(|(_, slot)| res.holds(slot.node) && slot.free_count() > 0)
            .map(|(s, slot)| (s as u32, slot.free_count()))
            .collect();
        inside.sort_by_key(|&(s, free)| (std::cmp::Reverse(free), s));
        let mut left = protect;
        let mut held = Vec::new();
        for (slot, free) in inside {
            if left == 0 {
                break;
            }
            let k = u64::from(free).min(left) as usize;
            let gpus: Vec<u32> = self.index.slots[slot as usize].free_now()[..k].to_vec();
            self.index.remove(slot, &gpus);
            left -= k as u64;
            held.push((slot, gpus));
        }
        let slot_of: BTreeMap<&str, u32> = (self.index.slots.iter().enumerate())
            .filter(|(_, slot)| res.holds(slot.node))
            .map(|(s, slot)| (slot.node.id.as_str(), s as u32))
            .collect();
        let mut busy: Vec<&(&str, &[u32], u64)> = inside_running.iter().collect();
        busy.sort_by_key(|(node, _, end)| (*end, *node));
        for &&(node, gpus, _) in &busy {
            if left == 0 {
                break;
            }
            let Some(&slot) = slot_of.get(node) else {
                continue;
            };
            for &g in gpus.iter().take(left as usize) {
                self.fence(slot, g);
                left -= 1;
            }
        }
        self.holds.push(Hold {
            job: res.id.clone(),
            start: res.start.max(now),
            capacity: Some(res.id.clone()),
            lends,
            count: held.iter().map(|(_, g)| g.len() as u64).sum(),
            held,
        });
    }

    /// Keeps GPU `gpu` of `slot` out of what the timeline ever frees.
    fn fence(&mut self, slot: u32, gpu: u32) {
        self.fenced.push((slot, gpu));
        if let Some(tl) = &mut self.timeline {
            tl.reserved.push((slot, gpu, NO_END));
        }
    }

    /// Waiting units' holds (not capacity reservations').
    fn unit_holds(&self) -> usize {
        self.holds.iter().filter(|h| h.capacity.is_none()).count()
    }

    /// Forgets this round's reservations (their held GPUs are free again)
    /// before the pass recomputes them.
    pub fn reset_round(&mut self) {
        for h in self.holds.drain(..) {
            for (slot, gpus) in &h.held {
                self.index.give(*slot, gpus);
            }
        }
        // What this pass placed stays placed: GPUs borrowed from capacity
        // reservations stay fenced (and those fenced on running units are
        // fenced again by the next round's holds).
        if let Some(tl) = &mut self.timeline {
            tl.reserved.clear();
            tl.reserved
                .extend(self.fenced.iter().map(|&(slot, gpu)| (slot, gpu, NO_END)));
        }
        self.memo.clear();
        self.backfilled = false;
    }

    /// Decides one valid unit within quota under the Slurm-like or Gangway
    /// discipline.
    pub fn decide(&mut self, known: &Known<'a>, req: &Request, kind: PolicyKind) -> Outcome {
        if let Some(placement) = self.try_start(known, req) {
            return Outcome::Start(placement);
        }
        self.reserve_or_wait(known, req, kind)
    }

    /// Decides an elastic unit (Gangway's discipline): all its workers if
    /// they fit now, else the most that fit now (at least `min_workers`,
    /// the lowest ranks), else a reservation or a wait for `min_workers`.
    pub fn decide_elastic(
        &mut self,
        known: &Known<'a>,
        req: &Request,
        kind: PolicyKind,
    ) -> Outcome {
        if let Some(placement) = self.try_start(known, req) {
            return Outcome::Start(placement);
        }
        let sized = |w: usize| Request {
            ranks: req.ranks[..w].to_vec(),
            ..req.clone()
        };
        let min = (req.min_workers as usize).clamp(1, req.ranks.len());
        // Fitting is monotone in the number of workers: search the most.
        let (mut lo, mut hi) = (min, req.ranks.len() - 1);
        let mut most = None;
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            if self.can_start(known, &sized(mid)) {
                most = Some(mid);
                lo = mid + 1;
            } else if mid == 0 {
                break;
            } else {
                hi = mid - 1;
            }
        }
        if let Some(w) = most {
            if let Some(placement) = self.try_start(known, &sized(w)) {
                return Outcome::Start(placement);
            }
        }
        self.reserve_or_wait(known, &sized(min), kind)
    }

    /// The holds `req`, ending at `end`, may use, as a view mask: those it
    /// ends in time for, and lending capacity reservations' when it is
    /// preemptible.
    fn allowed(&self, req: &Request, end: Option<u64>) -> u64 {
        let borrows = req.priority <= PREEMPTIBLE_PRIORITY;
        self.holds
            .iter()
            .enumerate()
            .filter(|(_, h)| end.is_some_and(|e| e <= h.start) || (borrows && h.lends))
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Starts `req` now if it fits on free GPUs, or on held ones it ends in
    /// time for.
    fn try_start(&mut self, known: &Known<'a>, req: &Request) -> Option<Placement> {
        let end = timeline::end_of(known.now, req.estimated_duration_s);
        let mut pack_at = None;
        if end.is_some() {
            self.timeline(known);
            if self.pack_by_end && req.ranks.len() == 1 {
                if !self.index.tracks_ends() {
                    let tl = self.timeline.as_ref().expect("just built");
                    let horizon = tl.horizons(known, self.ty, self.index.slots.len());
                    self.index.track_ends(horizon);
                }
                pack_at = Some(known.now);
            }
        }
        let allowed = self.allowed(req, end);
        let start = Start { end, pack_at };
        let mut fit = self.in_view(req, 0, Some(start));
        if fit.is_none() && allowed != 0 {
            fit = self.in_view(req, allowed, Some(start));
        }
        let placement = fit?.placement?;
        self.backfilled |= !self.holds.is_empty();
        Some(placement)
    }

    /// Whether [`Self::try_start`] would start `req`, changing nothing.
    fn can_start(&mut self, known: &Known<'a>, req: &Request) -> bool {
        let end = timeline::end_of(known.now, req.estimated_duration_s);
        let allowed = self.allowed(req, end);
        self.in_view(req, 0, None).is_some()
            || (allowed != 0 && self.in_view(req, allowed, None).is_some())
    }

    /// A reservation for `req`, or why it waits.
    fn reserve_or_wait(&mut self, known: &Known<'a>, req: &Request, kind: PolicyKind) -> Outcome {
        let end = timeline::end_of(known.now, req.estimated_duration_s);
        let all: u64 = (1u64 << self.holds.len()) - 1;
        let allowed = self.allowed(req, end);
        // A unit whose victims are on their way out reserves beyond the cap,
        // so what they free (and the free GPUs it counted) waits for it.
        let owed =
            self.victims_in_flight.contains(req.job.as_str()) && self.unit_holds() < MAX_HOLDS;
        if self.unit_holds() < max_reservations(kind) || owed {
            if let Some(found) = self.reserve(known, req, kind) {
                return Outcome::Reserve(found);
            }
        }
        if allowed != all {
            if let Some(would) = self.in_view(req, all, None) {
                // Name the first reservation it may not use whose GPUs it wanted.
                let blocked = |h: &Hold| {
                    would.gpus.iter().any(|(slot, gpus)| {
                        h.held
                            .iter()
                            .any(|(s, held)| s == slot && gpus.iter().any(|g| held.contains(g)))
                    })
                };
                let candidates = || {
                    self.holds
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| allowed & (1 << i) == 0)
                        .map(|(_, h)| h)
                };
                let h = candidates()
                    .find(|h| blocked(h))
                    .or_else(|| candidates().next())
                    .expect("some reservation is not allowed");
                return Outcome::Wait(match &h.capacity {
                    Some(id) => WaitReason::HeldForReservation {
                        reservation: id.clone(),
                        start: h.start,
                    },
                    None => WaitReason::BlockedByReservation {
                        job: h.job.clone(),
                        start: h.start,
                    },
                });
            }
        }
        Outcome::Wait(WaitReason::NoCapacity {
            required: req.required,
            free_gpus: self.free_gpus(),
        })
    }

    fn timeline(&mut self, known: &Known<'a>) -> &mut Timeline<'a> {
        let (ty, index, fenced) = (self.ty, &self.index, &self.fenced);
        self.timeline.get_or_insert_with(|| {
            let mut tl = Timeline::new(ty, known, index);
            tl.reserved
                .extend(fenced.iter().map(|&(slot, gpu)| (slot, gpu, NO_END)));
            tl
        })
    }

    /// Best fit for `req` on the free GPUs plus the held GPUs of the holds in
    /// `mask`. `start`: carry it out as [`Start`] says; `None`: only say
    /// which GPUs it would take.
    fn in_view(&mut self, req: &Request, mask: u64, start: Option<Start>) -> Option<ViewFit> {
        let workers = req.ranks.len() as u64;
        let gpw = req.gpus_per_worker;
        let failed = self.memo.entry((gpw, mask)).or_insert(NEVER_FAILED);
        if place::known_to_fail(failed, workers, req.required) {
            return None;
        }
        let in_mask = |i: usize| mask & (1u64 << i) != 0;
        if mask != 0 {
            let extra: u64 = (self.holds.iter().enumerate())
                .filter(|(i, _)| in_mask(*i))
                .map(|(_, h)| h.count)
                .sum();
            if u64::from(self.index.region_free()) + extra < workers * u64::from(gpw) {
                return None;
            }
            for (_, h) in self.holds.iter().enumerate().filter(|(i, _)| in_mask(*i)) {
                for (slot, gpus) in &h.held {
                    self.index.give(*slot, gpus);
                }
            }
        }
        let index = &mut self.index;
        let timeline = &mut self.timeline;
        let fit = place::best_fit(index, workers, gpw, req.required, Some(failed)).and_then(
            |(level, dom)| {
                let packed = match start {
                    Some(Start {
                        end: Some(end),
                        pack_at: Some(now),
                    }) => index.fit_by_end(gpw, now, end),
                    _ => None,
                };
                let picks = match packed {
                    Some(slot) => vec![(slot, 1)],
                    None => place::picks(index, level, dom, workers, gpw)?,
                };
                // Which GPUs it takes matters only around holds.
                let gpus = if mask != 0 || start.is_none() {
                    place::gpus_of(index, &picks, gpw)
                } else {
                    Vec::new()
                };
                let placement = start.map(|Start { end, .. }| {
                    if let (Some(end), Some(tl)) = (end, timeline.as_mut()) {
                        tl.record_placed(end, index, &picks, gpw);
                    }
                    for &(slot, _) in &picks {
                        index.extend_end(slot, end.unwrap_or(NO_END));
                    }
                    place::commit(index, req, level, &picks)
                });
                Some(ViewFit { gpus, placement })
            },
        );
        if mask != 0 {
            let taken: &[SlotGpus] = match &fit {
                Some(f) if f.placement.is_some() => &f.gpus,
                _ => &[],
            };
            let mut fence: Vec<(u32, u32)> = Vec::new();
            for (i, h) in self.holds.iter_mut().enumerate() {
                if !in_mask(i) {
                    continue;
                }
                for (slot, gpus) in &mut h.held {
                    if let Some((_, used)) = taken.iter().find(|(s, _)| s == slot) {
                        if h.capacity.is_some() {
                            // Borrowed: they go back to the reservation.
                            fence.extend(
                                gpus.iter()
                                    .filter(|g| used.contains(g))
                                    .map(|&g| (*slot, g)),
                            );
                        }
                        gpus.retain(|g| !used.contains(g));
                    }
                    self.index.remove(*slot, gpus);
                }
                h.held.retain(|(_, g)| !g.is_empty());
                h.count = h.held.iter().map(|(_, g)| g.len() as u64).sum();
            }
            for (slot, gpu) in fence {
                self.fence(slot, gpu);
            }
        }
        fit
    }

    /// Reserves GPUs for `req` where and when it can start soonest, if the
    /// known ends say it ever can.
    fn reserve(&mut self, known: &Known<'a>, req: &Request, kind: PolicyKind) -> Option<Found> {
        let workers = req.ranks.len() as u64;
        let gpw = req.gpus_per_worker;
        let index = &self.index;
        let ever = *self
            .ever
            .entry(gpw)
            .or_insert_with(|| index.static_capacity(gpw));
        // The lowest level one domain of which could ever hold it.
        let reachable = Level::ALL
            .into_iter()
            .filter(|&l| l <= req.required)
            .find(|l| ever[l.index()] >= workers)?;
        let stop = match kind {
            // Wait for the level it prefers where a domain of it could ever hold it.
            PolicyKind::Gangway => req.preferred.min(req.required).max(reachable),
            _ => req.required,
        };
        self.timeline(known);
        let tl = self.timeline.as_mut().expect("just built");
        let ask = Ask { req, stop, ever };
        let mut found = earliest_start(&mut self.index, tl, known, &ask)?;
        // Waiting for the preferred level is worth it only while the
        // delay stays within the patience: a share of its own run time, the
        // price a wider placement would roughly cost it.
        let patience = req
            .estimated_duration_s
            .saturating_mul(u64::from(self.patience_pct))
            / 100;
        if stop < req.required && found.start > found.first_any.saturating_add(patience) {
            let ask = Ask {
                req,
                stop: req.required,
                ever,
            };
            found = earliest_start(&mut self.index, tl, known, &ask)?;
        }
        let until = timeline::end_of(found.start, req.estimated_duration_s).unwrap_or(NO_END);
        let mut held = Vec::new();
        for (slot, gpus) in &found.gpus {
            let free = self.index.slots[*slot as usize].free_now();
            let now: Vec<u32> = gpus
                .iter()
                .copied()
                .filter(|g| free.binary_search(g).is_ok())
                .collect();
            tl.reserved.extend(gpus.iter().map(|&g| (*slot, g, until)));
            if !now.is_empty() {
                self.index.remove(*slot, &now);
                held.push((*slot, now));
            }
        }
        self.holds.push(Hold {
            job: req.job.clone(),
            start: found.start,
            capacity: None,
            lends: false,
            count: held.iter().map(|(_, g)| g.len() as u64).sum(),
            held,
        });
        Some(found)
    }
}
