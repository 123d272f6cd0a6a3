//! ES256 JSON Web Tokens: minting with a [`SigningKey`], checking with a
//! [`Verifier`].
//!
//! The verifier parses the token itself and hands only the signature check
//! to `jsonwebtoken`, so every decision is visible here and in this order:
//! shape → header (`alg` must be exactly `ES256`, `kid` must name a trusted
//! key) → signature → claims (issuer, audience, expiry and not-before with
//! leeway, role rules). The algorithm is never taken from the token to pick
//! a verification method: that is what makes `alg=none` and the "HS256 keyed
//! with the public key" attack impossible, not merely rejected.
//!
//! A verifier remembers the tokens that passed every check (see
//! [`Verifier::verify_at`]), because checking an ES256 signature costs about
//! 250 µs of CPU and callers present the same token again and again: the
//! global tier's tenants, and the global tier and agents calling regions.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use crate::error::AuthError;

/// The only algorithm we sign with or accept.
const ALG: &str = "ES256";
/// Tokens longer than this are refused before any parsing (a JWT of ours is
/// well under 1 KiB).
const MAX_TOKEN_LEN: usize = 8 * 1024;
/// Most tokens a verifier remembers as verified (a few MB at most).
const CACHE_MAX: usize = 4096;
/// Longer tokens are checked every time rather than remembered.
const CACHE_MAX_TOKEN_LEN: usize = 2048;
/// Default allowance for clock skew between issuer and verifier.
const DEFAULT_LEEWAY_S: u64 = 30;

/// What a token's holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A tenant (AI lab) calling the public API; the token names its tenant.
    Tenant,
    /// An operator; may name a tenant to act on its behalf.
    Admin,
    /// The global tier calling a region.
    Service,
    /// A node agent calling its region; the token names that region.
    Agent,
}

impl Role {
    /// The lowercase name used in tokens.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Tenant => "tenant",
            Role::Admin => "admin",
            Role::Service => "service",
            Role::Agent => "agent",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The claims of a Gangway token. Times are Unix seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer; must equal the verifier's issuer exactly.
    pub iss: String,
    /// Audience (a single string); must equal the verifier's audience exactly.
    pub aud: String,
    /// Subject: who holds the token (a user, a service replica, a node id).
    pub sub: String,
    /// Expiry.
    pub exp: i64,
    /// Not valid before.
    pub nbf: i64,
    /// Issued at.
    pub iat: i64,
    /// What the holder is.
    pub role: Role,
    /// The tenant: required for [`Role::Tenant`], optional for [`Role::Admin`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Agent tokens: the region they may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// Claims for a token valid from now for `ttl`.
pub fn claims_for(
    role: Role,
    sub: &str,
    tenant: Option<&str>,
    region: Option<&str>,
    issuer: &str,
    audience: &str,
    ttl: Duration,
) -> Claims {
    let now = unix_now();
    let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    Claims {
        iss: issuer.to_owned(),
        aud: audience.to_owned(),
        sub: sub.to_owned(),
        exp: now.saturating_add(ttl),
        nbf: now,
        iat: now,
        role,
        tenant: tenant.map(str::to_owned),
        region: region.map(str::to_owned),
    }
}

/// A tenant (or region) name: 1–63 characters of `[a-z0-9-]`, not starting
/// with `-`. The same rule as `gangway_shared::ids::valid_tenant`, kept here
/// so this crate stays below every other one.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An ES256 (ECDSA P-256) private key with its key id.
#[derive(Clone)]
pub struct SigningKey {
    kid: String,
    private_pem: String,
    public_pem: String,
    encoding: EncodingKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A fresh random P-256 key.
    ///
    /// # Panics
    /// Only if the system's random source fails.
    pub fn generate(kid: &str) -> SigningKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .expect("generating a P-256 key needs a working system random source");
        Self::from_pair(kid, &pair).expect("a freshly generated P-256 key is usable")
    }

    /// Loads a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`) P-256 key.
    pub fn from_pem(kid: &str, private_pkcs8_pem: &str) -> Result<Self, AuthError> {
        let pair = rcgen::KeyPair::from_pem(private_pkcs8_pem).map_err(|e| {
            AuthError::Key(format!(
                "key {kid:?}: not a PKCS#8 PEM private key ({e}); expected `-----BEGIN PRIVATE KEY-----`"
            ))
        })?;
        Self::from_pair(kid, &pair)
    }

    fn from_pair(kid: &str, pair: &rcgen::KeyPair) -> Result<Self, AuthError> {
        if kid.is_empty() {
            return Err(AuthError::Key("a signing key needs a non-empty kid".into()));
        }
        if pair.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
            return Err(AuthError::Key(format!(
                "key {kid:?} is not an ECDSA P-256 key; tokens are signed with ES256"
            )));
        }
        let private_pem = pair.serialize_pem();
        let encoding = EncodingKey::from_ec_pem(private_pem.as_bytes())
            .map_err(|e| AuthError::Key(format!("key {kid:?}: {e}")))?;
        Ok(SigningKey {
            kid: kid.to_owned(),
            private_pem,
            public_pem: pair.public_key_pem(),
            encoding,
        })
    }

    /// The private key as PKCS#8 PEM. Keep it secret (files: mode 0600).
    pub fn private_pem(&self) -> String {
        self.private_pem.clone()
    }

    /// The public key as SPKI PEM (`-----BEGIN PUBLIC KEY-----`), for verifiers.
    pub fn public_pem(&self) -> String {
        self.public_pem.clone()
    }

    /// The key id that goes into every token's header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK (RFC 7517: `kty` EC, `crv` P-256, with its
    /// `kid`), as an OpenID Connect issuer publishes its keys.
    pub fn public_jwk(&self) -> serde_json::Value {
        // The SPKI of a P-256 key ends with its point: 0x04, x, y.
        let b64: String = (self.public_pem.lines())
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("a key's own PEM is base64");
        let point = &der[der.len() - 65..];
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        })
    }

    /// `(kid, public PEM)`, the shape [`Verifier::new`] takes.
    pub fn verifier_entry(&self) -> (String, String) {
        (self.kid.clone(), self.public_pem.clone())
    }

    /// Signs `claims` as a compact JWS with header `{"alg":"ES256","kid":…,"typ":"JWT"}`.
    pub fn sign(&self, claims: &Claims) -> Result<String, AuthError> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding)
            .map_err(|e| AuthError::Key(format!("signing with key {:?}: {e}", self.kid)))
    }
}

/// Checks tokens against a fixed issuer, audience and set of trusted keys.
/// Cloning is cheap (the state is behind an `Arc`).
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
    leeway_s: i64,
}

struct Inner {
    issuer: String,
    audience: String,
    /// Each key id's keys: one, or two while a key rotates under its id
    /// (the old and the new public key in one file).
    keys: BTreeMap<String, Vec<DecodingKey>>,
    /// Tokens that passed every check. It lives next to the keys, so a
    /// verifier rebuilt with other keys starts with nothing remembered.
    verified: VerifiedTokens,
}

/// What a verified token's claims say of when it is valid: `(nbf, exp)`,
/// Unix seconds (a remembered token answers only inside that window).
pub(crate) trait ValidWindow {
    fn window(&self) -> (i64, i64);
}

impl ValidWindow for Claims {
    fn window(&self) -> (i64, i64) {
        (self.nbf, self.exp)
    }
}

/// Tokens that passed every check of their verifier, with their claims, by
/// the token's exact bytes (`quick_cache`: bounded, concurrent, evicting
/// what is not used). An entry answers only while `nbf <= now < exp` —
/// without the verifier's leeway, so outside that window the full check
/// runs again and decides, leeway and all; an expired one is never hit
/// again, so it is what the cache evicts. Only successes go in: a flood of
/// bad tokens costs what it did before. At most [`CACHE_MAX`] entries.
pub(crate) struct VerifiedTokens<T = Claims> {
    cache: quick_cache::sync::Cache<Box<str>, T>,
}

impl<T: ValidWindow + Clone> VerifiedTokens<T> {
    pub(crate) fn new() -> Self {
        VerifiedTokens {
            cache: quick_cache::sync::Cache::new(CACHE_MAX),
        }
    }

    pub(crate) fn get(&self, token: &str, now: i64) -> Option<T> {
        self.cache.get(token).filter(|c| {
            let (nbf, exp) = c.window();
            nbf <= now && now < exp
        })
    }

    pub(crate) fn insert(&self, token: &str, claims: &T, now: i64) {
        let (nbf, exp) = claims.window();
        if token.len() > CACHE_MAX_TOKEN_LEN || !(nbf <= now && now < exp) {
            // Too big to keep, or outside the window a hit could answer in.
            return;
        }
        self.cache.insert(token.into(), claims.clone());
    }

    /// Forgets every token (the keys they were checked with changed).
    pub(crate) fn clear(&self) {
        self.cache.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cache.len()
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("issuer", &self.inner.issuer)
            .field("audience", &self.inner.audience)
            .field("kids", &self.inner.keys.keys().collect::<Vec<_>>())
            .field("leeway_s", &self.leeway_s)
            .finish()
    }
}

/// The parts of a JOSE header we look at; anything else is ignored except
/// `crit`, which we must refuse because we understand no extensions.
#[derive(Deserialize)]
struct JoseHeader {
    alg: Option<serde_json::Value>,
    kid: Option<serde_json::Value>,
    typ: Option<serde_json::Value>,
    crit: Option<serde_json::Value>,
}

impl Verifier {
    /// A verifier trusting the given `(kid, SPKI public PEM)` keys. Several
    /// keys means rotation: a token signed by any of them verifies. One
    /// kid's PEM may hold several public keys one after the other, as a CA
    /// bundle holds certificates: a token with that kid verifies if any of
    /// them signed it, so a signer can move to a new key under the same
    /// kid (the new key added beside the old, the signer switched, the old
    /// removed) without a moment where its tokens are refused.
    pub fn new(issuer: &str, audience: &str, keys: &[(String, String)]) -> Result<Self, AuthError> {
        if issuer.is_empty() || audience.is_empty() {
            return Err(AuthError::Key(
                "a verifier needs a non-empty issuer and audience".into(),
            ));
        }
        if keys.is_empty() {
            return Err(AuthError::Key(
                "a verifier needs at least one public key".into(),
            ));
        }
        let mut map = BTreeMap::new();
        for (kid, pem) in keys {
            if kid.is_empty() {
                return Err(AuthError::Key("every verification key needs a kid".into()));
            }
            let keys = pem_blocks(pem)
                .map(|block| public_key(kid, block))
                .collect::<Result<Vec<_>, _>>()?;
            if keys.is_empty() {
                // No block at all: let the parser say what is wrong.
                public_key(kid, pem)?;
            }
            if map.insert(kid.clone(), keys).is_some() {
                return Err(AuthError::Key(format!("kid {kid:?} is configured twice")));
            }
        }
        Ok(Verifier {
            inner: Arc::new(Inner {
                issuer: issuer.to_owned(),
                audience: audience.to_owned(),
                keys: map,
                verified: VerifiedTokens::new(),
            }),
            leeway_s: DEFAULT_LEEWAY_S as i64,
        })
    }

    /// Allowed clock skew for `exp` and `nbf`, in seconds (default 30).
    pub fn leeway(mut self, seconds: u64) -> Self {
        self.leeway_s = i64::try_from(seconds).unwrap_or(i64::MAX);
        self
    }

    /// The issuer this verifier trusts.
    pub fn issuer(&self) -> &str {
        &self.inner.issuer
    }

    /// The audience tokens must name.
    pub fn audience(&self) -> &str {
        &self.inner.audience
    }

    /// Verifies a raw token at the current time.
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        self.verify_at(token, unix_now())
    }

    /// Verifies the value of an `Authorization` header (`Bearer <jwt>`).
    pub fn verify_header(&self, authorization: Option<&str>) -> Result<Claims, AuthError> {
        self.verify(bearer_token(authorization)?)
    }

    /// Verifies a raw token as if the time were `now` (Unix seconds).
    ///
    /// A token this verifier (or a clone of it) already accepted is not
    /// checked again while `nbf <= now < exp`: its signature, key, header and
    /// claims are fixed by its bytes, which are the cache key, and the claim
    /// checks (issuer, audience, times, role rules) are repeated on the
    /// remembered claims, so a hit answers what the full check would. The
    /// leeway only widens the window, so clones with another leeway may share
    /// what was remembered.
    pub fn verify_at(&self, token: &str, now: i64) -> Result<Claims, AuthError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed(format!(
                "the token is longer than {MAX_TOKEN_LEN} bytes"
            )));
        }
        if let Some(claims) = self.inner.verified.get(token, now) {
            self.check_claims(&claims, now)?;
            return Ok(claims);
        }
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(sig_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::Malformed(
                "expected three base64url parts separated by dots".into(),
            ));
        };

        let header: JoseHeader = decode_json(header_b64, "header")?;
        let alg = match &header.alg {
            Some(serde_json::Value::String(alg)) => alg.as_str(),
            Some(other) => return Err(AuthError::UnsupportedAlgorithm(other.to_string())),
            None => return Err(AuthError::Malformed("the header has no `alg`".into())),
        };
        if alg != ALG {
            return Err(AuthError::UnsupportedAlgorithm(alg.to_owned()));
        }
        if header.crit.is_some() {
            return Err(AuthError::Malformed(
                "the header has critical extensions (`crit`), which this server does not support"
                    .into(),
            ));
        }
        match &header.typ {
            None => {}
            Some(serde_json::Value::String(t)) if t.eq_ignore_ascii_case("JWT") => {}
            Some(other) => {
                return Err(AuthError::Malformed(format!(
                    "the header's `typ` is {other}, not \"JWT\""
                )))
            }
        }
        let keys = match &header.kid {
            Some(serde_json::Value::String(kid)) => self
                .inner
                .keys
                .get(kid)
                .ok_or_else(|| AuthError::UnknownKey(kid.clone()))?,
            Some(other) => return Err(AuthError::UnknownKey(other.to_string())),
            None => return Err(AuthError::UnknownKey(String::new())),
        };

        let signed = &token[..header_b64.len() + 1 + payload_b64.len()];
        // Ok(false): wrong signature; Err: a signature that is not even
        // base64 or not 64 bytes. Either way it does not verify.
        let by = |key| {
            jsonwebtoken::crypto::verify(sig_b64, signed.as_bytes(), key, Algorithm::ES256)
                .unwrap_or(false)
        };
        if !keys.iter().any(by) {
            return Err(AuthError::BadSignature);
        }

        let claims: Claims = decode_json(payload_b64, "payload")?;
        self.check_claims(&claims, now)?;
        self.inner.verified.insert(token, &claims, now);
        Ok(claims)
    }

    fn check_claims(&self, c: &Claims, now: i64) -> Result<(), AuthError> {
        if c.iss != self.inner.issuer {
            return Err(AuthError::WrongIssuer {
                expected: self.inner.issuer.clone(),
                found: c.iss.clone(),
            });
        }
        if c.aud != self.inner.audience {
            return Err(AuthError::WrongAudience {
                expected: self.inner.audience.clone(),
                found: c.aud.clone(),
            });
        }
        if now > c.exp.saturating_add(self.leeway_s) {
            return Err(AuthError::Expired { expired_at: c.exp });
        }
        if now.saturating_add(self.leeway_s) < c.nbf {
            return Err(AuthError::NotYetValid { not_before: c.nbf });
        }
        if c.sub.is_empty() {
            return Err(AuthError::BadClaims("`sub` is empty".into()));
        }
        if let Some(tenant) = &c.tenant {
            if !valid_tenant(tenant) {
                return Err(AuthError::BadClaims(format!(
                    "tenant {tenant:?} is not a valid name (1-63 characters of a-z, 0-9 and '-', not starting with '-')"
                )));
            }
        }
        if let Some(region) = &c.region {
            if !valid_tenant(region) {
                return Err(AuthError::BadClaims(format!(
                    "region {region:?} is not a valid name (1-63 characters of a-z, 0-9 and '-', not starting with '-')"
                )));
            }
        }
        match c.role {
            Role::Tenant if c.tenant.is_none() => Err(AuthError::BadClaims(
                "a tenant token must name its tenant (`tenant` claim)".into(),
            )),
            Role::Agent if c.region.is_none() => Err(AuthError::BadClaims(
                "an agent token must name its region (`region` claim)".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// Whether two PEM texts of public keys (one each, or several, as a
/// rotating kid's file holds) have a key in common: the same block, line
/// breaks and spacing aside. (A configuration check: one key must not
/// vouch for two kinds of token.)
pub fn share_a_key(a: &str, b: &str) -> bool {
    let squeezed = |block: &str| -> String { block.split_whitespace().collect() };
    let b: Vec<String> = pem_blocks(b).map(squeezed).collect();
    pem_blocks(a).map(squeezed).any(|k| b.contains(&k))
}

/// The `-----BEGIN …-----` … `-----END …-----` blocks of a PEM text.
fn pem_blocks(pem: &str) -> impl Iterator<Item = &str> {
    const END: &str = "-----END ";
    let mut rest = pem;
    std::iter::from_fn(move || {
        let start = rest.find("-----BEGIN ")?;
        let end_at = start + rest[start..].find(END)?;
        // The end line runs to its closing dashes.
        let close = end_at + END.len() + rest[end_at + END.len()..].find("-----")? + 5;
        let block = &rest[start..close];
        rest = &rest[close..];
        Some(block)
    })
}

/// One ES256 public key of `kid` from its PEM block.
fn public_key(kid: &str, pem: &str) -> Result<DecodingKey, AuthError> {
    let key = DecodingKey::from_ec_pem(pem.as_bytes()).map_err(|e| {
        AuthError::Key(format!(
            "key {kid:?}: not an EC public key PEM ({e}); expected `-----BEGIN PUBLIC KEY-----`"
        ))
    })?;
    // A well-formed P-256 key answers "no" to a zero signature; any other
    // curve (or garbage) fails to load and answers an error.
    let zero_sig = URL_SAFE_NO_PAD.encode([0u8; 64]);
    if jsonwebtoken::crypto::verify(&zero_sig, b"probe", &key, Algorithm::ES256).is_err() {
        return Err(AuthError::Key(format!(
            "key {kid:?} is not an ECDSA P-256 public key; tokens are verified with ES256"
        )));
    }
    Ok(key)
}

/// Extracts the token from an `Authorization` header value. The scheme is
/// case-insensitive (RFC 7235).
pub fn bearer_token(authorization: Option<&str>) -> Result<&str, AuthError> {
    let value = authorization.map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Err(AuthError::Missing);
    }
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed(
            "the Authorization header must use the Bearer scheme".into(),
        ));
    }
    let token = rest.trim();
    if token.is_empty() {
        return Err(AuthError::Missing);
    }
    Ok(token)
}

/// Decodes one base64url JSON part. Syntax errors are `Malformed`; well-formed
/// JSON of the wrong shape (a missing claim, a string `exp`) is `BadClaims`.
pub(crate) fn decode_json<T: serde::de::DeserializeOwned>(
    part_b64: &str,
    what: &str,
) -> Result<T, AuthError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part_b64)
        .map_err(|_| AuthError::Malformed(format!("the {what} is not base64url")))?;
    serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data if what == "payload" => {
            AuthError::BadClaims(e.to_string())
        }
        _ => AuthError::Malformed(format!("the {what} is not a JSON object ({e})")),
    })
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["acme", "a", "globex-2", "0", &"a".repeat(63)] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in [
            "",
            "-acme",
            "Acme",
            "ac me",
            "ac_me",
            "acmé",
            &"a".repeat(64),
        ] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Ok("abc"));
        assert_eq!(bearer_token(None), Err(AuthError::Missing));
        assert_eq!(bearer_token(Some("  ")), Err(AuthError::Missing));
        assert_eq!(bearer_token(Some("Bearer ")), Err(AuthError::Missing));
        assert_eq!(
            bearer_token(Some("Basic dXNlcjpwYXNz")).unwrap_err().code(),
            "malformed_token"
        );
        assert_eq!(
            bearer_token(Some("abc.def.ghi")).unwrap_err().code(),
            "malformed_token"
        );
    }

    fn claims_between(nbf: i64, exp: i64) -> Claims {
        Claims {
            iss: "iss".into(),
            aud: "aud".into(),
            sub: "someone".into(),
            exp,
            nbf,
            iat: nbf,
            role: Role::Service,
            tenant: None,
            region: None,
        }
    }

    fn signed(nbf: i64, exp: i64) -> (SigningKey, Verifier, String) {
        let key = SigningKey::generate("k1");
        let verifier = Verifier::new("iss", "aud", &[key.verifier_entry()]).unwrap();
        let token = key.sign(&claims_between(nbf, exp)).unwrap();
        (key, verifier, token)
    }

    #[test]
    fn a_remembered_token_counts_only_between_nbf_and_exp() {
        let (key, v, token) = signed(1000, 1100);
        let strict = v.clone().leeway(0); // shares what `v` remembers
        assert_eq!(v.verify_at(&token, 1050), Ok(claims_between(1000, 1100)));
        assert_eq!(v.inner.verified.len(), 1);
        assert!(v.inner.verified.get(&token, 1099).is_some());
        assert!(v.inner.verified.get(&token, 1100).is_none());
        assert!(v.inner.verified.get(&token, 999).is_none());
        assert_eq!(
            strict.verify_at(&token, 1099),
            Ok(claims_between(1000, 1100))
        );
        // From `exp` on the full check decides: within the leeway for `v`,
        // expired for `strict`, expired for both after the leeway.
        assert_eq!(
            strict.verify_at(&token, 1101),
            Err(AuthError::Expired { expired_at: 1100 })
        );
        assert_eq!(v.verify_at(&token, 1101), Ok(claims_between(1000, 1100)));
        assert_eq!(
            v.verify_at(&token, 1131),
            Err(AuthError::Expired { expired_at: 1100 })
        );
        // Before `nbf` a remembered token is checked again too.
        assert_eq!(
            strict.verify_at(&token, 999),
            Err(AuthError::NotYetValid { not_before: 1000 })
        );
        // Accepted within the leeway before `nbf`, but not remembered there.
        let early = key.sign(&claims_between(2000, 2100)).unwrap();
        assert!(v.verify_at(&early, 1980).is_ok());
        assert!(v.inner.verified.get(&early, 1980).is_none());
        assert_eq!(
            strict.verify_at(&early, 1980),
            Err(AuthError::NotYetValid { not_before: 2000 })
        );
    }

    #[test]
    fn a_tampered_token_is_never_accepted_through_the_cache() {
        let (_, v, token) = signed(1000, 1100);
        assert!(v.verify_at(&token, 1050).is_ok());
        let (header, rest) = token.split_once('.').unwrap();
        let (payload, sig) = rest.split_once('.').unwrap();
        // Another payload (a tenant added) under the remembered signature.
        let mut forged = claims_between(1000, 1100);
        forged.tenant = Some("evil".into());
        let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        let swapped = format!("{header}.{forged_payload}.{sig}");
        assert_eq!(v.verify_at(&swapped, 1050), Err(AuthError::BadSignature));
        // The remembered payload under another signature.
        let first = if sig.starts_with('A') { "B" } else { "A" };
        let bad_sig = format!("{header}.{payload}.{first}{}", &sig[1..]);
        assert_eq!(v.verify_at(&bad_sig, 1050), Err(AuthError::BadSignature));
        // A suffix or a second token glued on is not the remembered token.
        assert!(v.verify_at(&format!("{token}x"), 1050).is_err());
        assert!(v.verify_at(&format!("{token}.{sig}"), 1050).is_err());
        assert_eq!(v.inner.verified.len(), 1, "only the genuine token");
    }

    #[test]
    fn failures_are_not_remembered() {
        let (key, v, token) = signed(1000, 1100);
        // Expired, and not yet valid beyond the leeway.
        assert!(v.verify_at(&token, 2000).is_err());
        assert!(v.verify_at(&token, 900).is_err());
        // Wrong audience, signed by a key this verifier does not trust.
        let mut other_aud = claims_between(1000, 1100);
        other_aud.aud = "elsewhere".into();
        let other_aud = key.sign(&other_aud).unwrap();
        let stranger = SigningKey::generate("k1")
            .sign(&claims_between(1000, 1100))
            .unwrap();
        for _ in 0..2 {
            assert!(matches!(
                v.verify_at(&other_aud, 1050),
                Err(AuthError::WrongAudience { .. })
            ));
            assert_eq!(v.verify_at(&stranger, 1050), Err(AuthError::BadSignature));
        }
        assert_eq!(v.inner.verified.len(), 0);
        // The good token, still unremembered, verifies in its window.
        assert!(v.verify_at(&token, 1050).is_ok());
        assert_eq!(v.inner.verified.len(), 1);
    }

    #[test]
    fn a_rebuilt_verifier_remembers_nothing() {
        let (_, old, token) = signed(1000, 1100);
        assert!(old.verify_at(&token, 1050).is_ok());
        // Rotation: the old key is gone from the new verifier.
        let new_key = SigningKey::generate("k2");
        let rotated = Verifier::new("iss", "aud", &[new_key.verifier_entry()]).unwrap();
        assert!(matches!(
            rotated.verify_at(&token, 1050),
            Err(AuthError::UnknownKey(_))
        ));
        // Another audience with the same keys: checked afresh, refused.
        let (key, _, _) = signed(1000, 1100);
        let a = Verifier::new("iss", "aud", &[key.verifier_entry()]).unwrap();
        let b = Verifier::new("iss", "other", &[key.verifier_entry()]).unwrap();
        let token = key.sign(&claims_between(1000, 1100)).unwrap();
        assert!(a.verify_at(&token, 1050).is_ok());
        assert!(matches!(
            b.verify_at(&token, 1050),
            Err(AuthError::WrongAudience { .. })
        ));
    }

    #[test]
    fn a_full_cache_stays_bounded_and_answers_only_inside_a_tokens_window() {
        let cache = VerifiedTokens::new();
        for i in 0..2 * CACHE_MAX {
            cache.insert(&format!("t{i}"), &claims_between(0, 1000), 0);
        }
        assert!(cache.len() <= CACHE_MAX, "{}", cache.len());
        cache.insert("new", &claims_between(0, 1000), 20);
        assert_eq!(cache.get("new", 20), Some(claims_between(0, 1000)));
        // Past its expiry a remembered token is not an answer.
        assert_eq!(cache.get("new", 1000), None);
        // Nor before it is valid, and one outside its window is not kept.
        cache.insert("later", &claims_between(100, 1000), 20);
        assert_eq!(cache.get("later", 150), None);
        // Oversized tokens are never kept.
        let cache = VerifiedTokens::new();
        cache.insert(
            &"x".repeat(CACHE_MAX_TOKEN_LEN + 1),
            &claims_between(0, 1000),
            0,
        );
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_kid_with_two_keys_accepts_either_while_the_signer_moves_over() {
        let (old, new) = (SigningKey::generate("k1"), SigningKey::generate("k1"));
        let both = format!("{}\n{}", old.public_pem(), new.public_pem());
        let v = Verifier::new("iss", "aud", &[("k1".into(), both)]).unwrap();
        let claims = claims_between(1000, 1100);
        assert!(v.verify_at(&old.sign(&claims).unwrap(), 1050).is_ok());
        assert!(v.verify_at(&new.sign(&claims).unwrap(), 1050).is_ok());
        let stranger = SigningKey::generate("k1").sign(&claims).unwrap();
        assert_eq!(v.verify_at(&stranger, 1050), Err(AuthError::BadSignature));
        // One good block and one of garbage: the whole key is refused.
        let bad = format!(
            "{}\n-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            old.public_pem()
        );
        assert!(Verifier::new("iss", "aud", &[("k1".into(), bad)]).is_err());
        assert!(Verifier::new("iss", "aud", &[("k1".into(), "garbage".into())]).is_err());
    }

    #[test]
    fn debug_hides_private_key() {
        let key = SigningKey::generate("k1");
        let shown = format!("{key:?}");
        assert!(shown.contains("k1") && !shown.contains("PRIVATE"));
    }
}
