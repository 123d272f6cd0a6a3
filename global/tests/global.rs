//! The global tier over real HTTPS in front of two real regions:
//! authentication, tenant isolation, idempotency across replicas, rate
//! limits, routing and failure of a region.

mod support;

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gangway_auth::jwt::Role;
use gangway_shared::api::{Job, JobList};
use gangway_shared::client::ListQuery;
use reqwest::StatusCode;
use support::{spec, Cloud};
use uuid::Uuid;

async fn code_of(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    (status, body["code"].as_str().unwrap_or("").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_authentication_failure_is_a_401_with_its_code() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let url = format!("{}/v1/jobs", cloud.globals[0]);
    let get = |auth: Option<String>| {
        let mut r = http.get(&url);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    let good = cloud.token("acme");
    assert_eq!(
        get(Some(format!("Bearer {good}"))).await.unwrap().status(),
        200
    );

    let mut expired = cloud.claims(Role::Tenant, Some("acme"));
    expired.exp = expired.iat - 3600;
    expired.nbf = expired.iat - 7200;
    let expired = cloud.auth.tenant_key.sign(&expired).unwrap();

    let mut wrong_aud = cloud.claims(Role::Tenant, Some("acme"));
    wrong_aud.aud = "someone-else".into();
    let wrong_aud = cloud.auth.tenant_key.sign(&wrong_aud).unwrap();

    // Same signature, different payload.
    let parts: Vec<&str> = good.split('.').collect();
    let mut payload: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    payload["tenant"] = "globex".into();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&payload).unwrap()),
        parts[2]
    );

    let header_none = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT","kid":"dev-tenant-1"}"#);
    let alg_none = format!("{header_none}.{}.", parts[1]);

    // HS256 "signed" with the public key as the HMAC secret.
    let mut hs = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs.kid = Some(cloud.auth.tenant_key.kid().to_string());
    let hs256 = jsonwebtoken::encode(
        &hs,
        &cloud.claims(Role::Tenant, Some("acme")),
        &jsonwebtoken::EncodingKey::from_secret(cloud.auth.tenant_key.public_pem().as_bytes())
            .unwrap(),
    )
    .unwrap();

    // A token from a key the tier does not know.
    let stranger = gangway_auth::jwt::SigningKey::generate("dev-tenant-1")
        .sign(&cloud.claims(Role::Tenant, Some("acme")))
        .unwrap();

    let cases: Vec<(Option<String>, &str)> = vec![
        (None, "missing_token"),
        (Some("Basic YWNtZTpodW50ZXIy".into()), "malformed_token"),
        (Some("Bearer not-a-jwt".into()), "malformed_token"),
        (Some(format!("Bearer {expired}")), "token_expired"),
        (Some(format!("Bearer {wrong_aud}")), "wrong_audience"),
        (Some(format!("Bearer {tampered}")), "bad_signature"),
        (Some(format!("Bearer {alg_none}")), "unsupported_algorithm"),
        (Some(format!("Bearer {hs256}")), "unsupported_algorithm"),
        (Some(format!("Bearer {stranger}")), "bad_signature"),
    ];
    for (auth, want) in cases {
        let r = get(auth.clone()).await.unwrap();
        assert!(r.headers().contains_key("www-authenticate"));
        assert_eq!(code_of(r).await, (401, want.to_string()), "{auth:?}");
    }

    // Roles: a tenant may not use admin endpoints, an admin not tenant ones.
    let r = http
        .get(format!("{}/v1/admin/quotas", cloud.globals[0]))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
    let r = http
        .get(format!("{}/v1/admin/quotas", cloud.globals[0]))
        .bearer_auth(cloud.admin_token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = get(Some(format!("Bearer {}", cloud.admin_token())))
        .await
        .unwrap();
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
}

/// Whoever holds the tenants' signing key (a tenant-token issuer, or a
/// thief of its key) cannot make themselves an operator: admin tokens are
/// verified by the operator keys alone, and a tenant key's admin token is
/// refused everywhere. Nor does an operator key make tenant tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_signing_key_cannot_mint_an_operator_token() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let call = |url: String, token: String| {
        let r = http.get(url).bearer_auth(token);
        async move { r.send().await.unwrap() }
    };
    let quotas = format!("{}/v1/admin/quotas", cloud.globals[0]);
    let jobs = format!("{}/v1/jobs", cloud.globals[1]);
    // The genuine article works: an operator key's admin token.
    assert_eq!(
        call(quotas.clone(), cloud.admin_token()).await.status(),
        200
    );

    // An admin token signed with the tenant key: the operator keys do not
    // know its kid, and the tenants' verifier does not vouch for admins.
    let forged = (cloud.auth.tenant_key)
        .sign(&cloud.claims(Role::Admin, None))
        .unwrap();
    for g in 0..2 {
        let url = format!("{}/v1/admin/quotas", cloud.globals[g]);
        let r = call(url, forged.clone()).await;
        assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
    }
    let r = call(jobs.clone(), forged.clone()).await;
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
    // The same, with the operator key's kid in the header: its signature
    // is the tenant key's, so it does not verify.
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(cloud.auth.operator_key.kid().to_string());
    let tenant_pem = cloud.auth.tenant_key.private_pem();
    let relabelled = jsonwebtoken::encode(
        &header,
        &cloud.claims(Role::Admin, None),
        &jsonwebtoken::EncodingKey::from_ec_pem(tenant_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let r = call(quotas.clone(), relabelled).await;
    assert_eq!(code_of(r).await, (401, "bad_signature".to_string()));

    // A tenant token signed with the operator key is no tenant's.
    let by_operator_key = (cloud.auth.operator_key)
        .sign(&cloud.claims(Role::Tenant, Some("acme")))
        .unwrap();
    let r = call(jobs, by_operator_key.clone()).await;
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
    let r = call(quotas, by_operator_key).await;
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
}

/// A tier configured with one key as both a tenant and an operator key
/// refuses to start: separation is not left to the operator's care.
#[test]
fn one_key_for_tenants_and_operators_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let auth = gangway_auth::DevMaterial::load_or_create(dir.path()).unwrap();
    let config = |operators: Vec<(String, String)>| {
        let mut c = gangway_global::config::GlobalConfig::new(
            std::fs::read_to_string(&auth.server_cert).unwrap(),
            std::fs::read_to_string(&auth.server_key).unwrap(),
            vec![],
            vec![auth.tenant_key.verifier_entry()],
            auth.service_key.clone(),
        );
        c.operator_keys = operators;
        c
    };
    let same_kid = (
        auth.tenant_key.kid().to_string(),
        auth.operator_key.public_pem(),
    );
    let same_key = ("operators".to_string(), auth.tenant_key.public_pem());
    for operators in [vec![same_kid], vec![same_key]] {
        let err = gangway_global::credentials::Credentials::new(&config(operators))
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("operators need keys of their own"),
            "{err}"
        );
    }
    assert!(
        gangway_global::credentials::Credentials::new(&config(vec![auth
            .operator_key
            .verifier_entry()]))
        .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_never_sees_or_touches_another_tenants_jobs() {
    let cloud = Cloud::start().await;
    let acme = cloud.client(0, "acme");
    let globex = cloud.client(1, "globex");
    let spec: gangway_shared::api::JobSpec = serde_json::from_value(spec(2)).unwrap();
    let job = acme.submit(&spec, Some("mine")).await.unwrap();
    let nobody = Uuid::new_v4();
    for id in [job.id, nobody] {
        assert_eq!(globex.get(id).await.unwrap_err().code(), Some("not_found"));
        assert_eq!(
            globex.cancel(id).await.unwrap_err().code(),
            Some("not_found")
        );
        assert_eq!(
            globex.events(id).await.unwrap_err().code(),
            Some("not_found")
        );
        assert_eq!(
            globex.explain(id).await.unwrap_err().code(),
            Some("not_found")
        );
    }
    assert!(globex
        .list(&ListQuery::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
    // The same key in another tenant is another job.
    let theirs = globex.submit(&spec, Some("mine")).await.unwrap();
    assert_ne!(theirs.id, job.id);
    // Nothing of globex's cancel attempt reached acme's job.
    let state = acme.get(job.id).await.unwrap().state;
    assert!(
        matches!(
            state,
            gangway_shared::api::JobState::Queued | gangway_shared::api::JobState::Starting
        ),
        "{state}"
    );
    assert_eq!(
        acme.list(&ListQuery::default()).await.unwrap().jobs.len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keyed_create_makes_one_job_however_it_is_retried() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let token = cloud.token("acme");
    let post = |g: usize, key: &str, body: serde_json::Value| {
        http.post(format!("{}/v1/jobs", cloud.globals[g]))
            .bearer_auth(&token)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    // Sequential retries, through both replicas: the same job, the same answer.
    let first = post(0, "k-seq", spec(4)).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Job = first.json().await.unwrap();
    for g in [0, 1, 1, 0] {
        let again = post(g, "k-seq", spec(4)).await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let again: Job = again.json().await.unwrap();
        // The same answer as the first time, even once the job moved on.
        assert_eq!(again, first);
    }
    // The same key with another body.
    assert_eq!(
        code_of(post(1, "k-seq", spec(8)).await.unwrap()).await,
        (422, "idempotency_key_reused".to_string())
    );
    // A refused body is not stored against the key.
    assert_eq!(
        code_of(post(0, "k-fixed", spec(0)).await.unwrap()).await,
        (422, "invalid_gpus".to_string())
    );
    assert_eq!(
        post(1, "k-fixed", spec(2)).await.unwrap().status(),
        StatusCode::CREATED
    );

    // 20 concurrent identical creates through both replicas: one job.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (http, token, url) = (http.clone(), token.clone(), cloud.globals[i % 2].clone());
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(format!("{url}/v1/jobs"))
                .bearer_auth(&token)
                .header("idempotency-key", "k-burst")
                .json(&spec(2))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body: serde_json::Value = r.json().await.unwrap();
            (status, body)
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => {
                ids.insert(body["id"].as_str().unwrap().to_string());
            }
            StatusCode::CONFLICT => {
                assert_eq!(body["code"], "idempotency_request_in_flight")
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let list: JobList = http
        .get(format!("{}/v1/jobs?name=t&limit=100", cloud.globals[1]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list.jobs.len(), 3, "k-seq, k-fixed and k-burst");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_every_region_sheds_load_a_create_is_told_when_to_retry_and_nothing_is_lost() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let token = cloud.token("acme");
    let post = |key: &str| {
        http.post(format!("{}/v1/jobs", cloud.globals[0]))
            .bearer_auth(&token)
            .header("idempotency-key", key)
            .json(&spec(4))
            .send()
    };
    // Both regions overloaded: every turn for sheddable work taken (as by
    // a flood of submissions that each hold a database connection).
    let mut held = Vec::new();
    for state in &cloud.states {
        let turns = state.sheddable.available_permits() as u32;
        held.push(
            state
                .sheddable
                .clone()
                .acquire_many_owned(turns)
                .await
                .unwrap(),
        );
    }
    // A keyed create: 503 `overloaded` with the regions' Retry-After, not
    // `no_region_available`, and the regions are not taken for dead.
    let refused = post("k-shed").await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("2")
    );
    assert_eq!(code_of(refused).await.1, "overloaded");
    let regions = cloud.client(0, "acme").regions().await.unwrap();
    assert!(regions.regions.iter().all(|r| r.healthy), "{regions:?}");
    // Once the load is gone, the retry with the same key makes the job,
    // once.
    drop(held);
    let made = post("k-shed").await.unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    let made: Job = made.json().await.unwrap();
    let again: Job = post("k-shed").await.unwrap().json().await.unwrap();
    assert_eq!(again.id, made.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_its_rate_limit_a_tenant_gets_429_and_others_do_not_notice() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let url = format!("{}/v1/jobs", cloud.globals[0]);
    let limited = cloud.token("limited");
    let acme = cloud.token("acme");
    let mut limited_codes = Vec::new();
    for _ in 0..8 {
        let r = http.get(&url).bearer_auth(&limited).send().await.unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=2).contains(&retry));
        }
        limited_codes.push(code_of(r).await);
        // The other tenant is never slowed.
        assert_eq!(
            http.get(&url)
                .bearer_auth(&acme)
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    assert!(limited_codes.iter().filter(|c| c.0 == 200).count() >= 3);
    assert!(limited_codes.contains(&(429, "rate_limited".to_string())));
    // Health is never limited.
    for _ in 0..50 {
        let r = http
            .get(format!("{}/healthz", cloud.globals[0]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_routed_listed_across_regions_and_survive_a_dead_region() {
    let cloud = Cloud::start().await;
    let acme = cloud.client(0, "acme");
    let mut by_region = std::collections::BTreeMap::new();
    let mut ids = Vec::new();
    for i in 0..12 {
        let s: gangway_shared::api::JobSpec = serde_json::from_value(spec(1)).unwrap();
        let job = acme.submit(&s, Some(&format!("spread-{i}"))).await.unwrap();
        *by_region.entry(job.region.clone()).or_insert(0) += 1;
        ids.push(job.id);
    }
    assert_eq!(by_region.len(), 2, "both regions take jobs: {by_region:?}");
    // Pinned.
    let mut pinned: gangway_shared::api::JobSpec = serde_json::from_value(spec(1)).unwrap();
    pinned.region = Some("r2".into());
    assert_eq!(acme.submit(&pinned, None).await.unwrap().region, "r2");
    pinned.region = Some("mars".into());
    assert_eq!(
        acme.submit(&pinned, None).await.unwrap_err().code(),
        Some("wrong_region")
    );
    // A tenant limited to r2 lands there, and may not pin r1.
    let boxed = cloud.client(0, "boxed");
    for i in 0..4 {
        let s: gangway_shared::api::JobSpec = serde_json::from_value(spec(1)).unwrap();
        assert_eq!(
            boxed
                .submit(&s, Some(&format!("b-{i}")))
                .await
                .unwrap()
                .region,
            "r2"
        );
    }
    let mut to_r1: gangway_shared::api::JobSpec = serde_json::from_value(spec(1)).unwrap();
    to_r1.region = Some("r1".into());
    assert_eq!(
        boxed.submit(&to_r1, None).await.unwrap_err().code(),
        Some("wrong_region")
    );
    // Cursor pagination across regions: pages of 5 cover all 13, newest first.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = acme
            .list(&ListQuery {
                limit: Some(5),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        seen.extend(page.jobs.iter().map(|j| (j.created_at, j.id)));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 13);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no repeats"
    );

    // r1 dies.
    cloud.regions[0].2.cancel();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let regions = acme.regions().await.unwrap().regions;
    assert!(!regions.iter().find(|r| r.name == "r1").unwrap().healthy);
    let list = acme.list(&ListQuery::default()).await.unwrap();
    assert_eq!(list.unavailable_regions, vec!["r1".to_string()]);
    // A job of r1 cannot be found now: 503 (retry), not 404.
    let r1_job = {
        let mut found = None;
        for id in &ids {
            if let Err(e) = acme.get(*id).await {
                found = Some(e);
                break;
            }
        }
        found.expect("some job lived in r1")
    };
    assert_eq!(r1_job.code(), Some("region_unavailable"));
    // New jobs go to the survivor.
    for i in 0..4 {
        let s: gangway_shared::api::JobSpec = serde_json::from_value(spec(1)).unwrap();
        let job = acme.submit(&s, Some(&format!("after-{i}"))).await.unwrap();
        assert_eq!(job.region, "r2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_says_where_and_when_without_creating_anything() {
    let cloud = Cloud::start().await;
    let acme = cloud.client(0, "acme");
    let s: gangway_shared::api::JobSpec = serde_json::from_value(spec(8)).unwrap();
    let d = acme.dry_run(&s).await.unwrap();
    assert_eq!(d.code, "would_start");
    assert_eq!(d.level, Some(gangway_shared::api::TopologyLevel::Nvlink));
    assert_eq!(d.nodes.len(), 1);
    assert_eq!(d.nodes[0].gpus.len(), 8);
    // Too big for any domain now (16 GPUs per region): it would wait.
    let mut big: gangway_shared::api::JobSpec = serde_json::from_value(spec(16)).unwrap();
    big.topology.required = Some(gangway_shared::api::TopologyLevel::Nvlink);
    let e = acme.dry_run(&big).await.unwrap_err();
    assert_eq!(e.code(), Some("unsatisfiable_topology"));
    assert!(acme
        .list(&ListQuery::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_merged_across_regions_and_private_to_its_tenant() {
    let cloud = Cloud::start().await;
    let acme = cloud.client(0, "acme");
    let globex = cloud.client(1, "globex");
    let mut ids = Vec::new();
    for (i, region) in ["r1", "r2"].into_iter().enumerate() {
        let mut s: gangway_shared::api::JobSpec = serde_json::from_value(spec(2)).unwrap();
        s.region = Some(region.into());
        ids.push(acme.submit(&s, Some(&format!("u-{i}"))).await.unwrap().id);
    }
    // Wait until both are placed (no agents here: they stay starting).
    for id in &ids {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while acme.get(*id).await.unwrap().state == gangway_shared::api::JobState::Queued {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let q = gangway_shared::api::UsageQuery {
        group_by: Some(gangway_shared::api::UsageGroup::Region),
        ..Default::default()
    };
    let u = acme.usage(&q).await.unwrap();
    let regions: Vec<&str> = u.rows.iter().map(|r| r.key.as_str()).collect();
    assert!(regions.contains(&"r1") && regions.contains(&"r2"), "{u:?}");
    // Two GPUs in each region for at least a second.
    assert!(u.total_gpu_seconds >= 4.0, "{u:?}");
    assert!(u.unavailable_regions.is_empty());
    let theirs = globex.usage(&q).await.unwrap();
    assert!(theirs.rows.is_empty());
    assert_eq!(theirs.total_gpu_seconds, 0.0);
    // A window backwards is refused.
    let bad = gangway_shared::api::UsageQuery {
        from: Some(chrono::Utc::now()),
        to: Some(chrono::Utc::now() - chrono::Duration::hours(1)),
        ..Default::default()
    };
    assert_eq!(
        acme.usage(&bad).await.unwrap_err().code(),
        Some("invalid_query")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_limits_set_through_the_global_tier_refuse_creates_with_their_code() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let g = &cloud.globals[0];
    let admin = cloud.admin_token();
    let call = |method: &str, path: &str, body: Option<serde_json::Value>, token: &str| {
        let mut r = http
            .request(method.parse().unwrap(), format!("{g}{path}"))
            .bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };

    // Set in every region at once, by an operator only.
    let r = call(
        "PUT",
        "/v1/admin/limits/acme",
        Some(serde_json::json!({"max_queued_jobs": 1, "max_gpus": 12})),
        &cloud.token("acme"),
    )
    .await
    .unwrap();
    assert_eq!(code_of(r).await, (403, "forbidden".to_string()));
    let r = call(
        "PUT",
        "/v1/admin/limits/acme",
        Some(serde_json::json!({"max_queued_jobs": 10, "max_gpus": 8})),
        &admin,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let set: serde_json::Value = r.json().await.unwrap();
    for region in ["r1", "r2"] {
        assert_eq!(set["regions"][region]["max_queued_jobs"], 10, "{set}");
        assert_eq!(set["regions"][region]["max_gpus"], 8, "{set}");
    }
    // A bad body is refused once, before any region, and changes nothing.
    for (body, want) in [
        (serde_json::json!({"max_gpus": -1}), "invalid_limits"),
        (serde_json::json!({}), "invalid_limits"),
        (
            serde_json::json!({"max_gpus": 1, "extra": 1}),
            "invalid_spec",
        ),
    ] {
        let r = call("PUT", "/v1/admin/limits/acme", Some(body.clone()), &admin)
            .await
            .unwrap();
        assert_eq!(code_of(r).await, (422, want.to_string()), "{body}");
    }
    let r = call(
        "PUT",
        "/v1/admin/limits/acme%3Fx",
        Some(serde_json::json!({"max_gpus": 1})),
        &admin,
    )
    .await
    .unwrap();
    assert_eq!(code_of(r).await, (422, "invalid_spec".to_string()));

    // Creates: the region's 429 reaches the tenant unchanged. (The GPU
    // limit counts running jobs too, so the refusal does not depend on
    // whether the scheduler has started the first job yet.)
    let acme = cloud.client(0, "acme");
    let pinned = |gpus: i64| {
        let mut s: gangway_shared::api::JobSpec = serde_json::from_value(spec(gpus)).unwrap();
        s.region = Some("r1".into());
        s
    };
    let first = acme.submit(&pinned(8), Some("first")).await.unwrap();
    assert_eq!(first.region, "r1");
    let r = http
        .post(format!("{g}/v1/jobs"))
        .bearer_auth(cloud.token("acme"))
        .json(&pinned(1))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("retry-after").is_none());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "requested_gpus_limit", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("region r1"), "{message}");
    let e = acme.submit(&pinned(1), None).await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::TOO_MANY_REQUESTS));
    let e = acme.dry_run(&pinned(1)).await.unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (
            Some(StatusCode::TOO_MANY_REQUESTS),
            Some("requested_gpus_limit")
        )
    );
    // The accepted create, retried at the limit, is still its own answer.
    let again = acme.submit(&pinned(8), Some("first")).await.unwrap();
    assert_eq!(again.id, first.id);
    // r2 alone gets more room for queued jobs; GPUs stay at 12, so after 8
    // GPUs, 8 more is over.
    let r = call(
        "PUT",
        "/v1/admin/limits/acme?region=r2",
        Some(serde_json::json!({"max_queued_jobs": 5, "max_gpus": 12})),
        &admin,
    )
    .await
    .unwrap();
    let set: serde_json::Value = r.json().await.unwrap();
    assert_eq!(set["regions"]["r2"]["max_queued_jobs"], 5, "{set}");
    assert!(set["regions"].get("r1").is_none(), "{set}");
    let mut s = pinned(8);
    s.region = Some("r2".into());
    acme.submit(&s, None).await.unwrap();
    let e = acme.submit(&s, None).await.unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (
            Some(StatusCode::TOO_MANY_REQUESTS),
            Some("requested_gpus_limit")
        )
    );
    assert!(e.to_string().contains("16 in all"), "{e}");
    // Other tenants are not limited.
    cloud
        .client(1, "globex")
        .submit(&pinned(1), None)
        .await
        .unwrap();
    let jobs = acme.list(&ListQuery::default()).await.unwrap().jobs;
    assert_eq!(jobs.len(), 2, "nothing refused was created: {jobs:?}");

    // Listed per region; removed from one.
    let r = call("GET", "/v1/admin/limits", None, &admin).await.unwrap();
    let listed: serde_json::Value = r.json().await.unwrap();
    for region in ["r1", "r2"] {
        assert_eq!(
            listed["regions"][region]["limits"][0]["tenant"], "acme",
            "{listed}"
        );
    }
    let r = call("DELETE", "/v1/admin/limits/acme?region=r1", None, &admin)
        .await
        .unwrap();
    let deleted: serde_json::Value = r.json().await.unwrap();
    assert_eq!(deleted["regions"]["r1"]["deleted"], true, "{deleted}");
    assert!(deleted["regions"].get("r2").is_none(), "{deleted}");
    acme.submit(&pinned(1), None).await.unwrap();
    let r = call("GET", "/v1/admin/limits?region=r1", None, &admin)
        .await
        .unwrap();
    let listed: serde_json::Value = r.json().await.unwrap();
    assert_eq!(listed["regions"]["r1"]["limits"], serde_json::json!([]));
    let r = call("DELETE", "/v1/admin/limits/acme?region=r1", None, &admin)
        .await
        .unwrap();
    let again: serde_json::Value = r.json().await.unwrap();
    assert_eq!(again["regions"]["r1"]["code"], "not_found", "{again}");
}

fn reservation(gpus: i64, region: Option<&str>, start: i64, end: i64) -> serde_json::Value {
    let at = |s: i64| {
        chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() / 60 * 60 + s, 0)
            .unwrap()
            .to_rfc3339()
    };
    let mut body = serde_json::json!({"gpu_type": "h100", "gpus": gpus, "level": "leaf",
        "start": at(start), "end": at(end)});
    if let Some(r) = region {
        body["region"] = r.into();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_go_to_their_region_and_its_jobs_follow_them() {
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let token = cloud.token("acme");
    let post = |g: usize, key: Option<&str>, body: serde_json::Value| {
        let mut r = http
            .post(format!("{}/v1/reservations", cloud.globals[g]))
            .bearer_auth(&token)
            .json(&body);
        if let Some(k) = key {
            r = r.header("idempotency-key", k);
        }
        r.send()
    };
    let hour = 3600;
    // acme may use both regions: it must say which.
    assert_eq!(
        code_of(
            post(0, None, reservation(8, None, hour, 2 * hour))
                .await
                .unwrap()
        )
        .await,
        (422, "invalid_reservation".to_string())
    );
    assert_eq!(
        code_of(
            post(0, None, reservation(8, Some("mars"), hour, 2 * hour))
                .await
                .unwrap()
        )
        .await,
        (422, "wrong_region".to_string())
    );
    // A tenant with one region gets it.
    let boxed = cloud.client(1, "boxed");
    let theirs: gangway_shared::api::ReservationSpec =
        serde_json::from_value(reservation(4, None, 3 * hour, 4 * hour)).unwrap();
    assert_eq!(
        boxed
            .create_reservation(&theirs, None)
            .await
            .unwrap()
            .region,
        "r2"
    );

    // Keyed, in r2, the whole leaf for an hour: the same key gives the same
    // reservation through either replica; naming another region, or
    // another body, it is refused.
    let whole = reservation(16, Some("r2"), hour, 2 * hour);
    let first = post(0, Some("res-1"), whole.clone()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: gangway_shared::api::Reservation = first.json().await.unwrap();
    assert_eq!(first.region, "r2");
    let again = post(1, Some("res-1"), whole.clone()).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: gangway_shared::api::Reservation = again.json().await.unwrap();
    assert_eq!(again, first);
    let elsewhere = reservation(16, Some("r1"), hour, 2 * hour);
    assert_eq!(
        code_of(post(1, Some("res-1"), elsewhere).await.unwrap()).await,
        (422, "idempotency_key_reused".to_string())
    );
    assert_eq!(
        code_of(
            post(0, Some("res-1"), reservation(8, Some("r2"), hour, 2 * hour))
                .await
                .unwrap()
        )
        .await,
        (422, "idempotency_key_reused".to_string())
    );

    // r2's leaf is taken then: refused, with the earliest window, passed
    // on from the region as it is.
    let acme = cloud.client(1, "acme");
    let late: gangway_shared::api::ReservationSpec =
        serde_json::from_value(reservation(8, Some("r2"), hour, 2 * hour)).unwrap();
    match acme.create_reservation(&late, None).await {
        Err(gangway_shared::client::ClientError::Api { status, body, .. }) => {
            assert_eq!(
                (status.as_u16(), body.code.as_str()),
                (409, "reservation_unavailable")
            );
            let hour = chrono::Duration::seconds(hour);
            assert_eq!(body.earliest_start, Some(first.end.unwrap()));
            assert_eq!(body.earliest_end, Some(first.end.unwrap() + hour));
        }
        other => panic!("{other:?}"),
    }
    // r1 has room.
    let in_r1: gangway_shared::api::ReservationSpec =
        serde_json::from_value(reservation(8, Some("r1"), hour, 2 * hour)).unwrap();
    let r1 = acme.create_reservation(&in_r1, None).await.unwrap();
    assert_eq!(r1.region, "r1");

    // Get, list and resize find the region that has it; other tenants see
    // nothing; operators see every tenant's.
    let globex = cloud.client(0, "globex");
    assert_eq!(acme.get_reservation(first.id).await.unwrap().region, "r2");
    assert_eq!(
        globex.get_reservation(first.id).await.unwrap_err().code(),
        Some("not_found")
    );
    let mine = acme.list_reservations().await.unwrap();
    let ids: Vec<Uuid> = mine.reservations.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&first.id) && ids.contains(&r1.id));
    assert!(globex
        .list_reservations()
        .await
        .unwrap()
        .reservations
        .is_empty());
    let all: gangway_shared::api::ReservationList = http
        .get(format!("{}/v1/admin/reservations", cloud.globals[0]))
        .bearer_auth(cloud.admin_token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.reservations.len(), 3);
    let smaller = gangway_shared::api::ReservationResize {
        gpus: Some(12),
        end: None,
    };
    let resized = acme
        .resize_reservation(first.id, &smaller, Some("res-2"))
        .await
        .unwrap();
    assert_eq!((resized.gpus, resized.region.as_str()), (12, "r2"));

    // Jobs naming a reservation go to its region, whatever the routing
    // would have chosen; one naming a reservation nobody has is refused.
    for i in 0..4 {
        let mut s: gangway_shared::api::JobSpec = serde_json::from_value(spec(4)).unwrap();
        s.reservation = Some(first.id);
        let job = acme.submit(&s, Some(&format!("in-res-{i}"))).await.unwrap();
        assert_eq!(job.region, "r2");
    }
    let mut s: gangway_shared::api::JobSpec = serde_json::from_value(spec(4)).unwrap();
    s.reservation = Some(Uuid::new_v4());
    assert_eq!(
        acme.submit(&s, None).await.unwrap_err().code(),
        Some("invalid_reservation")
    );

    // Delete, twice: the same answer.
    let gone = acme.delete_reservation(first.id, None).await.unwrap();
    assert_eq!(gone.state, gangway_shared::api::ReservationState::Deleted);
    let again = acme.delete_reservation(first.id, None).await.unwrap();
    assert_eq!(again.state, gangway_shared::api::ReservationState::Deleted);

    // An operator reserves for a tenant (keyed: the same key gives the
    // same one), resizes and deletes it; the tenant sees it as its own, and
    // the region audits each under the operator's name.
    let admin = cloud.admin_token();
    let for_acme = format!("{}/v1/admin/tenants/acme/reservations", cloud.globals[0]);
    let body = reservation(8, Some("r1"), 3 * hour, 4 * hour);
    let mut made = None;
    for _ in 0..2 {
        let r = http
            .post(&for_acme)
            .bearer_auth(&admin)
            .header("idempotency-key", "ops-1")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let r: gangway_shared::api::Reservation = r.json().await.unwrap();
        assert_eq!((r.tenant.as_str(), r.region.as_str()), ("acme", "r1"));
        assert!(made.is_none_or(|id| id == r.id));
        made = Some(r.id);
    }
    let made = made.unwrap();
    assert_eq!(acme.get_reservation(made).await.unwrap().gpus, 8);
    // A tenant cannot use the operators' route.
    let as_tenant = http
        .post(&for_acme)
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(as_tenant.status(), StatusCode::FORBIDDEN);
    let bad = format!(
        "{}/v1/admin/tenants/Not%20A%20Tenant/reservations",
        cloud.globals[0]
    );
    let r = http
        .post(&bad)
        .bearer_auth(&admin)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(code_of(r).await, (422, "invalid_spec".to_string()));
    let path = format!("{}/v1/admin/reservations/{made}", cloud.globals[1]);
    let r = http
        .patch(&path)
        .bearer_auth(&admin)
        .json(&serde_json::json!({"gpus": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http.delete(&path).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        acme.get_reservation(made).await.unwrap().state,
        gangway_shared::api::ReservationState::Deleted
    );
    let log: serde_json::Value = http
        .get(format!("{}/v1/admin/audit?region=r1", cloud.globals[0]))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = log["regions"]["r1"]["entries"].as_array().unwrap();
    for action in [
        "reservation.create",
        "reservation.resize",
        "reservation.delete",
    ] {
        let entry = entries
            .iter()
            .find(|e| e["action"] == action && e["target"] == made.to_string())
            .unwrap_or_else(|| panic!("no {action} in {log}"));
        assert_eq!(entry["actor"], "test", "{entry}");
    }
}

fn cluster(nodes: i64, region: Option<&str>) -> serde_json::Value {
    let mut body = serde_json::json!({"gpu_type": "h100", "nodes": nodes, "level": "leaf"});
    if let Some(r) = region {
        body["region"] = r.into();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_go_to_their_region_and_their_jobs_follow_them() {
    use gangway_shared::api::{Cluster, ClusterList, ClusterResize, ClusterSpec, ClusterState};
    let cloud = Cloud::start().await;
    let http = cloud.http();
    let token = cloud.token("acme");
    let admin = cloud.admin_token();
    let send = |g: usize, method: &str, path: &str, key: Option<&str>, auth: &str| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = http
            .request(method, format!("{}{path}", cloud.globals[g]))
            .bearer_auth(auth);
        if let Some(k) = key {
            r = r.header("idempotency-key", k);
        }
        r
    };
    let post = |g: usize, key: Option<&str>, body: serde_json::Value| {
        send(g, "POST", "/v1/clusters", key, &token)
            .json(&body)
            .send()
    };
    // acme may use both regions: it must say which.
    assert_eq!(
        code_of(post(0, None, cluster(1, None)).await.unwrap()).await,
        (422, "invalid_cluster".to_string())
    );
    assert_eq!(
        code_of(post(0, None, cluster(1, Some("mars"))).await.unwrap()).await,
        (422, "wrong_region".to_string())
    );
    // A tenant with one region gets it.
    let boxed = cloud.client(1, "boxed");
    let theirs: ClusterSpec = serde_json::from_value(cluster(1, None)).unwrap();
    let theirs = boxed.create_cluster(&theirs, None).await.unwrap();
    assert_eq!((theirs.region.as_str(), theirs.members.len()), ("r2", 1));

    // Keyed, in r1: the same key gives the same cluster through either
    // replica; naming another region, it is refused.
    let first = post(0, Some("cl-1"), cluster(1, Some("r1"))).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Cluster = first.json().await.unwrap();
    assert_eq!(
        (first.region.as_str(), first.state, first.members.len()),
        ("r1", ClusterState::Ready, 1)
    );
    let again = post(1, Some("cl-1"), cluster(1, Some("r1"))).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Cluster = again.json().await.unwrap();
    assert_eq!((again.id, &again.members), (first.id, &first.members));
    assert_eq!(
        code_of(post(1, Some("cl-1"), cluster(1, Some("r2"))).await.unwrap()).await,
        (422, "idempotency_key_reused".to_string())
    );
    // r2 has one free node left (boxed holds the other): two are refused,
    // passed on from the region as it is, and nothing is bound.
    let acme = cloud.client(1, "acme");
    let two: ClusterSpec = serde_json::from_value(cluster(2, Some("r2"))).unwrap();
    let e = acme.create_cluster(&two, None).await.unwrap_err();
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(409), Some("cluster_unavailable"))
    );

    // Get and list find the region that has it; other tenants see nothing;
    // operators see every tenant's.
    let globex = cloud.client(0, "globex");
    let got = acme.get_cluster(first.id).await.unwrap();
    assert_eq!(got.region, "r1");
    assert_eq!(got.events.first().map(|e| e.kind.as_str()), Some("created"));
    assert_eq!(
        globex.get_cluster(first.id).await.unwrap_err().code(),
        Some("not_found")
    );
    let mine = acme.list_clusters().await.unwrap();
    let ids: Vec<Uuid> = mine.clusters.iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![first.id]);
    assert!(mine.unavailable_regions.is_empty());
    assert!(globex.list_clusters().await.unwrap().clusters.is_empty());
    let all: ClusterList = send(0, "GET", "/v1/admin/clusters", None, &admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<Uuid> = all.clusters.iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![first.id, theirs.id], "newest first");
    assert_eq!(
        send(0, "GET", "/v1/admin/clusters", None, &token)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );

    // Resize through the global tier: it grows inside r1's leaf.
    let grown = acme
        .resize_cluster(first.id, &ClusterResize { nodes: 2 }, Some("cl-2"))
        .await
        .unwrap();
    assert_eq!(
        (grown.region.as_str(), grown.nodes, grown.members.len()),
        ("r1", 2, 2)
    );

    // A job naming the cluster and no region goes to its region, and is
    // placed on its nodes; one naming a cluster nobody has is refused.
    let mut s: gangway_shared::api::JobSpec = serde_json::from_value(spec(16)).unwrap();
    s.cluster = Some(first.id);
    let job = acme.submit(&s, Some("on-cluster")).await.unwrap();
    assert_eq!(job.region, "r1");
    let members: std::collections::BTreeSet<String> =
        grown.members.iter().map(|m| m.node_id.clone()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let placed = loop {
        let j = acme.get(job.id).await.unwrap();
        if j.workers.iter().all(|w| w.node.is_some()) && !j.workers.is_empty() {
            break j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never placed: {:?}",
            j.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for w in &placed.workers {
        assert!(members.contains(w.node.as_ref().unwrap()), "{w:?}");
    }
    let busy = acme.get_cluster(first.id).await.unwrap();
    assert_eq!(busy.in_use_gpus, 16);
    s.cluster = Some(Uuid::new_v4());
    let e = acme.submit(&s, None).await.unwrap_err();
    assert_eq!(e.code(), Some("invalid_cluster"));
    assert!(e.to_string().contains("you have no cluster"), "{e}");
    // A reservation and a cluster at once: refused before any region.
    s.reservation = Some(Uuid::new_v4());
    s.cluster = Some(first.id);
    assert_eq!(
        acme.submit(&s, None).await.unwrap_err().code(),
        Some("invalid_cluster")
    );

    // Operators find any tenant's cluster, resize and delete it; the region
    // audits it under the operator's name.
    let path = format!("/v1/admin/clusters/{}", theirs.id);
    let r = send(1, "GET", &path, None, &admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Cluster>().await.unwrap().tenant, "boxed");
    let r = send(1, "PATCH", &path, Some("op-1"), &admin)
        .json(&serde_json::json!({"nodes": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Cluster>().await.unwrap().members.len(), 2);
    let r = send(0, "DELETE", &path, None, &admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Cluster>().await.unwrap().state,
        ClusterState::Deleted
    );
    let missing = format!("/v1/admin/clusters/{}", Uuid::new_v4());
    assert_eq!(
        code_of(send(0, "GET", &missing, None, &admin).send().await.unwrap()).await,
        (404, "not_found".to_string())
    );
    let log: serde_json::Value = send(0, "GET", "/v1/admin/audit?region=r2", None, &admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = log["regions"]["r2"]["entries"].as_array().unwrap();
    for action in ["cluster.resize", "cluster.delete"] {
        let entry = entries
            .iter()
            .find(|e| e["action"] == action)
            .unwrap_or_else(|| panic!("no {action} in {log}"));
        assert_eq!(entry["actor"], "test", "{entry}");
    }

    // A cluster with nothing running is deleted at once (200), again the
    // same; one whose job still runs is `deleting` (202) until it stops.
    let spare: ClusterSpec = serde_json::from_value(cluster(1, Some("r2"))).unwrap();
    let spare = acme.create_cluster(&spare, None).await.unwrap();
    for _ in 0..2 {
        let path = format!("/v1/clusters/{}", spare.id);
        let r = send(0, "DELETE", &path, None, &token).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.json::<Cluster>().await.unwrap().state,
            ClusterState::Deleted
        );
    }
    let path = format!("/v1/clusters/{}", first.id);
    let r = send(1, "DELETE", &path, Some("cl-3"), &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(
        r.json::<Cluster>().await.unwrap().state,
        ClusterState::Deleting
    );
    let deleting = acme.get_cluster(first.id).await.unwrap();
    assert_eq!(deleting.state, ClusterState::Deleting);
    assert_eq!(
        deleting.events.last().map(|e| e.kind.as_str()),
        Some("deleting")
    );
    // It takes no new jobs.
    s.reservation = None;
    assert_eq!(
        acme.submit(&s, None).await.unwrap_err().code(),
        Some("invalid_cluster")
    );
}
