//! Token verification: one valid path, and every way a token is refused,
//! each with its stable code.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gangway_auth::{claims_for, AuthError, Claims, Role, SigningKey, Verifier};
use serde_json::json;

const ISS: &str = "https://gangway.test";
const AUD: &str = "gangway-api";

struct Fixture {
    key: SigningKey,
    verifier: Verifier,
}

fn fixture() -> Fixture {
    let key = SigningKey::generate("k1");
    let verifier = Verifier::new(ISS, AUD, &[key.verifier_entry()]).unwrap();
    Fixture { key, verifier }
}

fn tenant_claims(tenant: &str) -> Claims {
    claims_for(
        Role::Tenant,
        "alice",
        Some(tenant),
        None,
        ISS,
        AUD,
        Duration::from_secs(600),
    )
}

fn b64(v: &serde_json::Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

fn parts(token: &str) -> (String, String, String) {
    let mut it = token.split('.').map(str::to_owned);
    (it.next().unwrap(), it.next().unwrap(), it.next().unwrap())
}

/// The code of the error verifying `token` at the current time.
fn code(v: &Verifier, token: &str) -> &'static str {
    v.verify(token).unwrap_err().code()
}

#[test]
fn valid_token_round_trips_claims() {
    let f = fixture();
    let claims = tenant_claims("acme");
    let token = f.key.sign(&claims).unwrap();
    assert_eq!(f.verifier.verify(&token).unwrap(), claims);
    let header = format!("Bearer {token}");
    assert_eq!(f.verifier.verify_header(Some(&header)).unwrap(), claims);

    let (h, _, _) = parts(&token);
    let h: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
    assert_eq!(h["alg"], "ES256");
    assert_eq!(h["kid"], "k1");
}

#[test]
fn every_role_verifies_with_its_required_claims() {
    let f = fixture();
    let ttl = Duration::from_secs(60);
    for claims in [
        claims_for(Role::Admin, "ops", None, None, ISS, AUD, ttl),
        claims_for(Role::Admin, "ops", Some("acme"), None, ISS, AUD, ttl),
        claims_for(Role::Service, "global-0", None, None, ISS, AUD, ttl),
        claims_for(Role::Agent, "node-7", None, Some("us-east"), ISS, AUD, ttl),
    ] {
        let token = f.key.sign(&claims).unwrap();
        assert_eq!(f.verifier.verify(&token).unwrap(), claims);
    }
}

#[test]
fn header_failures() {
    let f = fixture();
    let v = &f.verifier;
    assert_eq!(v.verify_header(None).unwrap_err().code(), "missing_token");
    assert_eq!(
        v.verify_header(Some("")).unwrap_err().code(),
        "missing_token"
    );
    let token = f.key.sign(&tenant_claims("acme")).unwrap();
    let basic = format!("Basic {token}");
    assert_eq!(
        v.verify_header(Some(&basic)).unwrap_err().code(),
        "malformed_token"
    );
    assert_eq!(
        v.verify_header(Some(&token)).unwrap_err().code(),
        "malformed_token"
    );
}

#[test]
fn garbage_is_malformed() {
    let f = fixture();
    for garbage in [
        "garbage",
        "a.b",
        "a.b.c.d",
        "!!!.???.***",
        "e30.e30.",
        &"x".repeat(10_000),
    ] {
        let err = f.verifier.verify(garbage).unwrap_err();
        assert_eq!(err.code(), "malformed_token", "{garbage:.40}: {err}");
    }
    let err = f
        .verifier
        .verify_header(Some("Bearer garbage"))
        .unwrap_err();
    assert_eq!(err.code(), "malformed_token");
    assert!(err.to_string().contains("Authorization: Bearer"), "{err}");
}

#[test]
fn expired_token_is_refused_after_the_leeway() {
    let f = fixture();
    let mut claims = tenant_claims("acme");
    claims.exp = claims.iat - 3600;
    claims.nbf = claims.iat - 7200;
    let token = f.key.sign(&claims).unwrap();
    let err = f.verifier.verify(&token).unwrap_err();
    assert_eq!(err.code(), "token_expired");
    assert!(err.to_string().contains("get a new one"), "{err}");

    // Inside the leeway it still verifies; with no leeway it does not.
    let exp = claims.exp;
    assert!(f.verifier.verify_at(&token, exp + 30).is_ok());
    assert_eq!(
        f.verifier.verify_at(&token, exp + 31).unwrap_err(),
        AuthError::Expired { expired_at: exp }
    );
    let strict = f.verifier.clone().leeway(0);
    assert!(strict.verify_at(&token, exp).is_ok());
    assert_eq!(
        strict.verify_at(&token, exp + 1).unwrap_err().code(),
        "token_expired"
    );
}

#[test]
fn token_from_the_future_is_not_yet_valid() {
    let f = fixture();
    let mut claims = tenant_claims("acme");
    claims.nbf = claims.iat + 3600;
    claims.exp = claims.iat + 7200;
    let token = f.key.sign(&claims).unwrap();
    assert_eq!(code(&f.verifier, &token), "token_not_yet_valid");
    assert!(f.verifier.verify_at(&token, claims.nbf - 30).is_ok());
    assert_eq!(
        f.verifier
            .verify_at(&token, claims.nbf - 31)
            .unwrap_err()
            .code(),
        "token_not_yet_valid"
    );
}

#[test]
fn tampered_payload_keeps_no_signature() {
    let f = fixture();
    let token = f.key.sign(&tenant_claims("acme")).unwrap();
    let (h, p, s) = parts(&token);
    let mut payload: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap();
    payload["role"] = json!("admin");
    payload["tenant"] = json!("globex");
    let forged = format!("{h}.{}.{s}", b64(&payload));
    assert_eq!(code(&f.verifier, &forged), "bad_signature");
}

#[test]
fn tampered_signature_is_refused() {
    let f = fixture();
    let token = f.key.sign(&tenant_claims("acme")).unwrap();
    let (h, p, s) = parts(&token);
    let mut sig = URL_SAFE_NO_PAD.decode(&s).unwrap();
    sig[0] ^= 0x01;
    let forged = format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(&sig));
    assert_eq!(code(&f.verifier, &forged), "bad_signature");
    // Truncated, empty and non-base64 signatures as well.
    assert_eq!(
        code(&f.verifier, &format!("{h}.{p}.{}", &s[..20])),
        "bad_signature"
    );
    assert_eq!(code(&f.verifier, &format!("{h}.{p}.")), "bad_signature");
    assert_eq!(code(&f.verifier, &format!("{h}.{p}.***")), "bad_signature");
}

#[test]
fn alg_none_is_refused() {
    let f = fixture();
    let claims = serde_json::to_value(tenant_claims("acme")).unwrap();
    for alg in ["none", "None", "NONE"] {
        let header = json!({"alg": alg, "typ": "JWT", "kid": "k1"});
        let token = format!("{}.{}.", b64(&header), b64(&claims));
        assert_eq!(code(&f.verifier, &token), "unsupported_algorithm", "{alg}");
    }
    // alg of the wrong JSON type; alg missing or null.
    let token = format!(
        "{}.{}.",
        b64(&json!({"alg": 256, "kid": "k1"})),
        b64(&claims)
    );
    assert_eq!(code(&f.verifier, &token), "unsupported_algorithm");
    for header in [json!({"kid": "k1"}), json!({"alg": null, "kid": "k1"})] {
        let token = format!("{}.{}.", b64(&header), b64(&claims));
        assert_eq!(code(&f.verifier, &token), "malformed_token", "{header}");
    }
}

#[test]
fn hs256_keyed_with_the_public_key_is_refused() {
    let f = fixture();
    let public_pem = f.key.public_pem();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    let token = jsonwebtoken::encode(
        &header,
        &tenant_claims("acme"),
        &jsonwebtoken::EncodingKey::from_secret(public_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let err = f.verifier.verify(&token).unwrap_err();
    assert_eq!(err.code(), "unsupported_algorithm");
    assert!(err.to_string().contains("HS256"), "{err}");
}

#[test]
fn other_asymmetric_algorithms_are_refused() {
    let f = fixture();
    let token = f.key.sign(&tenant_claims("acme")).unwrap();
    let (_, p, s) = parts(&token);
    for alg in ["RS256", "ES384", "ES512", "PS256", "EdDSA", "es256"] {
        let header = json!({"alg": alg, "typ": "JWT", "kid": "k1"});
        let token = format!("{}.{p}.{s}", b64(&header));
        assert_eq!(code(&f.verifier, &token), "unsupported_algorithm", "{alg}");
    }
}

#[test]
fn unknown_or_missing_kid_is_refused() {
    let f = fixture();
    let claims = tenant_claims("acme");
    let other = SigningKey::generate("k2");
    let token = other.sign(&claims).unwrap();
    let err = f.verifier.verify(&token).unwrap_err();
    assert_eq!(err, AuthError::UnknownKey("k2".into()));

    // Our own signature, but the header names no key.
    let (_, p, s) = parts(&f.key.sign(&claims).unwrap());
    let header = json!({"alg": "ES256", "typ": "JWT"});
    assert_eq!(
        code(&f.verifier, &format!("{}.{p}.{s}", b64(&header))),
        "unknown_key"
    );

    // A known kid but another key's signature: the signature fails.
    let forged_kid = SigningKey::from_pem("k1", &other.private_pem()).unwrap();
    assert_eq!(
        code(&f.verifier, &forged_kid.sign(&claims).unwrap()),
        "bad_signature"
    );
}

#[test]
fn wrong_audience_and_issuer_are_refused() {
    let f = fixture();
    let mut claims = tenant_claims("acme");
    claims.aud = "gangway-region".into();
    let err = f
        .verifier
        .verify(&f.key.sign(&claims).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), "wrong_audience");

    // Exact match only: no prefixes, no case folding.
    claims.aud = format!("{AUD}x");
    assert_eq!(
        code(&f.verifier, &f.key.sign(&claims).unwrap()),
        "wrong_audience"
    );

    let mut claims = tenant_claims("acme");
    claims.iss = "https://evil.test".into();
    assert_eq!(
        code(&f.verifier, &f.key.sign(&claims).unwrap()),
        "wrong_issuer"
    );

    // An audience given as an array is not our claim shape.
    let mut payload = serde_json::to_value(tenant_claims("acme")).unwrap();
    payload["aud"] = json!([AUD]);
    let token = sign_raw(&f.key, &payload);
    assert_eq!(code(&f.verifier, &token), "bad_claims");
}

/// Signs an arbitrary JSON payload (for claims our `Claims` type cannot express).
fn sign_raw(key: &SigningKey, payload: &serde_json::Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(key.kid().to_owned());
    let enc = jsonwebtoken::EncodingKey::from_ec_pem(key.private_pem().as_bytes()).unwrap();
    jsonwebtoken::encode(&header, payload, &enc).unwrap()
}

#[test]
fn role_claim_rules() {
    let f = fixture();
    let ttl = Duration::from_secs(60);

    let no_tenant = claims_for(Role::Tenant, "alice", None, None, ISS, AUD, ttl);
    let err = f
        .verifier
        .verify(&f.key.sign(&no_tenant).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), "bad_claims");
    assert!(err.to_string().contains("tenant"), "{err}");

    for bad in ["", "-acme", "Acme", "ac_me", &"a".repeat(64)] {
        let claims = tenant_claims(bad);
        assert_eq!(
            code(&f.verifier, &f.key.sign(&claims).unwrap()),
            "bad_claims",
            "{bad:?}"
        );
    }

    let agent = claims_for(Role::Agent, "node-1", None, None, ISS, AUD, ttl);
    let err = f.verifier.verify(&f.key.sign(&agent).unwrap()).unwrap_err();
    assert_eq!(err.code(), "bad_claims");
    assert!(err.to_string().contains("region"), "{err}");

    // An unknown role, or a claim missing altogether.
    let mut payload = serde_json::to_value(tenant_claims("acme")).unwrap();
    payload["role"] = json!("root");
    assert_eq!(code(&f.verifier, &sign_raw(&f.key, &payload)), "bad_claims");
    let mut payload = serde_json::to_value(tenant_claims("acme")).unwrap();
    payload.as_object_mut().unwrap().remove("exp");
    assert_eq!(code(&f.verifier, &sign_raw(&f.key, &payload)), "bad_claims");
}

#[test]
fn rotation_accepts_every_configured_key_and_no_other() {
    let old = SigningKey::generate("2025-01");
    let new = SigningKey::generate("2025-02");
    let retired = SigningKey::generate("2024-12");
    let v = Verifier::new(ISS, AUD, &[old.verifier_entry(), new.verifier_entry()]).unwrap();
    let claims = tenant_claims("acme");
    assert_eq!(v.verify(&old.sign(&claims).unwrap()).unwrap(), claims);
    assert_eq!(v.verify(&new.sign(&claims).unwrap()).unwrap(), claims);
    assert_eq!(code(&v, &retired.sign(&claims).unwrap()), "unknown_key");
}

#[test]
fn keys_round_trip_through_pem() {
    let key = SigningKey::generate("k1");
    let again = SigningKey::from_pem("k1", &key.private_pem()).unwrap();
    assert_eq!(again.public_pem(), key.public_pem());
    assert!(key.public_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
    assert!(key.private_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
    let v = Verifier::new(ISS, AUD, &[("k1".into(), key.public_pem())]).unwrap();
    let claims = tenant_claims("acme");
    assert_eq!(v.verify(&again.sign(&claims).unwrap()).unwrap(), claims);
}

#[test]
fn bad_key_configuration_is_invalid_key() {
    let key = SigningKey::generate("k1");
    let check = |keys: &[(String, String)]| Verifier::new(ISS, AUD, keys).unwrap_err().code();
    assert_eq!(check(&[]), "invalid_key");
    assert_eq!(check(&[("k1".into(), "not a pem".into())]), "invalid_key");
    assert_eq!(check(&[("k1".into(), key.private_pem())]), "invalid_key");
    assert_eq!(check(&[("".into(), key.public_pem())]), "invalid_key");
    assert_eq!(
        check(&[key.verifier_entry(), key.verifier_entry()]),
        "invalid_key"
    );
    assert_eq!(
        SigningKey::from_pem("k1", &key.public_pem())
            .unwrap_err()
            .code(),
        "invalid_key"
    );
    assert_eq!(
        SigningKey::from_pem("k1", "junk").unwrap_err().code(),
        "invalid_key"
    );
}
