//! `gangway billing reconcile` (docs/billing.md): for a period, per tenant
//! and region, the GPU-seconds the region's allocations held against the
//! billed and credited GPU-seconds of the merged, deduplicated ledger.
//!
//! Live placements are counted, on both sides, only up to the hour the
//! region's meter has written (`metered_until`): the allocations are read
//! first, in one snapshot per region, with the placements live in it; the
//! ledger after, leaving out the rows of those placements from that hour
//! on and every row starting after the snapshot. A placement that ends
//! between the two reads is thus counted the same on both sides, and a
//! quiet cloud reconciles to zero. The arithmetic is
//! [`gangway_shared::billing::reconcile::tally`]'s; corrections take their
//! time off the billed side (it was never held), credits move theirs to
//! the credited side. Committed capacity is not allocation and is not
//! compared.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, SecondsFormat, Utc};
use gangway_shared::billing::reconcile::{tally, Report};
use gangway_shared::billing::{AllocatedUsage, CreditRecords, UsageRecords};
use reqwest::Method;

use super::{month_bounds, read_merged};
use crate::admin_cli::with_query;
use crate::conn::Conn;

pub async fn reconcile(
    conn: Conn,
    month: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    epsilon: f64,
    without: Vec<String>,
) -> anyhow::Result<u8> {
    let period = match (month, from, to) {
        (Some(m), None, None) => month_bounds(&m),
        (None, Some(f), Some(t)) if f < t => Ok((f, t)),
        (None, Some(_), Some(_)) => Err(anyhow::anyhow!("--from must be before --to")),
        _ => Err(anyhow::anyhow!("give --month YYYY-MM, or --from and --to")),
    };
    let (from, to) = match period {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(2);
        }
    };
    if !(epsilon.is_finite() && epsilon >= 0.0) {
        eprintln!("error: --epsilon must be a number of GPU-seconds, at least 0");
        return Ok(2);
    }
    // A placement ending between the reads is counted alike on both sides;
    // one whose transaction straddles the snapshot is not: a difference is
    // looked at again once before it is reported.
    let mut report = None;
    for attempt in 0..2 {
        let r = match compare(&conn, from, to, epsilon, &without).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: cannot reconcile: {e:#}");
                return Ok(2);
            }
        };
        if r.reconciled || attempt == 1 {
            report = Some(r);
            break;
        }
        eprintln!("differences seen; reading again in 2 s (a placement may have just ended)");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let report = report.expect("one reading at least");
    if conn.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
        for r in &without {
            println!(
                "{r}: left out (it does not answer: its allocations cannot be read; its usage \
                 is billed with `billing export --from-copies {r}`)"
            );
        }
    }
    Ok(if report.reconciled { 0 } else { 1 })
}

/// The allocations first, each region in one snapshot; then the ledger,
/// merged and deduplicated; compared by [`tally`]. The regions `without`
/// (gone: they must not answer) are left out, their rows and credits
/// held elsewhere too.
async fn compare(
    conn: &Conn,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    epsilon: f64,
    without: &[String],
) -> anyhow::Result<Report> {
    let client = conn.admin_client()?;
    let period = [
        ("from", from.to_rfc3339_opts(SecondsFormat::Micros, true)),
        ("to", to.to_rfc3339_opts(SecondsFormat::Micros, true)),
    ];
    let doc = client
        .call_json(
            Method::GET,
            &with_query("/v1/admin/usage/allocated", &period),
            None,
        )
        .await?;
    let mut allocated: BTreeMap<String, AllocatedUsage> = BTreeMap::new();
    let names: Vec<&String> = doc["regions"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(n, _)| n)
        .collect();
    if let Some(r) = without.iter().find(|r| !names.contains(r)) {
        bail!("--without {r}: the global tier knows no region {r}");
    }
    for (name, answer) in doc["regions"].as_object().into_iter().flatten() {
        if without.contains(name) {
            if serde_json::from_value::<AllocatedUsage>(answer.clone()).is_ok() {
                bail!("region {name} answers: reconcile it (drop --without {name})");
            }
            continue;
        }
        let a: AllocatedUsage = serde_json::from_value(answer.clone()).map_err(|_| {
            anyhow::anyhow!(
                "region {name} did not say what its allocations held ({answer}); retry once it \
                 answers"
            )
        })?;
        allocated.insert(name.clone(), a);
    }
    if allocated.is_empty() {
        bail!("the global tier named no region");
    }
    let (mut rows, _) =
        read_merged::<UsageRecords>(&client, "/v1/admin/usage/records", &period, without)
            .await
            .context("reading the usage ledger")?;
    let (mut credits, _) =
        read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &period, without)
            .await
            .context("reading the credits")?;
    rows.retain(|_, r| !without.contains(&r.region));
    credits.retain(|_, c| !without.contains(&c.region));
    Ok(tally(&allocated, &rows, &credits, (from, to), epsilon))
}

fn print(r: &Report) {
    let t = |d: &DateTime<Utc>| d.to_rfc3339_opts(SecondsFormat::Secs, true);
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|l| {
            vec![
                l.tenant.clone(),
                l.region.clone(),
                format!("{:.1}", l.allocated_gpu_seconds),
                format!("{:.1}", l.billed_gpu_seconds),
                format!("{:.1}", l.credited_gpu_seconds),
                format!("{:.1}", l.difference_gpu_seconds),
            ]
        })
        .collect();
    println!("GPU-seconds from {} to {}", t(&r.from), t(&r.to));
    print!(
        "{}",
        crate::jobs_cli::table(
            &[
                "TENANT",
                "REGION",
                "ALLOCATED",
                "BILLED",
                "CREDITED",
                "DIFFERENCE"
            ],
            &rows
        )
    );
    for (name, n) in &r.regions {
        match n.metered_until {
            Some(w) if n.live_placements > 0 => println!(
                "{name}: {} live placement(s), counted to {} (the hour its meter has written)",
                n.live_placements,
                t(&w)
            ),
            None if n.live_placements > 0 => println!(
                "{name}: {} live placement(s), not counted (its meter has not run yet)",
                n.live_placements
            ),
            _ => {}
        }
    }
    if r.reconciled {
        println!(
            "reconciled: billed + credited = allocated for every tenant and region (within {} \
             GPU-seconds)",
            r.epsilon_gpu_seconds
        );
    } else {
        println!("NOT reconciled:");
        for p in &r.problems {
            println!("- {p}");
        }
    }
}
