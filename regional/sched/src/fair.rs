//! Gangway's queue order: priority classes, then fair sharing between
//! tenants, re-evaluated after every decision of the pass.
//!
//! Within a priority class the next unit comes from the tenant fair sharing
//! favours now: first tenants holding less than their guarantee of the
//! unit's GPU type, then the lowest weighted dominant share, then the oldest
//! unit. A tenant's dominant share is its largest share of any GPU type's
//! capacity, counting what it holds now (what this pass has started and
//! reserved included) plus its decayed past usage ([`Share::history`]),
//! divided by its weight. Each tenant's own units keep queue order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::types::{Request, Share, Snapshot};

/// The order of one round's units, drawn one at a time.
pub(crate) struct FairOrder<'r> {
    /// Priority classes, highest first, each with its tenants' queues.
    classes: VecDeque<Vec<TenantQueue<'r>>>,
    /// GPUs of each type in the region (every node of the snapshot).
    capacity: BTreeMap<&'r str, u64>,
}

struct TenantQueue<'r> {
    tenant: &'r str,
    /// In queue order.
    units: VecDeque<&'r Request>,
    /// Every GPU type the tenant holds, queues for or has terms for, with
    /// its terms.
    types: Vec<(&'r str, Share)>,
}

impl<'r> FairOrder<'r> {
    /// `units` in queue order (priority, then age); `size_aging_s` as
    /// [`crate::Policy::size_aging_s`].
    pub fn new(snapshot: &'r Snapshot, units: &[&'r Request], size_aging_s: u64) -> FairOrder<'r> {
        let capacity = snapshot.gpus_by_type();
        let mut types: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (t, g) in snapshot.usage.keys().chain(snapshot.shares.keys()) {
            types.entry(t.as_str()).or_default().insert(g.as_str());
        }
        for u in units {
            types
                .entry(u.tenant.as_str())
                .or_default()
                .insert(u.gpu_type.as_str());
        }
        let mut classes: VecDeque<Vec<TenantQueue<'r>>> = VecDeque::new();
        let mut current: Option<i32> = None;
        for &u in units {
            if current != Some(u.priority) {
                current = Some(u.priority);
                classes.push_back(Vec::new());
            }
            let class = classes.back_mut().expect("just pushed");
            match class.iter_mut().find(|q| q.tenant == u.tenant) {
                Some(q) => q.units.push_back(u),
                None => class.push(TenantQueue {
                    tenant: u.tenant.as_str(),
                    units: VecDeque::from([u]),
                    types: types[u.tenant.as_str()]
                        .iter()
                        .map(|&g| {
                            let terms = snapshot
                                .shares
                                .get(&(u.tenant.clone(), g.to_string()))
                                .copied()
                                .unwrap_or_default();
                            (g, terms)
                        })
                        .collect(),
                }),
            }
        }
        if size_aging_s > 0 {
            for class in classes.iter_mut() {
                for q in class.iter_mut() {
                    // A stable sort: equal ranks keep queue order.
                    q.units
                        .make_contiguous()
                        .sort_by_cached_key(|u| size_rank(u, snapshot.now, size_aging_s));
                }
            }
        }
        FairOrder { classes, capacity }
    }

    /// The next unit, given what tenants hold now.
    pub fn next(&mut self, usage: &BTreeMap<(&str, &str), u64>) -> Option<&'r Request> {
        loop {
            let class = self.classes.front_mut()?;
            if class.is_empty() {
                self.classes.pop_front();
                continue;
            }
            let mut best: Option<(usize, Key<'r>)> = None;
            for (i, q) in class.iter().enumerate() {
                let key = key(q, usage, &self.capacity);
                if best.as_ref().is_none_or(|(_, b)| key < *b) {
                    best = Some((i, key));
                }
            }
            let (i, _) = best.expect("a non-empty class");
            let q = &mut class[i];
            let unit = q.units.pop_front().expect("queues are never empty");
            if q.units.is_empty() {
                class.swap_remove(i);
            }
            return Some(unit);
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
    let unit = q.units.front().expect("queues are never empty");
    let held = |ty: &str| usage.get(&(q.tenant, ty)).copied().unwrap_or(0);
    let guaranteed = (q.types.iter())
        .find(|(ty, _)| *ty == unit.gpu_type)
        .map_or(0, |(_, s)| s.guaranteed);
    let under = held(&unit.gpu_type) < u64::from(guaranteed);
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
    (!under, dominant, unit.seq, q.tenant)
}
