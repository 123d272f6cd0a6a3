//! Reconciliation's arithmetic (docs/billing.md, `gangway billing
//! reconcile`): for a period, per tenant and region, the GPU-seconds the
//! region's allocations held against the billed and credited GPU-seconds
//! of the merged, deduplicated ledger. Pure: the CLI reads, this compares.
//!
//! Live placements count, on both sides, only up to the hour the region's
//! meter has written (`metered_until`): the allocations are read first, in
//! one snapshot per region, with the placements live in it; the ledger
//! after, leaving out the rows of those placements from that hour on and
//! every row starting after the snapshot. A placement that ends between
//! the two reads is thus counted the same on both sides, and a quiet cloud
//! reconciles to zero.
//!
//! It is about allocated GPU-seconds only: committed capacity
//! (guarantees, reservations, clusters) is billed whether used or not, is
//! not allocation, and is not compared here.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{AllocatedUsage, CreditRecord, UsageRecord};

/// One tenant in one region.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Line {
    pub tenant: String,
    pub region: String,
    pub allocated_gpu_seconds: f64,
    /// Charged: the ledger's usage less its credits and corrections.
    pub billed_gpu_seconds: f64,
    pub credited_gpu_seconds: f64,
    /// allocated − (billed + credited).
    pub difference_gpu_seconds: f64,
}

/// What one region said of itself.
#[derive(Clone, Debug, Serialize)]
pub struct RegionNote {
    pub as_of: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metered_until: Option<DateTime<Utc>>,
    pub live_placements: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub epsilon_gpu_seconds: f64,
    pub reconciled: bool,
    pub regions: BTreeMap<String, RegionNote>,
    pub rows: Vec<Line>,
    /// Other inconsistencies found (credits without their usage row, or
    /// larger than it), and what to check next for each difference.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Seconds of [s, e) inside [from, to).
pub fn overlap(s: DateTime<Utc>, e: DateTime<Utc>, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let (s, e) = (s.max(from), e.min(to));
    if e > s {
        (e - s).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
    } else {
        0.0
    }
}

/// GPU-seconds of a row of `gpus` over [s, e) holding `gpu_seconds`,
/// inside [from, to): all of it when it lies inside.
pub fn clipped(
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

/// Compares what each region's allocations held (`allocated`, by region)
/// with the merged ledger's `rows` and `credits` (credits and
/// corrections, by id) over [from, to).
pub fn tally(
    allocated: &BTreeMap<String, AllocatedUsage>,
    rows: &BTreeMap<Uuid, UsageRecord>,
    credits: &BTreeMap<Uuid, CreditRecord>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    epsilon: f64,
) -> Report {
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
    for (name, a) in allocated {
        for t in &a.tenants {
            line(&mut lines, &t.tenant, name).allocated_gpu_seconds += t.gpu_seconds;
        }
    }
    // Live placements of each region at its snapshot, by (job, attempt,
    // rank): their rows from max(start, watermark) on are not counted.
    let mut live: BTreeMap<(&str, Uuid, i32, i32), Vec<DateTime<Utc>>> = BTreeMap::new();
    for (name, a) in allocated {
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
        // Billed for now; its credits move their part to credited below,
        // its corrections take theirs off.
        line(&mut lines, &r.tenant, &r.region).billed_gpu_seconds += s;
    }
    let mut problems = Vec::new();
    let (mut orphans, mut excess) = (BTreeSet::new(), BTreeSet::new());
    let mut offset: BTreeMap<Uuid, f64> = BTreeMap::new();
    for c in credits.values() {
        if overlap(c.started_at, c.ended_at, from, to) <= 0.0 {
            continue; // issued in the period, for time before it
        }
        match counted.get(&c.usage_id) {
            Some(&row_s) => {
                let total = offset.entry(c.usage_id).or_default();
                *total += c.gpu_seconds;
                if *total > row_s + 1e-6 {
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
                if !c.is_correction() {
                    l.credited_gpu_seconds += s;
                }
            }
            None if rows.contains_key(&c.usage_id) => {} // its row is left out above
            None => {
                orphans.insert(c.credit_id);
            }
        }
    }
    if !orphans.is_empty() {
        problems.push(format!(
            "{} credit(s) or correction(s) offset usage rows no region holds (e.g. {}): a \
             usage row was removed while its credit stayed; compare `usage_credits` with \
             `usage_ledger` in the region that ran it",
            orphans.len(),
            orphans.iter().next().expect("one")
        ));
    }
    if !excess.is_empty() {
        problems.push(format!(
            "{} credit(s) or correction(s) take off more than the usage row they offset \
             (e.g. {})",
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
                 held: look for a row reaching past its placement's release without its \
                 correction (cause `correction` in `GET /v1/admin/usage/credits`), or a row \
                 added by hand, and list the rows with `GET \
                 /v1/admin/usage/records?region={r}&tenant={t}&from=…&to=…`",
                -d
            )
        });
    }
    let reconciled = problems.is_empty();
    Report {
        from,
        to,
        epsilon_gpu_seconds: epsilon,
        reconciled,
        regions: allocated
            .iter()
            .map(|(name, a)| {
                (
                    name.clone(),
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
