//! Single sign-on against an OpenID Connect identity provider the test
//! serves over HTTPS (its own CA): discovery, JWKS, RS256 and ES256 keys,
//! `aud` as an array, a claim naming the tenant, a separate issuer for
//! operators, keys rotated with no restart — and every forgery refused.
//! Nothing bypasses verification: the global tier fetches the keys itself.
//! And the console's single sign-on through the provider's authorization
//! code flow (PKCE), played by a browser's redirects and cookies, with the
//! attacks on it: a callback the browser did not start, another state, a
//! token for another nonce, a code used twice, a user the API refuses.

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
/// document and key set, the key sets changeable while it runs; and a
/// browser sign-in (authorization code flow with PKCE) that signs in the
/// user of `user` at once, with the realm's signing key.
struct Idp {
    base: String,
    ca_pem: String,
    keys: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    fetches: Arc<AtomicUsize>,
    /// The claims of whoever signs in next (beside iss, aud, nonce, times).
    user: Arc<Mutex<Value>>,
    /// A nonce to put in ID tokens instead of the one asked (an attack).
    wrong_nonce: Arc<Mutex<Option<String>>>,
    _dir: tempfile::TempDir,
}

/// A code the provider handed out and not yet exchanged.
#[derive(Clone, Debug)]
struct Grant {
    realm: String,
    client_id: String,
    redirect_uri: String,
    nonce: String,
    challenge: String,
}

#[derive(Clone)]
struct IdpState {
    base: String,
    keys: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    fetches: Arc<AtomicUsize>,
    user: Arc<Mutex<Value>>,
    wrong_nonce: Arc<Mutex<Option<String>>>,
    grants: Arc<Mutex<BTreeMap<String, Grant>>>,
}

async fn discovery(State(s): State<IdpState>, Path(realm): Path<String>) -> Json<Value> {
    let issuer = format!("{}/{realm}", s.base);
    Json(
        json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
                "authorization_endpoint": format!("{issuer}/authorize"),
                "token_endpoint": format!("{issuer}/token"),
                "id_token_signing_alg_values_supported": ["RS256", "ES256"]}),
    )
}

/// Signs the user in at once: a code for the client, sent back to its
/// redirect URI with the state.
async fn authorize(
    State(s): State<IdpState>,
    Path(realm): Path<String>,
    axum::extract::Query(q): axum::extract::Query<BTreeMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    if get("response_type") != "code" || get("code_challenge_method") != "S256" {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            "code flow with S256 only",
        )
            .into_response();
    }
    let code = uuid::Uuid::new_v4().simple().to_string();
    s.grants.lock().unwrap().insert(
        code.clone(),
        Grant {
            realm,
            client_id: get("client_id"),
            redirect_uri: get("redirect_uri"),
            nonce: get("nonce"),
            challenge: get("code_challenge"),
        },
    );
    let to = format!("{}?code={code}&state={}", get("redirect_uri"), get("state"));
    axum::response::Redirect::to(&to).into_response()
}

/// Exchanges a code once, for the client and redirect URI it was given
/// to, with the PKCE verifier of its challenge.
async fn token_endpoint(
    State(s): State<IdpState>,
    Path(realm): Path<String>,
    axum::Form(f): axum::Form<BTreeMap<String, String>>,
) -> (axum::http::StatusCode, Json<Value>) {
    use base64::Engine;
    use sha2::Digest;
    let bad = |why: &str| {
        (
            axum::http::StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant", "error_description": why})),
        )
    };
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let Some(grant) = s.grants.lock().unwrap().remove(&get("code")) else {
        return bad("unknown or used code");
    };
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(get("code_verifier").as_bytes()));
    // The tenants' realm has the console registered as a confidential
    // client (the secret the test configures); the operators' as public.
    let secret_ok = realm != "tenants" || get("client_secret") == "s3cret";
    if grant.realm != realm
        || !secret_ok
        || grant.client_id != get("client_id")
        || grant.redirect_uri != get("redirect_uri")
        || grant.challenge != challenge
    {
        return bad("the code was not issued for this");
    }
    let mut claims = s.user.lock().unwrap().clone();
    claims["iss"] = json!(format!("{}/{realm}", s.base));
    claims["aud"] = json!(grant.client_id);
    claims["nonce"] = json!(s.wrong_nonce.lock().unwrap().clone().unwrap_or(grant.nonce));
    claims["iat"] = json!(now());
    claims["exp"] = json!(now() + 600);
    (
        axum::http::StatusCode::OK,
        Json(json!({"id_token": rs256("rsa-1", &claims), "token_type": "Bearer"})),
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
            user: Arc::new(Mutex::new(json!({}))),
            wrong_nonce: Arc::new(Mutex::new(None)),
            grants: Arc::new(Mutex::new(BTreeMap::new())),
        };
        let app = Router::new()
            .route("/{realm}/.well-known/openid-configuration", get(discovery))
            .route("/{realm}/jwks", get(jwks))
            .route("/{realm}/authorize", get(authorize))
            .route("/{realm}/token", axum::routing::post(token_endpoint))
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
            user: state.user,
            wrong_nonce: state.wrong_nonce,
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
                client_secret: None,
            },
            OidcIssuer {
                issuer: operators.clone(),
                audience: "gangway-ops".into(),
                kind: OidcKind::Operators {
                    require: Some(("groups".into(), "sre".into())),
                },
                ca_pem: Some(ca.clone()),
                refresh: Duration::from_secs(300),
                client_secret: None,
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

/// A browser's cookie jar, by name, as the test plays one.
fn set_cookies(resp: &reqwest::Response, jar: &mut BTreeMap<String, String>) {
    for c in resp.headers().get_all(reqwest::header::SET_COOKIE) {
        let pair = c.to_str().unwrap().split(';').next().unwrap();
        let (name, value) = pair.split_once('=').unwrap();
        if value.is_empty() {
            jar.remove(name);
        } else {
            jar.insert(name.to_string(), value.to_string());
        }
    }
}

fn cookie_header(jar: &BTreeMap<String, String>) -> String {
    jar.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_through_the_providers_code_flow_and_refuses_what_it_did_not_start() {
    let rsa: Value = serde_json::from_str(RSA_JWK).unwrap();
    let idp = Idp::start(BTreeMap::from([
        ("tenants".to_string(), vec![rsa.clone()]),
        ("operators".to_string(), vec![rsa.clone()]),
    ]))
    .await;
    let (tenants, operators) = (idp.issuer("tenants"), idp.issuer("operators"));
    let ca = idp.ca_pem.clone();
    let cloud = Cloud::start_with(|c| {
        c.oidc = vec![
            OidcIssuer {
                issuer: tenants.clone(),
                audience: "gangway-console".into(),
                kind: OidcKind::Tenants {
                    tenant_claim: "org".into(),
                },
                ca_pem: Some(ca.clone()),
                refresh: Duration::from_secs(300),
                client_secret: Some("s3cret".into()),
            },
            OidcIssuer {
                issuer: operators.clone(),
                audience: "gangway-ops".into(),
                kind: OidcKind::Operators {
                    require: Some(("groups".into(), "sre".into())),
                },
                ca_pem: Some(ca.clone()),
                refresh: Duration::from_secs(300),
                client_secret: None,
            },
        ];
    })
    .await;
    let g = cloud.globals[0].trim_end_matches('/').to_string();
    // The browser: both CAs trusted, redirects shown, cookies by hand.
    let browser = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&cloud.ca).unwrap())
        .add_root_certificate(reqwest::Certificate::from_pem(idp.ca_pem.as_bytes()).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // A GET with the jar's cookies.
    let visit = |url: String, jar: &BTreeMap<String, String>| {
        let r = browser.get(url).header("cookie", cookie_header(jar));
        async move { r.send().await.unwrap() }
    };
    let acme_job = cloud
        .client(0, "acme")
        .submit(&serde_json::from_value(spec(1)).unwrap(), None)
        .await
        .unwrap();
    *idp.user.lock().unwrap() = json!({"sub": "alice", "org": "acme"});

    // Start: the sign-in page offers it; it sends the browser to the
    // provider with a flow cookie of its own.
    let page = browser.get(format!("{g}/sign-in")).send().await.unwrap();
    let body = page.text().await.unwrap();
    assert!(body.contains("id=\"sso-tenants\"") && body.contains("id=\"sso-operators\""));
    let start = |kind: &'static str| {
        let (browser, g) = (&browser, &g);
        async move {
            let mut jar = BTreeMap::new();
            let r = browser
                .get(format!("{g}/sign-in/sso/{kind}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 303, "{kind}");
            set_cookies(&r, &mut jar);
            let to = r.headers()["location"].to_str().unwrap().to_string();
            // The provider signs the user in and sends the browser back.
            let back = browser.get(&to).send().await.unwrap();
            assert_eq!(back.status(), 303, "{}", back.text().await.unwrap());
            let callback = back.headers()["location"].to_str().unwrap().to_string();
            (jar, to, callback)
        }
    };
    let (mut jar, to, callback) = start("tenants").await;
    assert!(to.starts_with(&format!("{tenants}/authorize?")), "{to}");
    for part in [
        "client_id=gangway-console",
        "code_challenge_method=S256",
        "scope=openid",
        "redirect_uri=https%3A%2F%2F127.0.0.1",
    ] {
        assert!(to.contains(part), "{to} lacks {part}");
    }
    assert!(jar.contains_key("gangway_sso"));
    assert!(
        callback.starts_with(&format!("{g}/sign-in/sso/callback?code=")),
        "{callback}"
    );

    // The attacker's login CSRF: the callback without the browser's flow
    // cookie (a link sent to someone else) signs nobody in.
    let r = browser.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(!r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("gangway_console"));
    // Another state than the one this browser started: refused.
    let forged_state = {
        let (code, _) = callback.split_once("&state=").unwrap();
        format!("{code}&state=not-mine")
    };
    let r = visit(forged_state.clone(), &jar).await;
    assert_eq!(r.status(), 400);
    // The real one: a session, and a page that continues (not a redirect:
    // the session cookie is SameSite=Strict).
    let r = visit(callback.clone(), &jar).await;
    assert_eq!(r.status(), 200);
    set_cookies(&r, &mut jar);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("http-equiv=\"refresh\"") && body.contains("url=/jobs"),
        "{body}"
    );
    assert!(jar
        .get("gangway_console")
        .is_some_and(|c| c.starts_with("t~")));
    assert!(
        !jar.contains_key("gangway_sso"),
        "the flow cookie is cleared"
    );
    let jobs = browser
        .get(format!("{g}/jobs"))
        .header(
            "cookie",
            format!("gangway_console={}", jar["gangway_console"]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(jobs.status(), 200);
    assert!(jobs
        .text()
        .await
        .unwrap()
        .contains(&acme_job.id.to_string()));
    // The same code again: the provider refuses it, nothing is set.
    let mut again = BTreeMap::new();
    let r = browser
        .get(format!("{g}/sign-in/sso/tenants"))
        .send()
        .await
        .unwrap();
    set_cookies(&r, &mut again);
    let replay = format!(
        "{}&state={}",
        callback.split_once("&state=").unwrap().0,
        again["gangway_sso"].split('~').nth(1).unwrap()
    );
    let r = visit(replay.clone(), &again).await;
    assert_eq!(r.status(), 401);
    assert!(!r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("gangway_console="));

    // A token for another sign-in's nonce: refused.
    *idp.wrong_nonce.lock().unwrap() = Some("someone-elses".into());
    let (jar, _, callback) = start("tenants").await;
    let r = visit(callback.clone(), &jar).await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("nonce"));
    *idp.wrong_nonce.lock().unwrap() = None;

    // Operators: only members of the required group.
    *idp.user.lock().unwrap() = json!({"sub": "bob", "groups": ["dev"]});
    let (jar, to, callback) = start("operators").await;
    assert!(to.contains("client_id=gangway-ops"), "{to}");
    let r = visit(callback.clone(), &jar).await;
    assert_eq!(r.status(), 401, "not in the operators' group");
    *idp.user.lock().unwrap() = json!({"sub": "carol", "groups": ["sre"]});
    let (mut jar, _, callback) = start("operators").await;
    let r = visit(callback.clone(), &jar).await;
    assert_eq!(r.status(), 200);
    set_cookies(&r, &mut jar);
    let fleet = browser
        .get(format!("{g}/fleet"))
        .header(
            "cookie",
            format!("gangway_console={}", jar["gangway_console"]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(fleet.status(), 200);
    assert!(fleet.text().await.unwrap().contains("data-region=\"r1\""));
}

#[test]
fn one_issuer_for_tenants_and_operators_is_refused() {
    let issuer = |kind| OidcIssuer {
        issuer: "https://idp.example/realms/one".into(),
        audience: "gangway".into(),
        kind,
        ca_pem: None,
        refresh: Duration::from_secs(300),
        client_secret: None,
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
