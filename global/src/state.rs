//! What every request handler of the global tier shares: the tenants'
//! token verifier (with the rest of the reloadable credentials), the rate limiter, the regions (and what the tier last
//! heard of each), and which regions each tenant may use. Stateless
//! otherwise: any replica answers any call.

use std::sync::Arc;

use crate::config::GlobalConfig;
use crate::credentials::Credentials;
use crate::identity::Identity;
use crate::oidc::{Oidc, OidcKind};
use crate::ratelimit::RateLimiter;
use crate::regions::Regions;

#[derive(Clone)]
pub struct GlobalState {
    /// The tenant-token verifier, the service key and the client to the
    /// regions: `credentials.current()` for each request; SIGHUP may
    /// replace them (`gangway global`).
    pub credentials: Credentials,
    pub rate_limiter: Arc<RateLimiter>,
    pub regions: Arc<Regions>,
    /// Regions each listed tenant may use; tenants not listed may use all.
    pub tenant_regions: Arc<std::collections::BTreeMap<String, Vec<String>>>,
    /// The OpenID Connect issuer of tenants' tokens, if one is configured.
    pub oidc_tenants: Option<Oidc>,
    /// The OpenID Connect issuer of operators' tokens, if one is configured.
    pub oidc_operators: Option<Oidc>,
    /// Tenants' records and API keys, as a majority of regions holds them.
    pub identity: Arc<Identity>,
    /// The price book of tenants' costs (`GET /v1/costs`), if configured.
    pub price_book: Option<Arc<std::path::PathBuf>>,
}

impl GlobalState {
    pub fn new(config: GlobalConfig) -> anyhow::Result<Self> {
        let credentials = Credentials::new(&config)?;
        crate::oidc::check_issuers(&config.oidc)?;
        let issuer = |operators: bool| -> anyhow::Result<Option<Oidc>> {
            (config.oidc.iter())
                .find(|i| matches!(i.kind, OidcKind::Operators { .. }) == operators)
                .map(|i| Oidc::new(i.clone()))
                .transpose()
        };
        Ok(GlobalState {
            oidc_tenants: issuer(false)?,
            oidc_operators: issuer(true)?,
            regions: Arc::new(Regions::with_credentials(&config, credentials.clone())?),
            credentials,
            rate_limiter: Arc::new(RateLimiter::new(
                config.default_rate,
                config.tenant_rates.clone(),
            )),
            tenant_regions: Arc::new(config.tenant_regions.clone()),
            identity: Arc::new(Identity::default()),
            price_book: config.price_book.clone().map(Arc::new),
        })
    }

    /// Whether `tenant` may run new jobs in `region`.
    pub fn tenant_may_use(&self, tenant: &str, region: &str) -> bool {
        self.tenant_regions
            .get(tenant)
            .is_none_or(|allowed| allowed.iter().any(|r| r == region))
    }
}
