//! The waiting units of one run, and the window of them each pass sees.
//!
//! The core is shown at most `cap` units, the first in queue order
//! (priority, then seq, then job index); the rest wait beyond the window and
//! move in as units leave it. The window's requests are kept between passes
//! (lent to the snapshot for each pass, then taken back), so a pass costs no
//! rebuilding.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use gangway_sched::Request;

/// Queue order: priority (high first), then seq, then job index.
pub(crate) type QKey = (Reverse<i32>, u64, u32);

pub(crate) struct Queue {
    cap: usize,
    keys: BTreeSet<QKey>,
    /// The window's requests, in no particular order (the core sorts).
    pub requests: Vec<Request>,
    /// The job index of each entry of `requests`.
    jobs: Vec<u32>,
    /// GPUs of each entry of `requests`.
    gpus: Vec<u64>,
    /// How many windowed units need each GPU count.
    sizes: BTreeMap<u64, u32>,
    overflow: BTreeMap<QKey, (Request, u64)>,
}

impl Queue {
    pub fn new(cap: usize) -> Queue {
        Queue {
            cap: cap.max(1),
            keys: BTreeSet::new(),
            requests: Vec::new(),
            jobs: Vec::new(),
            gpus: Vec::new(),
            sizes: BTreeMap::new(),
            overflow: BTreeMap::new(),
        }
    }

    /// Units waiting, in the window and beyond.
    pub fn len(&self) -> usize {
        self.keys.len() + self.overflow.len()
    }

    /// The fewest GPUs any windowed unit needs.
    pub fn min_gpus(&self) -> Option<u64> {
        self.sizes.keys().next().copied()
    }

    /// Queues a unit. Returns true when it entered the window (pushing the
    /// window's last unit beyond it when full).
    pub fn push(&mut self, key: QKey, req: Request, gpus: u64) -> bool {
        let full = self.keys.len() >= self.cap;
        if full && self.keys.last().is_some_and(|last| key > *last) {
            self.overflow.insert(key, (req, gpus));
            return false;
        }
        self.enter(key, req, gpus);
        if full {
            let evicted = self.keys.pop_last().expect("the window is not empty");
            let at = self
                .jobs
                .iter()
                .rposition(|&j| j == evicted.2)
                .expect("a windowed unit has a request");
            let (req, gpus) = self.take(at);
            self.overflow.insert(evicted, (req, gpus));
        }
        true
    }

    fn enter(&mut self, key: QKey, req: Request, gpus: u64) {
        self.keys.insert(key);
        self.requests.push(req);
        self.jobs.push(key.2);
        self.gpus.push(gpus);
        *self.sizes.entry(gpus).or_insert(0) += 1;
    }

    fn take(&mut self, at: usize) -> (Request, u64) {
        self.jobs.swap_remove(at);
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

    /// Removes the windowed units of `placed` jobs (with their keys).
    pub fn remove(&mut self, placed: &BTreeMap<u32, QKey>) {
        let mut at = 0;
        while at < self.jobs.len() {
            if let Some(key) = placed.get(&self.jobs[at]) {
                self.keys.remove(key);
                self.take(at);
            } else {
                at += 1;
            }
        }
    }

    /// Moves units from beyond the window into it while it has room; their
    /// jobs go to `entered`.
    pub fn top_up(&mut self, entered: &mut Vec<u32>) {
        while self.keys.len() < self.cap {
            let Some((key, (req, gpus))) = self.overflow.pop_first() else {
                break;
            };
            entered.push(key.2);
            self.enter(key, req, gpus);
        }
    }

    /// Whether `job` is in the window now.
    pub fn windowed(&self, key: &QKey) -> bool {
        self.keys.contains(key)
    }
}
