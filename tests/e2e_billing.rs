//! The billing export across real processes (docs/billing.md): jobs run in
//! a cloud of three regions that replicate each other's usage rows;
//! `gangway billing export` merges every region's ledger, counts each row
//! once and prices it, and its total matches, to the cent, the GPU time
//! the regions' allocations held, computed by hand from their databases.

mod support;

use std::process::Command;
use std::time::Duration;

use chrono::{Datelike, Utc};
use gangway_chaos::cloud::{Cloud, REGIONS};
use gangway_shared::api::{JobSpec, JobState};
use support::BIN;

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

/// GPU-seconds the allocations of region `r` held (released ones), per
/// priority rank.
async fn held(url: &str) -> Vec<(i16, f64)> {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db.query(
        "SELECT j.priority, sum(extract(epoch FROM a.released_at - a.allocated_at))::float8
         FROM allocations a JOIN jobs j USING (job_id)
         WHERE a.released_at IS NOT NULL GROUP BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_counts_every_regions_usage_once_and_prices_it_to_the_cent() {
    let cloud = Cloud::start(std::path::Path::new(BIN), true).await;
    // Four keyed jobs, normal and low priority, 10 s each (200 s × 0.05).
    let mut ids = Vec::new();
    for (i, priority) in ["normal", "low", "normal", "low"].iter().enumerate() {
        let key = format!("bill-{i}");
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": key, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
            "priority": priority, "estimated_duration_s": 200, "command": ["train"]
        }))
        .unwrap();
        ids.push(cloud.tenant.submit(&spec, Some(&key)).await.unwrap().id);
    }
    for id in &ids {
        cloud
            .wait_for(*id, "succeeded", Duration::from_secs(120), |j| {
                j.state == JobState::Succeeded
            })
            .await
            .unwrap();
    }
    // The rows reach the buddies within a beat or two.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // By hand: every region's allocations, priced.
    let mut expect = 0.0;
    let mut gpu_s = 0.0;
    for r in REGIONS {
        for (priority, s) in held(cloud.database(r)).await {
            let price = if priority == 0 { 1.10 } else { 2.75 };
            expect += s / 3600.0 * price;
            gpu_s += s;
        }
    }
    assert!(
        gpu_s > 4.0 * 8.0 * 9.0,
        "four 8-GPU jobs of about 10 s: {gpu_s}"
    );

    let book = cloud.dir.path().join("prices.toml");
    std::fs::write(&book, PRICE_BOOK).unwrap();
    let (_, flags) = cloud.operator();
    let now = Utc::now();
    let month = format!("{}-{:02}", now.year(), now.month());
    let export = |format: &str| {
        let out = Command::new(BIN)
            .args(["billing", "export", "--month", &month, "--format", format])
            .arg("--price-book")
            .arg(&book)
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "exit {:?}: {stderr}",
            out.status.code()
        );
        (String::from_utf8(out.stdout).unwrap(), stderr)
    };
    let (csv, stderr) = export("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "BilledCost",
        "EffectiveCost",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "ResourceId",
        "SkuId",
        "UsageQuantity",
        "UsageUnit",
        "RegionId",
    ] {
        assert!(header.contains(&col), "no {col} in {header:?}");
    }
    let at = |c: &str| header.iter().position(|h| *h == c).unwrap();
    let (cost_i, id_i) = (at("BilledCost"), at("x_UsageId"));
    let mut total = 0.0;
    let mut seen = std::collections::BTreeSet::new();
    let mut jobs = std::collections::BTreeSet::new();
    for line in lines {
        // The description is quoted (it has a comma); the rest is plain.
        let (_, tail) = line.rsplit_once('"').unwrap();
        let head = line.split_once('"').unwrap().0;
        let fields: Vec<&str> = head
            .trim_end_matches(',')
            .split(',')
            .chain(std::iter::once(""))
            .chain(tail.trim_start_matches(',').split(','))
            .collect();
        total += fields[cost_i].parse::<f64>().unwrap();
        assert!(seen.insert(fields[id_i].to_string()), "row twice: {line}");
        jobs.insert(fields[at("ResourceId")].to_string());
    }
    // Each job's rows, once — though its buddy holds them too (the
    // regions together read more rows than the export has) — and the
    // whole to the cent.
    assert_eq!(jobs.len(), 4, "{csv}");
    let read: usize = (stderr.lines())
        .filter_map(|l| l.strip_suffix(" usage rows read"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .sum();
    assert!(
        read > seen.len(),
        "no row was replicated: {read} read\n{stderr}"
    );
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
}
