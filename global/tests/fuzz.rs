//! Random and malformed requests thrown at the global router, with real
//! regions behind it: never a 5xx, never a panic, and every refusal is our
//! JSON error with a code.

mod support;

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::ServiceExt;

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null)),
        ".{0,40}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A job spec with some fields replaced by random JSON or removed.
fn mutated_spec() -> impl Strategy<Value = serde_json::Value> {
    let fields = [
        "name",
        "gpus",
        "gpu_type",
        "priority",
        "estimated_duration_s",
        "max_duration_s",
        "command",
        "env",
        "gpus_per_worker",
        "mode",
        "topology",
        "region",
        "extra",
    ];
    prop::collection::vec((0..fields.len(), prop::option::of(json_value())), 0..4).prop_map(
        move |muts| {
            let mut spec = support::spec(2);
            for (i, v) in muts {
                match v {
                    Some(v) => spec[fields[i]] = v,
                    None => {
                        spec.as_object_mut().unwrap().remove(fields[i]);
                    }
                }
            }
            spec
        },
    )
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(uuid::Uuid::new_v4().to_string()),
        "[a-zA-Z0-9._~%-]{0,40}",
        Just("..".to_string()),
        Just("%00".to_string()),
        Just("%F0%9F%92%A5".to_string()),
        "[a-z]{200,300}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (0..10usize, segment(), segment(), "[a-z=&%0-9]{0,30}").prop_map(|(t, a, b, q)| {
        let p = match t {
            0 => "/v1/jobs".to_string(),
            1 => format!("/v1/jobs/{a}"),
            2 => format!("/v1/jobs/{a}/cancel"),
            3 => format!("/v1/jobs/{a}/events"),
            4 => format!("/v1/jobs/{a}/explain"),
            5 => format!("/v1/jobs/{a}/{b}"),
            6 => "/v1/regions".to_string(),
            7 => format!("/v1/admin/quotas/{a}/{b}"),
            8 => format!("/v1/admin/limits/{a}"),
            _ => format!("/{a}/{b}"),
        };
        if q.is_empty() {
            p
        } else {
            format!("{p}?{q}")
        }
    })
}

#[derive(Debug, Clone)]
enum Auth {
    None,
    Tenant,
    Admin,
    Garbage(String),
}

fn auth() -> impl Strategy<Value = Auth> {
    prop_oneof![
        Just(Auth::None),
        Just(Auth::Tenant),
        Just(Auth::Tenant),
        Just(Auth::Admin),
        ".{0,60}".prop_map(|s| Auth::Garbage(format!("Bearer {s}"))),
        ".{0,60}".prop_map(Auth::Garbage),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..200),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        mutated_spec().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        mutated_spec().prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_router_never_answers_5xx(
        method in prop::sample::select(vec![Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH]),
        path in path(),
        auth in auth(),
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
        content_type in prop::option::of(prop::sample::select(vec!["application/json", "text/plain", "application/json; charset=utf-8", "multipart/form-data"])),
        body in body(),
    ) {
        let env = env();
        env.rt.block_on(async {
            let mut req = Request::builder().method(method.clone()).uri(path.as_str());
            match &auth {
                Auth::None => {}
                Auth::Tenant => req = req.header("authorization", format!("Bearer {}", env.tenant)),
                Auth::Admin => req = req.header("authorization", format!("Bearer {}", env.admin)),
                Auth::Garbage(s) => {
                    if let Ok(v) = HeaderValue::from_str(s) {
                        req = req.header("authorization", v);
                    }
                }
            }
            if let Some(k) = key.as_ref().and_then(|k| HeaderValue::from_bytes(k).ok()) {
                req = req.header("idempotency-key", k);
            }
            if let Some(ct) = content_type {
                req = req.header("content-type", ct);
            }
            let Ok(req) = req.body(Body::from(body.clone())) else {
                return; // not a request http would let anyone send
            };
            let resp = gangway_global::app(env.state.clone()).oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(
                !status.is_server_error(),
                "{method} {path} ({auth:?}) → {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            if !status.is_success() {
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                    panic!("{method} {path} → {status} without a JSON error: {}", String::from_utf8_lossy(&bytes))
                });
                assert!(v["code"].is_string() && v["message"].is_string(), "{v}");
            }
        });
    }
}

/// A value a person (or an attacker) might put into a console URL.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        Just("<script>alert(1)</script>".to_string()),
        Just("\"><img src=x onerror=alert(1)>".to_string()),
        Just("queued".to_string()),
        Just("r1".to_string()),
        "[a-z]{300,400}",
    ]
}

fn console_path() -> impl Strategy<Value = String> {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    (0..14usize, segment(), hostile(), hostile()).prop_map(move |(t, a, q, r)| {
        let (q, r) = (enc(&q), enc(&r));
        match t {
            0 => "/".to_string(),
            1 => format!("/jobs?name={q}&state={r}"),
            2 => format!("/jobs?region={q}&cursor={r}"),
            3 => format!("/jobs/{a}"),
            4 => format!("/jobs/{a}?after={q}"),
            5 => "/usage".to_string(),
            6 => "/fleet".to_string(),
            7 => format!("/fleet/{a}?leaf={q}"),
            8 => format!("/fleet/r1?leaf={q}"),
            9 => "/queue".to_string(),
            10 => format!("/audit?action={q}"),
            11 => format!("/sign-in?expired={q}"),
            12 => format!("/sign-in/sso/{a}"),
            _ => format!("/sign-in/sso/callback?code={q}&state={r}"),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// The console with any session (none, a tenant's, an operator's, a
    /// made-up one) and any path and query: never a 5xx, and nothing of
    /// the URL comes back as markup.
    #[test]
    fn the_console_never_answers_5xx_nor_reflects_markup(
        path in console_path(),
        session in prop::sample::select(vec![0usize, 1, 2, 3]),
    ) {
        let env = env();
        env.rt.block_on(async {
            let mut req = Request::builder().method(Method::GET).uri(path.as_str());
            match session {
                1 => req = req.header("cookie", format!("gangway_console=t~{}", env.tenant)),
                2 => req = req.header("cookie", format!("gangway_console=o~{}", env.admin)),
                3 => req = req.header("cookie", "gangway_console=t~not.a.token; gangway_sso=t~a~b~c"),
                _ => {}
            }
            let Ok(req) = req.body(Body::empty()) else { return };
            let resp = gangway_global::app(env.state.clone()).oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let body = String::from_utf8_lossy(&bytes);
            assert!(!status.is_server_error(), "GET {path} (session {session}) → {status}: {body}");
            assert!(
                !body.contains("<script>alert") && !body.contains("<img src=x"),
                "GET {path} reflected markup: {body}"
            );
        });
    }
}

struct Env {
    rt: tokio::runtime::Runtime,
    state: gangway_global::GlobalState,
    tenant: String,
    admin: String,
    _cloud: support::Cloud,
}

/// One cloud for every case (started on first use).
fn env() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (cloud, state) = rt.block_on(async {
            let cloud = support::Cloud::start().await;
            let state = cloud.state();
            state.regions.refresh_all().await;
            tokio::spawn(gangway_global::regions::poll_health(
                state.regions.clone(),
                tokio_util::sync::CancellationToken::new(),
            ));
            (cloud, state)
        });
        Env {
            tenant: cloud.token("fuzz"),
            admin: cloud.admin_token(),
            state,
            rt,
            _cloud: cloud,
        }
    })
}
