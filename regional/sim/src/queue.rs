//! The waiting units of one run, and the window of them each pass sees.
//!
//! The core is shown the first `cap` units in queue order (priority, then
//! seq, then job index) and, beyond those, each tenant's first `per_tenant`
//! units; the rest wait beyond the window and move in as units leave it. The
//! per-tenant part keeps fair sharing honest: with a plain window, a tenant
//! whose units arrived after a large burst of another's would be invisible
//! to the core, however far below its entitlement it is, until the burst
//! drained. The window's requests are kept between passes (lent to the
//! snapshot for each pass, then taken back), so a pass costs no rebuilding.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::Request;

/// Queue order: priority (high first), then seq, then job index.
pub(crate) type QKey = (Reverse<i32>, u64, u32);

/// A set split into its first `n` keys and the rest.
#[derive(Default)]
struct Split {
    first: BTreeSet<QKey>,
    rest: BTreeSet<QKey>,
}

impl Split {
    /// Inserts `key`. Returns whether it is among the first `n`, and the key
    /// it pushed out of them.
    fn insert(&mut self, n: usize, key: QKey) -> (bool, Option<QKey>) {
        if n == 0 {
            self.rest.insert(key);
            return (false, None);
        }
        if self.first.len() < n {
            // The first part is only short when nothing is beyond it.
            self.first.insert(key);
            return (true, None);
        }
        if self.first.last().is_some_and(|last| key < *last) {
            self.first.insert(key);
            let out = self.first.pop_last().expect("the first part is full");
            self.rest.insert(out);
            return (true, Some(out));
        }
        self.rest.insert(key);
        (false, None)
    }

    /// Removes `key`. Returns the key that moved into the first part in its
    /// place.
    fn remove(&mut self, key: &QKey) -> Option<QKey> {
        if self.first.remove(key) {
            let next = self.rest.pop_first()?;
            self.first.insert(next);
            Some(next)
        } else {
            self.rest.remove(key);
            None
        }
    }

    fn len(&self) -> usize {
        self.first.len() + self.rest.len()
    }
}

pub(crate) struct Queue {
    cap: usize,
    per_tenant: usize,
    /// Every waiting unit, split at `cap`.
    all: Split,
    /// Per tenant index, its waiting units split at `per_tenant`.
    tenants: Vec<Split>,
    /// Tenant index of each job.
    tenant_of: Vec<u32>,
    /// Requests of the units beyond the window.
    beyond: BTreeMap<QKey, (Request, u64)>,
    /// The window's requests, in no particular order (the core sorts).
    pub requests: Vec<Request>,
    /// The job index of each entry of `requests`.
    jobs: Vec<u32>,
    /// GPUs of each entry of `requests`.
    gpus: Vec<u64>,
    /// Per job: its position in `requests` (u32::MAX: not in the window).
    pos: Vec<u32>,
    /// How many windowed units need each GPU count.
    sizes: BTreeMap<u64, u32>,
}

impl Queue {
    /// A queue for jobs whose tenants (by job index) are `tenant_of`.
    pub fn new(cap: usize, per_tenant: usize, tenant_of: Vec<u32>) -> Queue {
        let tenants = tenant_of.iter().map(|&t| t as usize + 1).max().unwrap_or(0);
        Queue {
            cap: cap.max(1),
            per_tenant,
            all: Split::default(),
            tenants: (0..tenants).map(|_| Split::default()).collect(),
            pos: vec![u32::MAX; tenant_of.len()],
            tenant_of,
            beyond: BTreeMap::new(),
            requests: Vec::new(),
            jobs: Vec::new(),
            gpus: Vec::new(),
            sizes: BTreeMap::new(),
        }
    }

    /// Units waiting, in the window and beyond.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Units in the window.
    #[cfg(test)]
    pub fn window_len(&self) -> usize {
        self.requests.len()
    }

    /// The fewest GPUs any windowed unit needs.
    pub fn min_gpus(&self) -> Option<u64> {
        self.sizes.keys().next().copied()
    }

    /// Whether the unit with this key is in the window now.
    pub fn windowed(&self, key: &QKey) -> bool {
        self.all.first.contains(key) || self.tenant(key).first.contains(key)
    }

    fn tenant(&self, key: &QKey) -> &Split {
        &self.tenants[self.tenant_of[key.2 as usize] as usize]
    }

    /// Queues a unit. Returns true when it entered the window (pushing
    /// another unit beyond it when that one is no longer among the first
    /// overall nor among its tenant's first).
    pub fn push(&mut self, key: QKey, req: Request, gpus: u64) -> bool {
        let t = self.tenant_of[key.2 as usize] as usize;
        let (in_all, out_all) = self.all.insert(self.cap, key);
        let (in_tenant, out_tenant) = self.tenants[t].insert(self.per_tenant, key);
        if in_all || in_tenant {
            self.enter(key, req, gpus);
        } else {
            self.beyond.insert(key, (req, gpus));
        }
        for out in [out_all, out_tenant].into_iter().flatten() {
            if !self.windowed(&out) && self.pos[out.2 as usize] != u32::MAX {
                let entry = self.take(out.2);
                self.beyond.insert(out, entry);
            }
        }
        in_all || in_tenant
    }

    /// The request of a unit beyond the window (`None` for one in it, or
    /// not queued): the region shows a job owed what its victims free
    /// whatever its place, and so does the simulator.
    pub fn beyond_request(&self, key: &QKey) -> Option<&Request> {
        self.beyond.get(key).map(|(req, _)| req)
    }

    /// Removes the units of `placed` jobs (with their keys), in the window
    /// or shown beyond it; units that move into the window in their place
    /// go to `entered`.
    pub fn remove(&mut self, placed: &BTreeMap<u32, QKey>, entered: &mut Vec<u32>) {
        for (&job, key) in placed {
            if self.pos[job as usize] == u32::MAX {
                self.beyond.remove(key);
            } else {
                self.take(job);
            }
            let t = self.tenant_of[job as usize] as usize;
            let promoted = [self.all.remove(key), self.tenants[t].remove(key)];
            for p in promoted.into_iter().flatten() {
                if self.windowed(&p) {
                    if let Some((req, gpus)) = self.beyond.remove(&p) {
                        self.enter(p, req, gpus);
                        entered.push(p.2);
                    }
                }
            }
        }
    }

    fn enter(&mut self, key: QKey, req: Request, gpus: u64) {
        self.pos[key.2 as usize] = self.requests.len() as u32;
        self.requests.push(req);
        self.jobs.push(key.2);
        self.gpus.push(gpus);
        *self.sizes.entry(gpus).or_insert(0) += 1;
    }

    /// Takes a windowed job's request out of the window.
    fn take(&mut self, job: u32) -> (Request, u64) {
        let at = std::mem::replace(&mut self.pos[job as usize], u32::MAX) as usize;
        self.jobs.swap_remove(at);
        if let Some(&moved) = self.jobs.get(at) {
            self.pos[moved as usize] = at as u32;
        }
        let gpus = self.gpus.swap_remove(at);
        match self.sizes.get_mut(&gpus) {
            Some(1) => {
                self.sizes.remove(&gpus);
            }
            Some(n) => *n -= 1,
            None => unreachable!("sizes count every windowed unit"),
        }
        (self.requests.swap_remove(at), gpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(job: u32) -> Request {
        Request {
            job: format!("j{job}"),
            ranks: vec![0],
            tenant: String::new(),
            gpu_type: "g".into(),
            gpus_per_worker: 1,
            required: gangway_sched::Level::Region,
            preferred: gangway_sched::Level::Nvlink,
            priority: 1,
            seq: u64::from(job),
            estimated_duration_s: 1,
            min_workers: 0,
            submitted: 0,
            reservation: None,
        }
    }

    fn key(job: u32) -> QKey {
        (Reverse(1), u64::from(job), job)
    }

    fn window(q: &Queue) -> Vec<u32> {
        let mut w = q.jobs.clone();
        w.sort_unstable();
        w
    }

    #[test]
    fn each_tenant_keeps_its_first_units_in_the_window() {
        // Jobs 0..6 of tenant 0, then 6..8 of tenant 1; the first 3 overall
        // plus each tenant's first 1.
        let tenant_of = vec![0, 0, 0, 0, 0, 0, 1, 1];
        let mut q = Queue::new(3, 1, tenant_of.clone());
        for j in 0..8 {
            let entered = q.push(key(j), req(j), 1);
            assert_eq!(entered, j < 3 || j == 6, "job {j}");
        }
        assert_eq!(window(&q), vec![0, 1, 2, 6]);
        assert_eq!((q.len(), q.window_len()), (8, 4));
        // Placing 0 and 6 brings in 3 (overall) and 7 (tenant 1's first).
        let placed = [(0, key(0)), (6, key(6))].into_iter().collect();
        let mut entered = Vec::new();
        q.remove(&placed, &mut entered);
        entered.sort_unstable();
        assert_eq!(entered, vec![3, 7]);
        assert_eq!(window(&q), vec![1, 2, 3, 7]);
        // An older unit of tenant 0 pushes 3 out of the first three overall
        // and 1 out of tenant 0's first: 3 leaves the window, 1 stays (still
        // among the first three overall), 7 stays (tenant 1's first).
        let k = (Reverse(1), 0, 5);
        let mut q2 = Queue::new(3, 1, tenant_of);
        for j in [1, 2, 3, 7] {
            q2.push(key(j), req(j), 1);
        }
        assert_eq!(window(&q2), vec![1, 2, 3, 7]);
        let mut r = req(5);
        r.seq = 0;
        assert!(q2.push(k, r, 1));
        assert_eq!(window(&q2), vec![1, 2, 5, 7]);
    }

    #[test]
    fn a_unit_beyond_the_window_can_be_shown_and_placed() {
        // (A job owed what its victims free is shown whatever the window.)
        let mut q = Queue::new(1, 0, vec![0; 3]);
        for j in 0..3 {
            q.push(key(j), req(j), 1);
        }
        assert_eq!(window(&q), vec![0]);
        assert!(q.beyond_request(&key(0)).is_none(), "in the window");
        assert_eq!(
            q.beyond_request(&key(2)).map(|r| r.job.as_str()),
            Some("j2")
        );
        // Placed from beyond: it leaves the queue, the window stays.
        let mut entered = Vec::new();
        q.remove(&[(2, key(2))].into_iter().collect(), &mut entered);
        assert!(entered.is_empty());
        assert_eq!((q.len(), window(&q)), (2, vec![0]));
        assert!(q.beyond_request(&key(2)).is_none());
        // And the next in line still moves in when the window's unit goes.
        q.remove(&[(0, key(0))].into_iter().collect(), &mut entered);
        assert_eq!((entered, window(&q)), (vec![1], vec![1]));
    }

    #[test]
    fn without_a_tenant_part_the_window_is_the_first_units() {
        let mut q = Queue::new(2, 0, vec![0; 5]);
        for j in (0..5).rev() {
            q.push(key(j), req(j), u64::from(j) + 1);
        }
        assert_eq!(window(&q), vec![0, 1]);
        assert_eq!(q.min_gpus(), Some(1));
        let placed = [(0, key(0))].into_iter().collect();
        let mut entered = Vec::new();
        q.remove(&placed, &mut entered);
        assert_eq!(entered, vec![2]);
        assert_eq!(q.min_gpus(), Some(2));
        assert!(q.windowed(&key(2)) && !q.windowed(&key(3)));
    }
}
