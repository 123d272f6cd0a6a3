//! Gangway's queue order: priority classes, then fair sharing between
//! tenants, re-evaluated after every decision of the pass.
//!
//! Units with victims in flight (they preempted, and wait for the victims
//! to stop) come before every class: the GPUs their victims free are
//! theirs, not the next class's. Without that, a unit that reclaimed for
//! its tenant's guarantee watched a higher class (often the victims
//! themselves, requeued) take what it freed, and reclaimed again.
//!
//! Within a priority class the next unit comes from the tenant fair sharing
//! favours now: first tenants holding less than their guarantee of the
//! unit's GPU type, then the lowest weighted dominant share, then the oldest
//! unit. A tenant's dominant share is its largest share of any GPU type's
//! capacity, counting what it holds now (what this pass has started and
//! reserved included) plus its decayed past usage ([`Share::history`]),
//! divided by its weight. Each tenant's own units keep queue order.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::types::{Request, Share, Snapshot};

/// The order of one round's units, drawn one at a time.
///
/// Between two draws only the tenant of the unit drawn last may have had
/// its usage change (the round starts or reserves that unit, nothing
/// else): so a draw computes that tenant's key again and reuses every
/// other tenant's, O(tenants) comparisons a draw rather than O(tenants ×
/// types) map lookups (at 50,000 queued units, keys were a fifth of a pass).
pub(crate) struct FairOrder<'r> {
    /// Priority classes, highest first, each with its tenants' queues.
    classes: VecDeque<Vec<TenantQueue<'r>>>,
    /// GPUs of each type in the region (every node of the snapshot).
    capacity: BTreeMap<&'r str, u64>,
}

struct TenantQueue<'r> {
    tenant: &'r str,
    /// Its key as of the last draw; `None` until computed, and after one of
    /// its units is drawn.
    key: Option<Key<'r>>,
    /// In queue order, each with what its key needs, side by side (the
    /// units themselves are scattered in memory: reading each head's
    /// fields was most of a draw's time).
    units: VecDeque<Entry<'r>>,
    /// The GPU types it queues for here (`Entry::ty` indexes them), each
    /// with the tenant's guarantee of it.
    queued: Vec<(&'r str, u32)>,
    /// Every GPU type the tenant holds, queues for or has terms for, with
    /// its terms.
    types: Vec<(&'r str, Share)>,
}

/// One unit of a tenant's queue.
struct Entry<'r> {
    unit: &'r Request,
    seq: u64,
    /// Its type's index in [`TenantQueue::queued`].
    ty: u16,
}

/// A unit drawn, with its tenant and GPU type as strings the order holds
/// (the same for every unit of a tenant and type: map lookups keyed by them
/// compare strings already in the cache).
pub(crate) struct Drawn<'r> {
    pub unit: &'r Request,
    pub tenant: &'r str,
    pub ty: &'r str,
}

impl<'r> FairOrder<'r> {
    /// `units` in queue order (priority, then age); `size_aging_s` as
    /// [`crate::Policy::size_aging_s`]; `owed`: the jobs with victims in
    /// flight, drawn before every class.
    pub fn new(
        snapshot: &'r Snapshot,
        units: &[&'r Request],
        size_aging_s: u64,
        owed: &BTreeSet<&str>,
    ) -> FairOrder<'r> {
        let capacity = snapshot.gpus_by_type();
        let mut classes: VecDeque<Vec<TenantQueue<'r>>> = VecDeque::new();
        // (owed, priority) of the class being filled.
        let mut current: Option<(bool, i32)> = None;
        // The current class's queue of each tenant.
        let mut queue_of: HashMap<&str, usize> = HashMap::new();
        let is_owed = |u: &Request| !owed.is_empty() && owed.contains(u.job.as_str());
        let first = units.iter().filter(|u| is_owed(u));
        for &u in first.chain(units.iter().filter(|u| !is_owed(u))) {
            let class_of = (is_owed(u), u.priority);
            if current != Some(class_of) {
                current = Some(class_of);
                classes.push_back(Vec::new());
                queue_of.clear();
            }
            let class = classes.back_mut().expect("just pushed");
            let q = match queue_of.get(u.tenant.as_str()) {
                Some(&i) => &mut class[i],
                None => {
                    queue_of.insert(u.tenant.as_str(), class.len());
                    class.push(TenantQueue {
                        tenant: u.tenant.as_str(),
                        key: None,
                        units: VecDeque::new(),
                        queued: Vec::new(),
                        types: Vec::new(),
                    });
                    class.last_mut().expect("just pushed")
                }
            };
            let ty = match q.queued.iter().position(|(t, _)| *t == u.gpu_type) {
                Some(i) => i,
                None => {
                    q.queued.push((u.gpu_type.as_str(), 0));
                    q.queued.len() - 1
                }
            };
            q.units.push_back(Entry {
                unit: u,
                seq: u.seq,
                ty: u16::try_from(ty).expect("fewer than 65,536 GPU types"),
            });
        }
        // Every type each tenant holds, queues for (in any class) or has
        // terms for, with its terms.
        let mut types: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (t, g) in snapshot.usage.keys().chain(snapshot.shares.keys()) {
            types.entry(t.as_str()).or_default().insert(g.as_str());
        }
        for q in classes.iter().flatten() {
            let of = types.entry(q.tenant).or_default();
            of.extend(q.queued.iter().map(|&(t, _)| t));
        }
        for q in classes.iter_mut().flatten() {
            q.types = types[q.tenant]
                .iter()
                .map(|&g| {
                    let terms = snapshot
                        .shares
                        .get(&(q.tenant.to_string(), g.to_string()))
                        .copied()
                        .unwrap_or_default();
                    (g, terms)
                })
                .collect();
            for (ty, guaranteed) in q.queued.iter_mut() {
                *guaranteed = (q.types.iter())
                    .find(|(t, _)| t == ty)
                    .map_or(0, |(_, s)| s.guaranteed);
            }
        }
        if size_aging_s > 0 {
            for class in classes.iter_mut() {
                for q in class.iter_mut() {
                    // A stable sort: equal ranks keep queue order.
                    q.units
                        .make_contiguous()
                        .sort_by_cached_key(|e| size_rank(e.unit, snapshot.now, size_aging_s));
                }
            }
        }
        FairOrder { classes, capacity }
    }

    /// The next unit, given what tenants hold now.
    pub fn next(&mut self, usage: &BTreeMap<(&str, &str), u64>) -> Option<Drawn<'r>> {
        loop {
            let class = self.classes.front_mut()?;
            if class.is_empty() {
                self.classes.pop_front();
                continue;
            }
            let mut best: Option<(usize, Key<'r>)> = None;
            for (i, q) in class.iter_mut().enumerate() {
                let key = match q.key {
                    Some(k) => k,
                    None => {
                        let k = key(q, usage, &self.capacity);
                        q.key = Some(k);
                        k
                    }
                };
                debug_assert_eq!(key, self::key(q, usage, &self.capacity), "a stale key");
                if best.as_ref().is_none_or(|(_, b)| key < *b) {
                    best = Some((i, key));
                }
            }
            let (i, _) = best.expect("a non-empty class");
            let q = &mut class[i];
            let e = q.units.pop_front().expect("queues are never empty");
            let drawn = Drawn {
                unit: e.unit,
                tenant: q.tenant,
                ty: q.queued[usize::from(e.ty)].0,
            };
            // Its head and its tenant's usage change: computed again next draw.
            q.key = None;
            if q.units.is_empty() {
                class.swap_remove(i);
            }
            return Some(drawn);
        }
    }
}

/// A unit's rank within its tenant's queue: the power of two of its
/// estimated GPU-seconds (unknown: last), less one per `aging_s` waited.
fn size_rank(unit: &Request, now: u64, aging_s: u64) -> i64 {
    let size = match unit.estimated_duration_s {
        0 => 64,
        d => i64::from(63 - unit.gpus().saturating_mul(d).max(1).leading_zeros() as i32),
    };
    let waited = now.saturating_sub(unit.submitted) / aging_s;
    size - i64::try_from(waited).unwrap_or(i64::MAX / 2)
}

/// Smaller goes first: under its guarantee, dominant share, unit age, tenant.
type Key<'r> = (bool, u128, u64, &'r str);

fn key<'r>(
    q: &TenantQueue<'r>,
    usage: &BTreeMap<(&str, &str), u64>,
    capacity: &BTreeMap<&str, u64>,
) -> Key<'r> {
    let head = q.units.front().expect("queues are never empty");
    let held = |ty: &str| usage.get(&(q.tenant, ty)).copied().unwrap_or(0);
    let (ty, guaranteed) = q.queued[usize::from(head.ty)];
    let under = held(ty) < u64::from(guaranteed);
    let mut dominant: u128 = 0;
    for &(ty, s) in &q.types {
        let cap = capacity.get(ty).copied().unwrap_or(0);
        if cap == 0 {
            continue;
        }
        // (held + history) / (capacity × weight), in fixed point.
        let amount = u128::from(held(ty)) * 1000 + u128::from(s.history);
        let v = amount * 1_000_000_000 / (u128::from(cap) * u128::from(s.weight()));
        dominant = dominant.max(v);
    }
    (!under, dominant, head.seq, q.tenant)
}
