//! The global tier's configuration.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_auth::jwt::SigningKey;

pub use gangway_shared::tokens::{
    ISSUER as TENANT_ISSUER, ISSUER as SERVICE_ISSUER, PUBLIC_AUDIENCE as TENANT_AUDIENCE,
    REGION_AUDIENCE as SERVICE_AUDIENCE,
};

#[derive(Clone, Debug)]
pub struct RegionEndpoint {
    pub name: String,
    /// The regional API's base URL.
    pub url: String,
}

/// A token bucket: `per_second` requests a second on average, bursts of
/// up to `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: u32,
    pub burst: u32,
}

#[derive(Clone)]
pub struct GlobalConfig {
    /// PEM certificate chain and key the HTTPS listener presents.
    pub tls_cert_pem: String,
    pub tls_key_pem: String,
    pub regions: Vec<RegionEndpoint>,
    /// Keys (key id, public PEM) that verify tenant tokens; more than one
    /// while keys rotate.
    pub tenant_keys: Vec<(String, String)>,
    /// Keys (key id, public PEM) that verify operator (admin) tokens: none
    /// of them a tenant key. Empty: no admin endpoint answers.
    pub operator_keys: Vec<(String, String)>,
    /// Signs the short-lived tokens the global tier presents to regions.
    pub service_key: SigningKey,
    /// Every tenant's limit unless `tenant_rates` names it.
    pub default_rate: RateLimit,
    pub tenant_rates: BTreeMap<String, RateLimit>,
    /// Regions a tenant may run new jobs in; tenants not listed may use
    /// every region.
    pub tenant_regions: BTreeMap<String, Vec<String>>,
    /// How long one call to a region may take.
    pub region_timeout: Duration,
    /// How often regions' health and capacity are refreshed.
    pub health_interval: Duration,
    /// A region that has not answered for this long is unhealthy.
    pub unhealthy_after: Duration,
    /// The CA (PEM) that signs the regions' certificates: calls to regions
    /// trust it alone and go over HTTPS only. `None`: plain HTTP to regions
    /// (`--insecure-http`).
    pub region_ca_pem: Option<String>,
    /// External OpenID Connect issuers (`crate::oidc`): at most one for
    /// tenants and one for operators.
    pub oidc: Vec<crate::oidc::OidcIssuer>,
    /// The price book of tenants' costs (`GET /v1/costs`), read at each
    /// request; `None`: costs are not offered.
    pub price_book: Option<std::path::PathBuf>,
}

impl GlobalConfig {
    pub fn new(
        tls_cert_pem: String,
        tls_key_pem: String,
        regions: Vec<RegionEndpoint>,
        tenant_keys: Vec<(String, String)>,
        service_key: SigningKey,
    ) -> Self {
        GlobalConfig {
            tls_cert_pem,
            tls_key_pem,
            regions,
            tenant_keys,
            operator_keys: Vec::new(),
            service_key,
            default_rate: RateLimit {
                per_second: 200,
                burst: 400,
            },
            tenant_rates: BTreeMap::new(),
            tenant_regions: BTreeMap::new(),
            region_timeout: Duration::from_secs(10),
            health_interval: Duration::from_millis(1000),
            unhealthy_after: Duration::from_secs(5),
            region_ca_pem: None,
            oidc: Vec::new(),
            price_book: None,
        }
    }
}
