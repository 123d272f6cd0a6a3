//! The keys and the CA a region rotates without a restart: the verifier
//! of its callers' tokens (`--service-key`: the global tier's service
//! tokens, agents' tokens, peers' tokens), the key that signs its own
//! tokens to its peers (`--peer-signing-key`), and the client it calls
//! its peers with, which trusts the peers' CA (`--ca`).
//!
//! They live together in one [`Material`] behind a [`Reloadable`]: a
//! request or a call to a peer takes the `Arc` in use when it starts and
//! finishes with it, and [`Credentials::install`] swaps all of it at once
//! for what starts afterwards. `gangway region` re-reads the files on
//! SIGHUP, builds a whole new [`Material`] with [`Credentials::prepare`],
//! and installs it only if every file loaded; otherwise the old one stays.
//! [`RegionConfig::auth`](crate::RegionConfig::auth) and the
//! [`PeerConfig`] hold what the region started with; this is what it uses.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_auth::jwt::{Claims, SigningKey, Verifier};
use gangway_shared::reload::Reloadable;

use crate::config::PeerConfig;

/// How long one call to a peer may take.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// One generation of the region's keys and its client to the peers.
pub struct Material {
    /// Verifies callers' tokens; `None`: anyone may call
    /// (`--insecure-no-auth`, benchmarks only).
    pub verifier: Option<Verifier>,
    /// Signs this region's tokens to its peers.
    pub peer_key: Option<SigningKey>,
    /// Calls the peers, trusting their CA alone (or plain HTTP behind
    /// `--insecure-http`).
    pub(crate) peer_http: reqwest::Client,
    /// The token signed with `peer_key`, and when to renew it. It lives
    /// with the key, so a new key mints a new token at once.
    peer_token: Mutex<Option<(String, Instant)>>,
}

impl Material {
    /// The token this region calls its peers with, minted on demand with
    /// this generation's key; `None` without one.
    pub(crate) fn peer_token(
        &self,
        claims: impl FnOnce() -> Claims,
        renew: Duration,
    ) -> Option<String> {
        let key = self.peer_key.as_ref()?;
        let mut t = self.peer_token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((token, renew_at)) = t.as_ref() {
            if Instant::now() < *renew_at {
                return Some(token.clone());
            }
        }
        let token = key.sign(&claims()).expect("signing with a loaded key");
        *t = Some((token.clone(), Instant::now() + renew));
        Some(token)
    }
}

/// The handle to the region's [`Material`]; clones share it.
#[derive(Clone)]
pub struct Credentials {
    current: Reloadable<Material>,
    /// What the region started with; a reload keeps each the same: it
    /// never turns authentication off or on, nor TLS to the peers.
    has_verifier: bool,
    has_peer_key: bool,
    peer_tls: bool,
}

impl Credentials {
    /// The material a region starts with: `verifier` (its
    /// [`RegionConfig::auth`](crate::RegionConfig::auth)) and the peers'
    /// signing key and CA.
    pub fn new(verifier: Option<Verifier>, peers: &PeerConfig) -> Result<Self, String> {
        let material = build(verifier, peers.signing_key.clone(), peers.ca_pem.as_deref())?;
        Ok(Credentials {
            has_verifier: material.verifier.is_some(),
            has_peer_key: material.peer_key.is_some(),
            peer_tls: peers.ca_pem.is_some(),
            current: Reloadable::new(material),
        })
    }

    /// The material in use now; hold it for one request or call.
    pub fn current(&self) -> Arc<Material> {
        self.current.current()
    }

    /// A whole new generation from re-read files. Nothing changes until
    /// [`Credentials::install`]. Each part must be there if and only if
    /// it was at start.
    pub fn prepare(
        &self,
        verifier: Option<Verifier>,
        peer_key: Option<SigningKey>,
        peer_ca_pem: Option<&str>,
    ) -> Result<Material, String> {
        if verifier.is_some() != self.has_verifier {
            return Err(
                "token verification (--service-key) cannot be turned on or off without a restart"
                    .into(),
            );
        }
        if peer_key.is_some() != self.has_peer_key {
            return Err("--peer-signing-key cannot be added or removed without a restart".into());
        }
        if peer_ca_pem.is_some() != self.peer_tls {
            return Err("the peers' CA (--ca) cannot be added or removed without a restart".into());
        }
        build(verifier, peer_key, peer_ca_pem)
    }

    /// Puts `material` in use for every request and call from now on.
    pub fn install(&self, material: Material) {
        self.current.replace(material);
    }
}

fn build(
    verifier: Option<Verifier>,
    peer_key: Option<SigningKey>,
    peer_ca_pem: Option<&str>,
) -> Result<Material, String> {
    let peer_http = gangway_shared::client::internal_client(
        reqwest::Client::builder().timeout(PEER_TIMEOUT),
        peer_ca_pem,
    )
    .map_err(|e| format!("the peers' CA (--ca): {e}"))?;
    Ok(Material {
        verifier,
        peer_key,
        peer_http,
        peer_token: Mutex::new(None),
    })
}
