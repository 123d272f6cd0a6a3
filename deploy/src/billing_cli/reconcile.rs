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
//! quiet cloud reconciles to zero.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, SecondsFormat, Utc};
use gangway_shared::billing::{AllocatedUsage, CreditRecords, UsageRecords};
use reqwest::Method;
use serde::Serialize;
use uuid::Uuid;

use super::{month_bounds, read_merged};
use crate::admin_cli::with_query;
use crate::conn::Conn;

/// One tenant in one region.
#[derive(Clone, Debug, Default, Serialize)]
struct Line {
    tenant: String,
    region: String,
    allocated_gpu_seconds: f64,
    /// Charged: the ledger's usage less its credits.
    billed_gpu_seconds: f64,
    credited_gpu_seconds: f64,
    /// allocated − (billed + credited).
    difference_gpu_seconds: f64,
}

/// What one region said of itself.
#[derive(Clone, Debug, Serialize)]
struct RegionNote {
    as_of: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metered_until: Option<DateTime<Utc>>,
    live_placements: usize,
}

#[derive(Clone, Debug, Serialize)]
struct Report {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    epsilon_gpu_seconds: f64,
    reconciled: bool,
    regions: BTreeMap<String, RegionNote>,
    rows: Vec<Line>,
    /// Other inconsistencies found (credits without their usage row, or
    /// larger than it), and what to check next for each difference.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<String>,
}

pub async fn reconcile(
    conn: Conn,
    month: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    epsilon: f64,
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
        let r = match compare(&conn, from, to, epsilon).await {
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
    }
    Ok(if report.reconciled { 0 } else { 1 })
}

/// Seconds of [s, e) inside [from, to).
fn overlap(s: DateTime<Utc>, e: DateTime<Utc>, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let (s, e) = (s.max(from), e.min(to));
    if e > s {
        (e - s).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
    } else {
        0.0
    }
}

/// GPU-seconds of a row of `gpus` over [s, e) holding `gpu_seconds`,
/// inside [from, to): all of it when it lies inside.
fn clipped(
    gpus: i32,
    gpu_seconds: f64,
    (s, e): (DateTime<Utc>, DateTime<Utc>),
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> f64 {
    if s >= from && e <= to {
        gpu_seconds
    } else {
        gpus as f64 * overlap(s, e, from, to)
    }
}

async fn compare(
    conn: &Conn,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    epsilon: f64,
) -> anyhow::Result<Report> {
    let client = conn.admin_client()?;
    let period = [
        ("from", from.to_rfc3339_opts(SecondsFormat::Micros, true)),
        ("to", to.to_rfc3339_opts(SecondsFormat::Micros, true)),
    ];
    // The allocations first, each region in one snapshot.
    let doc = client
        .call_json(
            Method::GET,
            &with_query("/v1/admin/usage/allocated", &period),
            None,
        )
        .await?;
    let mut allocated: BTreeMap<String, AllocatedUsage> = BTreeMap::new();
    for (name, answer) in doc["regions"].as_object().into_iter().flatten() {
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
    // Then the ledger, merged and deduplicated.
    let (rows, _) = read_merged::<UsageRecords>(&client, "/v1/admin/usage/records", &period)
        .await
        .context("reading the usage ledger")?;
    let (credits, _) = read_merged::<CreditRecords>(&client, "/v1/admin/usage/credits", &period)
        .await
        .context("reading the credits")?;

    let mut lines: BTreeMap<(String, String), Line> = BTreeMap::new();
    fn line<'a>(
        lines: &'a mut BTreeMap<(String, String), Line>,
        tenant: &str,
        region: &str,
    ) -> &'a mut Line {
        lines
            .entry((tenant.to_string(), region.to_string()))
            .or_insert_with(|| Line {
                tenant: tenant.to_string(),
                region: region.to_string(),
                ..Line::default()
            })
    }
    for (name, a) in &allocated {
        for t in &a.tenants {
            line(&mut lines, &t.tenant, name).allocated_gpu_seconds += t.gpu_seconds;
        }
    }
    // Live placements of each region at its snapshot, by (job, attempt,
    // rank): their rows from max(start, watermark) on are not counted.
    let mut live: BTreeMap<(&str, Uuid, i32, i32), Vec<DateTime<Utc>>> = BTreeMap::new();
    for (name, a) in &allocated {
        for p in &a.live {
            let from_here = match a.metered_until {
                Some(w) => p.started_at.max(w),
                None => p.started_at,
            };
            live.entry((name.as_str(), p.job_id, p.attempt, p.rank))
                .or_default()
                .push(from_here);
        }
    }
    let mut counted: BTreeMap<Uuid, f64> = BTreeMap::new();
    for r in rows.values() {
        if let Some(a) = allocated.get(&r.region) {
            if r.started_at >= a.as_of {
                continue; // of a placement the snapshot did not hold
            }
            let key = (r.region.as_str(), r.job_id, r.attempt, r.rank);
            if live
                .get(&key)
                .is_some_and(|starts| starts.iter().any(|&s| r.started_at >= s))
            {
                continue; // a live placement's hours not metered at the snapshot
            }
        }
        let s = clipped(
            r.gpus,
            r.gpu_seconds,
            (r.started_at, r.ended_at),
            (from, to),
        );
        counted.insert(r.usage_id, r.gpu_seconds);
        // Billed for now; its credits move their part to credited below.
        line(&mut lines, &r.tenant, &r.region).billed_gpu_seconds += s;
    }
    let mut problems = Vec::new();
    let (mut orphans, mut excess) = (BTreeSet::new(), BTreeSet::new());
    for c in credits.values() {
        if overlap(c.started_at, c.ended_at, from, to) <= 0.0 {
            continue; // issued in the period, for time before it
        }
        match counted.get(&c.usage_id) {
            Some(&row_s) => {
                if c.gpu_seconds > row_s + 1e-6 {
                    excess.insert(c.credit_id);
                }
                let s = clipped(
                    c.gpus,
                    c.gpu_seconds,
                    (c.started_at, c.ended_at),
                    (from, to),
                );
                let l = line(&mut lines, &c.tenant, &c.region);
                l.billed_gpu_seconds -= s;
                l.credited_gpu_seconds += s;
            }
            None if rows.contains_key(&c.usage_id) => {} // its row is left out above
            None => {
                orphans.insert(c.credit_id);
            }
        }
    }
    if !orphans.is_empty() {
        problems.push(format!(
            "{} credit(s) offset usage rows no region holds (e.g. {}): a usage row was removed \
             while its credit stayed; compare `usage_credits` with `usage_ledger` in the region \
             that ran it",
            orphans.len(),
            orphans.iter().next().expect("one")
        ));
    }
    if !excess.is_empty() {
        problems.push(format!(
            "{} credit(s) credit more than the usage row they offset (e.g. {})",
            excess.len(),
            excess.iter().next().expect("one")
        ));
    }
    let mut out: Vec<Line> = lines.into_values().collect();
    for l in &mut out {
        l.difference_gpu_seconds =
            l.allocated_gpu_seconds - l.billed_gpu_seconds - l.credited_gpu_seconds;
    }
    for l in out
        .iter()
        .filter(|l| l.difference_gpu_seconds.abs() > epsilon)
    {
        let d = l.difference_gpu_seconds;
        let (t, r) = (&l.tenant, &l.region);
        problems.push(if !allocated.contains_key(r) {
            format!(
                "{t} in {r}: the ledger holds {:.1} GPU-seconds of a region no region answers \
                 for: a region renamed or removed, whose allocations cannot be read",
                -d
            )
        } else if d > 0.0 {
            format!(
                "{t} in {r}: the ledger lacks {d:.1} GPU-seconds its allocations held: check \
                 that {r}'s meter runs every hour (its log: 'metering live placements failed'; \
                 `metered_until` above), that no row was removed from {r}'s `usage_ledger` (and \
                 its buddy's copy), and list the rows with `GET \
                 /v1/admin/usage/records?region={r}&tenant={t}&from=…&to=…`"
            )
        } else {
            format!(
                "{t} in {r}: the ledger bills {:.1} GPU-seconds more than its allocations \
                 held: look for a release dated back past an hour the meter had already billed \
                 whole (a lost node, a returning region's moved jobs), and list the rows with \
                 `GET /v1/admin/usage/records?region={r}&tenant={t}&from=…&to=…`",
                -d
            )
        });
    }
    let reconciled = problems.is_empty();
    Ok(Report {
        from,
        to,
        epsilon_gpu_seconds: epsilon,
        reconciled,
        regions: allocated
            .into_iter()
            .map(|(name, a)| {
                (
                    name,
                    RegionNote {
                        as_of: a.as_of,
                        metered_until: a.metered_until,
                        live_placements: a.live.len(),
                    },
                )
            })
            .collect(),
        rows: out,
        problems,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_row_counts_its_part_inside_the_period() {
        let p = (at("2026-11-02T10:30:00Z"), at("2026-11-02T12:00:00Z"));
        let inside = (at("2026-11-02T11:00:00Z"), at("2026-11-02T11:30:00Z"));
        assert_eq!(clipped(8, 12345.0, inside, p), 12345.0);
        let across = (at("2026-11-02T10:00:00Z"), at("2026-11-02T11:00:00Z"));
        assert_eq!(clipped(8, 8.0 * 3600.0, across, p), 8.0 * 1800.0);
        let before = (at("2026-11-02T09:00:00Z"), at("2026-11-02T10:00:00Z"));
        assert_eq!(clipped(8, 8.0 * 3600.0, before, p), 0.0);
    }
}
