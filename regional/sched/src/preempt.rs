//! Scheduler-driven preemption under Gangway's discipline.
//!
//! After a pass has started what fits and reserved for the head of the
//! queue, waiting units that have a right to preempt choose victims, in
//! queue order, within [`PreemptionPolicy::max_victims_per_pass`] (and
//! twice as many searches):
//!
//! - **Priority**: a `normal` or `high` unit may preempt running units of
//!   the preemptible class (priority ≤ [`PREEMPTIBLE_PRIORITY`]) with a
//!   lower priority, that have been preempted fewer than
//!   [`PreemptionPolicy::max_preemptions`] times, of its own tenant or of
//!   one holding more than its guarantee of the type: a guarantee protects
//!   a tenant's low units as much as its normal ones.
//! - **Reclaim**: a unit whose tenant, once it runs, still holds no more
//!   than its guarantee of the type may preempt units of other tenants that
//!   hold more than their own guarantee (borrowers), whatever their
//!   priority, and whatever class waits besides: what its victims free is
//!   its own ([`crate::Plan::claims`]).
//!
//! - **Defragmentation** ([`PreemptionPolicy::defrag`]): a gang (two or
//!   more workers) that holds a reservation starting after the checkpoint
//!   deadline, with no higher class waiting for its type, may move units
//!   no higher than its own, of the preemptible class or of tenants that
//!   hold more than their guarantee of the type (borrowed capacity), that
//!   sit on one node with fewer GPUs than one of its workers (small jobs
//!   fragmenting the nodes it needs whole), preempted fewer than
//!   [`PreemptionPolicy::max_preemptions`] times — but only when every
//!   such victim fits at once on free GPUs outside the domain the gang
//!   takes (best fit, promised to them for the rest of the pass), so it
//!   is moved, not made to wait. The placer's fill-partly-used-nodes-first
//!   rule puts it back on those GPUs, not on the whole nodes it left.
//!
//! Either way a victim must have run [`PreemptionPolicy::min_run_s`] since
//! it last started, doubled for every time it was preempted before
//! ([`PreemptionPolicy::min_run_for`]: a backoff for every cause, so no
//! victim is preempted over and over), and a unit already being preempted
//! is never chosen again. A unit that has
//! victims in flight chooses no more; it waits as
//! [`WaitReason::Preempting`]. A unit that starts soon anyway (a
//! reservation starting within the checkpoint deadline) chooses none.
//!
//! **Victim choice.** For each domain, tightest level first up to the
//! unit's `required` level, candidates touching the domain are taken
//! greedily (lowest priority, then least work at risk, i.e. GPU-seconds
//! since their last checkpoint, then job id) until
//! the unit's workers fit on the domain's free GPUs plus the freed ones;
//! then every victim that is not needed is dropped again. Among domains:
//! a fit at or below the unit's preferred level first (its freed GPUs form
//! a topology-tight block), then the least work at risk, then the lowest
//! level, then the fewest victims, then the fewest GPUs freed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

use crate::backfill::TypeState;
use crate::index::TypeIndex;
use crate::reserved::{pool_usage, Reserved};
use crate::types::{
    Elastic, Level, Plan, PreemptCause, Preemption, PreemptionPolicy, Request, ReservedCapacity,
    Running, Snapshot, WaitReason, PREEMPTIBLE_PRIORITY,
};

/// Victim searches a pass may make, per victim it may choose.
const MAX_SEARCHES_PER_VICTIM: usize = 2;

/// A running unit that could be a victim, on one type's index.
struct Candidate<'s> {
    run: &'s Running,
    /// Its position in `snapshot.running`.
    at: usize,
    /// GPUs it holds per slot of the type's index.
    slots: Vec<(u32, u32)>,
    at_risk: u64,
}

/// What one type's victim searches share within a pass.
struct TypeVictims<'s> {
    cands: Vec<Candidate<'s>>,
    /// Per slot, GPUs of units expected to end by the deadline anyway.
    soon: Vec<u32>,
    /// Per slot, free GPUs promised to units that preempted this pass.
    promised: Vec<u32>,
    /// Per level, built on first use: (domain, position in `order`) for
    /// every domain each candidate touches, sorted.
    pairs: [Option<Vec<(u32, u32)>>; 4],
    /// Candidates in the order they are taken: lowest priority, least work
    /// at risk, then job id.
    order: Vec<usize>,
}

impl<'s> TypeVictims<'s> {
    fn new(snapshot: &'s Snapshot, ty: &str, index: &TypeIndex, until: u64) -> TypeVictims<'s> {
        let (cands, soon) = candidates(snapshot, ty, index, until);
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by_key(|&i| (cands[i].run.priority, cands[i].at_risk, &cands[i].run.job));
        TypeVictims {
            promised: vec![0; soon.len()],
            cands,
            soon,
            pairs: [None, None, None, None],
            order,
        }
    }

    fn pairs(&mut self, index: &TypeIndex, level: Level) -> &[(u32, u32)] {
        let (cands, order) = (&self.cands, &self.order);
        self.pairs[level.index()].get_or_insert_with(|| {
            let mut pairs = Vec::new();
            for (rank, &i) in order.iter().enumerate() {
                let first = pairs.len();
                for &(s, _) in &cands[i].slots {
                    let d = index.ancestor(s, level);
                    if !pairs[first..].iter().any(|&(x, _)| x == d) {
                        pairs.push((d, rank as u32));
                    }
                }
            }
            pairs.sort_unstable();
            pairs
        })
    }
}

/// What decides whether victims can be found for a unit: type, GPUs per
/// worker, workers, required level, priority, the tenant if it reclaims,
/// whether it may defragment, and the capacity reservation it runs in.
type Shape<'s> = (
    &'s str,
    u32,
    u64,
    Level,
    i32,
    Option<&'s str>,
    bool,
    Option<&'s str>,
);

/// The victims chosen for one unit.
struct Choice {
    /// Indices into the candidate list, in the order they were taken.
    victims: Vec<usize>,
    dom: u32,
    level: Level,
    /// (not tight, at risk, level, victims, GPUs freed, domain): smaller wins.
    score: (bool, u64, Level, usize, u64, u32),
}

/// The unit of each of a plan's placements and waits, in step with
/// [`Plan::placements`] and [`Plan::waiting`].
pub(crate) struct Decided<'a, 'r> {
    pub placed_by: &'a [&'r Request],
    pub waited_by: &'a [&'r Request],
}

/// Adds the pass's preemptions to `out` and turns the waits of the units
/// they are for into [`WaitReason::Preempting`].
pub(crate) fn choose(
    snapshot: &Snapshot,
    policy: &PreemptionPolicy,
    reserved: &Reserved,
    types: &mut BTreeMap<&str, TypeState>,
    out: &mut Plan,
    decided: Decided,
) {
    let now = snapshot.now;
    let until = now.saturating_add(policy.checkpoint_deadline_s);
    debug_assert_eq!(decided.placed_by.len(), out.placements.len());
    debug_assert_eq!(decided.waited_by.len(), out.waiting.len());
    // What tenants will hold: now, plus what the pass starts, minus what is
    // already on its way out.
    // (What runs in capacity reservations is not usage of the shared pool.)
    let mut usage = pool_usage(snapshot);
    for (p, req) in out.placements.iter().zip(decided.placed_by) {
        if req.reservation.is_none() {
            // (An elastic unit may have started with a prefix of its ranks.)
            let took = p.workers.len() as u64 * u64::from(req.gpus_per_worker);
            *usage.entry((&req.tenant, &req.gpu_type)).or_insert(0) += took;
        }
    }
    // Per unit (and GPU type: victims are of their unit's type) with
    // victims in flight: the victims, and when the last is expected to be
    // gone.
    let mut in_flight: BTreeMap<(&str, &str), (Vec<String>, u64)> = BTreeMap::new();
    for r in &snapshot.running {
        if let Some(for_job) = &r.preempted_for {
            let entry = (in_flight.entry((for_job.as_str(), r.gpu_type.as_str()))).or_default();
            entry.0.push(r.job.clone());
            entry.1 = entry.1.max(r.leaves_by(now, policy.checkpoint_deadline_s));
            if let Some(u) = usage.get_mut(&(r.tenant.as_str(), r.gpu_type.as_str())) {
                *u = u.saturating_sub(r.gpu_count());
            }
        }
    }
    let guarantees: HashMap<(&str, &str), u64> = (snapshot.shares.iter())
        .map(|((t, g), s)| ((t.as_str(), g.as_str()), u64::from(s.guaranteed)))
        .collect();
    let guaranteed = |tenant: &str, ty: &str| guarantees.get(&(tenant, ty)).copied().unwrap_or(0);

    // Per type, the highest priority among units waiting for capacity: a
    // unit of a lower class does not defragment, since what it moves would
    // make room for that class first. (It does reclaim: what its victims
    // free is its own by its claim, `fair.rs`.)
    let mut top_waiting: BTreeMap<&str, i32> = BTreeMap::new();
    for (w, req) in out.waiting.iter().zip(decided.waited_by) {
        if matches!(
            w.reason,
            WaitReason::Invalid { .. } | WaitReason::OverQuota { .. }
        ) {
            continue;
        }
        let top = top_waiting.entry(req.gpu_type.as_str()).or_insert(i32::MIN);
        *top = (*top).max(req.priority);
    }
    let mut budget = policy.max_victims_per_pass;
    let mut taken: BTreeSet<usize> = BTreeSet::new();
    // Per type, built on first use: candidates; per slot, GPUs of units
    // expected to end by the deadline anyway, and free GPUs promised to
    // units that preempted this pass.
    let mut per_type: BTreeMap<String, TypeVictims> = BTreeMap::new();
    // Shapes that found no victims since the last success.
    let mut failed: BTreeSet<Shape> = BTreeSet::new();

    // Searches cost up to a few milliseconds on a 40,000-GPU fleet: a pass
    // makes a bounded number, and the next pass goes on from there.
    let mut searches = MAX_SEARCHES_PER_VICTIM * policy.max_victims_per_pass;
    for (w, &req) in out.waiting.iter_mut().zip(decided.waited_by) {
        if budget == 0 || searches == 0 {
            break;
        }
        let starts_late = match &w.reason {
            WaitReason::NoCapacity { .. } | WaitReason::BlockedByReservation { .. } => true,
            // A reservation at `now` that did not start waits on units
            // that overran their estimates: no telling when they end.
            WaitReason::Reserved { start, .. } => *start > until || *start <= now,
            _ => continue,
        };
        let reserved_late = matches!(w.reason, WaitReason::Reserved { start, .. } if start > until);
        if let Some((victims, by)) = in_flight.get(&(req.job.as_str(), req.gpu_type.as_str())) {
            w.reason = WaitReason::Preempting {
                victims: victims.clone(),
                until: *by,
            };
            continue;
        }
        if !starts_late {
            continue;
        }
        let ty = req.gpu_type.as_str();
        let need = req.gpus();
        // A unit in a capacity reservation takes its GPUs back from
        // borrowers inside the reservation, and preempts nothing else.
        let within = match req.reservation.as_deref() {
            Some(id) => match reserved.active(id) {
                Some(res) => Some(res),
                None => continue,
            },
            None => None,
        };
        let by_priority = within.is_none() && req.priority > PREEMPTIBLE_PRIORITY;
        let held = usage.get(&(req.tenant.as_str(), ty)).copied().unwrap_or(0);
        let reclaim = within.is_none() && held + need <= guaranteed(&req.tenant, ty);
        let defrag = within.is_none()
            && policy.defrag
            && reserved_late
            && req.ranks.len() >= 2
            && top_waiting.get(ty).is_none_or(|&top| req.priority >= top);
        if !by_priority && !reclaim && !defrag && within.is_none() {
            continue;
        }
        let shape = (
            ty,
            req.gpus_per_worker,
            req.ranks.len() as u64,
            req.required,
            req.priority,
            reclaim.then_some(req.tenant.as_str()),
            defrag,
            within.map(|r| r.id.as_str()),
        );
        if failed.contains(&shape) {
            continue;
        }
        let Some(ts) = types.get(ty) else { continue };
        // Whether `tenant` holds more than its guarantee of the type now.
        let borrowing =
            |tenant: &str| usage.get(&(tenant, ty)).copied().unwrap_or(0) > guaranteed(tenant, ty);
        let tv = per_type
            .entry(ty.to_string())
            .or_insert_with(|| TypeVictims::new(snapshot, ty, &ts.index, until));
        // Who may be a victim of this unit, and why.
        let mut cause: Vec<Option<PreemptCause>> = Vec::with_capacity(tv.cands.len());
        for c in tv.cands.iter() {
            let r = c.run;
            let free_to_go = !taken.contains(&c.at) && r.job != req.job && r.reservation.is_none();
            let eligible =
                free_to_go && now.saturating_sub(r.started) >= policy.min_run_for(r.preemptions);
            let why = if let Some(res) = within {
                // Borrowers of the reservation's GPUs, whatever their age.
                let inside =
                    (c.slots.iter()).any(|&(s, _)| res.holds(ts.index.slots[s as usize].node));
                (free_to_go && inside && r.priority <= PREEMPTIBLE_PRIORITY)
                    .then_some(PreemptCause::Reservation)
            } else if !eligible {
                None
            } else if by_priority
                && r.priority <= PREEMPTIBLE_PRIORITY
                && r.priority < req.priority
                && r.preemptions < policy.max_preemptions
                // Another tenant's guarantee protects its low units too.
                && (r.tenant == req.tenant || borrowing(&r.tenant))
            {
                Some(PreemptCause::Priority)
            } else if reclaim && r.tenant != req.tenant && borrowing(&r.tenant) {
                Some(PreemptCause::Reclaim)
            } else if defrag
                && (r.priority <= PREEMPTIBLE_PRIORITY || borrowing(&r.tenant))
                && r.priority <= req.priority
                && r.preemptions < policy.max_preemptions
                && r.elastic.is_none()
                && r.gpus.len() == 1
                && r.gpu_count() < u64::from(req.gpus_per_worker)
            {
                Some(PreemptCause::Defrag)
            } else {
                None
            };
            cause.push(why);
        }
        let mut own: Vec<(u32, Vec<u32>)> = ts.held_for(&req.job);
        if let Some(res) = within {
            own.extend(ts.held_for_capacity(&res.id));
        }
        let mut free: Vec<u32> = (ts.index.slots.iter().enumerate())
            .map(|(s, slot)| (slot.free_count() + tv.soon[s]).saturating_sub(tv.promised[s]))
            .collect();
        for (slot, gpus) in &own {
            free[*slot as usize] += gpus.len() as u32;
        }
        searches -= 1;
        let Some(choice) = search(&ts.index, &free, tv, &cause, req, within) else {
            failed.insert(shape);
            continue;
        };
        if choice.victims.len() > budget {
            continue;
        }
        let range = slots_of(&ts.index, choice.level, choice.dom);
        // Units moved to defragment need somewhere else to go now.
        let movers: Vec<(u64, usize)> = (choice.victims.iter())
            .filter(|&&v| cause[v] == Some(PreemptCause::Defrag))
            .map(|&v| (tv.cands[v].run.gpu_count(), v))
            .collect();
        let landing = match landing_spots(&free, &range, &movers) {
            Some(spots) => spots,
            None => continue,
        };
        for (slot, n) in landing {
            tv.promised[slot as usize] += n;
        }
        failed.clear();
        // Promise the domain's free GPUs the unit will use, so later units
        // do not count them too.
        let mut freed: BTreeMap<u32, u32> = BTreeMap::new();
        for &v in &choice.victims {
            for &(slot, n) in &tv.cands[v].slots {
                if range.contains(&slot) {
                    *freed.entry(slot).or_insert(0) += n;
                }
            }
        }
        let gpw = req.gpus_per_worker;
        let mut workers = req.ranks.len() as u64;
        let order = freed
            .keys()
            .copied()
            .chain(range.clone().filter(|s| !freed.contains_key(s)));
        for slot in order {
            if workers == 0 {
                break;
            }
            let f = freed.get(&slot).copied().unwrap_or(0);
            let k = (u64::from(free[slot as usize] + f) / u64::from(gpw)).min(workers);
            workers -= k;
            let from_free = (k as u32 * gpw).saturating_sub(f);
            tv.promised[slot as usize] += from_free;
        }
        let mut victims = Vec::new();
        for &v in &choice.victims {
            let c = &tv.cands[v];
            taken.insert(c.at);
            let gpus = c.run.gpu_count();
            if let Some(u) = usage.get_mut(&(c.run.tenant.as_str(), ty)) {
                *u = u.saturating_sub(gpus);
            }
            out.preemptions.push(Preemption {
                job: c.run.job.clone(),
                for_job: req.job.clone(),
                cause: cause[v].expect("victims are eligible"),
                at_risk_gpu_s: c.at_risk,
                gpus,
            });
            victims.push(c.run.job.clone());
        }
        *usage.entry((req.tenant.as_str(), ty)).or_insert(0) += need;
        budget = budget.saturating_sub(victims.len());
        out.claims.insert(req.job.clone(), policy.claim_until(now));
        w.reason = WaitReason::Preempting { victims, until };
    }

    // Elastic units below their maximum restart larger where idle GPUs of
    // their type, which no waiting unit wants, could hold at least half as
    // many workers again.
    // (The types of units waiting for capacity: `top_waiting`'s, as the
    // waits turned into preemptions waited for capacity too.)
    let wanted = |ty: &str| top_waiting.contains_key(ty);
    for (at, r) in snapshot.running.iter().enumerate() {
        if budget == 0 {
            break;
        }
        let Some(e) = r.elastic else { continue };
        if e.workers >= e.max_workers
            || r.reservation.is_some()
            || e.gpus_per_worker == 0
            || r.preempted_for.is_some()
            || taken.contains(&at)
            || now.saturating_sub(r.started) < policy.min_run_for(r.preemptions)
            || wanted(r.gpu_type.as_str())
        {
            continue;
        }
        let Some(ts) = types.get(r.gpu_type.as_str()) else {
            continue;
        };
        let tv = per_type
            .entry(r.gpu_type.clone())
            .or_insert_with(|| TypeVictims::new(snapshot, &r.gpu_type, &ts.index, until));
        let target = (e.workers + e.workers.div_ceil(2)).min(e.max_workers);
        if let Some(promise) = grow_room(&ts.index, tv, r, e, target) {
            for (slot, n) in promise {
                tv.promised[slot as usize] += n;
            }
            taken.insert(at);
            out.preemptions.push(Preemption {
                job: r.job.clone(),
                for_job: r.job.clone(),
                cause: PreemptCause::Grow,
                at_risk_gpu_s: r.at_risk_gpu_s(now),
                gpus: r.gpu_count(),
            });
            budget -= 1;
        }
    }
}

/// Where units moved to defragment a domain would land: for each mover
/// (GPUs, candidate), largest first, the slot outside `range` with the
/// fewest free GPUs that still hold it (best fit, as the placer fills
/// partly used nodes first). `None` when one of them fits nowhere.
fn landing_spots(
    free: &[u32],
    range: &Range<u32>,
    movers: &[(u64, usize)],
) -> Option<Vec<(u32, u32)>> {
    if movers.is_empty() {
        return Some(Vec::new());
    }
    let mut left: Vec<u32> = free.to_vec();
    let mut order: Vec<&(u64, usize)> = movers.iter().collect();
    order.sort_by_key(|&&(gpus, v)| (std::cmp::Reverse(gpus), v));
    let mut spots = Vec::with_capacity(movers.len());
    for &&(gpus, _) in &order {
        let gpus = u32::try_from(gpus).ok()?;
        let slot = (0..left.len() as u32)
            .filter(|s| !range.contains(s) && left[*s as usize] >= gpus)
            .min_by_key(|&s| (left[s as usize], s))?;
        left[slot as usize] -= gpus;
        spots.push((slot, gpus));
    }
    Some(spots)
}

/// Whether one domain of `e.required` could hold `target` workers of the
/// running elastic unit `r` on free GPUs (not promised) plus its own; if so,
/// the free GPUs it would take there, per slot.
fn grow_room(
    index: &TypeIndex,
    tv: &TypeVictims,
    r: &Running,
    e: Elastic,
    target: u32,
) -> Option<Vec<(u32, u32)>> {
    let gpw = e.gpus_per_worker;
    let mut own: BTreeMap<u32, u32> = BTreeMap::new();
    for (node, gpus) in &r.gpus {
        if let Some(s) = (index.slots.iter()).position(|slot| slot.node.id == *node) {
            *own.entry(s as u32).or_insert(0) += gpus.len() as u32;
        }
    }
    let free = |s: u32| {
        let slot = &index.slots[s as usize];
        slot.free_count().saturating_sub(tv.promised[s as usize])
    };
    let level = e.required;
    let domains = index.levels[level.index()].ids.len().max(1);
    let mut workers = vec![0u64; domains];
    for s in 0..index.slots.len() as u32 {
        let have = free(s) + own.get(&s).copied().unwrap_or(0);
        workers[index.ancestor(s, level) as usize] += u64::from(have / gpw);
    }
    let dom = (0..domains).find(|&d| workers[d] >= u64::from(target))? as u32;
    // Its own GPUs first, then free ones, slot by slot.
    let mut left = u64::from(target);
    let mut promise = Vec::new();
    for s in slots_of(index, level, dom) {
        if left == 0 {
            break;
        }
        let mine = own.get(&s).copied().unwrap_or(0);
        let k = (u64::from((free(s) + mine) / gpw)).min(left);
        left -= k;
        let from_free = (k as u32 * gpw).saturating_sub(mine);
        if from_free > 0 {
            promise.push((s, from_free));
        }
    }
    Some(promise)
}

/// The running units of type `ty` that could be victims (not already being
/// preempted, not expected to end by `until` anyway), with their GPUs on the
/// type's index; and per slot, the GPUs of units expected to end by `until`
/// (after `now`: a unit that overran its estimate may run on for long).
fn candidates<'s>(
    snapshot: &'s Snapshot,
    ty: &str,
    index: &TypeIndex,
    until: u64,
) -> (Vec<Candidate<'s>>, Vec<u32>) {
    let slot_of: BTreeMap<&str, u32> = (index.slots.iter().enumerate())
        .map(|(s, slot)| (slot.node.id.as_str(), s as u32))
        .collect();
    let mut out = Vec::new();
    let mut soon = vec![0u32; index.slots.len()];
    for (at, run) in snapshot.running.iter().enumerate() {
        if run.gpu_type != ty || run.preempted_for.is_some() {
            continue;
        }
        let mut slots: Vec<(u32, u32)> = Vec::new();
        for (node, gpus) in &run.gpus {
            if let Some(&s) = slot_of.get(node.as_str()) {
                let limit = index.limit(s);
                let n = gpus.iter().filter(|&&g| g < limit).count() as u32;
                if n > 0 {
                    slots.push((s, n));
                }
            }
        }
        if run.expected_end > snapshot.now && run.expected_end <= until {
            for (s, n) in slots {
                soon[s as usize] += n;
            }
            continue;
        }
        if slots.is_empty() {
            continue;
        }
        out.push(Candidate {
            run,
            at,
            slots,
            at_risk: run.at_risk_gpu_s(snapshot.now),
        });
    }
    (out, soon)
}

/// The slots under domain `dom` of `level`: a contiguous range.
fn slots_of(index: &TypeIndex, level: Level, dom: u32) -> Range<u32> {
    let mut range = dom..dom + 1;
    for l in (0..=level.index()).rev() {
        let children = &index.levels[l].children;
        range = children[range.start as usize].start..children[range.end as usize - 1].end;
    }
    range
}

/// The best set of victims for `req` (see the module's rules), if any.
fn search(
    index: &TypeIndex,
    free: &[u32],
    tv: &mut TypeVictims,
    cause: &[Option<PreemptCause>],
    req: &Request,
    within: Option<&ReservedCapacity>,
) -> Option<Choice> {
    let gpw = req.gpus_per_worker;
    let workers = req.ranks.len() as u64;
    let tight = req.preferred.min(req.required);
    let fits = |slot: u32, extra: u32| u64::from((free[slot as usize] + extra) / gpw);
    // GPUs freed per slot while a domain is weighed; all 0 between domains.
    let mut freed: Vec<u32> = vec![0; free.len()];
    let mut best: Option<Choice> = None;
    let mut list: Vec<usize> = Vec::new();
    let top = within.map_or(req.required, |r| req.required.min(r.level));
    for level in Level::ALL.into_iter().filter(|&l| l <= top) {
        if best.as_ref().is_some_and(|b| !b.score.0) && level > tight {
            break;
        }
        tv.pairs(index, level);
        let (pairs, order, cands) = (
            tv.pairs[level.index()].as_deref().expect("just built"),
            &tv.order,
            &tv.cands,
        );
        for group in pairs.chunk_by(|a, b| a.0 == b.0) {
            let dom = group[0].0;
            list.clear();
            list.extend(
                (group.iter())
                    .map(|&(_, r)| order[r as usize])
                    .filter(|&i| cause[i].is_some()),
            );
            if list.is_empty() {
                continue;
            }
            let range = slots_of(index, level, dom);
            // (At or below the reservation's level a domain is inside it
            // or apart from it.)
            if within.is_some_and(|r| !r.holds(index.slots[range.start as usize].node)) {
                continue;
            }
            let base: u64 = range.clone().map(|s| fits(s, 0)).sum();
            if base >= workers {
                // It fits here without victims (once units expected to end by
                // the deadline have): not a place to preempt for.
                continue;
            }
            let mut fit = base;
            let mut chosen: Vec<usize> = Vec::new();
            let add = |freed: &mut [u32], fit: &mut u64, i: usize, sign: bool| {
                for &(s, n) in &cands[i].slots {
                    if !range.contains(&s) {
                        continue;
                    }
                    let f = &mut freed[s as usize];
                    let before = fits(s, *f);
                    if sign {
                        *f += n;
                    } else {
                        *f -= n;
                    }
                    let after = fits(s, *f);
                    *fit = *fit + after - before;
                }
            };
            for &i in &list {
                add(&mut freed, &mut fit, i, true);
                chosen.push(i);
                if fit >= workers {
                    break;
                }
            }
            if fit < workers {
                // Not even with every candidate gone.
                for &i in &chosen {
                    for &(s, _) in &cands[i].slots {
                        freed[s as usize] = 0;
                    }
                }
                continue;
            }
            // Drop victims that turned out not to be needed, the latest
            // (most costly) first.
            for k in (0..chosen.len()).rev() {
                let i = chosen[k];
                add(&mut freed, &mut fit, i, false);
                if fit >= workers {
                    chosen.remove(k);
                } else {
                    add(&mut freed, &mut fit, i, true);
                }
            }
            for &i in &chosen {
                for &(s, _) in &cands[i].slots {
                    freed[s as usize] = 0;
                }
            }
            let at_risk: u64 = chosen.iter().map(|&i| cands[i].at_risk).sum();
            let gpus: u64 = chosen.iter().map(|&i| cands[i].run.gpu_count()).sum();
            let score = (level > tight, at_risk, level, chosen.len(), gpus, dom);
            if best.as_ref().is_none_or(|b| score < b.score) {
                best = Some(Choice {
                    victims: chosen,
                    dom,
                    level,
                    score,
                });
            }
        }
    }
    best
}
