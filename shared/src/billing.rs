//! The usage ledger's records (issue 8, docs/billing.md): one per worker
//! placement that has ended, as regions keep, replicate and export them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// One ended placement of one worker: `gpus` GPUs of `gpu_type` held from
/// `started_at` to `ended_at`. `usage_id` is derived from (job, epoch,
/// attempt, rank, start), so the same placement is the same record
/// wherever it is held: merging regions' ledgers and dropping repeated ids
/// counts every GPU-second once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRecord {
    pub usage_id: Uuid,
    pub job_id: Uuid,
    /// The job's ownership epoch (a failover makes the next).
    pub epoch: i32,
    pub attempt: i32,
    pub rank: i32,
    pub tenant: String,
    /// The region that ran it.
    pub region: String,
    pub gpu_type: String,
    /// The job's priority class (0 low, 1 normal, 2 high).
    pub priority: i16,
    pub gpus: i32,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    /// Sum over its GPUs of the time each was held.
    pub gpu_seconds: f64,
    /// How it ended: `succeeded`, `failed`, `cancelled`, `preempted`,
    /// `node_lost`.
    pub ended_by: String,
    /// What caused a preemption or loss (`priority`, `reclaim`, `drain`,
    /// `maintenance`, `fenced`, `evacuating`, `node_lost`, `operator`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The job's newest checkpoint when the placement ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_at: Option<DateTime<Utc>>,
}

/// A page of ledger records (`GET /v1/admin/usage/records`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct UsageRecords {
    pub records: Vec<UsageRecord>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
}

/// A credit (docs/billing.md): GPU time of one usage row that a
/// provider-caused end of its placement lost (the work after the job's
/// newest checkpoint), not charged. `credit_id` is derived from the usage
/// row it offsets (`usage_id`), so there is one credit per row wherever
/// it is held.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreditRecord {
    pub credit_id: Uuid,
    /// The usage row it offsets, and that row's start (the credit is
    /// priced as of then, like the row).
    pub usage_id: Uuid,
    pub usage_started_at: DateTime<Utc>,
    pub job_id: Uuid,
    pub epoch: i32,
    pub attempt: i32,
    pub rank: i32,
    pub tenant: String,
    /// The region that ran the placement.
    pub region: String,
    pub gpu_type: String,
    pub priority: i16,
    pub gpus: i32,
    /// The lost time, within the usage row's clock hour.
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub gpu_seconds: f64,
    /// How the placement ended (`node_lost`, `preempted`, `moved`).
    pub ended_by: String,
    /// The credited cause (`node_lost`, `drain`, `maintenance`, `repair`,
    /// `health`, `fenced`, `evacuating`, `failing_back`, `moved`,
    /// `operator`, `reclaim`, `defrag`, `grow`).
    pub cause: String,
    /// The job's newest checkpoint when the placement ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_at: Option<DateTime<Utc>>,
    /// When the home wrote it: the billing month it is credited in.
    pub issued_at: DateTime<Utc>,
}

/// A page of credits (`GET /v1/admin/usage/credits`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct CreditRecords {
    pub credits: Vec<CreditRecord>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
}

/// What a region's allocations held in a period, per tenant, as
/// reconciliation compares it with the ledger (`GET
/// /v1/admin/usage/allocated`, docs/billing.md): every placement clipped to
/// [from, to), a live one only up to `metered_until` (the hours the meter
/// has written). Read in one snapshot of the region's database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AllocatedUsage {
    pub region: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The database's clock just after the snapshot was taken: ledger rows
    /// starting later are of placements the snapshot did not hold.
    pub as_of: DateTime<Utc>,
    /// Every live placement has its ledger rows for the hours before this;
    /// `None`: the meter has not run (live placements count nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metered_until: Option<DateTime<Utc>>,
    pub tenants: Vec<TenantAllocated>,
    /// The placements live at the snapshot: their ledger rows from
    /// `metered_until` (or their start, if later) on are not counted.
    pub live: Vec<LivePlacement>,
}

/// One tenant's allocated GPU-seconds in a region and period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantAllocated {
    pub tenant: String,
    pub gpu_seconds: f64,
    /// The part of it held by live placements (up to `metered_until`).
    pub live_gpu_seconds: f64,
}

/// A live placement: one worker's GPUs on one node since `started_at`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
pub struct LivePlacement {
    pub job_id: Uuid,
    pub attempt: i32,
    pub rank: i32,
    pub started_at: DateTime<Utc>,
}

/// The priority class named by a record's `priority` (the scheduler's
/// rank: 0 low, 1 normal, 2 high).
pub fn priority_name(rank: i16) -> &'static str {
    match rank {
        i16::MIN..=0 => "low",
        1 => "normal",
        _ => "high",
    }
}

/// What a GPU-hour costs, by GPU type, priority class and (optionally)
/// region, each price in force from its effective date until a later one
/// of the same scope (a TOML file, docs/billing.md):
///
/// ```toml
/// currency = "USD"
/// [[price]]
/// gpu_type = "h100"
/// priority = "normal"   # low, normal, high, or "*" (the default)
/// region = "*"          # a region's name, or "*" (the default)
/// effective = "2026-11-01T00:00:00Z"
/// per_gpu_hour = 2.50
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceBook {
    pub currency: String,
    #[serde(rename = "price", default)]
    pub prices: Vec<Price>,
}

/// One price of a [`PriceBook`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub gpu_type: String,
    #[serde(default = "any")]
    pub priority: String,
    #[serde(default = "any")]
    pub region: String,
    pub effective: DateTime<Utc>,
    pub per_gpu_hour: f64,
}

fn any() -> String {
    "*".into()
}

impl PriceBook {
    /// Reads and checks a price book; the error says what to fix.
    pub fn parse(text: &str) -> Result<PriceBook, String> {
        let book: PriceBook = toml::from_str(text).map_err(|e| format!("price book: {e}"))?;
        if book.currency.trim().is_empty() {
            return Err("price book: `currency` is empty".into());
        }
        for p in &book.prices {
            if !["*", "low", "normal", "high"].contains(&p.priority.as_str()) {
                return Err(format!(
                    "price book: priority {:?} of {} is not low, normal, high or \"*\"",
                    p.priority, p.gpu_type
                ));
            }
            if !(p.per_gpu_hour.is_finite() && p.per_gpu_hour >= 0.0) {
                return Err(format!(
                    "price book: per_gpu_hour {} of {} is not a price",
                    p.per_gpu_hour, p.gpu_type
                ));
            }
        }
        Ok(book)
    }

    /// The price of a GPU-hour of `gpu_type` at `priority` in `region` at
    /// `at`: of the prices in force then (effective at or before `at`), the
    /// most specific (a region named over any, a priority named over any),
    /// and of those the latest.
    pub fn price(
        &self,
        gpu_type: &str,
        priority: &str,
        region: &str,
        at: DateTime<Utc>,
    ) -> Option<&Price> {
        (self.prices.iter())
            .filter(|p| p.gpu_type == gpu_type && p.effective <= at)
            .filter(|p| p.priority == "*" || p.priority == priority)
            .filter(|p| p.region == "*" || p.region == region)
            .max_by_key(|p| (p.region != "*", p.priority != "*", p.effective))
    }
}

/// One line of a billing export, with the FinOps FOCUS columns (and
/// Gangway's own, `x_`-prefixed): one ledger record, priced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(non_snake_case)]
pub struct FocusRow {
    pub BillingAccountId: String,
    pub SubAccountId: String,
    pub BillingPeriodStart: DateTime<Utc>,
    pub BillingPeriodEnd: DateTime<Utc>,
    pub ChargePeriodStart: DateTime<Utc>,
    pub ChargePeriodEnd: DateTime<Utc>,
    pub ChargeCategory: String,
    pub ChargeDescription: String,
    pub ResourceId: String,
    pub ResourceType: String,
    pub RegionId: String,
    pub ServiceName: String,
    pub SkuId: String,
    pub UsageQuantity: f64,
    pub UsageUnit: String,
    pub PricingQuantity: f64,
    pub PricingUnit: String,
    pub ListUnitPrice: f64,
    pub ListCost: f64,
    pub BilledCost: f64,
    pub EffectiveCost: f64,
    pub BillingCurrency: String,
    pub x_UsageId: Uuid,
    pub x_Epoch: i32,
    pub x_Attempt: i32,
    pub x_Rank: i32,
    pub x_Gpus: i32,
    pub x_EndedBy: String,
    pub x_Cause: String,
    /// On a credit, the usage row it offsets (`x_UsageId` is the
    /// credit's own id); empty on usage.
    pub x_CreditedUsageId: String,
}

impl FocusRow {
    /// `r` priced by `book` for the billing period [start, end) (`r` lies
    /// within one clock hour, so within the period or outside it); `None`
    /// when the book has no price for it.
    pub fn of(
        r: &UsageRecord,
        book: &PriceBook,
        period: (DateTime<Utc>, DateTime<Utc>),
    ) -> Option<FocusRow> {
        let priority = priority_name(r.priority);
        let price = book.price(&r.gpu_type, priority, &r.region, r.started_at)?;
        let hours = r.gpu_seconds / 3600.0;
        let cost = hours * price.per_gpu_hour;
        Some(FocusRow {
            BillingAccountId: r.tenant.clone(),
            SubAccountId: r.tenant.clone(),
            BillingPeriodStart: period.0,
            BillingPeriodEnd: period.1,
            ChargePeriodStart: r.started_at,
            ChargePeriodEnd: r.ended_at,
            ChargeCategory: "Usage".into(),
            ChargeDescription: format!(
                "{} × {} GPU ({priority} priority), job {} rank {}",
                r.gpus, r.gpu_type, r.job_id, r.rank
            ),
            ResourceId: r.job_id.to_string(),
            ResourceType: "TrainingJob".into(),
            RegionId: r.region.clone(),
            ServiceName: "Gangway GPU".into(),
            SkuId: format!("gpu-{}-{priority}", r.gpu_type),
            UsageQuantity: hours,
            UsageUnit: "GPU-Hours".into(),
            PricingQuantity: hours,
            PricingUnit: "GPU-Hours".into(),
            ListUnitPrice: price.per_gpu_hour,
            ListCost: cost,
            BilledCost: cost,
            EffectiveCost: cost,
            BillingCurrency: book.currency.clone(),
            x_UsageId: r.usage_id,
            x_Epoch: r.epoch,
            x_Attempt: r.attempt,
            x_Rank: r.rank,
            x_Gpus: r.gpus,
            x_EndedBy: r.ended_by.clone(),
            x_Cause: r.cause.clone().unwrap_or_default(),
            x_CreditedUsageId: String::new(),
        })
    }

    /// Credit `c` priced by `book` for the billing period [start, end) it
    /// was issued in: like the usage row it offsets (its SKU, at that
    /// row's start), with negative quantities and costs; `None` when the
    /// book has no price for it.
    pub fn credit(
        c: &CreditRecord,
        book: &PriceBook,
        period: (DateTime<Utc>, DateTime<Utc>),
    ) -> Option<FocusRow> {
        let priority = priority_name(c.priority);
        let price = book.price(&c.gpu_type, priority, &c.region, c.usage_started_at)?;
        let hours = c.gpu_seconds / 3600.0;
        let cost = hours * price.per_gpu_hour;
        let since = match c.checkpointed_at {
            Some(t) => format!(
                "work since checkpoint at {}",
                t.format("%Y-%m-%dT%H:%M:%SZ")
            ),
            None => "no checkpoint".to_string(),
        };
        Some(FocusRow {
            BillingAccountId: c.tenant.clone(),
            SubAccountId: c.tenant.clone(),
            BillingPeriodStart: period.0,
            BillingPeriodEnd: period.1,
            ChargePeriodStart: c.started_at,
            ChargePeriodEnd: c.ended_at,
            ChargeCategory: "Credit".into(),
            ChargeDescription: format!(
                "credit: {} × {} GPU ({priority} priority) lost to {}, job {} rank {} ({since})",
                c.gpus, c.gpu_type, c.cause, c.job_id, c.rank
            ),
            ResourceId: c.job_id.to_string(),
            ResourceType: "TrainingJob".into(),
            RegionId: c.region.clone(),
            ServiceName: "Gangway GPU".into(),
            SkuId: format!("gpu-{}-{priority}", c.gpu_type),
            UsageQuantity: -hours,
            UsageUnit: "GPU-Hours".into(),
            PricingQuantity: -hours,
            PricingUnit: "GPU-Hours".into(),
            ListUnitPrice: price.per_gpu_hour,
            ListCost: -cost,
            BilledCost: -cost,
            EffectiveCost: -cost,
            BillingCurrency: book.currency.clone(),
            x_UsageId: c.credit_id,
            x_Epoch: c.epoch,
            x_Attempt: c.attempt,
            x_Rank: c.rank,
            x_Gpus: c.gpus,
            x_EndedBy: c.ended_by.clone(),
            x_Cause: c.cause.clone(),
            x_CreditedUsageId: c.usage_id.to_string(),
        })
    }

    /// The CSV header, in the field order of [`FocusRow::csv`].
    pub const CSV_HEADER: &'static str = "BillingAccountId,SubAccountId,BillingPeriodStart,\
        BillingPeriodEnd,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,ChargeDescription,\
        ResourceId,ResourceType,RegionId,ServiceName,SkuId,UsageQuantity,UsageUnit,\
        PricingQuantity,PricingUnit,ListUnitPrice,ListCost,BilledCost,EffectiveCost,\
        BillingCurrency,x_UsageId,x_Epoch,x_Attempt,x_Rank,x_Gpus,x_EndedBy,x_Cause,\
        x_CreditedUsageId";

    /// The row as one CSV line (RFC 4180 quoting where needed).
    pub fn csv(&self) -> String {
        fn q(s: &str) -> String {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        }
        let t = |d: &DateTime<Utc>| d.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        [
            q(&self.BillingAccountId),
            q(&self.SubAccountId),
            t(&self.BillingPeriodStart),
            t(&self.BillingPeriodEnd),
            t(&self.ChargePeriodStart),
            t(&self.ChargePeriodEnd),
            q(&self.ChargeCategory),
            q(&self.ChargeDescription),
            q(&self.ResourceId),
            q(&self.ResourceType),
            q(&self.RegionId),
            q(&self.ServiceName),
            q(&self.SkuId),
            format!("{:.9}", self.UsageQuantity),
            q(&self.UsageUnit),
            format!("{:.9}", self.PricingQuantity),
            q(&self.PricingUnit),
            format!("{:.6}", self.ListUnitPrice),
            format!("{:.9}", self.ListCost),
            format!("{:.9}", self.BilledCost),
            format!("{:.9}", self.EffectiveCost),
            q(&self.BillingCurrency),
            self.x_UsageId.to_string(),
            self.x_Epoch.to_string(),
            self.x_Attempt.to_string(),
            self.x_Rank.to_string(),
            self.x_Gpus.to_string(),
            q(&self.x_EndedBy),
            q(&self.x_Cause),
            q(&self.x_CreditedUsageId),
        ]
        .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
[[price]]
gpu_type = "h100"
effective = "2026-11-15T00:00:00Z"
per_gpu_hour = 2.5
[[price]]
gpu_type = "h100"
region = "eu-central"
effective = "2026-01-01T00:00:00Z"
per_gpu_hour = 4.0
"#;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn the_most_specific_price_in_force_applies() {
        let b = PriceBook::parse(BOOK).unwrap();
        let p = |prio, region, t| b.price("h100", prio, region, at(t)).map(|p| p.per_gpu_hour);
        assert_eq!(p("normal", "us-east", "2026-11-01T00:00:00Z"), Some(3.0));
        // A later effective date takes over from then on.
        assert_eq!(p("normal", "us-east", "2026-11-15T00:00:00Z"), Some(2.5));
        // A named priority, or region, beats any.
        assert_eq!(p("low", "us-east", "2026-11-20T00:00:00Z"), Some(1.0));
        assert_eq!(p("normal", "eu-central", "2026-11-20T00:00:00Z"), Some(4.0));
        // Nothing in force yet, or no such GPU type: no price.
        assert_eq!(p("normal", "us-east", "2025-12-31T00:00:00Z"), None);
        assert!(b
            .price("a100", "normal", "us-east", at("2026-11-20T00:00:00Z"))
            .is_none());
    }

    #[test]
    fn a_price_book_with_a_mistake_says_what_to_fix() {
        let bad = BOOK.replace("priority = \"low\"", "priority = \"urgent\"");
        assert!(PriceBook::parse(&bad).unwrap_err().contains("urgent"));
        let typo = BOOK.replace("per_gpu_hour = 1.0", "per_gpu_hr = 1.0");
        assert!(PriceBook::parse(&typo).is_err());
    }

    #[test]
    fn a_record_priced_is_its_gpu_hours_times_the_price() {
        let b = PriceBook::parse(BOOK).unwrap();
        let r = UsageRecord {
            usage_id: Uuid::nil(),
            job_id: Uuid::nil(),
            epoch: 1,
            attempt: 1,
            rank: 0,
            tenant: "acme".into(),
            region: "us-east".into(),
            gpu_type: "h100".into(),
            priority: 1,
            gpus: 8,
            started_at: at("2026-11-20T10:00:00Z"),
            ended_at: at("2026-11-20T10:45:00Z"),
            gpu_seconds: 8.0 * 2700.0,
            ended_by: "succeeded".into(),
            cause: None,
            checkpointed_at: None,
        };
        let period = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let row = FocusRow::of(&r, &b, period).unwrap();
        // 8 GPUs × 0.75 h × 2.50 = 15.00
        assert_eq!(row.UsageQuantity, 6.0);
        assert!((row.BilledCost - 15.0).abs() < 1e-9);
        assert_eq!(row.SkuId, "gpu-h100-normal");
        let line = row.csv();
        assert!(
            line.starts_with("acme,acme,2026-11-01T00:00:00.000000Z,"),
            "{line}"
        );
        // A field with a comma is quoted.
        assert!(
            line.contains(",\"8 × h100 GPU (normal priority), job "),
            "{line}"
        );
        assert!(line.contains(",15.000000000,"), "{line}");
    }

    #[test]
    fn a_credit_is_priced_like_the_row_it_offsets_and_negative() {
        let b = PriceBook::parse(BOOK).unwrap();
        // The row it offsets began before the price change of 15 November
        // took effect; the lost time lies after it: priced as the row is.
        let c = CreditRecord {
            credit_id: Uuid::from_u128(1),
            usage_id: Uuid::from_u128(2),
            usage_started_at: at("2026-11-14T23:00:00Z"),
            job_id: Uuid::nil(),
            epoch: 1,
            attempt: 2,
            rank: 0,
            tenant: "acme".into(),
            region: "us-east".into(),
            gpu_type: "h100".into(),
            priority: 1,
            gpus: 8,
            started_at: at("2026-11-14T23:30:00Z"),
            ended_at: at("2026-11-15T00:00:00Z"),
            gpu_seconds: 8.0 * 1800.0,
            ended_by: "node_lost".into(),
            cause: "node_lost".into(),
            checkpointed_at: Some(at("2026-11-14T23:30:00Z")),
            issued_at: at("2026-11-15T00:00:01Z"),
        };
        let period = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let row = FocusRow::credit(&c, &b, period).unwrap();
        // 8 GPUs × 0.5 h × 3.00, credited.
        assert_eq!(row.ChargeCategory, "Credit");
        assert_eq!(row.UsageQuantity, -4.0);
        assert!((row.BilledCost + 12.0).abs() < 1e-9);
        assert_eq!(row.EffectiveCost, row.BilledCost);
        assert_eq!(row.ListUnitPrice, 3.0);
        assert_eq!(row.SkuId, "gpu-h100-normal");
        assert_eq!(row.x_Cause, "node_lost");
        assert_eq!(row.x_UsageId, c.credit_id);
        assert_eq!(row.x_CreditedUsageId, c.usage_id.to_string());
        assert!(row.ChargeDescription.contains("lost to node_lost"));
        let line = row.csv();
        assert_eq!(
            line.matches(',').count(),
            FocusRow::CSV_HEADER.matches(',').count() + 1,
            "one comma inside the quoted description: {line}"
        );
        assert!(line.contains(",-12.000000000,"), "{line}");
        // No price for its SKU: none.
        let mut other = c.clone();
        other.gpu_type = "a100".into();
        assert!(FocusRow::credit(&other, &b, period).is_none());
    }
}
