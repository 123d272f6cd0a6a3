//! Single sign-on: tokens from external OpenID Connect issuers, one for
//! tenants and, apart, one for operators (never the same issuer: nothing
//! that can mint a tenant's token may mint an operator's).
//!
//! Each issuer is configured by its URL: the tier reads its discovery
//! document (`/.well-known/openid-configuration`, whose `issuer` must be
//! that URL), then the key set at its `jwks_uri`, at start and every
//! [`OidcIssuer::refresh`] after; and, at most every [`MIN_FETCH_GAP`],
//! as soon as a token names a key it has not seen, so an issuer's new key
//! verifies from its first token and a withdrawn key stops verifying at
//! the next fetch — no restart either way. The checks themselves are
//! `gangway_auth::oidc`'s; here, what a valid token means: a tenant
//! token's tenant is the value of a configured claim (`tenant_claim`),
//! an operator token may be required to carry a claim value (a group).

use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_auth::oidc::{KeySet, OidcVerifier, VerifiedClaims};
use gangway_auth::AuthError;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The least time between two fetches of an issuer's keys prompted by
/// tokens naming unknown keys (a flood of made-up kids costs one fetch
/// every this often, not one each).
pub const MIN_FETCH_GAP: Duration = Duration::from_secs(10);
/// After a failed fetch, the next try.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// Whose tokens an issuer mints, and how to read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OidcKind {
    /// Tenants' users: the tenant is the value of this claim.
    Tenants { tenant_claim: String },
    /// Operators: every valid token, or only those whose claim `.0` holds
    /// the value `.1` (a string claim equal to it, or an array holding it).
    Operators { require: Option<(String, String)> },
}

/// One configured issuer.
#[derive(Clone, Debug)]
pub struct OidcIssuer {
    /// Its URL, exactly as its tokens' `iss` and its discovery document's
    /// `issuer` say.
    pub issuer: String,
    /// What its tokens for this cloud name as `aud` (the client id).
    pub audience: String,
    pub kind: OidcKind,
    /// The CA (PEM) its HTTPS server's certificate chains to, for a
    /// private issuer; `None`: the usual public roots.
    pub ca_pem: Option<String>,
    /// How often its keys are fetched again.
    pub refresh: Duration,
    /// The console's client secret at this issuer, for single sign-on in
    /// a browser (the authorization code flow, with PKCE either way);
    /// `None`: a public client.
    pub client_secret: Option<String>,
}

/// A configured issuer at work: its verifier and what fetches its keys.
#[derive(Clone)]
pub struct Oidc {
    pub config: Arc<OidcIssuer>,
    pub verifier: OidcVerifier,
    http: reqwest::Client,
    /// When its keys were last fetched (or tried), serialising fetches.
    fetched: Arc<tokio::sync::Mutex<Option<Instant>>>,
    /// Where a browser signs in, and where its code is exchanged, as the
    /// last discovery document said (`None`: it names none, or it was not
    /// read yet).
    endpoints: Arc<std::sync::RwLock<Option<Endpoints>>>,
}

/// An issuer's endpoints for a browser's sign-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub authorization: String,
    pub token: String,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
    #[serde(default)]
    authorization_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint: Option<String>,
}

/// What a token endpoint answers (the fields used).
#[derive(Deserialize)]
struct TokenAnswer {
    id_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

impl Oidc {
    pub fn new(config: OidcIssuer) -> anyhow::Result<Oidc> {
        anyhow::ensure!(
            config.issuer.starts_with("https://"),
            "OpenID Connect issuer {:?}: an issuer is an https:// URL",
            config.issuer
        );
        let verifier = OidcVerifier::new(&config.issuer, &config.audience)
            .map_err(|e| anyhow::anyhow!("OpenID Connect issuer {:?}: {e}", config.issuer))?;
        let http = gangway_shared::client::internal_client(
            reqwest::Client::builder()
                .https_only(true)
                .timeout(Duration::from_secs(10)),
            config.ca_pem.as_deref(),
        )
        .map_err(|e| anyhow::anyhow!("OpenID Connect issuer {:?}: {e}", config.issuer))?;
        Ok(Oidc {
            config: Arc::new(config),
            verifier,
            http,
            fetched: Arc::new(tokio::sync::Mutex::new(None)),
            endpoints: Arc::new(std::sync::RwLock::new(None)),
        })
    }

    /// The issuer's endpoints for a browser's sign-in, if its discovery
    /// document names both (https only).
    pub fn endpoints(&self) -> Option<Endpoints> {
        self.endpoints.read().expect("endpoints lock").clone()
    }

    /// Exchanges an authorization `code` for the ID token it stands for
    /// (the authorization code flow; `verifier` is the PKCE code verifier).
    /// The token is not verified here: [`Oidc::verify`] does that.
    pub async fn exchange(
        &self,
        code: &str,
        redirect_uri: &str,
        verifier: &str,
    ) -> Result<String, String> {
        let endpoints = self
            .endpoints()
            .ok_or("the identity provider names no token endpoint")?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("client_id", self.config.audience.as_str()),
            ("code_verifier", verifier),
        ];
        if let Some(secret) = &self.config.client_secret {
            form.push(("client_secret", secret));
        }
        let resp = (self.http.post(&endpoints.token).form(&form).send().await)
            .map_err(|e| format!("{}: {e}", endpoints.token))?;
        let status = resp.status();
        let answer: TokenAnswer = resp
            .json()
            .await
            .map_err(|e| format!("{}: {e}", endpoints.token))?;
        match answer {
            TokenAnswer {
                id_token: Some(t), ..
            } if status.is_success() => Ok(t),
            TokenAnswer {
                error,
                error_description,
                ..
            } => Err(format!(
                "the identity provider refused the sign-in ({status}): {}{}",
                error.unwrap_or_else(|| "no ID token".into()),
                error_description
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            )),
        }
    }

    /// Whether `token` says it comes from this issuer (unverified: which
    /// verifier decides, not what it decides).
    pub fn claims_to_issue(&self, token: &str) -> bool {
        gangway_auth::oidc::issuer_of(token).as_deref() == Some(self.config.issuer.as_str())
    }

    /// Fetches the discovery document and the key set and puts the keys in
    /// use.
    pub async fn fetch_keys(&self) -> Result<(), String> {
        let mut fetched = self.fetched.lock().await;
        *fetched = Some(Instant::now());
        let result = self.fetch().await;
        match &result {
            Ok(keys) => {
                tracing::info!(
                    issuer = %self.config.issuer,
                    kids = ?keys.kids().collect::<Vec<_>>(),
                    skipped = ?keys.skipped,
                    "OpenID Connect keys fetched"
                );
                metrics::counter!("gangway_global_oidc_key_fetches_total", "outcome" => "ok")
                    .increment(1);
            }
            Err(e) => {
                tracing::warn!(issuer = %self.config.issuer, error = %e, "OpenID Connect keys not fetched");
                metrics::counter!("gangway_global_oidc_key_fetches_total", "outcome" => "failed")
                    .increment(1);
            }
        }
        let keys = result?;
        self.verifier.install(keys);
        Ok(())
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let issuer = self.config.issuer.trim_end_matches('/');
        let url = format!("{issuer}/.well-known/openid-configuration");
        let discovery: Discovery = self.get_json(&url).await?;
        if discovery.issuer != self.config.issuer {
            return Err(format!(
                "{url} names issuer {:?}, not {:?}",
                discovery.issuer, self.config.issuer
            ));
        }
        let endpoints = match (discovery.authorization_endpoint, discovery.token_endpoint) {
            (Some(a), Some(t)) if a.starts_with("https://") && t.starts_with("https://") => {
                Some(Endpoints {
                    authorization: a,
                    token: t,
                })
            }
            _ => None,
        };
        *self.endpoints.write().expect("endpoints lock") = endpoints;
        let body = (self.http.get(&discovery.jwks_uri).send().await)
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("{}: {e}", discovery.jwks_uri))?
            .bytes()
            .await
            .map_err(|e| format!("{}: {e}", discovery.jwks_uri))?;
        KeySet::from_jwks(&body).map_err(|e| format!("{}: {e}", discovery.jwks_uri))
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        (self.http.get(url).send().await)
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("{url}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("{url}: {e}"))
    }

    /// Verifies `token`; when it names a key not seen yet, fetches the keys
    /// again first (unless they were fetched less than [`MIN_FETCH_GAP`]
    /// ago) and checks once more.
    pub async fn verify(&self, token: &str) -> Result<VerifiedClaims, AuthError> {
        match self.verifier.verify(token) {
            Err(AuthError::UnknownKey(kid)) if !kid.is_empty() => {
                let stale =
                    { *self.fetched.lock().await }.is_none_or(|at| at.elapsed() >= MIN_FETCH_GAP);
                if stale && !self.verifier.keys().has(&kid) {
                    // (A failure is logged; the token is refused below.)
                    let _ = self.fetch_keys().await;
                }
                self.verifier.verify(token)
            }
            other => other,
        }
    }

    /// Fetches the keys now and then every [`OidcIssuer::refresh`] (sooner
    /// again after a failure) until `stop`.
    pub async fn keep_keys_fresh(self, stop: CancellationToken) {
        loop {
            let wait = match self.fetch_keys().await {
                Ok(()) => self.config.refresh,
                Err(_) => RETRY_AFTER_FAILURE.min(self.config.refresh),
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// The issuers of a tier: at most one for tenants and one for operators,
/// never the same URL.
pub fn check_issuers(issuers: &[OidcIssuer]) -> anyhow::Result<()> {
    let tenants = issuers
        .iter()
        .filter(|i| matches!(i.kind, OidcKind::Tenants { .. }));
    let operators = issuers
        .iter()
        .filter(|i| matches!(i.kind, OidcKind::Operators { .. }));
    anyhow::ensure!(
        tenants.clone().count() <= 1 && operators.clone().count() <= 1,
        "at most one OpenID Connect issuer for tenants and one for operators"
    );
    for t in tenants {
        for o in operators.clone() {
            anyhow::ensure!(
                t.issuer.trim_end_matches('/') != o.issuer.trim_end_matches('/'),
                "OpenID Connect issuer {:?} is configured for tenants and for operators: \
                 operators need an issuer of their own",
                t.issuer
            );
        }
    }
    Ok(())
}
