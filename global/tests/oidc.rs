//! Single sign-on against an OpenID Connect identity provider the test
//! serves over HTTPS (its own CA): discovery, JWKS, RS256 and ES256 keys,
//! `aud` as an array, a claim naming the tenant, a separate issuer for
//! operators, keys rotated with no restart — and every forgery refused.
//! Nothing bypasses verification: the global tier fetches the keys itself.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use gangway_auth::jwt::SigningKey;
use gangway_global::oidc::{OidcIssuer, OidcKind};
use serde_json::{json, Value};
use support::{spec, Cloud};

/// The test-only RSA key (2048 bits, `openssl genrsa`) and its JWK.
const RSA_PEM: &[u8] = include_bytes!("fixtures/oidc-rsa.pem");
const RSA_JWK: &str = include_str!("fixtures/oidc-rsa.jwk.json");

/// An identity provider with a realm per issuer: each realm's discovery
/// document and key set, the key sets changeable while it runs.
struct Idp {
    base: String,
    ca_pem: String,
    keys: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    fetches: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

#[derive(Clone)]
struct IdpState {
    base: String,
    keys: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    fetches: Arc<AtomicUsize>,
}

async fn discovery(State(s): State<IdpState>, Path(realm): Path<String>) -> Json<Value> {
    let issuer = format!("{}/{realm}", s.base);
    Json(
        json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
                "id_token_signing_alg_values_supported": ["RS256", "ES256"]}),
    )
}

async fn jwks(State(s): State<IdpState>, Path(realm): Path<String>) -> Json<Value> {
    s.fetches.fetch_add(1, Ordering::SeqCst);
    let keys = s
        .keys
        .lock()
        .unwrap()
        .get(&realm)
        .cloned()
        .unwrap_or_default();
    Json(json!({ "keys": keys }))
}

impl Idp {
    async fn start(realms: BTreeMap<String, Vec<Value>>) -> Idp {
        let dir = tempfile::tempdir().unwrap();
        let pki = gangway_auth::DevMaterial::load_or_create(dir.path()).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let state = IdpState {
            base: base.clone(),
            keys: Arc::new(Mutex::new(realms)),
            fetches: Arc::new(AtomicUsize::new(0)),
        };
        let app = Router::new()
            .route("/{realm}/.well-known/openid-configuration", get(discovery))
            .route("/{realm}/jwks", get(jwks))
            .with_state(state.clone());
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(pki.server_config().unwrap());
        listener.set_nonblocking(true).unwrap();
        let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
        tokio::spawn(server.serve(app.into_make_service()));
        Idp {
            base,
            ca_pem: pki.ca_pem().unwrap(),
            keys: state.keys,
            fetches: state.fetches,
            _dir: dir,
        }
    }

    fn issuer(&self, realm: &str) -> String {
        format!("{}/{realm}", self.base)
    }

    fn set_keys(&self, realm: &str, keys: Vec<Value>) {
        self.keys.lock().unwrap().insert(realm.to_string(), keys);
    }
}

/// A token the way an identity provider makes one.
fn token(
    alg: jsonwebtoken::Algorithm,
    kid: &str,
    key: &jsonwebtoken::EncodingKey,
    claims: &Value,
) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn es256(key: &SigningKey, claims: &Value) -> String {
    let enc = jsonwebtoken::EncodingKey::from_ec_pem(key.private_pem().as_bytes()).unwrap();
    token(jsonwebtoken::Algorithm::ES256, key.kid(), &enc, claims)
}

fn rs256(kid: &str, claims: &Value) -> String {
    let enc = jsonwebtoken::EncodingKey::from_rsa_pem(RSA_PEM).unwrap();
    token(jsonwebtoken::Algorithm::RS256, kid, &enc, claims)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn code_of(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or_default();
    (status, body["code"].as_str().unwrap_or("").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_the_configured_issuers_work_and_forgeries_do_not() {
    let ec = SigningKey::generate("ec-1");
    let op = SigningKey::generate("op-1");
    let rsa: Value = serde_json::from_str(RSA_JWK).unwrap();
    let idp = Idp::start(BTreeMap::from([
        ("tenants".to_string(), vec![rsa.clone(), ec.public_jwk()]),
        ("operators".to_string(), vec![op.public_jwk()]),
    ]))
    .await;
    let (tenants, operators) = (idp.issuer("tenants"), idp.issuer("operators"));
    let ca = idp.ca_pem.clone();
    let cloud = Cloud::start_with(|c| {
        c.oidc = vec![
            OidcIssuer {
                issuer: tenants.clone(),
                audience: "gangway".into(),
                kind: OidcKind::Tenants {
                    tenant_claim: "org".into(),
                },
                ca_pem: Some(ca.clone()),
                refresh: Duration::from_secs(300),
            },
            OidcIssuer {
                issuer: operators.clone(),
                audience: "gangway-ops".into(),
                kind: OidcKind::Operators {
                    require: Some(("groups".into(), "sre".into())),
                },
                ca_pem: Some(ca.clone()),
                refresh: Duration::from_secs(300),
            },
        ];
    })
    .await;
    let started = Instant::now();
    let http = cloud.http();
    let call = |method: reqwest::Method, g: usize, path: &str, token: &str| {
        let r = (http.request(method, format!("{}{path}", cloud.globals[g])))
            .bearer_auth(token.to_string());
        async move { r.send().await.unwrap() }
    };
    let user = |tenant: Value, aud: Value| {
        json!({"iss": tenants, "aud": aud, "sub": "user-7", "org": tenant,
               "iat": now(), "exp": now() + 600})
    };

    // An RS256 token naming its tenant in `org`, `aud` an array: a tenant.
    let acme = rs256("rsa-1", &user(json!("acme"), json!(["account", "gangway"])));
    for g in 0..2 {
        let r = call(reqwest::Method::GET, g, "/v1/jobs", &acme).await;
        assert_eq!(r.status(), 200, "replica {g}: {}", r.text().await.unwrap());
    }
    let made = (http.post(format!("{}/v1/jobs", cloud.globals[0])))
        .bearer_auth(&acme)
        .json(&spec(1))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    let job: Value = made.json().await.unwrap();
    assert_eq!(job["tenant"], "acme");
    // Another tenant's single sign-on token sees none of it.
    let globex = es256(&ec, &user(json!("globex"), json!("gangway")));
    let id = job["id"].as_str().unwrap();
    let r = call(reqwest::Method::GET, 1, &format!("/v1/jobs/{id}"), &globex).await;
    assert_eq!(code_of(r).await, (404, "not_found".into()));

    // Forgeries and mistakes, each refused with its code.
    let mut expired = user(json!("acme"), json!("gangway"));
    expired["exp"] = json!(now() - 3600);
    let mut no_tenant = user(json!("acme"), json!("gangway"));
    no_tenant.as_object_mut().unwrap().remove("org");
    // Signed by a key the provider never published, under a kid it did.
    let stranger = SigningKey::generate("ec-1");
    // The provider's issuer named, but signed with the tier's own tenant
    // key (its kid unknown to the provider).
    let mut relabelled: Value = user(json!("acme"), json!("gangway"));
    relabelled["iss"] = json!(tenants);
    let tier_key_as_idp = token(
        jsonwebtoken::Algorithm::ES256,
        cloud.auth.tenant_key.kid(),
        &jsonwebtoken::EncodingKey::from_ec_pem(cloud.auth.tenant_key.private_pem().as_bytes())
            .unwrap(),
        &relabelled,
    );
    // Another issuer (another realm of the same provider, unconfigured),
    // though signed by a key the tenants' issuer publishes.
    let mut elsewhere = user(json!("acme"), json!("gangway"));
    elsewhere["iss"] = json!(idp.issuer("other"));
    let cases = [
        (es256(&ec, &elsewhere), "unknown_key"),
        (
            rs256("rsa-1", &user(json!("acme"), json!("other-app"))),
            "wrong_audience",
        ),
        (rs256("rsa-1", &expired), "token_expired"),
        (rs256("rsa-1", &no_tenant), "bad_claims"),
        (
            rs256("rsa-1", &user(json!("Not A Tenant"), json!("gangway"))),
            "bad_claims",
        ),
        (
            rs256("rsa-1", &user(json!(["acme", "globex"]), json!("gangway"))),
            "bad_claims",
        ),
        (
            es256(&stranger, &user(json!("acme"), json!("gangway"))),
            "bad_signature",
        ),
        // RS256 claimed for the EC key: the key decides the algorithm.
        (
            rs256("ec-1", &user(json!("acme"), json!("gangway"))),
            "unsupported_algorithm",
        ),
        (tier_key_as_idp, "unknown_key"),
    ];
    for (t, code) in cases {
        let r = call(reqwest::Method::GET, 0, "/v1/jobs", &t).await;
        assert_eq!(code_of(r).await, (401, code.to_string()));
    }
    // The tier's own tenant tokens still work beside the provider's.
    let r = call(reqwest::Method::GET, 0, "/v1/jobs", &cloud.token("acme")).await;
    assert_eq!(r.status(), 200);

    // Operators: their own issuer, their group required, their endpoints.
    let sre = |groups: Value| {
        json!({"iss": operators, "aud": "gangway-ops", "sub": "oncall", "groups": groups,
               "iat": now(), "exp": now() + 600})
    };
    let oncall = es256(&op, &sre(json!(["staff", "sre"])));
    let r = call(reqwest::Method::GET, 1, "/v1/admin/quotas", &oncall).await;
    assert_eq!(r.status(), 200);
    let r = call(reqwest::Method::GET, 1, "/v1/jobs", &oncall).await;
    assert_eq!(code_of(r).await, (403, "forbidden".into()));
    let intern = es256(&op, &sre(json!(["staff"])));
    let r = call(reqwest::Method::GET, 1, "/v1/admin/quotas", &intern).await;
    assert_eq!(code_of(r).await, (403, "forbidden".into()));
    // A tenant's sign-on token is no operator's, whatever it claims.
    let mut pretender = user(json!("acme"), json!("gangway"));
    pretender["groups"] = json!(["sre"]);
    let r = call(
        reqwest::Method::GET,
        0,
        "/v1/admin/quotas",
        &rs256("rsa-1", &pretender),
    )
    .await;
    assert_eq!(code_of(r).await, (403, "forbidden".into()));
    // ... nor is one the tenants' key signs with the operators' issuer.
    let mut crossed = sre(json!(["sre"]));
    crossed["iss"] = json!(operators);
    let r = call(
        reqwest::Method::GET,
        0,
        "/v1/admin/quotas",
        &rs256("rsa-1", &crossed),
    )
    .await;
    assert_eq!(code_of(r).await, (401, "unknown_key".into()));

    // A flood of made-up key ids costs the provider one fetch at most.
    let before = idp.fetches.load(Ordering::SeqCst);
    for i in 0..20 {
        let fake = SigningKey::generate(&format!("made-up-{i}"));
        let r = call(
            reqwest::Method::GET,
            0,
            "/v1/jobs",
            &es256(&fake, &user(json!("acme"), json!("gangway"))),
        )
        .await;
        assert_eq!(code_of(r).await, (401, "unknown_key".into()));
    }
    assert!(idp.fetches.load(Ordering::SeqCst) <= before + 1);

    // The provider rotates: a new key published, the RSA key withdrawn. A
    // token of the new key works without a restart (the tier fetches the
    // keys again for a kid it has not seen, at most every 10 s), and from
    // then on the withdrawn key's tokens are refused.
    let ec2 = SigningKey::generate("ec-2");
    idp.set_keys("tenants", vec![ec.public_jwk(), ec2.public_jwk()]);
    let by_new = es256(&ec2, &user(json!("acme"), json!("gangway")));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call(reqwest::Method::GET, 0, "/v1/jobs", &by_new).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(code_of(r).await, (401, "unknown_key".into()));
        assert!(Instant::now() < deadline, "the new key was never fetched");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let r = call(reqwest::Method::GET, 0, "/v1/jobs", &acme).await;
    assert_eq!(code_of(r).await, (401, "unknown_key".into()));
}

#[test]
fn one_issuer_for_tenants_and_operators_is_refused() {
    let issuer = |kind| OidcIssuer {
        issuer: "https://idp.example/realms/one".into(),
        audience: "gangway".into(),
        kind,
        ca_pem: None,
        refresh: Duration::from_secs(300),
    };
    let err = gangway_global::oidc::check_issuers(&[
        issuer(OidcKind::Tenants {
            tenant_claim: "org".into(),
        }),
        issuer(OidcKind::Operators { require: None }),
    ])
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("operators need an issuer of their own"),
        "{err}"
    );
}
