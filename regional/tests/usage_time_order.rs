//! The usage ledger in time order (docs/billing.md, "Reading it"):
//! `GET /v1/admin/usage/records?order=time` pages the rows overlapping a
//! period by (`started_at`, `usage_id`), with `next`/`next_start` as the
//! next page's `after`/`after_start` — the same rows as id order, which
//! stays as it was — against a real PostgreSQL and the region's API.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gangway_regional::{RegionConfig, Store};
use gangway_shared::billing::{UsageRecord, UsageRecords};
use uuid::Uuid;

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// A row of `tenant` from `start` for `minutes` (8 GPUs).
fn row(n: u32, tenant: &str, start: DateTime<Utc>, minutes: i64) -> UsageRecord {
    UsageRecord {
        usage_id: Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("row-{n}").as_bytes()),
        job_id: Uuid::from_u128(n as u128),
        epoch: 1,
        attempt: 1,
        rank: 0,
        tenant: tenant.into(),
        region: "peer".into(),
        gpu_type: "h100".into(),
        priority: 1,
        gpus: 8,
        started_at: start,
        ended_at: start + chrono::Duration::minutes(minutes),
        gpu_seconds: (8 * minutes * 60) as f64,
        ended_by: "succeeded".into(),
        cause: None,
        checkpointed_at: None,
        reservation_id: None,
        cluster_id: None,
    }
}

const FROM: &str = "2026-11-10T00:00:00Z";
const TO: &str = "2026-11-10T05:00:00Z";

/// Sixty rows over five clock hours — many starting on the hour (ties
/// broken by id), others at microsecond times — of two tenants, ids in no
/// relation to time; and rows just outside [FROM, TO).
fn ledger() -> Vec<UsageRecord> {
    let base = at(FROM);
    let mut rows: Vec<UsageRecord> = (0..60)
        .map(|i| {
            let hour = base + chrono::Duration::hours((i % 5) as i64);
            let start = if i % 3 == 0 {
                hour
            } else {
                hour + chrono::Duration::microseconds((i as i64 * 7 % 50) * 60_000_000 + 123_457)
            };
            let tenant = if i % 2 == 0 { "acme" } else { "globex" };
            row(i, tenant, start, 9)
        })
        .collect();
    // Ends as the period starts; starts as it ends: neither overlaps it.
    rows.push(row(100, "acme", base - chrono::Duration::minutes(30), 30));
    rows.push(row(101, "acme", at(TO), 30));
    // Starts before it, ends in it.
    rows.push(row(102, "acme", base - chrono::Duration::minutes(5), 5 + 1));
    rows
}

/// Every page in time order, `limit` a page, checking each page's cursor.
async fn by_time(store: &Store, tenant: Option<&str>, limit: i64) -> Vec<UsageRecord> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .usage_records_by_time(at(FROM), at(TO), tenant, after, limit)
            .await
            .unwrap();
        assert!(page.records.len() as i64 <= limit);
        let last = page.records.last().map(|r| (r.started_at, r.usage_id));
        all.extend(page.records);
        match (page.next_start, page.next) {
            (Some(t), Some(id)) => {
                assert_eq!(Some((t, id)), last, "the cursor is the last row");
                after = Some((t, id));
            }
            (None, None) => break,
            other => panic!("half a cursor: {other:?}"),
        }
    }
    all
}

fn in_time_order(rows: &[UsageRecord]) {
    let keys: Vec<(DateTime<Utc>, Uuid)> =
        rows.iter().map(|r| (r.started_at, r.usage_id)).collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "not in (started_at, usage_id) order: {keys:?}"
    );
}

fn ids(rows: &[UsageRecord]) -> BTreeSet<Uuid> {
    rows.iter().map(|r| r.usage_id).collect()
}

#[tokio::test]
async fn time_order_pages_the_same_rows_as_id_order_hour_by_hour() {
    let url = gangway_devkit::fresh_database("usage_time_order").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let key = gangway_auth::jwt::SigningKey::generate("svc");
    let mut cfg = RegionConfig::new("test", addr, &url);
    cfg.auth = Some(
        gangway_auth::jwt::Verifier::new(
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            &[key.verifier_entry()],
        )
        .unwrap(),
    );
    let state = gangway_regional::prepare(cfg, Duration::from_secs(10))
        .await
        .unwrap();
    let store = state.store.clone();
    let ledger = ledger();
    assert_eq!(
        store.hold_usage(&ledger).await.unwrap(),
        ledger.len() as u64
    );
    let want: BTreeSet<Uuid> = (ledger.iter())
        .filter(|r| r.ended_at > at(FROM) && r.started_at < at(TO))
        .map(|r| r.usage_id)
        .collect();
    assert_eq!(want.len(), 61);

    // The store: pages of 7 in time order, the rows of id order.
    let timed = by_time(&store, None, 7).await;
    in_time_order(&timed);
    assert_eq!(timed.len(), want.len(), "each row once");
    assert_eq!(ids(&timed), want);
    let by_id = store
        .usage_records(at(FROM), at(TO), None, None, 1000)
        .await
        .unwrap();
    assert_eq!(ids(&by_id.records), want);
    assert_eq!(by_id.next_start, None);
    for r in &timed {
        let same = by_id.records.iter().find(|s| s.usage_id == r.usage_id);
        assert_eq!(same, Some(r), "the same contents");
    }
    // Hour by hour: an hour's rows are contiguous.
    let hours: Vec<i64> = (timed.iter())
        .map(|r| r.started_at.timestamp().div_euclid(3600))
        .collect();
    assert!(hours.windows(2).all(|w| w[0] <= w[1]));
    // One tenant's, pages of 4.
    let acme = by_time(&store, Some("acme"), 4).await;
    in_time_order(&acme);
    let want_acme: BTreeSet<Uuid> = (timed.iter())
        .filter(|r| r.tenant == "acme")
        .map(|r| r.usage_id)
        .collect();
    assert_eq!(ids(&acme), want_acme);
    // Pages of one: every cursor a tie-break or a microsecond time.
    assert_eq!(by_time(&store, None, 1).await, timed);

    // The API: the same pages, as the global tier asks for them.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(
        listener,
        state,
        shutdown.clone(),
    ));
    let token = key
        .sign(&gangway_auth::jwt::claims_for(
            gangway_auth::jwt::Role::Service,
            "global",
            None,
            None,
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            Duration::from_secs(600),
        ))
        .unwrap();
    let http = reqwest::Client::new();
    let get = |q: Vec<(&'static str, String)>| {
        let url = format!(
            "http://{addr}/v1/admin/usage/records?{}",
            gangway_shared::http::query_string(&q)
        );
        let req = http.get(url).bearer_auth(&token);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let period = || vec![("from", FROM.to_string()), ("to", TO.to_string())];
    let mut api = Vec::new();
    let mut cursor: Vec<(&'static str, String)> = Vec::new();
    loop {
        let mut q = period();
        q.push(("order", "time".into()));
        q.push(("limit", "7".into()));
        q.extend(cursor.clone());
        let (status, body) = get(q).await;
        assert_eq!(status, 200, "{body}");
        let page: UsageRecords = serde_json::from_value(body).unwrap();
        api.extend(page.records);
        match (page.next, page.next_start) {
            (Some(id), Some(t)) => {
                cursor = vec![
                    ("after", id.to_string()),
                    (
                        "after_start",
                        t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                    ),
                ];
            }
            (None, None) => break,
            other => panic!("half a cursor: {other:?}"),
        }
    }
    assert_eq!(api, timed);
    // Id order, as before: no `next_start`.
    let mut q = period();
    q.push(("limit", "7".into()));
    let (status, body) = get(q).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["next"].is_string() && body.get("next_start").is_none(),
        "{body}"
    );
    // What is not a query of it.
    let bad = [
        vec![("order", "sideways".to_string())],
        vec![("after_start", FROM.to_string())],
        vec![
            ("order", "time".to_string()),
            ("after", Uuid::nil().to_string()),
        ],
        vec![
            ("order", "time".to_string()),
            ("after_start", FROM.to_string()),
        ],
    ];
    for extra in bad {
        let mut q = period();
        q.extend(extra.clone());
        let (status, body) = get(q).await;
        assert_eq!(status, 400, "{extra:?}: {body}");
        assert_eq!(body["code"], "invalid_query", "{body}");
    }
    shutdown.cancel();
    let _ = server.await;
}
