//! The web console over real HTTPS, against two regions on a real
//! PostgreSQL (tests/support): sign-in and its cookie, the headers every
//! page carries, and the attacker's side — a forged token, a form posted
//! from another site, another tenant's job, a tenant at an operator's
//! page, a job named to inject script. The pages in a real browser:
//! tests/e2e_console.rs.

mod support;

use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::{redirect, StatusCode};
use serde_json::json;
use support::Cloud;

/// A client that shows redirects instead of following them.
fn browser(cloud: &Cloud) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&cloud.ca).unwrap())
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in with `credential`; the session cookie (`name=value`) if one
/// was set, and the answer's status.
async fn sign_in(cloud: &Cloud, credential: &str) -> (StatusCode, Option<String>, String) {
    let g = &cloud.globals[0];
    let resp = browser(cloud)
        .post(format!("{g}/sign-in"))
        .header("origin", g.trim_end_matches('/'))
        .form(&[("credential", credential)])
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let cookie = resp
        .headers()
        .get(SET_COOKIE)
        .map(|c| c.to_str().unwrap().to_string());
    (status, cookie, resp.text().await.unwrap())
}

fn session(cookie: &str) -> String {
    cookie.split(';').next().unwrap().to_string()
}

async fn page(cloud: &Cloud, cookie: &str, path: &str) -> (StatusCode, String) {
    let resp = browser(cloud)
        .get(format!("{}{path}", cloud.globals[0]))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_signs_in_and_sees_its_jobs_and_nobody_elses() {
    let cloud = Cloud::start().await;
    let g = &cloud.globals[0];
    let http = browser(&cloud);

    // Nobody signed in: the console sends them to sign in, and even that
    // page carries the policy.
    let home = http.get(format!("{g}/")).send().await.unwrap();
    assert_eq!(home.status(), StatusCode::SEE_OTHER);
    assert_eq!(home.headers()[LOCATION], "/sign-in");
    let form = http.get(format!("{g}/sign-in")).send().await.unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    let csp = form.headers()[CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(form.headers()["x-frame-options"], "DENY");
    let jobs = http.get(format!("{g}/jobs")).send().await.unwrap();
    assert_eq!(
        jobs.headers()[LOCATION],
        "/sign-in",
        "no page without a session"
    );

    // acme's job, named to inject script into whoever looks at it.
    let hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>";
    let acme = cloud.client(0, "acme");
    let mut spec = support::spec(8);
    spec["name"] = json!(hostile);
    let job = acme
        .submit(&serde_json::from_value(spec).unwrap(), None)
        .await
        .unwrap();

    // acme signs in with its token: a cookie only the server reads.
    let (status, cookie, _) = sign_in(&cloud, &cloud.token("acme")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = cookie.expect("a session cookie");
    for attr in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie} lacks {attr}");
    }
    let acme_session = session(&cookie);
    let (status, list) = page(&cloud, &acme_session, "/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert!(list.contains(&job.id.to_string()), "acme's job is listed");
    assert!(
        !list.contains("<script>alert") && !list.contains("<img src=x"),
        "the job's name is escaped, not markup: {list}"
    );
    assert!(
        list.contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "{list}"
    );
    // Filters: by state, by region (one that exists, one that does not).
    // The job is placed (it stays `starting`: these regions have no
    // agents) by the time the filter asks.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while acme.get(job.id).await.unwrap().state != gangway_shared::api::JobState::Starting {
        assert!(
            std::time::Instant::now() < deadline,
            "the job was never placed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (_, starting) = page(&cloud, &acme_session, "/jobs?state=starting").await;
    assert!(starting.contains(&job.id.to_string()));
    let (_, queued) = page(&cloud, &acme_session, "/jobs?state=queued").await;
    assert!(!queued.contains(&job.id.to_string()));
    let (_, succeeded) = page(&cloud, &acme_session, "/jobs?state=succeeded").await;
    assert!(!succeeded.contains(&job.id.to_string()));
    let other_region = if job.region == "r1" { "r2" } else { "r1" };
    let (_, there) = page(
        &cloud,
        &acme_session,
        &format!("/jobs?region={other_region}"),
    )
    .await;
    assert!(!there.contains(&job.id.to_string()));
    let (_, here) = page(
        &cloud,
        &acme_session,
        &format!("/jobs?region={}", job.region),
    )
    .await;
    assert!(here.contains(&job.id.to_string()));
    let (status, _) = page(&cloud, &acme_session, "/jobs?region=nowhere").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = page(&cloud, &acme_session, "/jobs?state=bogus").await;
    assert!(status.is_client_error(), "{status}");

    // Its job's page: the timeline starts with `queued`, and it says why
    // it waits.
    let (status, detail) = page(&cloud, &acme_session, &format!("/jobs/{}", job.id)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(detail.contains("data-kind=\"queued\""), "{detail}");
    assert!(detail.contains("id=\"why\""), "{detail}");
    assert!(!detail.contains("<script>alert"));

    // globex, signed in, sees none of it: not in its list, and acme's job
    // page is a 404 that shows nothing of the job.
    let (_, cookie) = {
        let (s, c, _) = sign_in(&cloud, &cloud.token("globex")).await;
        (s, session(&c.unwrap()))
    };
    let (_, theirs) = page(&cloud, &cookie, "/jobs").await;
    assert!(!theirs.contains(&job.id.to_string()));
    let (status, body) = page(&cloud, &cookie, &format!("/jobs/{}", job.id)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        !body.contains("alert(1)") && !body.contains("&#60;script"),
        "{body}"
    );
    // Nor by forging a session cookie with acme's name in it.
    let forged =
        "gangway_console=t~eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhY21lIiwidGVuYW50IjoiYWNtZSJ9.c2ln";
    let (status, _) = page(&cloud, forged, &format!("/jobs/{}", job.id)).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "a forged token is sent to sign in"
    );

    // A tenant at an operator's page is told it is not theirs.
    let (status, body) = page(&cloud, &acme_session, "/fleet/r1").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!body.contains("data-node="), "{body}");
    let (status, _) = page(&cloud, &acme_session, "/queue").await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Signing out clears the cookie.
    let out = http
        .post(format!("{g}/sign-out"))
        .header("origin", g.trim_end_matches('/'))
        .header("cookie", &acme_session)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert!(out.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_credentials_and_forms_from_other_sites_get_no_session() {
    let cloud = Cloud::start().await;
    let g = &cloud.globals[0];

    // A token signed by a key the cloud does not trust.
    let stranger =
        gangway_auth::dev::DevMaterial::load_or_create(tempfile::tempdir().unwrap().path())
            .unwrap();
    let forged = stranger
        .tenant_key
        .sign(&cloud.claims(gangway_auth::jwt::Role::Tenant, Some("acme")))
        .unwrap();
    for bad in [forged.as_str(), "gwk_nokey_0000", "not a token at all"] {
        let (status, cookie, body) = sign_in(&cloud, bad).await;
        assert!(status.is_client_error(), "{bad}: {status}");
        assert!(cookie.is_none(), "{bad}: no cookie");
        assert!(body.contains("id=\"error\""), "{bad}: the page says why");
    }
    // An empty or oversized credential is refused before any API call.
    let (status, cookie, _) = sign_in(&cloud, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(cookie.is_none());
    let (status, cookie, _) = sign_in(&cloud, &"a".repeat(20_000)).await;
    assert!(status.is_client_error());
    assert!(cookie.is_none());

    // A valid token posted from another site's form: refused, no cookie
    // (another site cannot sign someone into an account of its choosing).
    let resp = browser(&cloud)
        .post(format!("{g}/sign-in"))
        .header("origin", "https://evil.example")
        .form(&[("credential", cloud.token("acme"))])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(resp.headers().get(SET_COOKIE).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_regions_the_fleet_map_the_queue_and_a_cordoned_node() {
    let cloud = Cloud::start().await;
    let g = &cloud.globals[0];
    let acme = cloud.client(0, "acme");
    let mut spec = support::spec(8);
    spec["region"] = json!("r1");
    acme.submit(&serde_json::from_value(spec).unwrap(), None)
        .await
        .unwrap();

    let (status, cookie, _) = sign_in(&cloud, &cloud.admin_token()).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let ops = session(&cookie.unwrap());

    let (status, regions) = page(&cloud, &ops, "/fleet").await;
    assert_eq!(status, StatusCode::OK);
    for r in ["r1", "r2"] {
        assert!(
            regions.contains(&format!("data-region=\"{r}\"")),
            "{regions}"
        );
    }

    let (status, map) = page(&cloud, &ops, "/fleet/r1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(map.contains("data-node=\"n1\""), "{map}");
    assert!(!map.contains("data-state=\"cordoned\""), "{map}");

    // Cordoned through the API, the node changes colour on the map.
    let resp = cloud
        .http()
        .post(format!("{g}/v1/admin/nodes/n1/cordon?region=r1"))
        .bearer_auth(cloud.admin_token())
        .json(&json!({"reason": "console test"}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    let (_, map) = page(&cloud, &ops, "/fleet/r1").await;
    assert!(
        map.contains("data-node=\"n1\" data-state=\"cordoned\""),
        "{map}"
    );
    assert!(map.contains("class=\"node s-cordoned\""), "{map}");

    // Zoomed into a leaf: its nodes only, read with the API's leaf filter.
    let (status, zoomed) = page(&cloud, &ops, "/fleet/r1?leaf=l0").await;
    assert_eq!(status, StatusCode::OK);
    assert!(zoomed.contains("data-node=\"n0\"") && zoomed.contains("data-node=\"n1\""));
    let (_, elsewhere) = page(&cloud, &ops, "/fleet/r1?leaf=l9").await;
    assert!(!elsewhere.contains("data-node="), "{elsewhere}");
    let api = |q: &'static str| {
        let (http, g, token) = (cloud.http(), g.clone(), cloud.admin_token());
        async move {
            http.get(format!("{g}/v1/admin/nodes?{q}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        }
    };
    let leaf: serde_json::Value = api("region=r1&leaf=l0").await.json().await.unwrap();
    assert_eq!(leaf["regions"]["r1"]["nodes"].as_array().unwrap().len(), 2);
    let none: serde_json::Value = api("region=r1&leaf=l9").await.json().await.unwrap();
    assert_eq!(none["regions"]["r1"]["nodes"].as_array().unwrap().len(), 0);
    let bad = api("region=r1&leaf=a%20b%26c").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    // The queue by tenant and GPU type, and the audit log with the cordon.
    let (status, queue) = page(&cloud, &ops, "/queue").await;
    assert_eq!(status, StatusCode::OK);
    assert!(queue.contains("<td>acme</td>"), "{queue}");
    let (status, audit) = page(&cloud, &ops, "/audit").await;
    assert_eq!(status, StatusCode::OK);
    assert!(audit.contains("data-action=\"node.cordon\""), "{audit}");
    let (status, _) = page(&cloud, &ops, "/maintenance").await;
    assert_eq!(status, StatusCode::OK);

    // An operator is not a tenant: tenants' pages say so.
    let (status, _) = page(&cloud, &ops, "/jobs").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A region that does not exist is a clear 4xx, not a panic.
    let (status, _) = page(&cloud, &ops, "/fleet/nowhere").await;
    assert!(status.is_client_error(), "{status}");
}
