//! Capacity reservations in a pass ([`Snapshot::reserved`]): keeping the
//! promise [`crate::capacity::admit`] made.
//!
//! - **The owner's units first.** A unit naming a reservation
//!   ([`Request::reservation`]) is decided before any other unit of its
//!   type: it must be its tenant's, of its type, the reservation started
//!   and not over, and its GPUs must fit in what the reservation's other
//!   units leave of it. It is placed only inside the reservation's domain
//!   (best fit at the lowest level its `required` allows there), whole,
//!   outside its tenant's quota and fair share: the reservation is
//!   capacity of its own, so neither what it places nor what its units
//!   hold counts as the tenant's usage of the shared pool.
//! - **The rest of the reservation is held.** Each round then holds, for
//!   every reservation not over (the earliest [`MAX_CAPACITY_HOLDS`] of a
//!   type), the free GPUs of its domain up to what its units do not use,
//!   whole nodes first. Like a waiting gang's reservation, a unit that ends
//!   before the reservation starts may use them; unlike it, a preemptible
//!   unit (priority ≤ [`crate::PREEMPTIBLE_PRIORITY`]) may always borrow them
//!   while the policy lends reserved GPUs ([`crate::Policy::lend_reserved`]).
//!   Nothing else can take them, so at its start the reservation's domain
//!   holds its GPUs free, or lent to work that will have ended or that can
//!   be preempted. Without lending, an owner's unit never waits for a
//!   borrower to checkpoint, at the price of the GPUs it leaves idle.
//! - **Borrowers give them back.** An owner's unit that does not fit in
//!   the domain preempts borrowers there (`PreemptCause::Reservation`,
//!   `preempt.rs`): preemptible units not of the reservation, whatever
//!   their age. A reservation's running units are never victims of
//!   anything else, and never grow.

use std::collections::BTreeMap;

use crate::backfill::{TypeState, MAX_CAPACITY_HOLDS};
use crate::index::TypeIndex;
use crate::place;
use crate::types::{
    Node, Placement, Request, ReservedCapacity, Running, Snapshot, WaitReason, Waiting,
};

/// What a pass knows of the capacity reservations.
pub(crate) struct Reserved<'s> {
    /// By id: the reservation and the GPUs its units hold (running, and
    /// placed by this pass).
    by_id: BTreeMap<&'s str, (&'s ReservedCapacity, u64)>,
    now: u64,
    /// [`crate::Policy::lend_reserved`].
    lend: bool,
}

impl<'s> Reserved<'s> {
    pub fn new(snapshot: &'s Snapshot, lend: bool) -> Reserved<'s> {
        let mut by_id: BTreeMap<&str, (&ReservedCapacity, u64)> = (snapshot.reserved.iter())
            .map(|r| (r.id.as_str(), (r, 0)))
            .collect();
        for r in &snapshot.running {
            if let Some(e) = r.reservation.as_deref().and_then(|id| by_id.get_mut(id)) {
                e.1 += r.gpu_count();
            }
        }
        Reserved {
            by_id,
            now: snapshot.now,
            lend,
        }
    }

    /// The reservation `id` if it is live now (started, not over).
    pub fn active(&self, id: &str) -> Option<&'s ReservedCapacity> {
        let (r, _) = self.by_id.get(id)?;
        (r.start <= self.now && !r.over(self.now)).then_some(*r)
    }

    /// Decides the owners' units (in queue order): placements, and waits;
    /// each unit decided is pushed to `placed_by` or `waited_by` alongside
    /// its placement or wait (what preemption reads them back with).
    pub fn place_units<'r>(
        &mut self,
        units: &[&'r Request],
        types: &mut BTreeMap<&str, TypeState>,
        (placements, placed_by): (&mut Vec<Placement>, &mut Vec<&'r Request>),
        (waits, waited_by): (&mut Vec<Waiting>, &mut Vec<&'r Request>),
    ) {
        for &req in units {
            match self.place_unit(req, types) {
                Ok(p) => {
                    placements.push(p);
                    placed_by.push(req);
                }
                Err(w) => {
                    waits.push(w);
                    waited_by.push(req);
                }
            }
        }
    }

    /// [`Self::place_units`] for one unit: where it starts, or why it waits.
    fn place_unit(
        &mut self,
        req: &Request,
        types: &mut BTreeMap<&str, TypeState>,
    ) -> Result<Placement, Waiting> {
        let id = req
            .reservation
            .as_deref()
            .expect("only reservations' units");
        let wait = |reason| Waiting {
            job: req.job.clone(),
            ranks: req.ranks.clone(),
            reason,
        };
        let unavailable = |detail: String| {
            wait(WaitReason::ReservationUnavailable {
                reservation: id.to_string(),
                detail,
            })
        };
        let Some(&(res, in_use)) = self.by_id.get(id) else {
            return Err(unavailable("no reservation with this id here".into()));
        };
        if res.tenant != req.tenant {
            return Err(unavailable("it is another tenant's".into()));
        }
        if res.gpu_type != req.gpu_type {
            return Err(unavailable(format!("it holds {} GPUs", res.gpu_type)));
        }
        if res.over(self.now) {
            let end = res.end.unwrap_or(0);
            return Err(unavailable(format!("it ended at t={end}s")));
        }
        if res.start > self.now {
            return Err(wait(WaitReason::ReservationNotStarted {
                reservation: id.to_string(),
                start: res.start,
            }));
        }
        let need = req.gpus();
        if in_use + need > u64::from(res.gpus) {
            return Err(wait(WaitReason::ReservationFull {
                reservation: id.to_string(),
                gpus: res.gpus,
                in_use: sat(in_use),
                requested: sat(need),
            }));
        }
        let Some(ts) = types.get_mut(req.gpu_type.as_str()) else {
            unreachable!("every queued type has a state")
        };
        match place_inside(&mut ts.index, res, req) {
            Some(p) => {
                self.by_id.get_mut(id).expect("found above").1 += need;
                Ok(p)
            }
            None => Err(wait(WaitReason::NoCapacity {
                required: req.required.min(res.level),
                free_gpus: ts.free_gpus(),
            })),
        }
    }

    /// Holds, for this round, each type's reservations' free GPUs beyond
    /// what their units use (the earliest-starting first); what is not free
    /// now is fenced on the units running in the domain that end first.
    pub fn hold(&self, types: &mut BTreeMap<&str, TypeState>, running: &[Running]) {
        let mut live: Vec<&(&ReservedCapacity, u64)> = (self.by_id.values())
            .filter(|(r, _)| !r.over(self.now))
            .collect();
        live.sort_by_key(|(r, _)| (r.start, r.id.as_str()));
        let mut per_type: BTreeMap<&str, usize> = BTreeMap::new();
        for &(res, in_use) in live {
            let Some(ts) = types.get_mut(res.gpu_type.as_str()) else {
                continue;
            };
            let n = per_type.entry(res.gpu_type.as_str()).or_default();
            if *n == MAX_CAPACITY_HOLDS {
                continue;
            }
            *n += 1;
            let inside: Vec<(&str, &[u32], u64)> = (running.iter())
                .filter(|r| r.gpu_type == res.gpu_type && r.reservation.as_deref() != Some(&res.id))
                .flat_map(|r| {
                    (r.gpus.iter())
                        .map(move |(node, gpus)| (node.as_str(), gpus.as_slice(), r.expected_end))
                })
                .collect();
            let protect = u64::from(res.gpus).saturating_sub(in_use);
            ts.hold_capacity(res, protect, self.lend, self.now, &inside);
        }
    }
}

/// What each tenant holds of each type's shared pool: the snapshot's
/// usage, less what runs in capacity reservations (GPUs of their own).
pub(crate) fn pool_usage(snapshot: &Snapshot) -> BTreeMap<(&str, &str), u64> {
    let mut usage: BTreeMap<(&str, &str), u64> = (snapshot.usage.iter())
        .map(|((t, g), &u)| ((t.as_str(), g.as_str()), u64::from(u)))
        .collect();
    for r in snapshot.running.iter().filter(|r| r.reservation.is_some()) {
        if let Some(u) = usage.get_mut(&(r.tenant.as_str(), r.gpu_type.as_str())) {
            *u = u.saturating_sub(r.gpu_count());
        }
    }
    usage
}

/// `req` placed inside `res`'s domain on the type's free GPUs there, the
/// index updated; `None` when it does not fit there now.
fn place_inside(index: &mut TypeIndex, res: &ReservedCapacity, req: &Request) -> Option<Placement> {
    // The domain's nodes as they are now, as a tree of their own.
    let inside: Vec<(u32, Node)> = (index.slots.iter().enumerate())
        .filter(|(_, slot)| res.holds(slot.node))
        .map(|(s, slot)| {
            let node = Node {
                free: slot.free_now().to_vec(),
                ..slot.node.clone()
            };
            (s as u32, node)
        })
        .collect();
    if inside.is_empty() {
        return None;
    }
    let mut sub = TypeIndex::build(
        (inside.iter().enumerate())
            .map(|(i, (_, n))| (i as u32, n))
            .collect(),
    );
    let workers = req.ranks.len() as u64;
    let gpw = req.gpus_per_worker;
    let (level, dom) = place::best_fit(&mut sub, workers, gpw, req.required, None)?;
    let picks = place::picks(&sub, level, dom, workers, gpw)?;
    let placement = place::commit(&mut sub, req, level, &picks);
    for w in &placement.workers {
        let (slot, _) = (inside.iter())
            .find(|(_, n)| n.id == w.node)
            .expect("placed inside the domain");
        index.remove(*slot, &w.gpus);
    }
    Some(placement)
}

fn sat(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[path = "reserved_tests.rs"]
mod tests;
