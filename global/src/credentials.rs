//! The keys and the CA the global tier rotates without a restart: the
//! tenant-token verifier (`--tenant-key`), the operator-token verifier
//! (`--operator-key`), the key that signs its service and agent tokens for
//! regions (`--service-signing-key`), and the client it calls regions with,
//! which trusts the regions' CA (`--region-ca`).
//!
//! Tenant and operator tokens are verified by separate keys: a tenant key
//! vouches for tenant tokens only and an operator key for admin tokens
//! only, and no key (nor public key under another kid) may be both, so
//! whoever can mint a tenant's token cannot mint an operator's.
//!
//! They live together in one [`Material`] behind a [`Reloadable`]: a
//! request takes the `Arc` in use when it starts and finishes with it (a
//! call to a region already under way keeps its connection and its
//! token), and [`Credentials::install`] swaps them all at once for the
//! requests after. `gangway global` re-reads the files on SIGHUP, builds a
//! whole new [`Material`] with [`Credentials::prepare`], and installs it
//! only if every file loaded; otherwise the old one stays.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gangway_auth::jwt::{Claims, SigningKey, Verifier};
use gangway_shared::reload::Reloadable;

use crate::config::{GlobalConfig, TENANT_AUDIENCE, TENANT_ISSUER};

/// Tenant keys and operator keys: (key id, public PEM) each.
pub type KeyLists<'a> = (&'a [(String, String)], &'a [(String, String)]);

/// One generation of the tier's keys and its client to the regions.
pub struct Material {
    /// Verifies tenant tokens.
    pub verifier: Verifier,
    /// Verifies operator (admin) tokens; `None` when no `--operator-key`
    /// is configured: then no admin endpoint answers.
    pub operator_verifier: Option<Verifier>,
    /// Signs the tier's service tokens and the agent tokens it mints.
    pub service_key: SigningKey,
    /// Calls the regions, trusting the regions' CA alone (or plain HTTP
    /// behind `--insecure-http`).
    pub(crate) http: reqwest::Client,
    /// The service token signed with `service_key`, and when to renew it.
    /// It lives with the key, so a new key mints a new token at once.
    token: Mutex<Option<(String, Instant)>>,
}

impl Material {
    /// The service token, minted on demand with this generation's key.
    pub(crate) fn service_token(&self, claims: impl FnOnce() -> Claims, renew: Duration) -> String {
        let mut t = self.token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((token, renew_at)) = t.as_ref() {
            if Instant::now() < *renew_at {
                return token.clone();
            }
        }
        let token = self
            .service_key
            .sign(&claims())
            .expect("signing with a loaded key does not fail");
        *t = Some((token.clone(), Instant::now() + renew));
        token
    }
}

/// The handle to the tier's [`Material`]; clones share it.
#[derive(Clone)]
pub struct Credentials {
    current: Reloadable<Material>,
    /// How long one call to a region may take (the client's timeout).
    region_timeout: Duration,
    /// Started with a CA for the regions: a reload must bring one too
    /// (never a fall back to plain HTTP or the system's roots).
    region_tls: bool,
}

impl Credentials {
    /// The material `config` names.
    pub fn new(config: &GlobalConfig) -> anyhow::Result<Self> {
        let material = build(
            (&config.tenant_keys, &config.operator_keys),
            config.service_key.clone(),
            config.region_ca_pem.as_deref(),
            config.region_timeout,
        )?;
        Ok(Credentials {
            current: Reloadable::new(material),
            region_timeout: config.region_timeout,
            region_tls: config.region_ca_pem.is_some(),
        })
    }

    /// The material in use now; hold it for one request.
    pub fn current(&self) -> std::sync::Arc<Material> {
        self.current.current()
    }

    /// A whole new generation from re-read files: the tenant and the
    /// operator keys, each as `(kid, public PEM)`, the service signing key,
    /// the regions' CA (PEM). Nothing changes until
    /// [`Credentials::install`].
    pub fn prepare(
        &self,
        (tenant_keys, operator_keys): KeyLists<'_>,
        service_key: SigningKey,
        region_ca_pem: Option<&str>,
    ) -> anyhow::Result<Material> {
        anyhow::ensure!(
            region_ca_pem.is_some() == self.region_tls,
            "the regions' CA (--region-ca) cannot be added or removed without a restart"
        );
        build(
            (tenant_keys, operator_keys),
            service_key,
            region_ca_pem,
            self.region_timeout,
        )
    }

    /// Puts `material` in use for every request from now on.
    pub fn install(&self, material: Material) {
        self.current.replace(material);
    }
}

fn build(
    (tenant_keys, operator_keys): KeyLists<'_>,
    service_key: SigningKey,
    region_ca_pem: Option<&str>,
    region_timeout: Duration,
) -> anyhow::Result<Material> {
    let verifier = Verifier::new(TENANT_ISSUER, TENANT_AUDIENCE, tenant_keys)
        .map_err(|e| anyhow::anyhow!("tenant verification keys (--tenant-key): {e}"))?;
    for (kid, pem) in operator_keys {
        for (tenant_kid, tenant_pem) in tenant_keys {
            anyhow::ensure!(
                kid != tenant_kid,
                "key id {kid:?} is both a tenant key (--tenant-key) and an operator key \
                 (--operator-key): operators need keys of their own"
            );
            anyhow::ensure!(
                !gangway_auth::jwt::share_a_key(pem, tenant_pem),
                "operator key {kid:?} (--operator-key) is also tenant key {tenant_kid:?} \
                 (--tenant-key): operators need keys of their own"
            );
        }
    }
    let operator_verifier = match operator_keys {
        [] => None,
        keys => Some(
            Verifier::new(TENANT_ISSUER, TENANT_AUDIENCE, keys)
                .map_err(|e| anyhow::anyhow!("operator verification keys (--operator-key): {e}"))?,
        ),
    };
    let http = gangway_shared::client::internal_client(
        reqwest::Client::builder()
            .timeout(region_timeout)
            .pool_max_idle_per_host(64),
        region_ca_pem,
    )
    .map_err(|e| anyhow::anyhow!("the regions' CA (--region-ca): {e}"))?;
    Ok(Material {
        verifier,
        operator_verifier,
        service_key,
        http,
        token: Mutex::new(None),
    })
}
