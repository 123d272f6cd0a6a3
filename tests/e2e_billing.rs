//! The billing export across real processes (docs/billing.md): jobs run in
//! a cloud of three regions that replicate each other's usage rows and
//! credits; one of them loses its node (a provider-caused loss, credited).
//! `gangway billing export` merges every region's ledger, counts each row
//! once and prices it, and its total matches, to the cent, the GPU time
//! the regions' allocations held less the lost time, computed by hand from
//! their databases.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{Datelike, Utc};
use gangway_chaos::cloud::{Cloud, REGIONS};
use gangway_shared::api::{Granularity, Job, JobSpec, JobState, UsageGroup, UsageQuery};
use gangway_shared::client::Client;
use support::BIN;
use uuid::Uuid;

const PRICE_BOOK: &str = r#"
currency = "USD"
[[price]]
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.75
[[price]]
gpu_type = "h100"
priority = "low"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.10
"#;

async fn connect(url: &str) -> tokio_postgres::Client {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db
}

/// GPU-seconds the allocations of a region held (released ones), per
/// priority rank: all of them, and those lost with their node.
async fn held(url: &str) -> Vec<(i16, f64, f64)> {
    connect(url)
        .await
        .query(
            "SELECT j.priority, sum(extract(epoch FROM a.released_at - a.allocated_at))::float8,
                    coalesce(sum(extract(epoch FROM a.released_at - a.allocated_at))
                             FILTER (WHERE a.release_reason = 'node_lost'), 0)::float8
             FROM allocations a JOIN jobs j USING (job_id)
             WHERE a.released_at IS NOT NULL GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Polls the global tier until `cond` holds for the job.
async fn wait_job(tenant: &Client, id: Uuid, what: &str, cond: impl Fn(&Job) -> bool) -> Job {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Ok(job) = tenant.get(id).await {
            if cond(&job) {
                return job;
            }
        }
        assert!(Instant::now() < deadline, "job {id}: {what} never happened");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One CSV line's fields (RFC 4180 quoting).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

fn spec(key: &str, priority: &str, estimated_s: u32) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": key, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "priority": priority, "estimated_duration_s": estimated_s, "command": ["train"]
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_counts_every_regions_usage_once_and_prices_it_to_the_cent() {
    let cloud = Cloud::start(std::path::Path::new(BIN), true).await;
    let (_, flags) = cloud.operator();
    let gangway = |args: &[&str]| {
        let out = Command::new(BIN).args(args).args(&flags).output().unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };

    // A job (20 s) whose node dies after a few seconds, before any
    // checkpoint: that time is lost to the provider, and credited. It runs
    // again from the start elsewhere.
    let lost = cloud
        .tenant
        .submit(&spec("bill-lost", "normal", 400), Some("bill-lost"))
        .await
        .unwrap()
        .id;
    let running = wait_job(&cloud.tenant, lost, "running", |j| {
        j.state == JobState::Running
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let node = running.workers[0].node.clone().unwrap();
    let (code, _, stderr) = gangway(&[
        "admin",
        "node",
        "inject-fault",
        &node,
        "--kind",
        "node-down",
        "--region",
        &running.region,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");

    // Four keyed jobs, normal and low priority, 10 s each (200 s × 0.05).
    let mut ids = vec![lost];
    for (i, priority) in ["normal", "low", "normal", "low"].iter().enumerate() {
        let key = format!("bill-{i}");
        ids.push(
            cloud
                .tenant
                .submit(&spec(&key, priority, 200), Some(&key))
                .await
                .unwrap()
                .id,
        );
    }
    for id in &ids {
        let done = wait_job(&cloud.tenant, *id, "an end", |j| j.state.is_terminal()).await;
        assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    }
    // The rows reach the buddies within a beat or two.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // By hand: every region's allocations, priced, less the time lost with
    // the node (the job had no checkpoint: all of that placement).
    let mut expect = 0.0;
    let (mut gpu_s, mut lost_s) = (0.0, 0.0);
    for r in REGIONS {
        for (priority, s, l) in held(cloud.database(r)).await {
            let price = if priority == 0 { 1.10 } else { 2.75 };
            expect += (s - l) / 3600.0 * price;
            gpu_s += s;
            lost_s += l;
        }
        let ckpt = connect(cloud.database(r))
            .await
            .query_opt(
                "SELECT checkpointed_at FROM jobs WHERE job_id = $1 AND checkpointed_at IS NOT NULL",
                &[&lost],
            )
            .await
            .unwrap();
        assert!(ckpt.is_none(), "the lost job checkpointed in {r}");
    }
    assert!(
        gpu_s > 4.0 * 8.0 * 9.0 + 8.0 * 19.0,
        "four 8-GPU jobs of about 10 s and one of 20 s: {gpu_s}"
    );
    assert!(lost_s > 8.0 * 2.0, "about 3 s of 8 GPUs lost: {lost_s}");

    let book = cloud.dir.path().join("prices.toml");
    std::fs::write(&book, PRICE_BOOK).unwrap();
    let book = book.display().to_string();
    let now = Utc::now();
    let month = format!("{}-{:02}", now.year(), now.month());
    let export = |format: &str| {
        let (code, out, stderr) = gangway(&[
            "billing",
            "export",
            "--month",
            &month,
            "--format",
            format,
            "--price-book",
            &book,
        ]);
        assert_eq!(code, Some(0), "{stderr}");
        (out, stderr)
    };
    let (csv, stderr) = export("csv");
    let mut lines = csv.lines();
    let header = csv_fields(lines.next().unwrap());
    for col in [
        "BilledCost",
        "EffectiveCost",
        "ChargeCategory",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "ResourceId",
        "SkuId",
        "UsageQuantity",
        "UsageUnit",
        "RegionId",
        "x_Cause",
        "x_CreditedUsageId",
    ] {
        assert!(header.iter().any(|h| h == col), "no {col} in {header:?}");
    }
    let at = |c: &str| header.iter().position(|h| h == c).unwrap();
    let mut total = 0.0;
    let mut credited = 0.0;
    let mut seen = std::collections::BTreeSet::new();
    let mut jobs = std::collections::BTreeSet::new();
    for line in lines {
        let f = csv_fields(line);
        assert_eq!(f.len(), header.len(), "{line}");
        let cost: f64 = f[at("BilledCost")].parse().unwrap();
        total += cost;
        assert!(seen.insert(f[at("x_UsageId")].clone()), "row twice: {line}");
        jobs.insert(f[at("ResourceId")].clone());
        if f[at("ChargeCategory")] == "Credit" {
            // A credit: negative, priced like the usage it offsets, with
            // its cause.
            assert_eq!(f[at("ResourceId")], lost.to_string(), "{line}");
            assert_eq!(f[at("x_Cause")], "node_lost", "{line}");
            assert!(cost < 0.0, "{line}");
            assert_eq!(f[at("SkuId")], "gpu-h100-normal");
            assert!(!f[at("x_CreditedUsageId")].is_empty());
            credited -= cost;
        } else {
            assert_eq!(f[at("ChargeCategory")], "Usage", "{line}");
            assert!(cost >= 0.0, "{line}");
        }
    }
    // Each job's rows, once — though its buddy holds them too (the
    // regions together read more rows than the export has) — and the
    // whole to the cent, the credit included.
    assert_eq!(jobs.len(), 5, "{csv}");
    let read = |what: &str| -> usize {
        (stderr.lines())
            .filter_map(|l| l.strip_suffix(what))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .sum()
    };
    assert!(
        read(" usage rows read") + read(" credits read") > seen.len(),
        "no row was replicated\n{stderr}"
    );
    assert!(
        read(" credits read") >= 2,
        "the credit is held by two regions\n{stderr}"
    );
    assert_eq!(
        (credited * 100.0).round(),
        (lost_s / 3600.0 * 2.75 * 100.0).round(),
        "credit {credited}\n{stderr}"
    );
    assert!(credited > 0.0);
    assert_eq!(
        (total * 100.0).round(),
        (expect * 100.0).round(),
        "export {total} vs by hand {expect}\n{stderr}"
    );
    // JSON Lines says the same.
    let (jsonl, _) = export("jsonl");
    let rows: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), seen.len());
    let sum: f64 = rows.iter().map(|r| r["BilledCost"].as_f64().unwrap()).sum();
    assert_eq!((sum * 100.0).round(), (expect * 100.0).round());
    assert!(rows.iter().all(|r| r["UsageUnit"] == "GPU-Hours"));
    assert!(rows.iter().any(|r| r["ChargeCategory"] == "Credit"));

    // The tenant's own view, from the ledger: every row once (though
    // buddies hold them too), the credit apart from what is billed.
    let auth = gangway_auth::dev::DevMaterial::load_or_create(cloud.dir.path()).unwrap();
    let sign = |tenant: &str| {
        auth.tenant_key
            .sign(&gangway_auth::jwt::claims_for(
                gangway_auth::jwt::Role::Tenant,
                &format!("{tenant}-e2e"),
                Some(tenant),
                None,
                gangway_shared::tokens::ISSUER,
                gangway_shared::tokens::PUBLIC_AUDIENCE,
                Duration::from_secs(3600),
            ))
            .unwrap()
    };
    let ca = std::fs::read(&auth.ca_cert).unwrap();
    let url = cloud.tenant.base().to_string();
    let globex = Client::public(url.clone(), sign("globex"), Some(&ca)).unwrap();
    let window = UsageQuery {
        from: Some(now - chrono::Duration::hours(2)),
        to: Some(Utc::now() + chrono::Duration::minutes(1)),
        granularity: Some(Granularity::Hour),
        group_by: Some(UsageGroup::Job),
        job: None,
    };
    let mine = cloud.tenant.usage(&window).await.unwrap();
    assert!(mine.unavailable_regions.is_empty(), "{mine:?}");
    assert!(
        (mine.total_gpu_seconds - gpu_s).abs() < 0.5,
        "{mine:?} vs {gpu_s}"
    );
    assert!(
        (mine.total_credited_gpu_seconds - lost_s).abs() < 0.5,
        "{mine:?}"
    );
    assert!(
        (mine.total_billed_gpu_seconds - (gpu_s - lost_s)).abs() < 0.5,
        "{mine:?}"
    );
    assert_eq!(mine.total_pending_gpu_seconds, 0.0);
    let keys: std::collections::BTreeSet<&str> = mine.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys.len(), 5, "{mine:?}");
    let only_lost = UsageQuery {
        job: Some(lost),
        ..window.clone()
    };
    let one = cloud.tenant.usage(&only_lost).await.unwrap();
    assert!(one.rows.iter().all(|r| r.key == lost.to_string()));
    assert!(
        (one.total_credited_gpu_seconds - lost_s).abs() < 0.5,
        "{one:?}"
    );
    let by_region = cloud
        .tenant
        .usage(&UsageQuery {
            group_by: Some(UsageGroup::Region),
            ..window.clone()
        })
        .await
        .unwrap();
    assert!(by_region
        .rows
        .iter()
        .all(|r| REGIONS.contains(&r.key.as_str())));
    assert!((by_region.total_gpu_seconds - gpu_s).abs() < 0.5);
    // Another tenant sees none of it, even naming acme's job.
    for q in [&window, &only_lost] {
        let theirs = globex.usage(q).await.unwrap();
        assert!(theirs.rows.is_empty(), "{theirs:?}");
        assert_eq!(theirs.total_gpu_seconds, 0.0);
    }
    // Bad input: 400 with its code.
    for bad in [
        "/v1/usage?granularity=fortnight",
        "/v1/usage?group_by=tenant",
        "/v1/usage?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
        "/v1/usage?job=acme",
    ] {
        let e = cloud
            .tenant
            .call_json(reqwest::Method::GET, bad, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("invalid_query"), "{bad}: {e:?}");
    }
    // `gangway usage` shows the credit.
    let out = Command::new(BIN)
        .args([
            "usage",
            "--group-by",
            "job",
            "--url",
            &url,
            "--token",
            &sign("acme"),
        ])
        .arg("--ca-cert")
        .arg(&auth.ca_cert)
        .arg("--state-dir")
        .arg(cloud.dir.path().join("no-dev-state"))
        .args(["--from", &window.from.unwrap().to_rfc3339()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains("CREDITED") && table.contains(&lost.to_string()),
        "{table}"
    );
    assert!(table.contains("credited: GPU time lost"), "{table}");

    // Reconciliation: billed + credited = allocated, per tenant and region.
    let (from, to) = (
        (now - chrono::Duration::hours(2)).to_rfc3339(),
        (Utc::now() + chrono::Duration::minutes(5)).to_rfc3339(),
    );
    let reconcile = || {
        gangway(&[
            "billing",
            "reconcile",
            "--from",
            &from,
            "--to",
            &to,
            "--json",
        ])
    };
    let (code, out, stderr) = reconcile();
    assert_eq!(code, Some(0), "{out}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["reconciled"], true, "{report}");
    let lines = report["rows"].as_array().unwrap();
    let sum = |k: &str| -> f64 { lines.iter().map(|l| l[k].as_f64().unwrap()).sum() };
    assert!(
        (sum("allocated_gpu_seconds") - gpu_s).abs() < 0.5,
        "{report}"
    );
    assert!(
        (sum("credited_gpu_seconds") - lost_s).abs() < 0.5,
        "{report}"
    );
    assert!(
        (sum("billed_gpu_seconds") - (gpu_s - lost_s)).abs() < 0.5,
        "{report}"
    );
    for l in lines {
        assert!(
            l["difference_gpu_seconds"].as_f64().unwrap().abs() < 0.5,
            "{l}"
        );
        assert_eq!(l["tenant"], "acme");
    }
    // The table says the same.
    let (code, table, _) = gangway(&["billing", "reconcile", "--from", &from, "--to", &to]);
    assert_eq!(code, Some(0), "{table}");
    assert!(
        table.contains("DIFFERENCE") && table.contains("reconciled"),
        "{table}"
    );

    // A usage row removed by hand, from every region holding it: the
    // difference is that row's, named, and the exit status says so.
    let mut gone = None;
    for r in REGIONS {
        let db = connect(cloud.database(r)).await;
        let row = db
            .query_opt(
                "SELECT usage_id, gpu_seconds, region FROM usage_ledger
                 WHERE region = $1 AND usage_id NOT IN (SELECT usage_id FROM usage_credits)
                 ORDER BY usage_id LIMIT 1",
                &[&r],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            gone = Some((
                row.get::<_, Uuid>(0),
                row.get::<_, f64>(1),
                row.get::<_, String>(2),
            ));
            break;
        }
    }
    let (id, seconds, region) = gone.unwrap();
    for r in REGIONS {
        let db = connect(cloud.database(r)).await;
        db.execute("DELETE FROM usage_outbox WHERE usage_id = $1", &[&id])
            .await
            .unwrap();
        db.execute("DELETE FROM usage_ledger WHERE usage_id = $1", &[&id])
            .await
            .unwrap();
    }
    let (code, out, stderr) = reconcile();
    assert_eq!(code, Some(1), "{out}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["reconciled"], false);
    let off: Vec<&serde_json::Value> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["difference_gpu_seconds"].as_f64().unwrap().abs() > 0.5)
        .collect();
    assert_eq!(off.len(), 1, "{report}");
    assert_eq!(off[0]["region"], region.as_str());
    assert!(
        (off[0]["difference_gpu_seconds"].as_f64().unwrap() - seconds).abs() < 0.5,
        "{report}"
    );
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("lacks") && problems.contains(&region),
        "{problems}"
    );
    let (code, table, _) = gangway(&["billing", "reconcile", "--from", &from, "--to", &to]);
    assert_eq!(code, Some(1));
    assert!(table.contains("NOT reconciled"), "{table}");
    // Bad input: a 4xx with its code from the API, a clear refusal here.
    let (code, _, stderr) = gangway(&["billing", "reconcile", "--from", &to, "--to", &from]);
    assert_eq!(code, Some(2), "{stderr}");
    let (admin, _) = cloud.operator();
    let bad = admin
        .call_json(
            reqwest::Method::GET,
            &format!(
                "/v1/admin/usage/allocated?from={}&to=2020-01-01T00:00:00Z",
                now.format("%Y-%m-%dT%H:%M:%SZ")
            ),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some("invalid_query"), "{bad:?}");
}
