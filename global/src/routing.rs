//! Where a job goes.
//!
//! Every region is ranked for a job by rendezvous (highest-random-weight)
//! hashing of the job id and the region's name: every replica computes the
//! same order without talking to anyone, and removing a region only moves
//! the jobs that ranked it first. A keyed create's id derives from (tenant,
//! key), so a retry ranks the regions the same way.

use uuid::Uuid;

pub use gangway_shared::ids::rendezvous;

/// A region's capacity of one GPU type, as the chooser sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    /// GPUs free now.
    pub free: u32,
    /// GPUs that may take work at all.
    pub schedulable: u32,
    /// GPUs asked by jobs waiting there (its queue, and what this replica
    /// sent it since it last said).
    pub backlog: u32,
}

impl Capacity {
    /// Free GPUs the waiting jobs do not already claim.
    fn room(&self) -> u32 {
        self.free.saturating_sub(self.backlog)
    }

    /// How long its queue is for its size: the backlog per schedulable GPU.
    fn load(&self) -> f64 {
        self.backlog as f64 / self.schedulable.max(1) as f64
    }
}

/// A candidate region as the chooser sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub name: &'a str,
    /// Its capacity of the job's type, if it has any.
    pub capacity: Option<Capacity>,
}

/// The region a new job should go to: in rendezvous order, the first with
/// room for `gpus` GPUs of the type now (free GPUs its waiting jobs do not
/// claim); else, of those that could ever hold the job, the one whose
/// queue is shortest for its size (the first in order among equals), so
/// that in a burst, when every region is full, waiting work — above all
/// the large gangs that wait longest — spreads over the regions instead of
/// piling up where the hash happened to send it; else the first (whose
/// validation then says why not).
pub fn choose<'a>(job_id: Uuid, gpus: u32, candidates: &[Candidate<'a>]) -> Option<&'a str> {
    let order = rendezvous(job_id, candidates.iter().map(|c| c.name));
    let cap = |name: &str| {
        candidates
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.capacity)
    };
    let fits = order
        .iter()
        .filter_map(|n| Some((*n, cap(n)?)))
        .filter(|(_, c)| c.schedulable >= gpus);
    order
        .iter()
        .find(|n| cap(n).is_some_and(|c| c.room() >= gpus))
        .copied()
        .or_else(|| {
            fits.min_by(|(_, a), (_, b)| a.load().total_cmp(&b.load()))
                .map(|(n, _)| n)
        })
        .or_else(|| order.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGIONS: [&str; 3] = ["us-east", "us-west", "eu-central"];

    #[test]
    fn the_order_is_stable_and_spreads_jobs() {
        let id = Uuid::from_u128(42);
        assert_eq!(rendezvous(id, REGIONS), rendezvous(id, REGIONS));
        let mut firsts = std::collections::BTreeMap::new();
        for i in 0..3000u128 {
            *firsts
                .entry(rendezvous(Uuid::from_u128(i * 7919), REGIONS)[0])
                .or_insert(0) += 1;
        }
        for r in REGIONS {
            assert!(firsts[r] > 800, "{r} got {} of 3000", firsts[r]);
        }
    }

    #[test]
    fn removing_a_region_moves_only_its_jobs() {
        for i in 0..500u128 {
            let id = Uuid::from_u128(i * 104_729);
            let all = rendezvous(id, REGIONS);
            let without: Vec<&str> = REGIONS
                .iter()
                .copied()
                .filter(|r| *r != "us-west")
                .collect();
            let fewer = rendezvous(id, without);
            if all[0] != "us-west" {
                assert_eq!(fewer[0], all[0]);
            }
        }
    }

    fn cap(free: u32, schedulable: u32, backlog: u32) -> Option<Capacity> {
        Some(Capacity {
            free,
            schedulable,
            backlog,
        })
    }

    #[test]
    fn choose_prefers_room_then_the_shortest_queue_then_order() {
        let id = Uuid::from_u128(7);
        let order = rendezvous(id, REGIONS);
        let c = |name, capacity| Candidate { name, capacity };
        // Everyone has room: the first in order.
        let all: Vec<Candidate> = REGIONS.iter().map(|n| c(*n, cap(64, 64, 0))).collect();
        assert_eq!(choose(id, 8, &all), Some(order[0]));
        // Only the last in order has room now.
        let mut busy: Vec<Candidate> = order.iter().map(|n| c(*n, cap(0, 64, 0))).collect();
        busy[2].capacity = cap(16, 64, 0);
        assert_eq!(choose(id, 8, &busy), Some(order[2]));
        // Free GPUs that waiting jobs claim are no room.
        busy[2].capacity = cap(16, 64, 16);
        busy[1].capacity = cap(8, 64, 0);
        assert_eq!(choose(id, 8, &busy), Some(order[1]));
        // Nobody has room: the shortest queue for its size among those
        // that could hold the job, the first in order among equals.
        let full: Vec<Candidate> = order.iter().map(|n| c(*n, cap(0, 128, 64))).collect();
        assert_eq!(choose(id, 64, &full), Some(order[0]));
        let mut queues = full.clone();
        queues[0].capacity = cap(0, 128, 512);
        queues[1].capacity = cap(0, 256, 256); // a longer queue, but twice the size
        queues[2].capacity = cap(0, 32, 0); // too small for the job
        assert_eq!(choose(id, 64, &queues), Some(order[1]));
        // Nobody has the type: the first, whose validation will say so.
        let none: Vec<Candidate> = order.iter().map(|n| c(*n, None)).collect();
        assert_eq!(choose(id, 8, &none), Some(order[0]));
    }

    #[test]
    fn in_a_burst_big_gangs_spread_over_full_regions() {
        // Three full regions of 10,240 GPUs; 30 gangs of 2,048 GPUs come in
        // while none has room. Hashing alone sends them where it happens
        // to; weighing the queues sends each region a third.
        let mut backlog = [0u32; 3];
        for i in 0..30u128 {
            let candidates: Vec<Candidate> = REGIONS
                .iter()
                .zip(backlog)
                .map(|(name, b)| Candidate {
                    name,
                    capacity: cap(100, 10_240, b),
                })
                .collect();
            let to = choose(Uuid::from_u128(i * 7919 + 1), 2048, &candidates).unwrap();
            backlog[REGIONS.iter().position(|r| *r == to).unwrap()] += 2048;
        }
        assert_eq!(backlog, [10 * 2048; 3], "{backlog:?}");
    }
}
