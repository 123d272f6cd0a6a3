//! The billing export across real processes (docs/billing.md): jobs run in
//! a cloud of three regions that replicate each other's usage rows and
//! credits; one of them loses its node (a provider-caused loss, credited).
//! The tenant is guaranteed a GPU in every region for the while, and one
//! job runs in a capacity reservation: committed capacity, billed whether
//! used or not, which covers the usage inside it. `gangway billing export`
//! merges every region's ledger and commitments, counts each row once and
//! prices it, and its total matches, to the cent, what the regions'
//! allocations held less the lost time, with the commitments, computed by
//! hand from their databases (the allocations, the reservation's own row,
//! the audit log of the quota changes).

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, Utc};
use gangway_chaos::cloud::{Cloud, REGIONS};
use gangway_shared::api::{
    Granularity, Job, JobSpec, JobState, ReservationSpec, TopologyLevel, UsageGroup, UsageQuery,
};
use gangway_shared::billing::{cents, Decimal};
use gangway_shared::client::Client;
use support::BIN;
use uuid::Uuid;

/// Usage prices only: not enough for a month with commitments.
const USAGE_PRICES: &str = r#"
currency = "USD"
[[price]]
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.49
[[price]]
gpu_type = "h100"
priority = "low"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.10
"#;

/// And committed capacity: a guaranteed GPU-hour, the usage it covers, and
/// a reserved GPU-hour (the usage inside it free).
const COMMITMENT_PRICES: &str = r#"
[[commitment]]
kind = "guarantee"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.60
covered_usage_per_gpu_hour = 0.40
[[commitment]]
kind = "reservation"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.20
"#;

/// The book's prices, as decimals (none of them, but 2.49's cents, is
/// exact in binary).
fn d(s: &str) -> Decimal {
    s.parse().unwrap()
}
const NORMAL: &str = "2.49";
const LOW: &str = "1.10";
const GUARANTEE: &str = "1.60";
const GUARANTEE_COVERED: &str = "0.40";
const RESERVATION: &str = "2.20";

/// Seconds since the epoch, to the microsecond, exactly.
fn secs(t: DateTime<Utc>) -> Decimal {
    Decimal::new(t.timestamp_micros(), 6)
}

/// Adds `gpus` × [s, e) to `hourly`, cut at clock hours (keyed by the
/// hour's start, in seconds).
fn spread(hourly: &mut BTreeMap<i64, Decimal>, s: Decimal, e: Decimal, gpus: i64) {
    let hour = Decimal::from(3600);
    let mut h = (s / hour).floor() * hour;
    while h < e {
        let part = e.min(h + hour) - s.max(h);
        if part > Decimal::ZERO {
            let key = i64::try_from(h).unwrap();
            *hourly.entry(key).or_default() += Decimal::from(gpus) * part;
        }
        h += hour;
    }
}

/// What one region billed, by hand, from its own database: (cost, GPU-s
/// held, GPU-s lost with the node, the credit's cost).
///
/// Per clock hour: the guarantee's GPU-seconds (from the audit log's quota
/// changes) cover the ordinary usage of the hour in proportion (all of it
/// when it is enough), at its covered price, the rest at the usage price;
/// the reservation's (from its own row: created to deleted) cover its
/// job's, free; each committed GPU-hour is paid at its price; the lost
/// time is credited at what its hour billed.
async fn by_hand(url: &str) -> (Decimal, Decimal, Decimal, Decimal) {
    let db = connect(url).await;
    // (hour, priority) → (held, lost); the reservation's job by hour.
    let mut ordinary: BTreeMap<(i64, i16), (Decimal, Decimal)> = BTreeMap::new();
    let mut reserved_use: BTreeMap<i64, Decimal> = BTreeMap::new();
    let (mut held_s, mut lost_s) = (Decimal::ZERO, Decimal::ZERO);
    for r in db
        .query(
            "SELECT j.priority, j.reservation_id IS NOT NULL, a.allocated_at, a.released_at,
                    a.release_reason = 'node_lost'
             FROM allocations a JOIN jobs j USING (job_id) WHERE a.released_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
    {
        let (priority, reserved, s, e, lost): (i16, bool, DateTime<Utc>, DateTime<Utc>, bool) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        held_s += secs(e) - secs(s);
        if lost {
            lost_s += secs(e) - secs(s);
        }
        if reserved {
            spread(&mut reserved_use, secs(s), secs(e), 1);
            continue;
        }
        let mut h = BTreeMap::new();
        spread(&mut h, secs(s), secs(e), 1);
        for (hour, x) in h {
            let slot = ordinary.entry((hour, priority)).or_default();
            slot.0 += x;
            if lost {
                slot.1 += x;
            }
        }
    }
    // The guarantee: acme's guaranteed h100 GPUs between quota changes.
    let mut guaranteed: BTreeMap<i64, Decimal> = BTreeMap::new();
    let changes: Vec<(DateTime<Utc>, i64)> = db
        .query(
            "SELECT at, (detail->>'guaranteed_gpus')::bigint FROM audit_log
             WHERE action = 'quota.set' AND target = 'acme/h100' ORDER BY audit_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(changes.len() >= 2, "{changes:?}");
    for w in changes.windows(2) {
        spread(&mut guaranteed, secs(w[0].0), secs(w[1].0), w[0].1);
    }
    assert_eq!(changes.last().unwrap().1, 0, "the guarantee was taken back");
    // The reservation, from its creation (or start) to its deletion.
    let mut reserved: BTreeMap<i64, Decimal> = BTreeMap::new();
    for r in db
        .query(
            "SELECT gpus, greatest(created_at, start_at), updated_at FROM capacity_reservations
             WHERE state = 'deleted'",
            &[],
        )
        .await
        .unwrap()
    {
        let (gpus, s, e): (i32, DateTime<Utc>, DateTime<Utc>) = (r.get(0), r.get(1), r.get(2));
        spread(&mut reserved, secs(s), secs(e), gpus.into());
    }
    let (mut cost, mut credit) = (Decimal::ZERO, Decimal::ZERO);
    let hour = Decimal::from(3600);
    let hours: std::collections::BTreeSet<i64> = (ordinary.keys().map(|k| k.0))
        .chain(guaranteed.keys().copied())
        .chain(reserved.keys().copied())
        .chain(reserved_use.keys().copied())
        .collect();
    let cover = |committed: Decimal, used: Decimal| {
        if committed > Decimal::ZERO && used > Decimal::ZERO {
            (committed / used).min(Decimal::ONE)
        } else {
            Decimal::ZERO
        }
    };
    for h in hours {
        let g = guaranteed.get(&h).copied().unwrap_or_default();
        let used: Decimal = (ordinary.range((h, i16::MIN)..=(h, i16::MAX)))
            .map(|(_, v)| v.0)
            .sum();
        let f = cover(g, used);
        for (&(_, priority), &(s, l)) in ordinary.range((h, i16::MIN)..=(h, i16::MAX)) {
            let price = d(if priority == 0 { LOW } else { NORMAL });
            let unit = (Decimal::ONE - f) * price + f * d(GUARANTEE_COVERED);
            cost += (s - l) / hour * unit;
            credit += l / hour * unit;
        }
        cost += g / hour * d(GUARANTEE);
        let r = reserved.get(&h).copied().unwrap_or_default();
        let ru = reserved_use.get(&h).copied().unwrap_or_default();
        cost += ru / hour * (Decimal::ONE - cover(r, ru)) * d(NORMAL) + r / hour * d(RESERVATION);
    }
    (cost, held_s, lost_s, credit)
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db
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
/// A CSV export's header and rows (the `csv` crate's reading).
fn csv_rows(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_reader(text.as_bytes());
    let header = r.headers().unwrap().iter().map(String::from).collect();
    let rows = (r.records())
        .map(|rec| rec.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

/// The rules of FOCUS 1.0 that the FinOps Foundation's validator
/// (`focus-validator` 1.0.0; `.ci/run` installs it, and
/// `GANGWAY_FOCUS_VALIDATOR` names it) finds broken in the CSV `file`.
fn focus_validator_failures(file: &std::path::Path) -> Vec<String> {
    let bin = std::env::var("GANGWAY_FOCUS_VALIDATOR")
        .unwrap_or_else(|_| "/opt/gangway-focus-validator/bin/focus-validator".into());
    let python = std::path::Path::new(&bin).with_file_name("python3");
    // It reads its list of currency codes from a path relative to the
    // working directory: run it where its package is installed.
    let site = Command::new(&python)
        .args([
            "-c",
            "import focus_validator, os; print(os.path.dirname(os.path.dirname(focus_validator.__file__)))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .unwrap_or_else(|| {
            panic!(
                "no FOCUS validator at {bin}: run `bash .ci/run`, or `python3 -m venv \
                 /opt/gangway-focus-validator && /opt/gangway-focus-validator/bin/pip install \
                 focus-validator==1.0.0 'multimethod<1.10'`, or set GANGWAY_FOCUS_VALIDATOR"
            )
        });
    let site = String::from_utf8(site.stdout).unwrap();
    let out = Command::new(&bin)
        .args(["--validate-version", "1.0", "--data-file"])
        .arg(file)
        .current_dir(site.trim())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let errors = String::from_utf8_lossy(&out.stderr).into_owned();
    // It exits 0 either way: what failed is in its report.
    assert!(
        out.status.success() && !text.contains("Traceback") && !errors.contains("Traceback"),
        "the validator did not run: {text}\n{errors}"
    );
    let failed: Vec<String> = (text.lines())
        .filter_map(|l| l.trim().strip_suffix(" failed:"))
        .map(String::from)
        .collect();
    assert!(
        !failed.is_empty() || !text.contains("Validation failed"),
        "{text}"
    );
    failed
}

fn spec(key: &str, priority: &str, estimated_s: u32) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": key, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "priority": priority, "estimated_duration_s": estimated_s, "command": ["train"]
    }))
    .unwrap()
}

fn spec_in(key: &str, reservation: Uuid, estimated_s: u32) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": key, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "priority": "normal", "estimated_duration_s": estimated_s, "command": ["train"],
        "reservation": reservation
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

    // acme is guaranteed one h100 GPU in every region for the while
    // (committed capacity, which covers its ordinary usage).
    let (code, _, stderr) = gangway(&[
        "admin",
        "quota",
        "set",
        "acme",
        "h100",
        "--guaranteed",
        "1",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");

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

    // A reservation of one node in another region, and a job (10 s) in
    // it: reserved capacity, billed whether used or not, the job's usage
    // inside it free.
    let other = REGIONS
        .iter()
        .find(|r| **r != running.region)
        .unwrap()
        .to_string();
    let reservation = cloud
        .tenant
        .create_reservation(
            &ReservationSpec {
                gpu_type: "h100".into(),
                gpus: 8,
                level: TopologyLevel::Region,
                start: None,
                end: None,
                region: Some(other.clone()),
            },
            Some("bill-reserve"),
        )
        .await
        .unwrap();
    let in_reservation = cloud
        .tenant
        .submit(&spec_in("bill-res", reservation.id, 200), Some("bill-res"))
        .await
        .unwrap()
        .id;

    // Four keyed jobs, normal and low priority, 10 s each (200 s × 0.05).
    let mut ids = vec![lost, in_reservation];
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
    let ran = cloud.tenant.get(in_reservation).await.unwrap();
    assert_eq!(ran.region, other);
    // The commitments end: the reservation is deleted, the guarantee taken
    // back.
    cloud
        .tenant
        .delete_reservation(reservation.id, None)
        .await
        .unwrap();
    let (code, _, stderr) = gangway(&[
        "admin",
        "quota",
        "set",
        "acme",
        "h100",
        "--guaranteed",
        "0",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    // The rows reach the buddies within a beat or two.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // By hand: every region's allocations, priced, less the time lost with
    // the node (the job had no checkpoint: all of that placement), with
    // the commitments.
    let mut expect = Decimal::ZERO;
    let (mut gpu_s, mut lost_s, mut lost_cost) = (Decimal::ZERO, Decimal::ZERO, Decimal::ZERO);
    for r in REGIONS {
        let (cost, s, l, credit) = by_hand(cloud.database(r)).await;
        expect += cost;
        gpu_s += s;
        lost_s += l;
        lost_cost += credit;
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
        gpu_s > Decimal::from(5 * 8 * 9 + 8 * 19),
        "five 8-GPU jobs of about 10 s and one of 20 s: {gpu_s}"
    );
    assert!(
        lost_s > Decimal::from(8 * 2),
        "about 3 s of 8 GPUs lost: {lost_s}"
    );
    // GPU-seconds, as the usage API gives them (a float).
    let f = |x: Decimal| -> f64 { x.to_string().parse().unwrap() };
    let (gpu_s, lost_s) = (f(gpu_s), f(lost_s));

    let now = Utc::now();
    let month = format!("{}-{:02}", now.year(), now.month());
    let run_export = |book: &str, format: &str| {
        gangway(&[
            "billing",
            "export",
            "--month",
            &month,
            "--format",
            format,
            "--price-book",
            book,
        ])
    };
    // A price book without commitment prices: the export stops and names
    // what to add.
    let partial = cloud.dir.path().join("usage-prices.toml");
    std::fs::write(&partial, USAGE_PRICES).unwrap();
    let (code, _, stderr) = run_export(&partial.display().to_string(), "csv");
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains(&format!("commitment reservation h100 in {other}"))
            && stderr.contains("commitment guarantee h100 in"),
        "{stderr}"
    );
    let book = cloud.dir.path().join("prices.toml");
    std::fs::write(&book, format!("{USAGE_PRICES}{COMMITMENT_PRICES}")).unwrap();
    let book = book.display().to_string();
    let export = |format: &str| {
        let (code, out, stderr) = run_export(&book, format);
        assert_eq!(code, Some(0), "{stderr}");
        (out, stderr)
    };
    let (csv, stderr) = export("csv");
    // The FinOps Foundation's validator for FOCUS 1.0 finds nothing wrong.
    let file = cloud.dir.path().join("export.csv");
    std::fs::write(&file, &csv).unwrap();
    let failed = focus_validator_failures(&file);
    assert!(failed.is_empty(), "FOCUS rules failed: {failed:?}\n{csv}");
    let (header, rows) = csv_rows(&csv);
    for col in [
        "BilledCost",
        "EffectiveCost",
        "ChargeCategory",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "ResourceId",
        "SkuId",
        "SkuPriceId",
        "ConsumedQuantity",
        "ConsumedUnit",
        "RegionId",
        "ProviderName",
        "InvoiceIssuerName",
        "ServiceCategory",
        "PricingCategory",
        "ContractedCost",
        "Tags",
        "x_Cause",
        "x_CreditedUsageId",
        "CommitmentDiscountId",
        "CommitmentDiscountType",
        "CommitmentDiscountStatus",
        "x_CapacityReservationId",
        "ChargeFrequency",
    ] {
        assert!(header.iter().any(|h| h == col), "no {col} in {header:?}");
    }
    let at = |c: &str| header.iter().position(|h| h == c).unwrap();
    let mut total = Decimal::ZERO;
    let mut credited = Decimal::ZERO;
    let (mut effective, mut committed) = (Decimal::ZERO, Decimal::ZERO);
    let mut seen = std::collections::BTreeSet::new();
    let mut jobs = std::collections::BTreeSet::new();
    let mut statuses = std::collections::BTreeSet::new();
    // Ledger rows and credits (not commitments' lines).
    let mut ledger = std::collections::BTreeSet::new();
    for f in &rows {
        let line = f.join(",");
        assert_eq!(f.len(), header.len(), "{line}");
        let cost: Decimal = f[at("BilledCost")].parse().unwrap();
        total += cost;
        effective += f[at("EffectiveCost")].parse::<Decimal>().unwrap();
        // A usage row partly covered by a commitment is two lines (the
        // covered part, `Used`, and the rest): one per id and status.
        let status = f[at("CommitmentDiscountStatus")].clone();
        assert!(
            seen.insert((f[at("x_UsageId")].clone(), status.clone())),
            "row twice: {line}"
        );
        let kind = f[at("CommitmentDiscountType")].clone();
        statuses.insert((
            kind.clone(),
            f[at("ChargeCategory")].clone(),
            status.clone(),
        ));
        if f[at("ChargeCategory")] == "Purchase" {
            // A commitment's hour: its tenant's, in force whether used or
            // not.
            assert!(
                cost > Decimal::ZERO && f[at("ChargeFrequency")] == "Recurring",
                "{line}"
            );
            assert_eq!(f[at("BillingAccountId")], "acme");
            if kind == "reservation" {
                assert_eq!(f[at("ResourceId")], reservation.id.to_string(), "{line}");
                assert_eq!(f[at("x_CapacityReservationId")], reservation.id.to_string());
                assert_eq!(f[at("RegionId")], other);
            } else {
                assert_eq!(kind, "guarantee", "{line}");
            }
            committed += cost;
            continue;
        }
        if status == "Unused" {
            assert_eq!(cost, Decimal::ZERO, "{line}");
            assert_eq!(f[at("PricingCategory")], "Committed", "{line}");
            continue;
        }
        if status == "Used" && kind == "reservation" {
            // The job in the reservation: covered, free.
            assert_eq!(f[at("ResourceId")], in_reservation.to_string(), "{line}");
            assert_eq!(cost, Decimal::ZERO, "{line}");
        }
        jobs.insert(f[at("ResourceId")].clone());
        ledger.insert(f[at("x_UsageId")].clone());
        if f[at("ChargeCategory")] == "Credit" {
            // A credit: negative, priced like the usage it offsets, with
            // its cause.
            assert_eq!(f[at("ResourceId")], lost.to_string(), "{line}");
            assert_eq!(f[at("x_Cause")], "node_lost", "{line}");
            assert!(cost < Decimal::ZERO, "{line}");
            assert_eq!(f[at("SkuId")], "gpu-h100-normal");
            assert!(!f[at("x_CreditedUsageId")].is_empty());
            credited -= cost;
        } else {
            assert_eq!(f[at("ChargeCategory")], "Usage", "{line}");
            assert!(cost >= Decimal::ZERO, "{line}");
        }
    }
    // Each job's rows, once — though its buddy holds them too (the
    // regions together read more rows than the export has) — and the
    // whole to the cent, the credit and the commitments included.
    assert_eq!(jobs.len(), 6, "{csv}");
    // Money is written as the export computed it, exactly: to nine places.
    assert!(
        (rows.iter()).all(|f| f[at("BilledCost")]
            .split_once('.')
            .is_some_and(|(_, p)| p.len() == 9)),
        "{csv}"
    );
    for want in [
        ("reservation", "Purchase", ""),
        ("reservation", "Usage", "Used"),
        ("reservation", "Usage", "Unused"),
        ("guarantee", "Purchase", ""),
        ("guarantee", "Usage", "Used"),
    ] {
        let want = (want.0.to_string(), want.1.to_string(), want.2.to_string());
        assert!(statuses.contains(&want), "no {want:?} line: {statuses:?}");
    }
    assert!(committed > Decimal::ZERO);
    assert_eq!(
        cents(effective),
        cents(total),
        "effective cost sums to the billed cost"
    );
    let read = |what: &str| -> usize {
        (stderr.lines())
            .filter_map(|l| l.strip_suffix(what))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
            .sum()
    };
    assert!(
        read(" usage rows read") + read(" credits read") > ledger.len(),
        "no row was replicated\n{stderr}"
    );
    assert!(
        read(" credits read") >= 2,
        "the credit is held by two regions\n{stderr}"
    );
    assert_eq!(
        cents(credited),
        cents(lost_cost),
        "credit {credited}\n{stderr}"
    );
    assert!(credited > Decimal::ZERO);
    assert_eq!(
        cents(total),
        cents(expect),
        "export {total} vs by hand {expect}\n{stderr}"
    );
    // What the export says on standard error, per tenant, is that total.
    assert!(
        stderr.contains(&format!(", {} USD (after credits", cents(total))),
        "{stderr}"
    );
    // JSON Lines says the same.
    let (jsonl, _) = export("jsonl");
    let rows: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), seen.len());
    let billed = |tenant: Option<&str>| -> Decimal {
        (rows.iter())
            .filter(|r| tenant.is_none_or(|t| r["BillingAccountId"] == t))
            .map(|r| {
                r["BilledCost"]
                    .as_str()
                    .unwrap()
                    .parse::<Decimal>()
                    .unwrap()
            })
            .sum()
    };
    assert_eq!(billed(None), total, "the same lines as the CSV's");
    assert!(rows.iter().all(|r| r["PricingUnit"] == "GPU-Hours"));
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

    // The tenant's own costs (`GET /v1/costs`, priced by the global tier
    // with the same book): its lines of the operator's export, summed, to
    // the digit; another tenant's are its own (none).
    let acme_billed = billed(Some("acme"));
    assert_eq!(acme_billed, total, "only acme ran jobs");
    let costs = cloud.tenant.costs(Some(&month)).await.unwrap();
    assert_eq!(costs.tenant, "acme");
    assert_eq!(costs.billed, acme_billed, "{costs:?}");
    assert_eq!(costs.credits, -credited, "{costs:?}");
    assert_eq!(costs.commitments, committed, "{costs:?}");
    assert!(costs.regions_unavailable.is_empty(), "{costs:?}");
    let by_day: Decimal = costs.days.iter().map(|d| d.billed).sum();
    let by_sku: Decimal = costs.skus.iter().map(|s| s.billed).sum();
    assert_eq!((by_day, by_sku), (costs.billed, costs.billed), "{costs:?}");
    assert!(
        costs
            .skus
            .iter()
            .any(|s| s.sku == "commit-reservation-h100"),
        "{costs:?}"
    );
    let theirs = globex.costs(Some(&month)).await.unwrap();
    assert_eq!(
        (theirs.tenant.as_str(), theirs.billed),
        ("globex", Decimal::ZERO)
    );
    assert!(
        theirs.days.is_empty() && theirs.skus.is_empty(),
        "{theirs:?}"
    );
    // A month that is no month is refused.
    let bad = cloud.tenant.costs(Some("2026-13")).await.unwrap_err();
    assert!(bad.to_string().contains("invalid_query"), "{bad}");
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
    assert_eq!(keys.len(), 6, "{mine:?}");
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

    // The commitments the export priced, on the admin API: the
    // reservation's hours in its region, a guarantee in every region.
    let period = format!(
        "from={}&to={}",
        (now - chrono::Duration::hours(2)).format("%Y-%m-%dT%H:%M:%SZ"),
        (Utc::now() + chrono::Duration::minutes(5)).format("%Y-%m-%dT%H:%M:%SZ")
    );
    let doc = admin
        .call_json(
            reqwest::Method::GET,
            &format!("/v1/admin/usage/commitments?{period}&tenant=acme"),
            None,
        )
        .await
        .unwrap();
    for r in REGIONS {
        let page: gangway_shared::billing::CommitmentRecords =
            serde_json::from_value(doc["regions"][r].clone()).unwrap();
        let kinds: std::collections::BTreeSet<&str> =
            page.commitments.iter().map(|c| c.kind.as_str()).collect();
        assert!(kinds.contains("guarantee"), "{r}: {kinds:?}");
        assert_eq!(kinds.contains("reservation"), r == other, "{r}: {kinds:?}");
        assert!(page
            .commitments
            .iter()
            .all(|c| c.region == r && c.tenant == "acme"));
    }
    for bad in [
        "/v1/admin/usage/commitments?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
        "/v1/admin/usage/commitments?from=yesterday&to=2026-01-01T00:00:00Z",
        "/v1/admin/usage/commitments?to=2026-01-01T00:00:00Z",
    ] {
        let e = admin
            .call_json(reqwest::Method::GET, bad, None)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("invalid_query"), "{bad}: {e:?}");
    }

    // A region that does not come back (docs/billing.md): a globex job
    // runs in it when it is killed for good; its peers' copies bill it.
    let dead_job = globex
        .submit(&spec("bill-dead", "normal", 4000), Some("bill-dead"))
        .await
        .unwrap()
        .id;
    let running = wait_job(&globex, dead_job, "running", |j| {
        j.state == JobState::Running
    })
    .await;
    let dead = running.region.clone();
    // Its placement reaches its buddy within a beat or two.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, before, stderr) = run_export(&book, "csv");
    assert_eq!(code, Some(0), "{stderr}");
    let killed = Utc::now();
    cloud.kill(&dead).await.unwrap();
    let moved = wait_job(&globex, dead_job, "running elsewhere", |j| {
        j.state == JobState::Running && j.region != dead
    })
    .await;
    assert_eq!(moved.epoch, 2);
    let export_with = |extra: &[&str]| {
        let mut args = vec![
            "billing",
            "export",
            "--month",
            &month,
            "--format",
            "csv",
            "--price-book",
            &book,
        ];
        args.extend_from_slice(extra);
        gangway(&args)
    };
    // Without its copies the bill is incomplete, and says so; a region
    // that answers is billed from its own ledger.
    let (code, _, stderr) = export_with(&[]);
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains(&format!("region {dead} did not give")),
        "{stderr}"
    );
    let alive = REGIONS.iter().find(|r| **r != dead).unwrap();
    let (code, _, stderr) = export_with(&["--from-copies", alive]);
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains(&format!("region {alive} answers")),
        "{stderr}"
    );
    let (code, after, stderr) = export_with(&["--from-copies", &dead]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("from the copies of {dead}")),
        "{stderr}"
    );
    // Everything the dead region billed while it answered is billed the
    // same from its copies — usage, credits, its guarantee's hours.
    let (header, _) = csv_rows(&before);
    let at = |c: &str| header.iter().position(|h| h == c).unwrap();
    let lines_in = |csv: &str| -> std::collections::BTreeSet<Vec<String>> {
        (csv_rows(csv).1.into_iter())
            .filter(|f| f[at("RegionId")] == dead)
            .collect()
    };
    let (was, is) = (lines_in(&before), lines_in(&after));
    assert!(
        was.iter()
            .any(|f| f.iter().any(|v| v.contains("guarantee"))),
        "{dead}'s guarantee was billed"
    );
    let missing: Vec<&Vec<String>> = was.difference(&is).collect();
    assert!(
        missing.is_empty(),
        "not billed from the copies: {missing:#?}"
    );
    // And the job it ran when it died, to within a few seconds of its
    // death: the hours its adopter closed, credited after its checkpoint.
    let closed: Vec<Vec<String>> = (is.difference(&was))
        .filter(|f| f[at("ResourceId")] == dead_job.to_string())
        .cloned()
        .collect();
    let usage: Vec<&Vec<String>> = (closed.iter())
        .filter(|f| f[at("ChargeCategory")] == "Usage")
        .collect();
    assert!(!usage.is_empty(), "{closed:#?}");
    assert!(
        usage.iter().any(|f| f[at("x_EndedBy")] == "moved"),
        "{usage:#?}"
    );
    let end = (usage.iter())
        .map(|f| f[at("ChargePeriodEnd")].parse::<DateTime<Utc>>().unwrap())
        .max()
        .unwrap();
    assert!(
        end <= killed + chrono::Duration::seconds(1) && end > killed - chrono::Duration::seconds(5),
        "billed to {end}, killed at {killed}"
    );
    let quantity = |f: &Vec<String>| f[at("ConsumedQuantity")].parse::<f64>().unwrap();
    let held: f64 = usage.iter().map(|f| quantity(f)).sum();
    // From its placement (after its creation, before it ran) to the end.
    let hours_from = |t: DateTime<Utc>| (end - t).num_milliseconds() as f64 / 3.6e6 * 8.0;
    let (most, least) = (
        hours_from(running.created_at),
        hours_from(running.started_at.unwrap()),
    );
    assert!(
        held <= most + 1e-6 && held >= least - 1e-6,
        "{held} GPU-hours billed from the copies, not within [{least}, {most}]"
    );
    let credit: f64 = (closed.iter())
        .filter(|f| f[at("ChargeCategory")] == "Credit")
        .map(|f| -quantity(f))
        .sum();
    assert!(credit >= 0.0 && credit <= held + 1e-9, "{credit} of {held}");
    // The tenant API reads the dead region from the same copies.
    let theirs = globex
        .usage(&UsageQuery {
            job: Some(dead_job),
            group_by: Some(UsageGroup::Region),
            to: Some(Utc::now() + chrono::Duration::minutes(1)),
            ..window.clone()
        })
        .await
        .unwrap();
    assert!(theirs.replicated_regions.contains(&dead), "{theirs:?}");
    let in_dead: f64 = (theirs.rows.iter())
        .filter(|r| r.key == dead)
        .map(|r| r.gpu_seconds)
        .sum();
    assert!(
        (in_dead - held * 3600.0).abs() < 0.5,
        "{in_dead} vs {held} GPU-hours"
    );
    // Reconciliation cannot read the dead region's allocations: it stops,
    // unless told to leave it out; then it checks the others.
    let (code, _, stderr) = reconcile();
    assert_eq!(code, Some(2), "{stderr}");
    let (code, out, stderr) = gangway(&[
        "billing",
        "reconcile",
        "--from",
        &from,
        "--to",
        &to,
        "--without",
        &dead,
    ]);
    assert_ne!(code, Some(2), "{out}\n{stderr}");
    assert!(out.contains(&format!("{dead}: left out")), "{out}");
    let (_, out, _) = gangway(&[
        "billing",
        "reconcile",
        "--from",
        &from,
        "--to",
        &to,
        "--without",
        &dead,
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["region"] != dead.as_str()),
        "{report}"
    );
}
