//! Where a job goes.
//!
//! Every region is ranked for a job by rendezvous (highest-random-weight)
//! hashing of the job id and the region's name: every replica computes the
//! same order without talking to anyone, and removing a region only moves
//! the jobs that ranked it first. A keyed create's id derives from (tenant,
//! key), so a retry ranks the regions the same way.

use uuid::Uuid;

pub use gangway_shared::ids::rendezvous;

/// A candidate region as the chooser sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub name: &'a str,
    /// (free, schedulable) GPUs of the job's type, if the region has any.
    pub capacity: Option<(u32, u32)>,
}

/// The region a new job should go to: in rendezvous order, the first that
/// has `gpus` free GPUs of the type now; else the first that could ever
/// hold the job; else the first (whose validation then says why not).
pub fn choose<'a>(job_id: Uuid, gpus: u32, candidates: &[Candidate<'a>]) -> Option<&'a str> {
    let order = rendezvous(job_id, candidates.iter().map(|c| c.name));
    let cap = |name: &str| {
        candidates
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.capacity)
    };
    order
        .iter()
        .find(|n| cap(n).is_some_and(|(free, _)| free >= gpus))
        .or_else(|| {
            order
                .iter()
                .find(|n| cap(n).is_some_and(|(_, total)| total >= gpus))
        })
        .or_else(|| order.first())
        .copied()
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

    #[test]
    fn choose_prefers_free_capacity_then_size_then_order() {
        let id = Uuid::from_u128(7);
        let order = rendezvous(id, REGIONS);
        let c = |name, capacity| Candidate { name, capacity };
        // Everyone has room: the first in order.
        let all: Vec<Candidate> = REGIONS.iter().map(|n| c(*n, Some((64, 64)))).collect();
        assert_eq!(choose(id, 8, &all), Some(order[0]));
        // Only the last in order has room now.
        let mut busy: Vec<Candidate> = order.iter().map(|n| c(*n, Some((0, 64)))).collect();
        busy[2].capacity = Some((16, 64));
        assert_eq!(choose(id, 8, &busy), Some(order[2]));
        // Nobody has room: the first that could ever hold it.
        let mut small: Vec<Candidate> = order.iter().map(|n| c(*n, Some((0, 8)))).collect();
        small[1].capacity = Some((0, 128));
        assert_eq!(choose(id, 64, &small), Some(order[1]));
        // Nobody has the type: the first, whose validation will say so.
        let none: Vec<Candidate> = order.iter().map(|n| c(*n, None)).collect();
        assert_eq!(choose(id, 8, &none), Some(order[0]));
    }
}
