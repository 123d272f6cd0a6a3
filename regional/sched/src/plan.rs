//! One planning pass: [`plan`], in queue order under the policy's discipline.

use std::borrow::Cow;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};

use crate::backfill::{Outcome, TypeState};
use crate::fair::{Drawn, FairOrder};
use crate::index::{first_of_each_id, TypeIndex};
use crate::place::{self, FirstFit};
use crate::preempt;
use crate::reserved::{pool_usage, Reserved};
use crate::timeline::Known;
use crate::types::{
    Level, Plan, Policy, PolicyKind, Request, Reservation, Running, Snapshot, WaitReason, Waiting,
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

/// Sorts `units` by [`queue_order`], comparing their priority and `seq`
/// side by side in one array first: at 50,000 queued units, following
/// every comparison's two references to the units (scattered in memory)
/// made the sort a tenth of a pass.
fn sort_in_queue_order(units: &mut Vec<&Request>) {
    let mut keyed: Vec<(Reverse<i32>, u64, &Request)> = (units.iter())
        .map(|&r| (Reverse(r.priority), r.seq, r))
        .collect();
    // (Stable, as `sort_by(queue_order)` was.)
    keyed.sort_by(|a, b| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| queue_order(a.2, b.2))
    });
    units.clear();
    units.extend(keyed.into_iter().map(|(_, _, r)| r));
}

/// FIFO's order: arrival (`seq`) only, then job id and ranks so the order
/// is total.
fn fifo_order(a: &Request, b: &Request) -> Ordering {
    (a.seq, &a.job, a.ranks.first(), &a.ranks)
        .cmp(&(b.seq, &b.job, b.ranks.first(), &b.ranks))
        .then_with(|| queue_order(a, b))
}

/// Why a request can never be placed, if it cannot.
fn invalid(req: &Request) -> Option<String> {
    if req.ranks.is_empty() {
        return Some("it has no ranks".into());
    }
    if req.gpus_per_worker == 0 {
        return Some("gpus_per_worker is 0".into());
    }
    // (Ranks are usually in order: then no copy to sort.)
    if req.ranks.len() > 1 && !req.ranks.windows(2).all(|w| w[0] < w[1]) {
        let mut ranks = req.ranks.clone();
        ranks.sort_unstable();
        if let Some(w) = ranks.windows(2).find(|w| w[0] == w[1]) {
            return Some(format!("rank {} appears twice", w[0]));
        }
    }
    None
}

/// Computes which queued units to start now, which to reserve GPUs for, and
/// why the others wait, under `policy.kind` (see the crate's placement rules).
///
/// Pure and deterministic: the same snapshot gives the same plan.
pub fn plan(snapshot: &Snapshot, policy: &Policy) -> Plan {
    plan_in(snapshot, policy, None)
}

/// [`plan`], or with `only`, the plan of that GPU type's partition: what
/// `plan(&snapshot.partition(only))` decides, without copying the snapshot
/// (its other types' units are left out, their terms, usage and capacity
/// count as they do in a partition).
pub(crate) fn plan_in(snapshot: &Snapshot, policy: &Policy, only: Option<&str>) -> Plan {
    let kind = policy.kind;
    let mine = |ty: &str| only.is_none_or(|t| t == ty);
    let mut order: Vec<&Request> = (snapshot.queue.iter())
        .filter(|r| mine(&r.gpu_type))
        .collect();
    match kind {
        PolicyKind::FifoFirstFit => order.sort_by(|a, b| fifo_order(a, b)),
        _ => sort_in_queue_order(&mut order),
    }

    // Index only the GPU types somebody asks for. (Sorted, a type's units
    // mostly follow one another: one set insert per run of a type, not
    // one per unit, at 50,000 queued units.)
    let mut wanted: BTreeSet<&str> = BTreeSet::new();
    let mut last: Option<&str> = None;
    for r in &order {
        if last != Some(r.gpu_type.as_str()) {
            wanted.insert(r.gpu_type.as_str());
            last = Some(r.gpu_type.as_str());
        }
    }
    if kind == PolicyKind::Gangway && policy.preemption.enabled {
        // Elastic units below their maximum may grow: index their types too.
        wanted.extend(
            (snapshot.running.iter())
                .filter(|r| r.elastic.is_some_and(|e| e.workers < e.max_workers))
                .map(|r| r.gpu_type.as_str())
                .filter(|t| mine(t)),
        );
    }
    // Only the free GPUs the racks' power budgets can feed.
    let visible = crate::power::visible_nodes(snapshot);
    let keep = first_of_each_id(&visible);
    let mut by_type: BTreeMap<&str, Vec<_>> = wanted.iter().map(|&t| (t, Vec::new())).collect();
    let only = match wanted.len() {
        1 => wanted.first().copied(),
        _ => None,
    };
    for (i, node) in visible.iter().enumerate() {
        if !node.schedulable || keep.as_ref().is_some_and(|k| !k[i]) {
            continue;
        }
        let ty = node.gpu_type.as_str();
        match only {
            // One type queued (the common case): no map lookup per node.
            Some(t) if t != ty => {}
            _ => {
                if let Some(v) = by_type.get_mut(ty) {
                    v.push((i as u32, node));
                }
            }
        }
    }
    let mut types: BTreeMap<&str, TypeState> = by_type
        .into_iter()
        .map(|(t, nodes)| {
            (
                t,
                TypeState::new(
                    t,
                    TypeIndex::build(nodes),
                    policy.locality_patience_pct,
                    kind == PolicyKind::Gangway && policy.pack_by_end,
                ),
            )
        })
        .collect();
    // Units with victims in flight (they hold a reservation whatever the
    // limit) or whose victims just left: they come first in Gangway's order.
    let mut owed: BTreeSet<&str> = (snapshot.claims.iter())
        .filter(|&(_, &until)| until >= snapshot.now)
        .map(|(job, _)| job.as_str())
        .collect();
    for r in &snapshot.running {
        if let (Some(for_job), Some(ts)) = (&r.preempted_for, types.get_mut(r.gpu_type.as_str())) {
            ts.victims_in_flight.insert(for_job.as_str());
            owed.insert(for_job.as_str());
        }
    }
    let id_sorted = keep.is_none();
    // A unit being preempted is expected to let go of its GPUs by the
    // checkpoint deadline, whatever its estimate said.
    let leaving = |r: &Running| r.preempted_for.is_some();
    let running: Cow<[Running]> = if snapshot.running.iter().any(leaving) {
        let deadline = policy.preemption.checkpoint_deadline_s;
        Cow::Owned(
            snapshot
                .running
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    if leaving(&r) {
                        r.expected_end = r.expected_end.min(r.leaves_by(snapshot.now, deadline));
                    }
                    r
                })
                .collect(),
        )
    } else {
        Cow::Borrowed(&snapshot.running)
    };
    let known = Known::new(snapshot.now, &visible, &running);

    let quotas: BTreeMap<(&str, &str), u32> = snapshot
        .quotas
        .iter()
        .map(|((t, g), &q)| ((t.as_str(), g.as_str()), q))
        .collect();
    // (What runs in capacity reservations is not the tenants' usage of the
    // shared pool.)
    let mut usage = pool_usage(snapshot);

    let mut out = Plan {
        generation: snapshot.generation,
        partitions: (snapshot.partitions.iter())
            .filter(|(t, _)| mine(t))
            .map(|(t, &g)| (t.clone(), g))
            .collect(),
        ..Plan::default()
    };
    let max = policy.max_placements.unwrap_or(usize::MAX);
    // Units in capacity reservations go first, inside their reservations.
    let (in_reserved, order): (Vec<&Request>, Vec<&Request>) =
        order.into_iter().partition(|r| r.reservation.is_some());
    let mut reserved = Reserved::new(snapshot, policy.lend_reserved);
    let mut reserved_waits = Vec::new();
    // The request of each placement and wait, in step with `out.placements`
    // and `out.waiting` (preemption reads them back without a lookup).
    let mut placed_by: Vec<&Request> = Vec::new();
    let mut reserved_waited_by: Vec<&Request> = Vec::new();
    let mut waited_by: Vec<&Request> = Vec::new();
    reserved.place_units(
        &in_reserved,
        &mut types,
        (&mut out.placements, &mut placed_by),
        (&mut reserved_waits, &mut reserved_waited_by),
    );
    let mut queue = order;
    // Rounds: a unit started around a reservation can change where the
    // reservation would be computed (not when), so the pass runs again on
    // what is left with every reservation recomputed, until a round starts
    // nothing after a reservation. The last round's reservations and waits
    // are then exactly what a pass on the resulting state computes, and that
    // pass starts nothing (usually the second round is the last).
    loop {
        out.waiting.clear();
        waited_by.clear();
        out.reservations.clear();
        reserved.hold(&mut types, &running);
        // Reserved GPUs count against the tenant's quota for the rest of the
        // round, so the tenant's own backfill cannot push the reserved unit
        // over its quota by the time it starts.
        let mut charged: Vec<((&str, &str), u64)> = Vec::new();
        let mut left: Vec<&Request> = Vec::new();
        let mut cut = false;
        let mut order = match kind {
            PolicyKind::Gangway => {
                Order::Fair(FairOrder::new(snapshot, &queue, policy.size_aging_s, &owed))
            }
            _ => Order::Static(queue.clone().into_iter()),
        };
        while let Some(Drawn {
            unit: req,
            tenant,
            ty,
        }) = order.next(&usage)
        {
            if out.placements.len() >= max {
                cut = true;
                break;
            }
            let mut waits = Waits {
                waiting: &mut out.waiting,
                by: &mut waited_by,
                req,
            };
            if let Some(detail) = invalid(req) {
                waits.push(WaitReason::Invalid { detail });
                left.push(req);
                continue;
            }
            // Only Gangway's discipline starts elastic units with fewer
            // workers; the others place them whole.
            let elastic = kind == PolicyKind::Gangway && req.is_elastic();
            let need = if elastic { req.min_gpus() } else { req.gpus() };
            let key = (tenant, ty);
            let in_use = usage.get(&key).copied().unwrap_or(0);
            // An elastic unit the quota lets grow only part of the way.
            let mut capped: Option<Request> = None;
            if let Some(&quota) = quotas.get(&key) {
                let room = u64::from(quota).saturating_sub(in_use);
                if elastic && need <= room && room < req.gpus() {
                    let workers = (room / u64::from(req.gpus_per_worker)) as usize;
                    capped = Some(Request {
                        ranks: req.ranks[..workers].to_vec(),
                        ..req.clone()
                    });
                }
                if in_use + need > u64::from(quota) {
                    waits.push(WaitReason::OverQuota {
                        gpu_type: req.gpu_type.clone(),
                        quota,
                        in_use: sat(in_use),
                        requested: sat(need),
                    });
                    left.push(req);
                    continue;
                }
            }
            // Every queued type is indexed; a type no node has gets an empty tree.
            let Some(ts) = types.get_mut(ty) else {
                unreachable!("every queued type has a state")
            };
            let outcome = match kind {
                PolicyKind::FifoFirstFit => first_fit(ts, req, id_sorted),
                _ if elastic => ts.decide_elastic(&known, capped.as_ref().unwrap_or(req), kind),
                _ => ts.decide(&known, req, kind),
            };
            match outcome {
                Outcome::Start(placement) => {
                    let took = placement.workers.len() as u64 * u64::from(req.gpus_per_worker);
                    *usage.entry(key).or_insert(0) += took;
                    out.placements.push(placement);
                    placed_by.push(req);
                }
                Outcome::Reserve(found) => {
                    *usage.entry(key).or_insert(0) += need;
                    charged.push((key, need));
                    waits.push(WaitReason::Reserved {
                        start: found.start,
                        level: found.level,
                    });
                    out.reservations.push(Reservation {
                        job: req.job.clone(),
                        ranks: req.ranks.clone(),
                        start: found.start,
                        level: found.level,
                        gpus: found
                            .gpus
                            .iter()
                            .map(|(slot, gpus)| {
                                (ts.index.slots[*slot as usize].node.id.clone(), gpus.clone())
                            })
                            .collect(),
                    });
                    left.push(req);
                }
                Outcome::Wait(reason) => {
                    waits.push(reason);
                    left.push(req);
                }
            }
        }
        if cut || !types.values().any(|t| t.backfilled) {
            break;
        }
        for (key, need) in charged {
            *usage.get_mut(&key).expect("charged") -= need;
        }
        for ts in types.values_mut() {
            ts.reset_round();
        }
        if kind == PolicyKind::Gangway {
            sort_in_queue_order(&mut left);
        }
        queue = left;
    }
    // The reservations' units that wait come first: their borrowers are
    // the first victims.
    reserved_waits.append(&mut out.waiting);
    out.waiting = reserved_waits;
    reserved_waited_by.append(&mut waited_by);
    if kind == PolicyKind::Gangway && policy.preemption.enabled {
        preempt::choose(
            snapshot,
            &policy.preemption,
            &reserved,
            &mut types,
            &mut out,
            preempt::Decided {
                placed_by: &placed_by,
                waited_by: &reserved_waited_by,
            },
        );
    }
    out
}

/// A round's waits for one unit, each pushed with the unit it is for.
struct Waits<'a, 'r> {
    waiting: &'a mut Vec<Waiting>,
    by: &'a mut Vec<&'r Request>,
    req: &'r Request,
}

impl Waits<'_, '_> {
    fn push(&mut self, reason: WaitReason) {
        self.waiting.push(Waiting {
            job: self.req.job.clone(),
            ranks: self.req.ranks.clone(),
            reason,
        });
        self.by.push(self.req);
    }
}

/// The order a round draws its units in.
enum Order<'r> {
    /// Fixed: FIFO's and the Slurm-like discipline's.
    Static(std::vec::IntoIter<&'r Request>),
    /// Gangway's: fair sharing, re-evaluated after each decision.
    Fair(FairOrder<'r>),
}

impl<'r> Order<'r> {
    fn next(&mut self, usage: &BTreeMap<(&str, &str), u64>) -> Option<Drawn<'r>> {
        match self {
            Order::Static(it) => it.next().map(|unit| Drawn {
                unit,
                tenant: &unit.tenant,
                ty: &unit.gpu_type,
            }),
            Order::Fair(fair) => fair.next(usage),
        }
    }
}

/// FIFO: first fit in node-id order, blind to topology and to `required`.
/// `id_sorted`: snapshot positions follow node ids.
fn first_fit(ts: &mut TypeState, req: &Request, id_sorted: bool) -> Outcome {
    let workers = req.ranks.len() as u64;
    let gpw = req.gpus_per_worker;
    let ff = ts
        .first_fit
        .get_or_insert_with(|| FirstFit::new(&ts.index, id_sorted));
    let Some(picks) = ff.find(&ts.index, workers, gpw) else {
        return Outcome::Wait(WaitReason::NoCapacity {
            required: Level::Region,
            free_gpus: ts.index.region_free(),
        });
    };
    let level = ts.index.spanned_level(picks.iter().map(|&(s, _)| s));
    let placement = place::commit(&mut ts.index, req, level, &picks);
    ff.update(&ts.index, picks.iter().map(|&(s, _)| s));
    Outcome::Start(placement)
}

fn sat(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "preempt_tests.rs"]
mod preempt_tests;
