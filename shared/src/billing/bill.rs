//! A billing period priced (docs/billing.md, "The export"): the merged
//! ledger's rows, credits and corrections, and the capacity tenants
//! committed, as FOCUS rows. Pure: the export reads, this prices —
//! as a stream ([`Pricer`]: one clock hour of rows at a time, in time
//! order, its lines as soon as the hour is read) or all at once
//! ([`price`], the same lines, sorted).
//!
//! **Commitments apply per clock hour**, as cloud commitment discounts do:
//! in each hour, a commitment's GPU-seconds cover the usage that is
//! eligible for it — the rows of jobs in its reservation or cluster; for a
//! guarantee, its tenant's ordinary rows (in no reservation or cluster) of
//! its GPU type in its region. When the eligible usage of an hour exceeds
//! what was committed, every eligible row of that hour is covered in the
//! same proportion (committed / used): the result depends only on the
//! hour's totals, not on the order rows are read in. The covered part is
//! priced at the commitment's `covered_usage_per_gpu_hour`, the rest at the
//! usage price; what the commitment left idle is its `Unused` part.
//!
//! Per commitment and hour, three kinds of line:
//! - `Purchase` (`Recurring`): the committed GPU-hours × the commitment
//!   price — its `BilledCost`; `EffectiveCost` 0 (it is recognised on the
//!   lines it covers);
//! - `Usage` with `CommitmentDiscountStatus` `Used`: the covered part of a
//!   usage row, `BilledCost` at the covered price, `EffectiveCost` adding
//!   its share of the commitment;
//! - `Usage`, `Unused`: the idle part, `BilledCost` 0, `EffectiveCost` its
//!   share of the commitment.
//!
//! so the sum of `BilledCost` is what the tenant pays and the sum of
//! `EffectiveCost` equals it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::{
    decimal_seconds, focus_base, hours_of, priority_name, CommitmentKind, CommitmentPrice,
    CommitmentRecord, CreditRecord, FocusRow, PriceBook, UsageRecord,
};

/// [start, end).
pub type Period = (DateTime<Utc>, DateTime<Utc>);

/// The clock hour `t` lies in.
pub fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    Utc.timestamp_opt(t.timestamp().div_euclid(3600) * 3600, 0)
        .single()
        .expect("a whole hour")
}

/// The calendar month (UTC) `t` lies in, [first midnight, next month's).
pub fn month_of(t: DateTime<Utc>) -> Period {
    let first = NaiveDate::from_ymd_opt(t.year(), t.month(), 1).expect("a month's first day");
    let next = if t.month() == 12 {
        NaiveDate::from_ymd_opt(t.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(t.year(), t.month() + 1, 1)
    }
    .expect("the next month's first day");
    let at = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"));
    (at(first), at(next))
}

/// The calendar month named `YYYY-MM`, [its first midnight, the next
/// month's) in UTC; `None` when it is not one.
pub fn month_named(month: &str) -> Option<Period> {
    let (y, m) = month.split_once('-')?;
    if y.len() != 4 || m.len() != 2 {
        return None;
    }
    let first = NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)?;
    Some(month_of(
        Utc.from_utc_datetime(&first.and_hms_opt(0, 0, 0)?),
    ))
}

/// Where the rows needed to price `period` begin: its start, or the hour
/// of the oldest usage row a credit or correction issued in it offsets (a
/// credit is priced like its row, which may lie in an earlier month).
pub fn reads_from<'a>(
    period: Period,
    credits: impl IntoIterator<Item = &'a CreditRecord>,
) -> DateTime<Utc> {
    credits
        .into_iter()
        .filter(|c| c.issued_at >= period.0 && c.issued_at < period.1)
        .map(|c| hour_of(c.usage_started_at))
        .fold(period.0, |a, b| a.min(b))
}

/// What the price book lacks: per SKU, how many lines need it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpriced(pub BTreeMap<String, usize>);

impl std::fmt::Display for Unpriced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list: Vec<String> = (self.0.iter())
            .map(|(sku, n)| format!("{sku} ({n} rows)"))
            .collect();
        write!(
            f,
            "the price book has no price in force for: {}; add one and export again",
            list.join(", ")
        )
    }
}

/// (region, kind, commitment id, hour).
type Key = (String, CommitmentKind, String, DateTime<Utc>);

fn key_of(r: &UsageRecord) -> Key {
    let (kind, id) = r.commitment();
    (r.region.clone(), kind, id, hour_of(r.started_at))
}

/// How a usage row is priced: its usage price, and the part of it a
/// commitment covered.
#[derive(Clone, Debug)]
struct Rate {
    list: Decimal,
    /// The fraction of the row its commitment covered (0 to 1).
    covered: Decimal,
    commitment: Option<Covering>,
}

#[derive(Clone, Debug)]
struct Covering {
    kind: CommitmentKind,
    discount_id: String,
    capacity_id: Option<String>,
    covered_price: Decimal,
    commit_price: Decimal,
}

impl Rate {
    /// What a GPU-hour of the row was billed, on average.
    fn billed_unit(&self) -> Decimal {
        match &self.commitment {
            Some(c) => (Decimal::ONE - self.covered) * self.list + self.covered * c.covered_price,
            None => self.list,
        }
    }
}

/// `base` (its ids, times and description) for `q` GPU-hours (negative:
/// taken off), split into the part its commitment covered (`Used`) and
/// the rest at the usage price.
fn priced(base: FocusRow, q: Decimal, rate: &Rate) -> Vec<FocusRow> {
    let plain = |mut row: FocusRow, q: Decimal| {
        row.set_usage(q, rate.list);
        row
    };
    let Some(c) = (rate.commitment.as_ref()).filter(|_| rate.covered > Decimal::ZERO) else {
        return vec![plain(base, q)];
    };
    let mut used = base.clone();
    let qc = if rate.covered >= Decimal::ONE {
        q
    } else {
        q * rate.covered
    };
    used.set_usage(qc, rate.list);
    used.BilledCost = qc * c.covered_price;
    used.EffectiveCost = qc * (c.covered_price + c.commit_price);
    used.PricingCategory = Some("Committed".into());
    used.ChargeDescription = format!(
        "{} (covered by {} {})",
        used.ChargeDescription,
        c.kind.as_str(),
        c.discount_id
    );
    commitment_columns(&mut used, c.kind, &c.discount_id, c.capacity_id.as_deref());
    used.CommitmentDiscountStatus = Some("Used".into());
    used.x_CommitmentDiscountQuantity = Some(qc);
    if used.x_CapacityReservationId.is_some() {
        used.x_CapacityReservationStatus = Some("Used".into());
    }
    let mut out = vec![used];
    if rate.covered < Decimal::ONE {
        out.push(plain(base, q - qc));
    }
    out
}

fn commitment_columns(
    row: &mut FocusRow,
    kind: CommitmentKind,
    discount_id: &str,
    capacity: Option<&str>,
) {
    row.CommitmentDiscountId = Some(discount_id.to_string());
    row.CommitmentDiscountName = Some(match capacity {
        Some(id) => format!("{} {id}", kind.as_str()),
        None => format!(
            "guaranteed quota {}",
            discount_id.trim_start_matches("guarantee/")
        ),
    });
    row.CommitmentDiscountType = Some(kind.as_str().to_string());
    row.CommitmentDiscountCategory = Some("Usage".into());
    row.x_CommitmentDiscountUnit = Some("GPU-Hours".into());
    row.x_CapacityReservationId = capacity.map(String::from);
}

/// A commitment's line for its clock hour (`record`): its purchase, or
/// (`unused` GPU-seconds) the part it left idle.
fn commitment_line(
    record: &CommitmentRecord,
    committed_gpu_s: Decimal,
    unused: Option<Decimal>,
    price: &CommitmentPrice,
    book: &PriceBook,
    period: Period,
) -> FocusRow {
    let hours = hours_of(committed_gpu_s);
    let capacity = (record.kind != CommitmentKind::Guarantee).then(|| record.commitment_id.clone());
    let (resource_type, what) = match record.kind {
        CommitmentKind::Guarantee => ("GuaranteedQuota", "guaranteed"),
        CommitmentKind::Reservation => ("CapacityReservation", "reserved"),
        CommitmentKind::Cluster => ("DedicatedCluster", "in a dedicated cluster"),
    };
    let discount = record.discount_id();
    let mut row = focus_base(
        &record.tenant,
        book,
        period,
        (record.started_at, record.ended_at),
        "Purchase",
        format!(
            "{} × {} GPU {what} ({} {}): {:.6} GPU-hours committed",
            record.gpus,
            record.gpu_type,
            record.kind.as_str(),
            record.commitment_id,
            hours
        ),
        (
            capacity.clone().unwrap_or_else(|| discount.clone()),
            resource_type,
        ),
        &record.region,
        format!("commit-{}-{}", record.kind.as_str(), record.gpu_type),
        serde_json::json!({
            "gangway/gpu-type": record.gpu_type,
            "gangway/commitment": record.kind.as_str(),
        }),
    );
    let unit = price.per_gpu_hour;
    row.SkuPriceId = Some(price.sku_price_id());
    row.ChargeFrequency = "Recurring".into();
    row.PricingQuantity = hours;
    row.ListUnitPrice = unit;
    row.ContractedUnitPrice = unit;
    row.ListCost = hours * unit;
    row.ContractedCost = hours * unit;
    row.BilledCost = hours * unit;
    row.x_CommitmentDiscountQuantity = Some(hours);
    row.x_UsageId = record.record_id;
    row.x_Gpus = record.gpus;
    commitment_columns(&mut row, record.kind, &discount, capacity.as_deref());
    if let Some(unused) = unused {
        let h = hours_of(unused);
        row.ChargeCategory = "Usage".into();
        row.ChargeFrequency = "Usage-Based".into();
        row.PricingCategory = Some("Committed".into());
        row.ChargeDescription = format!(
            "unused: {h:.6} of {hours:.6} GPU-hours committed ({} {}) ran nothing",
            record.kind.as_str(),
            record.commitment_id
        );
        row.ConsumedQuantity = Some(Decimal::ZERO);
        row.ConsumedUnit = Some("GPU-Hours".into());
        row.PricingQuantity = h;
        row.ListCost = Decimal::ZERO;
        row.ContractedCost = Decimal::ZERO;
        row.BilledCost = Decimal::ZERO;
        row.EffectiveCost = h * unit;
        row.CommitmentDiscountStatus = Some("Unused".into());
        row.x_CommitmentDiscountQuantity = Some(h);
        if row.x_CapacityReservationId.is_some() {
            row.x_CapacityReservationStatus = Some("Unused".into());
        }
        row.x_UsageId = Uuid::new_v5(&record.record_id, b"unused");
    }
    row
}

/// The order of a bill's lines: by tenant, time, resource (job or
/// commitment), rank, category and status. [`price`] sorts its answer by
/// it; [`Pricer`] sorts each clock hour's lines, and the credits', by it.
pub fn line_order(a: &FocusRow, b: &FocusRow) -> std::cmp::Ordering {
    (
        &a.BillingAccountId,
        a.ChargePeriodStart,
        &a.ResourceId,
        a.x_Rank,
        &a.ChargeCategory,
        &a.CommitmentDiscountStatus,
    )
        .cmp(&(
            &b.BillingAccountId,
            b.ChargePeriodStart,
            &b.ResourceId,
            b.x_Rank,
            &b.ChargeCategory,
            &b.CommitmentDiscountStatus,
        ))
}

/// One hour's commitments: GPU-seconds committed per key, with a record
/// of it (for its line).
type HourCommitments = BTreeMap<Key, (Decimal, CommitmentRecord)>;

/// A billing period priced as a stream (docs/billing.md, "The export"),
/// one clock hour at a time, so that what is held is one hour's rows, not
/// the period's.
///
/// Built from the period (a calendar month), every credit and correction
/// the period needs (those issued in it, and any others of the rows it is
/// given: a row's coverage counts the corrections issued before its own
/// month ended), the commitments' hours and the book. Then given the usage
/// rows one clock hour at a time, hours in increasing order
/// ([`Pricer::hour`]): rows starting before the period (those of the hours
/// a credit or correction issued in it offsets, from [`reads_from`]) are
/// priced for that only, the others become the hour's lines, with the
/// hour's commitment lines (an hour with commitments but no rows gets its
/// commitment lines when a later hour, or [`Pricer::finish`], comes).
/// All it keeps between hours: how each row a credit or correction of the
/// period offsets was billed, the commitments not priced yet, and the
/// SKUs the book lacks. [`Pricer::finish`] then prices the credits and
/// corrections issued in the period and fails, naming every SKU, if the
/// book lacked a price that was needed.
///
/// The lines are the ones [`price`] gives for the same input (which is
/// this, sorted); here they come hour by hour, each hour's sorted by
/// [`line_order`], then the credits and corrections.
pub struct Pricer<'b> {
    period: Period,
    book: &'b PriceBook,
    credits: Vec<CreditRecord>,
    /// Corrections each row's month knew of when it ended, per usage row.
    corrected: BTreeMap<Uuid, Decimal>,
    /// Commitments of the hours not priced yet, per hour.
    committed: BTreeMap<DateTime<Utc>, HourCommitments>,
    /// The usage rows the period's credits and corrections offset.
    offset: BTreeSet<Uuid>,
    /// Of those, how each seen was billed (`None`: the book had no price).
    rates: BTreeMap<Uuid, Option<Rate>>,
    /// The last hour of rows given.
    last: Option<DateTime<Utc>>,
    unpriced: BTreeMap<String, usize>,
}

impl<'b> Pricer<'b> {
    /// A pricer of `period` (see [`Pricer`]): `credits` every credit and
    /// correction it needs, `commitments` the commitments' hours of the
    /// period and of any earlier hours whose rows it will be given.
    pub fn new(
        period: Period,
        credits: impl IntoIterator<Item = CreditRecord>,
        commitments: impl IntoIterator<Item = CommitmentRecord>,
        book: &'b PriceBook,
    ) -> Pricer<'b> {
        let within = |t: DateTime<Utc>| t >= period.0 && t < period.1;
        let credits: Vec<CreditRecord> = credits.into_iter().collect();
        let mut corrected: BTreeMap<Uuid, Decimal> = BTreeMap::new();
        for c in credits.iter().filter(|c| c.is_correction()) {
            if c.issued_at < month_of(c.usage_started_at).1 {
                *corrected.entry(c.usage_id).or_default() += decimal_seconds(c.gpu_seconds);
            }
        }
        let offset = (credits.iter())
            .filter(|c| within(c.issued_at))
            .map(|c| c.usage_id)
            .collect();
        let mut committed: BTreeMap<DateTime<Utc>, HourCommitments> = BTreeMap::new();
        for c in commitments {
            let key = (c.region.clone(), c.kind, c.commitment_id.clone(), c.hour);
            let g = decimal_seconds(c.gpu_seconds);
            committed
                .entry(c.hour)
                .or_default()
                .entry(key)
                .or_insert((Decimal::ZERO, c))
                .0 += g;
        }
        // Every commitment hour of the period is a line: a price the book
        // lacks is known now, before any row is read.
        let mut unpriced: BTreeMap<String, usize> = BTreeMap::new();
        for (key, (_, record)) in (committed.values().flatten()).filter(|(k, _)| within(k.3)) {
            if book
                .commitment_price(key.1, &record.gpu_type, &key.0, key.3)
                .is_none()
            {
                *unpriced
                    .entry(format!(
                        "commitment {} {} in {}",
                        key.1.as_str(),
                        record.gpu_type,
                        key.0
                    ))
                    .or_default() += 1;
            }
        }
        Pricer {
            period,
            book,
            credits,
            corrected,
            committed,
            offset,
            rates: BTreeMap::new(),
            last: None,
            unpriced,
        }
    }

    /// Whether a price the book lacks has been needed already: the bill
    /// will fail ([`Pricer::finish`]), whatever comes.
    pub fn lacks_prices(&self) -> bool {
        !self.unpriced.is_empty()
    }

    /// The lines of one clock hour of usage rows — every row of the hour,
    /// once (the caller merges and deduplicates) — preceded by those of
    /// any earlier hours that had commitments but no rows. Rows before the
    /// period give no line. Panics if `rows` span several hours, or if the
    /// hour is not after the last one given.
    pub fn hour<'r>(&mut self, rows: impl IntoIterator<Item = &'r UsageRecord>) -> Vec<FocusRow> {
        let mut rows: Vec<&UsageRecord> = rows.into_iter().collect();
        let Some(first) = rows.first() else {
            return Vec::new();
        };
        let hour = hour_of(first.started_at);
        assert!(
            rows.iter().all(|r| hour_of(r.started_at) == hour),
            "rows of one clock hour at a time"
        );
        assert!(
            self.last.is_none_or(|l| l < hour),
            "clock hours in increasing order, each once"
        );
        self.last = Some(hour);
        // In id order, so that the hour's sums are the same whatever order
        // the rows came in.
        rows.sort_by_key(|r| r.usage_id);
        let mut out = self.commitments_before(hour);
        let committed = self.committed.remove(&hour).unwrap_or_default();
        let (start, end) = self.period;
        let within = |t: DateTime<Utc>| t >= start && t < end;

        // Eligible usage per commitment this hour.
        let mut used: BTreeMap<Key, Decimal> = BTreeMap::new();
        for r in &rows {
            let corrected = self.corrected.get(&r.usage_id).copied().unwrap_or_default();
            let net = decimal_seconds(r.gpu_seconds) - corrected;
            *used.entry(key_of(r)).or_default() += net.max(Decimal::ZERO);
        }
        let mut lines = Vec::new();
        for r in &rows {
            let offset = self.offset.contains(&r.usage_id);
            if !within(r.started_at) && !offset {
                continue;
            }
            let rate = rate_of(r, &committed, &used, self.book, &mut self.unpriced);
            if offset {
                self.rates.insert(r.usage_id, rate.clone());
            }
            if !within(r.started_at) {
                continue;
            }
            let (Some(rate), Some(base)) = (rate, FocusRow::of(r, self.book, self.period)) else {
                continue; // no price: named
            };
            lines.extend(priced(
                base,
                hours_of(decimal_seconds(r.gpu_seconds)),
                &rate,
            ));
        }
        lines.extend(self.commitment_lines(hour, &committed, &used));
        lines.sort_by(line_order);
        out.extend(lines);
        out.into_iter().map(FocusRow::as_written).collect()
    }

    /// The lines of the hours before `hour` that had commitments but no
    /// rows (none: nothing used them).
    fn commitments_before(&mut self, hour: DateTime<Utc>) -> Vec<FocusRow> {
        let mut out = Vec::new();
        while let Some(entry) = self.committed.first_entry() {
            if *entry.key() >= hour {
                break;
            }
            let (h, committed) = entry.remove_entry();
            let mut lines = self.commitment_lines(h, &committed, &BTreeMap::new());
            lines.sort_by(line_order);
            out.extend(lines);
        }
        out
    }

    /// The purchase and unused lines of `hour`'s commitments, given what
    /// they covered; none for an hour before the period.
    fn commitment_lines(
        &self,
        hour: DateTime<Utc>,
        committed: &HourCommitments,
        used: &BTreeMap<Key, Decimal>,
    ) -> Vec<FocusRow> {
        let (start, end) = self.period;
        let mut lines = Vec::new();
        if !(hour >= start && hour < end) {
            return lines;
        }
        let book = self.book;
        for (key, &(g, ref record)) in committed {
            let Some(cp) = book.commitment_price(key.1, &record.gpu_type, &key.0, key.3) else {
                continue; // no price: named by `new`
            };
            lines.push(commitment_line(record, g, None, cp, book, self.period));
            let unused = g - g.min(used.get(key).copied().unwrap_or_default());
            if unused > Decimal::ZERO {
                lines.push(commitment_line(
                    record,
                    g,
                    Some(unused),
                    cp,
                    book,
                    self.period,
                ));
            }
        }
        lines
    }

    /// The lines of the commitment hours not priced yet, then the credits'
    /// and corrections' issued in the period (sorted by [`line_order`]);
    /// or, naming every SKU, what the book lacked for the whole period.
    pub fn finish(mut self) -> Result<Vec<FocusRow>, Unpriced> {
        let mut lines = self.commitments_before(DateTime::<Utc>::MAX_UTC);
        let (start, end) = self.period;
        let within = |t: DateTime<Utc>| t >= start && t < end;
        let book = self.book;
        let mut credited = Vec::new();
        for c in self.credits.iter().filter(|c| within(c.issued_at)) {
            let priority = priority_name(c.priority);
            let Some(mut base) = FocusRow::credit(c, book, self.period) else {
                *(self.unpriced)
                    .entry(format!("{} {priority} in {}", c.gpu_type, c.region))
                    .or_default() += 1;
                continue;
            };
            // Priced as its row was billed; a row no region holds any
            // more, at the usage price.
            let rate = match self.rates.get(&c.usage_id) {
                Some(Some(rate)) => rate.clone(),
                Some(None) => continue, // no price: named
                None => Rate {
                    list: base.ListUnitPrice,
                    covered: Decimal::ZERO,
                    commitment: None,
                },
            };
            let hours = hours_of(decimal_seconds(c.gpu_seconds));
            if c.is_correction() {
                base.ChargeCategory = "Usage".into();
                base.ChargeDescription = format!(
                    "correction: {} × {} GPU ({priority} priority) not held, job {} rank {} \
                     (its placement ended {}, before this time was metered)",
                    c.gpus,
                    c.gpu_type,
                    c.job_id,
                    c.rank,
                    c.started_at.format("%Y-%m-%dT%H:%M:%SZ")
                );
                if c.usage_started_at < start {
                    base.ChargeClass = Some("Correction".into());
                }
                credited.extend(priced(base, -hours, &rate));
            } else {
                base.BilledCost = -hours * rate.billed_unit();
                base.EffectiveCost = base.BilledCost;
                if rate.commitment.is_some() && rate.covered > Decimal::ZERO {
                    // Priced as a row partly or wholly covered was billed:
                    // not at the standard price alone.
                    base.PricingCategory = Some("Other".into());
                }
                credited.push(base);
            }
        }
        if !self.unpriced.is_empty() {
            return Err(Unpriced(self.unpriced));
        }
        credited.sort_by(line_order);
        lines.extend(credited);
        Ok(lines.into_iter().map(FocusRow::as_written).collect())
    }
}

/// How usage row `r` of an hour is priced, given the hour's commitments
/// and their eligible usage; `None` (and the SKU counted in `unpriced`)
/// when the book lacks a price it needs.
fn rate_of(
    r: &UsageRecord,
    committed: &HourCommitments,
    used: &BTreeMap<Key, Decimal>,
    book: &PriceBook,
    unpriced: &mut BTreeMap<String, usize>,
) -> Option<Rate> {
    let mut missing = |sku: String| *unpriced.entry(sku).or_default() += 1;
    let priority = priority_name(r.priority);
    let Some(p) = book.price(&r.gpu_type, priority, &r.region, r.started_at) else {
        missing(format!("{} {priority} in {}", r.gpu_type, r.region));
        return None;
    };
    let key = key_of(r);
    let share = match (committed.get(&key), used.get(&key)) {
        (Some(&(g, _)), Some(&u)) if g > Decimal::ZERO && u > Decimal::ZERO => {
            (g / u).min(Decimal::ONE)
        }
        _ => Decimal::ZERO,
    };
    let commitment = if share > Decimal::ZERO {
        match book.commitment_price(key.1, &r.gpu_type, &r.region, key.3) {
            Some(cp) => Some(Covering {
                kind: key.1,
                discount_id: super::discount_id(key.1, &r.region, &key.2),
                capacity_id: (key.1 != CommitmentKind::Guarantee).then(|| key.2.clone()),
                covered_price: cp.covered_usage_per_gpu_hour,
                commit_price: cp.per_gpu_hour,
            }),
            None => {
                missing(format!(
                    "commitment {} {} in {}",
                    key.1.as_str(),
                    r.gpu_type,
                    r.region
                ));
                return None;
            }
        }
    } else {
        None
    };
    Some(Rate {
        list: p.per_gpu_hour,
        covered: share,
        commitment,
    })
}

/// The FOCUS rows of `period` (a calendar month): the usage rows starting
/// in it, the credits and corrections issued in it, and the commitments'
/// hours in it, priced by `book`; sorted by [`line_order`] (tenant and
/// time). `rows` must hold every row of the hours the period's credits and
/// corrections offset (from [`reads_from`]), and `commitments` those
/// hours' commitments.
///
/// A usage row's coverage counts it net of the corrections issued before
/// its own month ended (so a month's bill never changes once it is over);
/// a correction or credit is priced as its row was billed. Fails, naming
/// every SKU, when the book lacks a price that is needed.
///
/// It is [`Pricer`] given the rows hour by hour, its lines sorted: the
/// export streams with the [`Pricer`] itself.
pub fn price<'a>(
    period: Period,
    rows: impl IntoIterator<Item = &'a UsageRecord>,
    credits: impl IntoIterator<Item = &'a CreditRecord>,
    commitments: impl IntoIterator<Item = &'a CommitmentRecord>,
    book: &PriceBook,
) -> Result<Vec<FocusRow>, Unpriced> {
    let mut hours: BTreeMap<DateTime<Utc>, Vec<&UsageRecord>> = BTreeMap::new();
    for r in rows {
        hours.entry(hour_of(r.started_at)).or_default().push(r);
    }
    let mut pricer = Pricer::new(
        period,
        credits.into_iter().cloned(),
        commitments.into_iter().cloned(),
        book,
    );
    let mut lines = Vec::new();
    for rows in hours.values() {
        lines.extend(pricer.hour(rows.iter().copied()));
    }
    lines.extend(pricer.finish()?);
    lines.sort_by(line_order);
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_month_is_yyyy_mm() {
        let (s, e) = month_named("2026-12").unwrap();
        assert_eq!(s.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(e.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        for bad in [
            "2026-13",
            "2026-1",
            "26-12",
            "2026/12",
            "",
            "2026-12-01",
            "x-y",
        ] {
            assert!(month_named(bad).is_none(), "{bad}");
        }
    }

    const BOOK: &str = r#"
currency = "USD"
[[price]]
gpu_type = "h100"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 3.0
[[price]]
gpu_type = "h100"
priority = "low"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 1.0
[[commitment]]
kind = "reservation"
gpu_type = "h100"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 2.0
[[commitment]]
kind = "guarantee"
gpu_type = "h100"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 1.5
covered_usage_per_gpu_hour = 0.5
[[commitment]]
kind = "guarantee"
gpu_type = "h100"
region = "eu-central"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 9.0
"#;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn book() -> PriceBook {
        PriceBook::parse(BOOK).unwrap()
    }

    const NOV: &str = "2026-11-10T10:00:00Z";

    fn nov() -> Period {
        month_of(at(NOV))
    }

    /// A row of `gpus` GPUs for `minutes` from `start`.
    fn row(n: u128, start: &str, minutes: i64, gpus: i32, priority: i16) -> UsageRecord {
        let s = at(start);
        UsageRecord {
            usage_id: Uuid::from_u128(n),
            job_id: Uuid::from_u128(1000 + n),
            epoch: 1,
            attempt: 1,
            rank: 0,
            tenant: "acme".into(),
            region: "us-east".into(),
            gpu_type: "h100".into(),
            priority,
            gpus,
            started_at: s,
            ended_at: s + chrono::Duration::minutes(minutes),
            gpu_seconds: (gpus as i64 * minutes * 60) as f64,
            ended_by: "succeeded".into(),
            cause: None,
            checkpointed_at: None,
            reservation_id: None,
            cluster_id: None,
        }
    }

    fn commitment(
        kind: CommitmentKind,
        id: &str,
        hour: &str,
        gpus: i32,
        minutes: i64,
    ) -> CommitmentRecord {
        let h = at(hour);
        CommitmentRecord {
            record_id: Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("{id}{hour}").as_bytes()),
            kind,
            commitment_id: id.into(),
            tenant: "acme".into(),
            region: "us-east".into(),
            gpu_type: "h100".into(),
            hour: h,
            started_at: h,
            ended_at: h + chrono::Duration::minutes(minutes),
            gpus,
            gpu_seconds: (gpus as i64 * minutes * 60) as f64,
        }
    }

    fn offset(of: &UsageRecord, n: u128, cause: &str, minutes: i64, issued: &str) -> CreditRecord {
        CreditRecord {
            credit_id: Uuid::from_u128(n),
            usage_id: of.usage_id,
            usage_started_at: of.started_at,
            job_id: of.job_id,
            epoch: of.epoch,
            attempt: of.attempt,
            rank: of.rank,
            tenant: of.tenant.clone(),
            region: of.region.clone(),
            gpu_type: of.gpu_type.clone(),
            priority: of.priority,
            gpus: of.gpus,
            started_at: of.ended_at - chrono::Duration::minutes(minutes),
            ended_at: of.ended_at,
            gpu_seconds: (of.gpus as i64 * minutes * 60) as f64,
            ended_by: "node_lost".into(),
            cause: cause.into(),
            checkpointed_at: None,
            issued_at: at(issued),
        }
    }

    fn sum(lines: &[FocusRow], f: impl Fn(&FocusRow) -> Decimal) -> Decimal {
        lines.iter().map(f).sum()
    }

    /// Within the export's rounding (9 places) of `b`.
    fn close(a: Decimal, b: f64) -> bool {
        use rust_decimal::prelude::ToPrimitive;
        (a.to_f64().unwrap() - b).abs() < 1e-8
    }

    /// A line's consumed GPU-hours (0 on a purchase).
    fn consumed(l: &FocusRow) -> Decimal {
        l.ConsumedQuantity.unwrap_or_default()
    }

    #[test]
    fn a_reservation_bills_its_gpu_hours_and_covers_its_jobs_usage() {
        let res = Uuid::from_u128(77);
        // 16 GPUs reserved for the hour; a job in it ran 8 for 30 minutes.
        let mut r = row(1, "2026-11-10T10:15:00Z", 30, 8, 1);
        r.reservation_id = Some(res);
        let c = commitment(
            CommitmentKind::Reservation,
            &res.to_string(),
            "2026-11-10T10:00:00Z",
            16,
            60,
        );
        let lines = price(nov(), [&r], [], [&c], &book()).unwrap();
        let cat = |l: &FocusRow| (l.ChargeCategory.clone(), l.CommitmentDiscountStatus.clone());
        let kinds: Vec<_> = lines.iter().map(cat).collect();
        assert_eq!(lines.len(), 3, "{kinds:?}");
        let purchase = lines
            .iter()
            .find(|l| l.ChargeCategory == "Purchase")
            .unwrap();
        assert!(close(purchase.BilledCost, 16.0 * 2.0));
        assert_eq!(purchase.EffectiveCost, Decimal::ZERO);
        assert_eq!(purchase.ChargeFrequency, "Recurring");
        assert_eq!(purchase.SkuId, "commit-reservation-h100");
        assert_eq!(purchase.ResourceId, res.to_string());
        assert_eq!(
            purchase.CommitmentDiscountId.as_deref(),
            Some(&*format!("reservation/{res}"))
        );
        assert_eq!(
            purchase.x_CapacityReservationId.as_deref(),
            Some(&*res.to_string())
        );
        assert_eq!(purchase.CommitmentDiscountStatus, None);
        let used = lines
            .iter()
            .find(|l| l.CommitmentDiscountStatus.as_deref() == Some("Used"))
            .unwrap();
        // Covered: 4 GPU-hours, billed at the covered price (0), its share
        // of the commitment in its effective cost.
        assert_eq!(used.ChargeCategory, "Usage");
        assert!(close(consumed(used), 4.0));
        assert_eq!(used.BilledCost, Decimal::ZERO);
        assert!(close(used.ListCost, 4.0 * 3.0));
        assert!(close(used.EffectiveCost, 4.0 * 2.0));
        assert_eq!(used.x_CapacityReservationStatus.as_deref(), Some("Used"));
        assert_eq!(used.x_UsageId, r.usage_id);
        let unused = lines
            .iter()
            .find(|l| l.CommitmentDiscountStatus.as_deref() == Some("Unused"))
            .unwrap();
        assert_eq!(unused.BilledCost, Decimal::ZERO);
        assert_eq!(consumed(unused), Decimal::ZERO);
        assert!(close(unused.PricingQuantity, 12.0));
        assert!(close(unused.EffectiveCost, 12.0 * 2.0));
        // Paid: the commitment only; effective cost sums to the same, and
        // the commitment's usage lines to its purchase (FOCUS).
        assert!(close(sum(&lines, |l| l.BilledCost), 32.0));
        assert!(close(sum(&lines, |l| l.EffectiveCost), 32.0));
        assert!(close(sum(&lines, consumed), 4.0));
        let line = used.csv();
        assert_eq!(
            line.matches(',').count(),
            FocusRow::COLUMNS.len() - 1 + 2,
            "one comma inside the quoted description, one in the tags: {line}"
        );
        assert!(line.contains(",Used,"), "{line}");
    }

    #[test]
    fn a_guarantee_covers_each_hours_ordinary_usage_in_proportion() {
        // 4 GPUs guaranteed for the hour; 8 GPU-hours of ordinary usage in
        // it (a normal and a low row): half of each is covered.
        let a = row(1, "2026-11-10T10:00:00Z", 60, 4, 1);
        let b = row(2, "2026-11-10T10:00:00Z", 60, 4, 0);
        // A row in a reservation is not the guarantee's; nor one of
        // another hour.
        let mut c = row(3, "2026-11-10T10:00:00Z", 60, 8, 1);
        c.reservation_id = Some(Uuid::from_u128(9));
        let d = row(4, "2026-11-10T11:00:00Z", 60, 8, 1);
        let g = commitment(
            CommitmentKind::Guarantee,
            "acme/h100",
            "2026-11-10T10:00:00Z",
            4,
            60,
        );
        let lines = price(nov(), [&a, &b, &c, &d], [], [&g], &book()).unwrap();
        let of = |id: u128| -> Vec<&FocusRow> {
            lines
                .iter()
                .filter(|l| l.x_UsageId == Uuid::from_u128(id))
                .collect()
        };
        let (la, lb) = (of(1), of(2));
        assert_eq!((la.len(), lb.len(), of(3).len(), of(4).len()), (2, 2, 1, 1));
        // a: 2 h covered at 0.5, 2 h at 3.0; b: 2 h at 0.5, 2 h at 1.0.
        assert!(close(
            sum(&la.iter().map(|l| (*l).clone()).collect::<Vec<_>>(), |l| l
                .BilledCost),
            2.0 * 0.5 + 2.0 * 3.0
        ));
        assert!(close(
            lb.iter().map(|l| l.BilledCost).sum::<Decimal>(),
            2.0 * 0.5 + 2.0 * 1.0
        ));
        let used: Vec<&&FocusRow> = la
            .iter()
            .filter(|l| l.CommitmentDiscountStatus.is_some())
            .collect();
        assert_eq!(used.len(), 1);
        assert_eq!(
            used[0].CommitmentDiscountId.as_deref(),
            Some("guarantee/us-east/acme/h100")
        );
        assert_eq!(used[0].x_CapacityReservationId, None);
        assert!(close(used[0].EffectiveCost, 2.0 * (0.5 + 1.5)));
        // c (no reservation commitment) and d (no guarantee that hour) are
        // plain usage.
        assert!(close(of(3)[0].BilledCost, 8.0 * 3.0) && of(3)[0].CommitmentDiscountId.is_none());
        assert!(close(of(4)[0].BilledCost, 8.0 * 3.0));
        // All used: no unused line; the purchase is 4 GPU-hours at 1.5.
        assert!(lines
            .iter()
            .all(|l| l.CommitmentDiscountStatus.as_deref() != Some("Unused")));
        let total = 2.0 * 0.5 + 2.0 * 3.0 + 2.0 * 0.5 + 2.0 * 1.0 + 24.0 + 24.0 + 4.0 * 1.5;
        assert!(close(sum(&lines, |l| l.BilledCost), total));
        assert!(close(sum(&lines, |l| l.EffectiveCost), total));
        // The same rows in another order: the same bill.
        let again = price(nov(), [&d, &c, &b, &a], [], [&g], &book()).unwrap();
        assert_eq!(again, lines);
    }

    #[test]
    fn a_correction_takes_off_what_was_never_held_at_the_price_billed() {
        // The meter billed a whole hour of 8 GPUs; the placement ended at
        // :15 (a back-dated release): 45 minutes corrected, issued in the
        // month. 2 GPUs guaranteed: they cover the 2 GPU-hours held.
        let r = row(1, "2026-11-10T10:00:00Z", 60, 8, 1);
        let fix = offset(&r, 50, "correction", 45, "2026-11-10T12:00:00Z");
        let g = commitment(
            CommitmentKind::Guarantee,
            "acme/h100",
            "2026-11-10T10:00:00Z",
            2,
            60,
        );
        let lines = price(nov(), [&r], [&fix], [&g], &book()).unwrap();
        let corrections: Vec<&FocusRow> =
            lines.iter().filter(|l| l.x_Cause == "correction").collect();
        assert!(!corrections.is_empty());
        assert!(corrections
            .iter()
            .all(|l| l.ChargeCategory == "Usage" && l.ChargeClass.is_none()));
        assert!(close(
            corrections.iter().map(|l| consumed(l)).sum::<Decimal>(),
            -6.0
        ));
        assert!(corrections
            .iter()
            .all(|l| l.x_CreditedUsageId == r.usage_id.to_string()));
        // Net: 2 GPU-hours, covered (0.5 each), and the guarantee (2 × 1.5).
        assert!(close(sum(&lines, consumed), 2.0));
        assert!(close(sum(&lines, |l| l.BilledCost), 2.0 * 0.5 + 3.0));
        assert!(close(sum(&lines, |l| l.EffectiveCost), 2.0 * 0.5 + 3.0));
        let used: Decimal = (lines.iter())
            .filter(|l| l.CommitmentDiscountStatus.as_deref() == Some("Used"))
            .map(|l| l.x_CommitmentDiscountQuantity.unwrap())
            .sum();
        assert!(
            close(used, 2.0),
            "the guarantee covered what was held: {used}"
        );

        // Issued after the month ended: November's bill stays as it was
        // (the row billed whole, 2 of 8 GPU-hours covered); December's
        // takes the 6 GPU-hours off at the price November billed them,
        // marked as correcting a closed month.
        let late = offset(&r, 51, "correction", 45, "2026-12-01T08:00:00Z");
        let before = price(nov(), [&r], [&late], [&g], &book()).unwrap();
        assert!(close(sum(&before, consumed), 8.0));
        let nov_billed = sum(&before, |l| l.BilledCost) - Decimal::from(3);
        let dec = month_of(at("2026-12-05T00:00:00Z"));
        assert_eq!(reads_from(dec, [&late]), at("2026-11-10T10:00:00Z"));
        let lines = price(dec, [&r], [&late], [&g], &book()).unwrap();
        assert!(lines.iter().all(|l| l.x_Cause == "correction"), "{lines:?}");
        assert!(lines
            .iter()
            .all(|l| l.ChargeClass.as_deref() == Some("Correction")));
        // To the export's 9 places: the rounded lines of November, three
        // quarters of them taken off.
        let off = -nov_billed * Decimal::from(6) / Decimal::from(8);
        assert!((sum(&lines, |l| l.BilledCost) - off).abs() < "0.00000001".parse().unwrap());
    }

    #[test]
    fn a_credit_is_priced_as_its_row_was_billed() {
        // A job in a reservation, fully covered (billed 0), loses 30
        // minutes: the credit is 0 — its usage cost nothing; an ordinary
        // job's credit is at the usage price.
        let res = Uuid::from_u128(77);
        let mut inside = row(1, "2026-11-10T10:00:00Z", 60, 8, 1);
        inside.reservation_id = Some(res);
        let plain = row(2, "2026-11-10T10:00:00Z", 60, 8, 1);
        let c = commitment(
            CommitmentKind::Reservation,
            &res.to_string(),
            "2026-11-10T10:00:00Z",
            8,
            60,
        );
        let lost_in = offset(&inside, 60, "node_lost", 30, "2026-11-10T11:00:00Z");
        let lost_out = offset(&plain, 61, "node_lost", 30, "2026-11-10T11:00:00Z");
        let lines = price(
            nov(),
            [&inside, &plain],
            [&lost_in, &lost_out],
            [&c],
            &book(),
        )
        .unwrap();
        let credit = |id: u128| {
            lines
                .iter()
                .find(|l| l.x_UsageId == Uuid::from_u128(id))
                .unwrap()
        };
        assert_eq!(credit(60).ChargeCategory, "Credit");
        assert_eq!(credit(60).BilledCost, Decimal::ZERO);
        assert!(close(credit(61).BilledCost, -4.0 * 3.0));
        assert!(close(credit(61).ListCost, -4.0 * 3.0));
        assert!(close(
            sum(&lines, |l| l.BilledCost),
            rust_decimal::prelude::ToPrimitive::to_f64(&sum(&lines, |l| l.EffectiveCost)).unwrap()
        ));
    }

    #[test]
    fn a_missing_price_stops_the_bill_and_names_what_to_add() {
        let mut r = row(1, "2026-11-10T10:00:00Z", 60, 8, 1);
        r.cluster_id = Some(Uuid::from_u128(5));
        let c = commitment(
            CommitmentKind::Cluster,
            &Uuid::from_u128(5).to_string(),
            "2026-11-10T10:00:00Z",
            16,
            60,
        );
        let e = price(nov(), [&r], [], [&c], &book()).unwrap_err();
        assert!(
            e.0.keys()
                .any(|k| k == "commitment cluster h100 in us-east"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("commitment cluster h100 in us-east"),
            "{e}"
        );
        // A book with no commitments at all still bills plain usage.
        let plain = PriceBook {
            commitments: vec![],
            ..book()
        };
        let ok = price(
            nov(),
            [&row(2, "2026-11-10T10:00:00Z", 60, 8, 1)],
            [],
            [],
            &plain,
        )
        .unwrap();
        assert_eq!(ok.len(), 1);
        let mut a100 = row(3, "2026-11-10T10:00:00Z", 60, 8, 1);
        a100.gpu_type = "a100".into();
        let e = price(nov(), [&a100], [], [], &plain).unwrap_err();
        assert_eq!(e.0.keys().collect::<Vec<_>>(), ["a100 normal in us-east"]);
    }

    #[test]
    fn commitment_prices_are_chosen_like_usage_prices() {
        let b = book();
        let p = |region, t| {
            b.commitment_price(CommitmentKind::Guarantee, "h100", region, at(t))
                .map(|p| p.per_gpu_hour)
        };
        assert_eq!(p("us-east", NOV), Some("1.5".parse().unwrap()));
        assert_eq!(
            p("eu-central", NOV),
            Some(Decimal::from(9)),
            "a named region beats any"
        );
        assert_eq!(
            p("us-east", "2025-01-01T00:00:00Z"),
            None,
            "not in force yet"
        );
        assert!(b
            .commitment_price(CommitmentKind::Cluster, "h100", "us-east", at(NOV))
            .is_none());
        let neg = BOOK.replace(
            "covered_usage_per_gpu_hour = 0.5",
            "covered_usage_per_gpu_hour = -1",
        );
        assert!(PriceBook::parse(&neg)
            .unwrap_err()
            .contains("covered_usage_per_gpu_hour"));
        let kind = BOOK.replace("kind = \"reservation\"", "kind = \"lease\"");
        assert!(PriceBook::parse(&kind).is_err());
        assert_eq!(
            hour_of(at("2026-11-10T10:59:59.5Z")),
            at("2026-11-10T10:00:00Z")
        );
        assert_eq!(
            month_of(at("2026-12-31T23:00:00Z")).1,
            at("2027-01-01T00:00:00Z")
        );
    }

    /// A month with several tenants and hours, a guarantee partly
    /// covering, a reservation, an hour of commitments without rows, a
    /// credit, corrections — one of a row of the previous month — and
    /// what was issued after the month.
    fn a_month() -> (Vec<UsageRecord>, Vec<CreditRecord>, Vec<CommitmentRecord>) {
        let res = Uuid::from_u128(77);
        let mut rows = vec![
            // October's last hour: a row a correction issued in November
            // offsets, and one that only shares its guarantee.
            row(1, "2026-10-31T23:00:00Z", 60, 8, 1),
            row(2, "2026-10-31T23:10:00Z", 50, 4, 1),
            row(3, "2026-11-01T00:00:00Z", 60, 8, 1),
            row(4, "2026-11-01T00:00:00Z", 30, 4, 0),
            row(5, "2026-11-01T00:30:00Z", 30, 8, 1),
            row(6, "2026-11-01T01:00:00Z", 60, 16, 2),
            row(7, "2026-11-01T01:20:00Z", 40, 8, 1),
            row(8, "2026-11-01T03:00:00Z", 60, 8, 1),
            row(9, "2026-11-30T23:00:00Z", 60, 8, 0),
        ];
        for n in [5, 7, 9] {
            rows[n - 1].tenant = "globex".into();
        }
        rows[6].reservation_id = Some(res);
        rows[7].reservation_id = Some(res);
        let guarantee =
            |hour: &str| commitment(CommitmentKind::Guarantee, "acme/h100", hour, 6, 60);
        let commitments = vec![
            guarantee("2026-10-31T23:00:00Z"),
            guarantee("2026-11-01T00:00:00Z"),
            guarantee("2026-11-01T01:00:00Z"),
            // No rows this hour: purchase and unused only.
            guarantee("2026-11-01T02:00:00Z"),
            commitment(
                CommitmentKind::Reservation,
                &res.to_string(),
                "2026-11-01T01:00:00Z",
                4,
                60,
            ),
            commitment(
                CommitmentKind::Reservation,
                &res.to_string(),
                "2026-11-01T03:00:00Z",
                16,
                30,
            ),
        ];
        let credits = vec![
            offset(&rows[0], 40, "correction", 20, "2026-11-01T02:00:00Z"),
            offset(&rows[2], 41, "node_lost", 15, "2026-11-01T01:30:00Z"),
            offset(&rows[5], 42, "correction", 30, "2026-11-01T02:00:00Z"),
            offset(&rows[7], 43, "drain", 10, "2026-11-01T04:00:00Z"),
            // Issued in December: not November's (nor its coverage).
            offset(&rows[8], 44, "node_lost", 30, "2026-12-01T00:30:00Z"),
            offset(&rows[3], 45, "correction", 10, "2026-12-02T00:00:00Z"),
        ];
        (rows, credits, commitments)
    }

    #[test]
    fn the_streaming_pricer_gives_the_lines_price_gives() {
        let (rows, credits, commitments) = a_month();
        let book = book();
        let whole = price(nov(), &rows, &credits, &commitments, &book).unwrap();
        // What the workload exercises.
        let has = |f: &dyn Fn(&FocusRow) -> bool| whole.iter().any(f);
        assert!(has(&|l| l.ChargeClass.as_deref() == Some("Correction")));
        assert!(has(&|l| l.ChargeCategory == "Credit"));
        assert!(has(
            &|l| l.x_Cause == "correction" && l.ChargeClass.is_none()
        ));
        assert!(has(&|l| {
            l.CommitmentDiscountStatus.as_deref() == Some("Used")
                && l.CommitmentDiscountType.as_deref() == Some("guarantee")
                && l.ChargeCategory == "Usage"
        }));
        assert!(has(&|l| {
            l.CommitmentDiscountStatus.as_deref() == Some("Used")
                && l.CommitmentDiscountType.as_deref() == Some("reservation")
        }));
        assert!(has(&|l| {
            l.CommitmentDiscountStatus.as_deref() == Some("Unused")
                && l.ChargePeriodStart == at("2026-11-01T02:00:00Z")
        }));
        assert!(has(&|l| l.BillingAccountId == "globex"));
        assert!(!has(&|l| l.x_UsageId == Uuid::from_u128(44)), "December's");
        assert!(!has(&|l| l.x_UsageId == rows[0].usage_id), "October's row");
        assert!(!has(
            &|l| l.ChargeCategory == "Purchase" && l.ChargePeriodStart < nov().0
        ));

        // The same rows split by hour, each hour's in reverse order.
        let mut pricer = Pricer::new(
            nov(),
            credits.iter().cloned(),
            commitments.iter().cloned(),
            &book,
        );
        let mut by_hour: BTreeMap<DateTime<Utc>, Vec<&UsageRecord>> = BTreeMap::new();
        for r in rows.iter().rev() {
            by_hour.entry(hour_of(r.started_at)).or_default().push(r);
        }
        let mut streamed = Vec::new();
        for rows in by_hour.values() {
            let lines = pricer.hour(rows.iter().copied());
            // Nothing of a later hour: each is written as it is read.
            let hour = hour_of(rows[0].started_at);
            assert!(lines.iter().all(|l| hour_of(l.ChargePeriodStart) <= hour));
            streamed.extend(lines);
        }
        assert!(!pricer.lacks_prices());
        let rest = pricer.finish().unwrap();
        assert!(
            rest.iter().all(|l| !l.x_CreditedUsageId.is_empty()),
            "{rest:?}"
        );
        // By hour (then tenant), credits and corrections last.
        let hours: Vec<DateTime<Utc>> = streamed
            .iter()
            .map(|l| hour_of(l.ChargePeriodStart))
            .collect();
        assert!(hours.windows(2).all(|w| w[0] <= w[1]), "{hours:?}");
        streamed.extend(rest);
        assert_eq!(streamed.len(), whole.len());
        let csv = |lines: &[FocusRow]| {
            let mut v: Vec<String> = lines.iter().map(FocusRow::csv).collect();
            v.sort();
            v
        };
        // As written: the same lines.
        assert_eq!(csv(&streamed), csv(&whole));
        streamed.sort_by(line_order);
        assert_eq!(streamed, whole);
    }

    #[test]
    fn the_streaming_pricer_knows_at_once_a_commitment_it_cannot_price() {
        let (rows, credits, mut commitments) = a_month();
        commitments.push(commitment(
            CommitmentKind::Cluster,
            &Uuid::from_u128(5).to_string(),
            "2026-11-01T00:00:00Z",
            16,
            60,
        ));
        let book = book();
        let mut pricer = Pricer::new(nov(), credits.clone(), commitments.clone(), &book);
        assert!(pricer.lacks_prices(), "before any row");
        let mut a100 = rows[2].clone();
        a100.usage_id = Uuid::from_u128(99);
        a100.gpu_type = "a100".into();
        let lines = pricer.hour([&a100]);
        assert!(
            lines.iter().all(|l| l.x_UsageId != a100.usage_id),
            "{lines:?}"
        );
        assert!(lines
            .iter()
            .all(|l| l.CommitmentDiscountType.as_deref() != Some("cluster")));
        let e = pricer.finish().unwrap_err();
        assert_eq!(
            e,
            price(nov(), [&a100], &credits, &commitments, &book).unwrap_err()
        );
        assert_eq!(
            e.0.keys().collect::<Vec<_>>(),
            [
                "a100 normal in us-east",
                "commitment cluster h100 in us-east"
            ]
        );
    }
}
