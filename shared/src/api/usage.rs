//! A tenant's GPU time (`GET /v1/usage`): buckets, groups, the query.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// How usage is bucketed in time.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Hour,
    #[default]
    Day,
    Month,
}

impl Granularity {
    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Month => "month",
        }
    }

    /// The longest period one query may span at this granularity.
    pub fn max_span(self) -> chrono::Duration {
        match self {
            Granularity::Hour => chrono::Duration::days(31),
            Granularity::Day => chrono::Duration::days(366),
            Granularity::Month => chrono::Duration::days(5 * 366),
        }
    }
}

/// What usage rows are keyed by besides their period.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum UsageGroup {
    Job,
    #[default]
    GpuType,
    Region,
}

impl UsageGroup {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageGroup::Job => "job",
            UsageGroup::GpuType => "gpu_type",
            UsageGroup::Region => "region",
        }
    }
}

/// GPU time of one tenant in one period, for one key, from the usage
/// ledger (docs/billing.md): `gpu_seconds` = `billed_gpu_seconds` +
/// `credited_gpu_seconds` + `pending_gpu_seconds`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// Start of the period (UTC, aligned to the granularity).
    pub period_start: DateTime<Utc>,
    /// The job id, GPU type or region name (the region that ran it).
    pub key: String,
    /// GPU-seconds held in the period (one GPU held one second = 1).
    pub gpu_seconds: f64,
    /// Of which charged: ledger rows less their credits.
    #[serde(default)]
    pub billed_gpu_seconds: f64,
    /// Of which credited: lost to provider-caused events (a node lost, a
    /// drain or maintenance, a region failure, …), not charged.
    #[serde(default)]
    pub credited_gpu_seconds: f64,
    /// Of which held by placements still running and not metered yet (the
    /// ledger gets them once their clock hour ends, or they do).
    #[serde(default)]
    pub pending_gpu_seconds: f64,
}

impl UsageRow {
    /// Adds `other`'s GPU-seconds to this row's.
    pub fn add(&mut self, other: &UsageRow) {
        self.gpu_seconds += other.gpu_seconds;
        self.billed_gpu_seconds += other.billed_gpu_seconds;
        self.credited_gpu_seconds += other.credited_gpu_seconds;
        self.pending_gpu_seconds += other.pending_gpu_seconds;
    }
}

/// A tenant's GPU time, from the usage ledger of every region (each
/// ledger row counted once, whichever regions hold it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub granularity: Granularity,
    pub group_by: UsageGroup,
    pub rows: Vec<UsageRow>,
    pub total_gpu_seconds: f64,
    #[serde(default)]
    pub total_billed_gpu_seconds: f64,
    #[serde(default)]
    pub total_credited_gpu_seconds: f64,
    #[serde(default)]
    pub total_pending_gpu_seconds: f64,
    /// Regions that did not answer. Their usage comes from the copies their
    /// buddies hold (`replicated_regions`), which may lag a little.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable_regions: Vec<String>,
    /// Regions whose usage was read from other regions' copies of their
    /// ledger rows (they did not answer): without their live placements'
    /// time not metered yet, and without rows not replicated yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicated_regions: Vec<String>,
    /// In a region's answer to the global tier only: the rows it holds for
    /// its peers, by the region that ran them (`rows` are its own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_for: BTreeMap<String, Vec<UsageRow>>,
}

impl Usage {
    /// A usage of these rows, with their totals.
    pub fn of(
        (from, to, granularity, group_by): (DateTime<Utc>, DateTime<Utc>, Granularity, UsageGroup),
        rows: Vec<UsageRow>,
    ) -> Usage {
        let mut total = UsageRow::default();
        for r in &rows {
            total.add(r);
        }
        Usage {
            from,
            to,
            granularity,
            group_by,
            rows,
            total_gpu_seconds: total.gpu_seconds,
            total_billed_gpu_seconds: total.billed_gpu_seconds,
            total_credited_gpu_seconds: total.credited_gpu_seconds,
            total_pending_gpu_seconds: total.pending_gpu_seconds,
            unavailable_regions: Vec::new(),
            replicated_regions: Vec::new(),
            held_for: BTreeMap::new(),
        }
    }
}

/// The query of `GET /v1/usage`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the period (RFC 3339); default: 7 days before `to`.
    pub from: Option<DateTime<Utc>>,
    /// End of the period, exclusive (RFC 3339); default: now.
    pub to: Option<DateTime<Utc>>,
    /// `hour` (periods up to 31 days), `day` (default; up to 366 days) or
    /// `month` (up to 5 years).
    pub granularity: Option<Granularity>,
    /// `gpu_type` (default), `job` or `region`.
    pub group_by: Option<UsageGroup>,
    /// Only this job's usage (one of the tenant's own: another tenant's
    /// job has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Uuid>,
}

impl UsageQuery {
    /// The window and grouping asked for, checked; the error says what to
    /// fix.
    pub fn resolve(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(DateTime<Utc>, DateTime<Utc>, Granularity, UsageGroup), String> {
        let to = self.to.unwrap_or(now);
        let from = self.from.unwrap_or(to - chrono::Duration::days(7));
        let granularity = self.granularity.unwrap_or_default();
        if from >= to {
            return Err("`from` must be before `to`".into());
        }
        if to - from > granularity.max_span() {
            return Err(format!(
                "a {} breakdown covers at most {} days; narrow the period or use a coarser granularity",
                granularity.as_str(),
                granularity.max_span().num_days()
            ));
        }
        Ok((from, to, granularity, self.group_by.unwrap_or_default()))
    }
}

/// A tenant's costs of one calendar month so far (`GET /v1/costs`): its
/// lines of the billing export (docs/billing.md), priced by the operator's
/// price book with its credits and commitments, summed. Amounts are exact
/// decimals (strings): the sums of the export's lines to the digit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Costs {
    pub tenant: String,
    /// `YYYY-MM`.
    pub month: String,
    pub currency: String,
    /// Everything billed: usage (net of corrections), credits, commitments.
    #[schema(value_type = String)]
    pub billed: crate::billing::Decimal,
    /// Of it, credits (negative): time lost to provider-caused events.
    #[schema(value_type = String)]
    pub credits: crate::billing::Decimal,
    /// Of it, committed capacity (guarantees, reservations, clusters),
    /// whether used or not.
    #[schema(value_type = String)]
    pub commitments: crate::billing::Decimal,
    /// GPU-hours used, net of credits and corrections.
    #[schema(value_type = String)]
    pub gpu_hours: crate::billing::Decimal,
    #[schema(value_type = String)]
    pub credited_gpu_hours: crate::billing::Decimal,
    #[schema(value_type = String)]
    pub committed_gpu_hours: crate::billing::Decimal,
    /// Billed per day (UTC), the days with lines.
    pub days: Vec<CostDay>,
    /// Billed per SKU (`SkuId`).
    pub skus: Vec<CostSku>,
    /// Regions that did not answer: their part is missing (read again
    /// later).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions_unavailable: Vec<String>,
    /// When it was read: usage is metered by clock hour, so the current
    /// hour is not in it yet.
    pub as_of: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostDay {
    pub day: chrono::NaiveDate,
    #[schema(value_type = String)]
    pub billed: crate::billing::Decimal,
    #[schema(value_type = String)]
    pub gpu_hours: crate::billing::Decimal,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostSku {
    pub sku: String,
    #[schema(value_type = String)]
    pub billed: crate::billing::Decimal,
    /// Its pricing quantity (GPU-hours).
    #[schema(value_type = String)]
    pub quantity: crate::billing::Decimal,
}
