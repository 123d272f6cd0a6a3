//! Tokens from an external OpenID Connect issuer: the issuer's signing keys
//! as its JSON Web Key Set publishes them ([`KeySet::from_jwks`]), and a
//! [`OidcVerifier`] that checks a token against them.
//!
//! Fetching the discovery document and the key set is the caller's (the
//! global tier's, which refreshes them in the background and when a token
//! names a key it has not seen, so keys rotate without a restart); this
//! module decides, in this order: shape → header (`alg` RS256 or ES256 and
//! the very algorithm of the key its `kid` names: a key is never used with
//! an algorithm the token chose) → signature → claims (`iss` exactly the
//! issuer, `aud` the audience or an array holding it, `exp` required, `nbf`
//! if present, 30 s of leeway, `sub` present). What a valid token means
//! (which tenant, which role) is the caller's mapping of its claims.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::AuthError;
use crate::jwt::{decode_json, unix_now, ValidWindow, VerifiedTokens};

/// Tokens longer than this are refused before any parsing.
const MAX_TOKEN_LEN: usize = 16 * 1024;
/// Allowance for clock skew between the issuer and us.
const LEEWAY_S: i64 = 30;
/// The shortest RSA modulus accepted, in bits.
const MIN_RSA_BITS: usize = 2048;

/// An issuer's usable signing keys, by key id, each with the one algorithm
/// it verifies.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: BTreeMap<String, (Algorithm, DecodingKey)>,
    /// Keys of the set that were left out, and why (for the log).
    pub skipped: Vec<String>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl KeySet {
    /// The signing keys of a JWKS document (RFC 7517): RSA keys of at least
    /// 2048 bits (RS256) and P-256 keys (ES256), each with a `kid`. Keys
    /// of other types or curves, for encryption (`use: enc`), or naming
    /// another algorithm are left out (named in [`KeySet::skipped`]), not
    /// an error: issuers publish such keys beside their signing keys.
    pub fn from_jwks(json: &[u8]) -> Result<KeySet, AuthError> {
        #[derive(Deserialize)]
        struct Doc {
            keys: Vec<Value>,
        }
        let doc: Doc = serde_json::from_slice(json)
            .map_err(|e| AuthError::Key(format!("the key set is not a JWKS document ({e})")))?;
        let mut set = KeySet::default();
        for raw in doc.keys {
            let kid = raw
                .get("kid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            match usable(raw) {
                Ok(_) if kid.is_empty() => set.skipped.push("a key without a kid".into()),
                Ok(key) => {
                    if set.keys.insert(kid.clone(), key).is_some() {
                        return Err(AuthError::Key(format!(
                            "the key set names kid {kid:?} twice"
                        )));
                    }
                }
                Err(why) => set.skipped.push(format!("{kid:?}: {why}")),
            }
        }
        Ok(set)
    }

    /// The key ids it holds.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Whether it holds key `kid`.
    pub fn has(&self, kid: &str) -> bool {
        self.keys.contains_key(kid)
    }
}

/// One JWK as a verification key, or why it is not one.
fn usable(raw: Value) -> Result<(Algorithm, DecodingKey), String> {
    let jwk: Jwk = serde_json::from_value(raw).map_err(|e| format!("not a JWK ({e})"))?;
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return Err("not a signing key (`use`)".into());
    }
    let (alg, key) = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            let n = URL_SAFE_NO_PAD
                .decode(rsa.n.trim_end_matches('='))
                .map_err(|_| "its modulus is not base64url")?;
            let bits = n
                .len()
                .saturating_sub(n.iter().take_while(|b| **b == 0).count())
                * 8;
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "an RSA key of {bits} bits (at least {MIN_RSA_BITS})"
                ));
            }
            let key = DecodingKey::from_rsa_components(&rsa.n, &rsa.e)
                .map_err(|e| format!("not an RSA key ({e})"))?;
            (Algorithm::RS256, key)
        }
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            let key = DecodingKey::from_ec_components(&ec.x, &ec.y)
                .map_err(|e| format!("not a P-256 key ({e})"))?;
            (Algorithm::ES256, key)
        }
        _ => return Err("neither RSA nor P-256".into()),
    };
    let named = jwk.common.key_algorithm;
    let agrees = matches!(
        (named, alg),
        (None, _)
            | (Some(KeyAlgorithm::RS256), Algorithm::RS256)
            | (Some(KeyAlgorithm::ES256), Algorithm::ES256)
    );
    if !agrees {
        return Err(format!("its `alg` is {named:?}, not {alg:?}"));
    }
    Ok((alg, key))
}

/// A token's claims once verified: the whole payload, and its validity
/// window for the verifier's memory.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedClaims {
    /// Every claim of the payload.
    pub claims: Map<String, Value>,
    /// `sub`.
    pub sub: String,
    nbf: i64,
    exp: i64,
}

impl ValidWindow for VerifiedClaims {
    fn window(&self) -> (i64, i64) {
        (self.nbf, self.exp)
    }
}

impl VerifiedClaims {
    /// A claim as strings: a string claim as one, an array's strings
    /// (`groups`, `roles`), nothing otherwise.
    pub fn strings(&self, claim: &str) -> Vec<&str> {
        match self.claims.get(claim) {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// Checks tokens of one OpenID Connect issuer for one audience against the
/// keys installed last ([`OidcVerifier::install`]). Clones share the keys
/// and the memory of verified tokens.
#[derive(Clone)]
pub struct OidcVerifier {
    inner: Arc<OidcInner>,
}

struct OidcInner {
    issuer: String,
    audience: String,
    keys: RwLock<Arc<KeySet>>,
    verified: VerifiedTokens<VerifiedClaims>,
}

impl std::fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("issuer", &self.inner.issuer)
            .field("audience", &self.inner.audience)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// A verifier for `issuer` (its `iss`, exactly as its discovery
    /// document says) and `audience`, with no keys yet: every token is
    /// refused (`unknown_key`) until keys are installed.
    pub fn new(issuer: &str, audience: &str) -> Result<OidcVerifier, AuthError> {
        if issuer.is_empty() || audience.is_empty() {
            return Err(AuthError::Key(
                "an OpenID Connect verifier needs an issuer and an audience".into(),
            ));
        }
        Ok(OidcVerifier {
            inner: Arc::new(OidcInner {
                issuer: issuer.to_owned(),
                audience: audience.to_owned(),
                keys: RwLock::new(Arc::new(KeySet::default())),
                verified: VerifiedTokens::new(),
            }),
        })
    }

    /// The issuer it trusts.
    pub fn issuer(&self) -> &str {
        &self.inner.issuer
    }

    /// Puts `keys` in use for every token from now on. Tokens remembered
    /// as verified are forgotten: a key the issuer withdrew verifies
    /// nothing more, whatever was checked with it before.
    pub fn install(&self, keys: KeySet) {
        *self.inner.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        self.inner.verified.clear();
    }

    /// The keys in use.
    pub fn keys(&self) -> Arc<KeySet> {
        self.inner
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The `kid` a token's header names, unverified (to tell a key the
    /// verifier has not seen yet, worth fetching the key set again for).
    pub fn kid_of(token: &str) -> Option<String> {
        let header: Value = decode_json(token.split('.').next()?, "header").ok()?;
        header.get("kid")?.as_str().map(str::to_owned)
    }

    /// Verifies `token` now.
    pub fn verify(&self, token: &str) -> Result<VerifiedClaims, AuthError> {
        self.verify_at(token, unix_now())
    }

    /// Verifies `token` as if the time were `now` (Unix seconds).
    pub fn verify_at(&self, token: &str, now: i64) -> Result<VerifiedClaims, AuthError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed(format!(
                "the token is longer than {MAX_TOKEN_LEN} bytes"
            )));
        }
        if let Some(claims) = self.inner.verified.get(token, now) {
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
        let header: Map<String, Value> = decode_json(header_b64, "header")?;
        if header.contains_key("crit") {
            return Err(AuthError::Malformed(
                "the header has critical extensions (`crit`), which this server does not support"
                    .into(),
            ));
        }
        let alg = match header.get("alg") {
            Some(Value::String(a)) => a.as_str(),
            Some(other) => return Err(AuthError::UnsupportedAlgorithm(other.to_string())),
            None => return Err(AuthError::Malformed("the header has no `alg`".into())),
        };
        let kid = match header.get("kid") {
            Some(Value::String(k)) => k.as_str(),
            Some(other) => return Err(AuthError::UnknownKey(other.to_string())),
            None => return Err(AuthError::UnknownKey(String::new())),
        };
        let keys = self.keys();
        let Some((key_alg, key)) = keys.keys.get(kid) else {
            return Err(AuthError::UnknownKey(kid.to_owned()));
        };
        // The key decides the algorithm; the token's header must agree.
        let wanted = match key_alg {
            Algorithm::RS256 => "RS256",
            _ => "ES256",
        };
        if alg != wanted {
            return Err(AuthError::UnsupportedAlgorithm(alg.to_owned()));
        }
        let signed = &token[..header_b64.len() + 1 + payload_b64.len()];
        if !jsonwebtoken::crypto::verify(sig_b64, signed.as_bytes(), key, *key_alg).unwrap_or(false)
        {
            return Err(AuthError::BadSignature);
        }
        let claims: Map<String, Value> = decode_json(payload_b64, "payload")?;
        let verified = self.check_claims(claims, now)?;
        self.inner.verified.insert(token, &verified, now);
        Ok(verified)
    }

    fn check_claims(
        &self,
        claims: Map<String, Value>,
        now: i64,
    ) -> Result<VerifiedClaims, AuthError> {
        let iss = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        if iss != self.inner.issuer {
            return Err(AuthError::WrongIssuer {
                expected: self.inner.issuer.clone(),
                found: iss.to_owned(),
            });
        }
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !audiences.contains(&self.inner.audience.as_str()) {
            return Err(AuthError::WrongAudience {
                expected: self.inner.audience.clone(),
                found: audiences.join(","),
            });
        }
        let time = |name: &str| -> Result<Option<i64>, AuthError> {
            match claims.get(name) {
                None => Ok(None),
                Some(v) => (v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
                    .map(Some)
                    .ok_or_else(|| AuthError::BadClaims(format!("`{name}` is not a number"))),
            }
        };
        let exp = time("exp")?.ok_or_else(|| AuthError::BadClaims("no `exp`".into()))?;
        let nbf = time("nbf")?.unwrap_or(i64::MIN);
        if now > exp.saturating_add(LEEWAY_S) {
            return Err(AuthError::Expired { expired_at: exp });
        }
        if now.saturating_add(LEEWAY_S) < nbf {
            return Err(AuthError::NotYetValid { not_before: nbf });
        }
        let sub = claims.get("sub").and_then(Value::as_str).unwrap_or("");
        if sub.is_empty() {
            return Err(AuthError::BadClaims("`sub` is missing or empty".into()));
        }
        Ok(VerifiedClaims {
            sub: sub.to_owned(),
            claims,
            nbf,
            exp,
        })
    }
}

/// The `iss` a token's payload names, unverified: which verifier to ask
/// (the answer comes from that verifier's checks alone).
pub fn issuer_of(token: &str) -> Option<String> {
    let payload: Value = decode_json(token.split('.').nth(1)?, "payload").ok()?;
    payload.get("iss")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jwt::SigningKey;
    use serde_json::json;

    const ISS: &str = "https://idp.example/realms/lab";
    const AUD: &str = "gangway";

    fn ec_jwk(key: &SigningKey) -> Value {
        key.public_jwk()
    }

    fn sign(key: &SigningKey, alg: jsonwebtoken::Algorithm, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(alg);
        header.kid = Some(key.kid().to_string());
        let enc = jsonwebtoken::EncodingKey::from_ec_pem(key.private_pem().as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &enc).unwrap()
    }

    fn claims(aud: Value) -> Value {
        json!({"iss": ISS, "aud": aud, "sub": "u-1", "exp": 2000, "iat": 1000, "org": "acme"})
    }

    fn verifier(keys: &[Value]) -> OidcVerifier {
        let v = OidcVerifier::new(ISS, AUD).unwrap();
        let set = KeySet::from_jwks(json!({ "keys": keys }).to_string().as_bytes()).unwrap();
        v.install(set);
        v
    }

    #[test]
    fn a_token_of_the_issuer_verifies_with_aud_as_a_string_or_an_array() {
        let key = SigningKey::generate("k1");
        let v = verifier(&[ec_jwk(&key)]);
        for aud in [json!(AUD), json!(["account", AUD])] {
            let token = sign(&key, jsonwebtoken::Algorithm::ES256, &claims(aud));
            let got = v.verify_at(&token, 1500).unwrap();
            assert_eq!(got.sub, "u-1");
            assert_eq!(got.strings("org"), vec!["acme"]);
        }
    }

    #[test]
    fn every_wrong_token_is_refused_with_its_code() {
        let key = SigningKey::generate("k1");
        let v = verifier(&[ec_jwk(&key)]);
        let es = |c: &Value| sign(&key, jsonwebtoken::Algorithm::ES256, c);
        let mut other_iss = claims(json!(AUD));
        other_iss["iss"] = json!("https://idp.example/realms/other");
        let mut no_exp = claims(json!(AUD));
        no_exp.as_object_mut().unwrap().remove("exp");
        let mut no_sub = claims(json!(AUD));
        no_sub["sub"] = json!("");
        let stranger = SigningKey::generate("k1");
        let unknown = SigningKey::generate("k2");
        // HS256 keyed with the public key: the key says ES256.
        let mut hs = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        hs.kid = Some("k1".into());
        let hs256 = jsonwebtoken::encode(
            &hs,
            &claims(json!(AUD)),
            &jsonwebtoken::EncodingKey::from_secret(key.public_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        let token = es(&claims(json!(AUD)));
        let parts: Vec<&str> = token.split('.').collect();
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","kid":"k1"}"#),
            parts[1]
        );
        let cases = [
            (es(&claims(json!("someone-else"))), 1500, "wrong_audience"),
            (es(&claims(json!(["a", "b"]))), 1500, "wrong_audience"),
            (es(&other_iss), 1500, "wrong_issuer"),
            (es(&claims(json!(AUD))), 2100, "token_expired"),
            (es(&no_exp), 1500, "bad_claims"),
            (es(&no_sub), 1500, "bad_claims"),
            (
                sign(
                    &stranger,
                    jsonwebtoken::Algorithm::ES256,
                    &claims(json!(AUD)),
                ),
                1500,
                "bad_signature",
            ),
            (
                sign(
                    &unknown,
                    jsonwebtoken::Algorithm::ES256,
                    &claims(json!(AUD)),
                ),
                1500,
                "unknown_key",
            ),
            (hs256, 1500, "unsupported_algorithm"),
            (none, 1500, "unsupported_algorithm"),
        ];
        for (token, now, code) in cases {
            let err = v.verify_at(&token, now).unwrap_err();
            assert_eq!(err.code(), code, "{err}");
        }
    }

    #[test]
    fn a_key_withdrawn_from_the_set_verifies_nothing_more_even_remembered_tokens() {
        let (old, new) = (SigningKey::generate("old"), SigningKey::generate("new"));
        let v = verifier(&[ec_jwk(&old)]);
        let by_old = sign(&old, jsonwebtoken::Algorithm::ES256, &claims(json!(AUD)));
        assert!(v.verify_at(&by_old, 1500).is_ok());
        v.install(
            KeySet::from_jwks(json!({"keys": [ec_jwk(&new)]}).to_string().as_bytes()).unwrap(),
        );
        assert_eq!(
            v.verify_at(&by_old, 1500).unwrap_err().code(),
            "unknown_key"
        );
        let by_new = sign(&new, jsonwebtoken::Algorithm::ES256, &claims(json!(AUD)));
        assert!(v.verify_at(&by_new, 1500).is_ok());
    }

    #[test]
    fn a_key_set_keeps_signing_keys_and_says_why_it_left_the_others_out() {
        let key = SigningKey::generate("ec");
        let mut enc = ec_jwk(&key);
        enc["use"] = json!("enc");
        enc["kid"] = json!("enc");
        let mut wrong_alg = ec_jwk(&key);
        wrong_alg["alg"] = json!("RS256");
        wrong_alg["kid"] = json!("mislabelled");
        let mut no_kid = ec_jwk(&key);
        no_kid.as_object_mut().unwrap().remove("kid");
        // A 1024-bit RSA modulus (128 bytes of 0xff): too short.
        let short = json!({"kty": "RSA", "kid": "short", "e": "AQAB",
                           "n": URL_SAFE_NO_PAD.encode([0xffu8; 128])});
        let okp = json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        let doc = json!({"keys": [ec_jwk(&key), enc, wrong_alg, no_kid, short, okp]});
        let set = KeySet::from_jwks(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.kids().collect::<Vec<_>>(), vec!["ec"]);
        assert_eq!(set.skipped.len(), 5, "{:?}", set.skipped);
        assert!(KeySet::from_jwks(b"{\"nokeys\": 1}").is_err());
        let twice = json!({"keys": [ec_jwk(&key), ec_jwk(&key)]});
        assert!(KeySet::from_jwks(twice.to_string().as_bytes()).is_err());
    }
}
