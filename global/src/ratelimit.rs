//! Per-tenant token buckets. Each tenant has its own bucket, so one
//! tenant's burst never slows another. Limits are per replica: with N
//! replicas behind a balancer a tenant gets up to N times its limit.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};

use crate::config::RateLimit;

pub struct RateLimiter {
    default: RateLimit,
    overrides: BTreeMap<String, RateLimit>,
    buckets: Mutex<HashMap<String, Arc<DefaultDirectRateLimiter>>>,
    clock: DefaultClock,
}

fn quota(limit: RateLimit) -> Quota {
    let per_second = NonZeroU32::new(limit.per_second.max(1)).expect("max(1) is non-zero");
    let burst = NonZeroU32::new(limit.burst.max(1)).expect("max(1) is non-zero");
    Quota::per_second(per_second).allow_burst(burst)
}

impl RateLimiter {
    pub fn new(default: RateLimit, overrides: BTreeMap<String, RateLimit>) -> Self {
        RateLimiter {
            default,
            overrides,
            buckets: Mutex::new(HashMap::new()),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one request from `key`'s bucket, or says how long to wait.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        let bucket = {
            let mut buckets = self.buckets.lock().expect("rate limiter lock");
            buckets
                .entry(key.to_string())
                .or_insert_with(|| {
                    let limit = self.overrides.get(key).copied().unwrap_or(self.default);
                    Arc::new(DefaultDirectRateLimiter::direct(quota(limit)))
                })
                .clone()
        };
        bucket
            .check()
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tenants_burst_leaves_another_alone() {
        let rl = RateLimiter::new(
            RateLimit {
                per_second: 1,
                burst: 3,
            },
            BTreeMap::from([(
                "big".to_string(),
                RateLimit {
                    per_second: 1,
                    burst: 10,
                },
            )]),
        );
        for _ in 0..3 {
            rl.check("acme").unwrap();
        }
        let wait = rl.check("acme").unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        rl.check("globex").unwrap();
        for _ in 0..10 {
            rl.check("big").unwrap();
        }
        assert!(rl.check("big").is_err());
    }
}
