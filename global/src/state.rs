//! What every request handler of the global tier shares: the tenants'
//! token verifier, the rate limiter, the regions (and what the tier last
//! heard of each), and which regions each tenant may use. Stateless
//! otherwise: any replica answers any call.

use std::sync::Arc;

use gangway_auth::jwt::Verifier;

use crate::config::{GlobalConfig, TENANT_AUDIENCE, TENANT_ISSUER};
use crate::ratelimit::RateLimiter;
use crate::regions::Regions;

#[derive(Clone)]
pub struct GlobalState {
    pub verifier: Verifier,
    pub rate_limiter: Arc<RateLimiter>,
    pub regions: Arc<Regions>,
    /// Regions each listed tenant may use; tenants not listed may use all.
    pub tenant_regions: Arc<std::collections::BTreeMap<String, Vec<String>>>,
}

impl GlobalState {
    pub fn new(config: GlobalConfig) -> anyhow::Result<Self> {
        let verifier = Verifier::new(TENANT_ISSUER, TENANT_AUDIENCE, &config.tenant_keys)
            .map_err(|e| anyhow::anyhow!("tenant verification keys: {e}"))?;
        Ok(GlobalState {
            verifier,
            rate_limiter: Arc::new(RateLimiter::new(
                config.default_rate,
                config.tenant_rates.clone(),
            )),
            regions: Arc::new(Regions::new(&config)?),
            tenant_regions: Arc::new(config.tenant_regions.clone()),
        })
    }

    /// Whether `tenant` may run new jobs in `region`.
    pub fn tenant_may_use(&self, tenant: &str, region: &str) -> bool {
        self.tenant_regions
            .get(tenant)
            .is_none_or(|allowed| allowed.iter().any(|r| r == region))
    }
}
