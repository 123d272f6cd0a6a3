//! The usage ledger's records (issue 8, docs/billing.md): one per worker
//! placement and clock hour, as regions keep, replicate and export them;
//! their credits and corrections; the capacity tenants committed; the
//! price book; and the FOCUS rows of the export ([`bill`] prices a month,
//! [`reconcile`] compares the ledger with the allocations).

use chrono::{DateTime, Utc};
use rust_decimal::prelude::FromPrimitive;
/// Money and quantities of the export: exact decimals.
pub use rust_decimal::Decimal;
use rust_decimal::RoundingStrategy;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub mod bill;
pub mod reconcile;

/// A page of a region's ledger (`GET /v1/admin/usage/records`,
/// `…/credits`, `…/commitments`): its items, and the id the next page
/// comes `after` (none on the last).
pub trait LedgerPage: serde::de::DeserializeOwned {
    type Item;
    fn into_items(self) -> (Vec<Self::Item>, Option<Uuid>);
    /// The item's id: one item wherever it is held.
    fn id(item: &Self::Item) -> Uuid;
}

impl LedgerPage for UsageRecords {
    type Item = UsageRecord;
    fn into_items(self) -> (Vec<UsageRecord>, Option<Uuid>) {
        (self.records, self.next)
    }
    fn id(r: &UsageRecord) -> Uuid {
        r.usage_id
    }
}

impl LedgerPage for CreditRecords {
    type Item = CreditRecord;
    fn into_items(self) -> (Vec<CreditRecord>, Option<Uuid>) {
        (self.credits, self.next)
    }
    fn id(c: &CreditRecord) -> Uuid {
        c.credit_id
    }
}

impl LedgerPage for CommitmentRecords {
    type Item = CommitmentRecord;
    fn into_items(self) -> (Vec<CommitmentRecord>, Option<Uuid>) {
        (self.commitments, self.next)
    }
    fn id(c: &CommitmentRecord) -> Uuid {
        c.record_id
    }
}

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
    /// The capacity reservation the job ran in (rows written since V20;
    /// absent: not in one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<Uuid>,
    /// The dedicated cluster the job ran on (rows written since V20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<Uuid>,
}

impl UsageRecord {
    /// The commitment this row's usage may be covered by: its job's
    /// reservation or cluster, or else its tenant's guarantee for the GPU
    /// type in the region that ran it (docs/billing.md).
    pub fn commitment(&self) -> (CommitmentKind, String) {
        match (self.reservation_id, self.cluster_id) {
            (Some(r), _) => (CommitmentKind::Reservation, r.to_string()),
            (None, Some(c)) => (CommitmentKind::Cluster, c.to_string()),
            (None, None) => (
                CommitmentKind::Guarantee,
                guarantee_id(&self.tenant, &self.gpu_type),
            ),
        }
    }
}

/// A guarantee's commitment id within its region: `TENANT/GPU_TYPE`.
pub fn guarantee_id(tenant: &str, gpu_type: &str) -> String {
    format!("{tenant}/{gpu_type}")
}

/// A page of ledger records (`GET /v1/admin/usage/records`): in id
/// order, or with `order=time` in (`started_at`, `usage_id`) order.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct UsageRecords {
    pub records: Vec<UsageRecord>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
    /// In time order (`order=time`), pass as `after_start` (with `next`
    /// as `after`) for the next page: the last row's `started_at`. Absent
    /// in id order and on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_start: Option<DateTime<Utc>>,
}

/// A credit (docs/billing.md): GPU time of one usage row that a
/// provider-caused end of its placement lost (the work after the job's
/// newest checkpoint), not charged. `credit_id` is derived from the usage
/// row it offsets (`usage_id`), so there is one credit per row wherever
/// it is held.
///
/// With cause [`CORRECTION`] it is a **correction** instead: the part of
/// the row past its placement's end, which a release dated back past an
/// hour the meter had already written whole says was never held (its id
/// `md5('correction/' || usage_id)`). A credit moves GPU time from billed
/// to credited; a correction takes it off the bill and off the time held.
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

/// The cause of a [`CreditRecord`] that is a correction.
pub const CORRECTION: &str = "correction";

impl CreditRecord {
    /// Whether it is a correction (time never held), not a credit.
    pub fn is_correction(&self) -> bool {
        self.cause == CORRECTION
    }
}

/// A page of credits (`GET /v1/admin/usage/credits`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct CreditRecords {
    pub credits: Vec<CreditRecord>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
}

/// The hours of a dead home's last placements that its adopter closed
/// (`GET /v1/admin/usage/closings`, docs/billing.md, "A region that does
/// not come back"): shaped as ledger rows of the home (`region`, ids from
/// `md5('closing/' …)`, the last hour `ended_by` `moved`) and the credits
/// of the work those placements lost (ids from `md5('closing-credit/' ||
/// usage_id)`, offsetting a closing or a held row of the placement). They
/// count only where the home is read from its copies: a home that answers
/// bills its placements itself. One per placement and hour: small.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Closings {
    pub records: Vec<UsageRecord>,
    pub credits: Vec<CreditRecord>,
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

/// What a tenant committed to (docs/billing.md): GPUs billed whether
/// used or not.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CommitmentKind {
    /// A guaranteed quota: `guaranteed_gpus` of a GPU type in a region.
    Guarantee,
    /// A capacity reservation: its GPUs over its window.
    Reservation,
    /// A dedicated cluster: its nodes × GPUs per node.
    Cluster,
}

impl CommitmentKind {
    pub const ALL: [CommitmentKind; 3] = [
        CommitmentKind::Guarantee,
        CommitmentKind::Reservation,
        CommitmentKind::Cluster,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CommitmentKind::Guarantee => "guarantee",
            CommitmentKind::Reservation => "reservation",
            CommitmentKind::Cluster => "cluster",
        }
    }

    pub fn parse(s: &str) -> Option<CommitmentKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What one tenant had committed in one region through one commitment
/// within one clock hour (`GET /v1/admin/usage/commitments`): `gpu_seconds`
/// GPU-seconds held for it between `started_at` and `ended_at` (GPUs ×
/// the time each version of the commitment was in force; a reservation
/// resized mid-hour holds each size for its part), at most `gpus` at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CommitmentRecord {
    /// Derived from (region, kind, commitment, hour): the same hour of
    /// the same commitment is the same id.
    pub record_id: Uuid,
    pub kind: CommitmentKind,
    /// The reservation's or cluster's id; `TENANT/GPU_TYPE` for a
    /// guarantee.
    pub commitment_id: String,
    pub tenant: String,
    /// The region that holds the commitment.
    pub region: String,
    pub gpu_type: String,
    /// The clock hour.
    pub hour: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub gpus: i32,
    pub gpu_seconds: f64,
}

impl CommitmentRecord {
    /// Its FOCUS `CommitmentDiscountId`, unique across regions.
    pub fn discount_id(&self) -> String {
        discount_id(self.kind, &self.region, &self.commitment_id)
    }
}

/// A commitment's FOCUS `CommitmentDiscountId`: `reservation/ID`,
/// `cluster/ID`, `guarantee/REGION/TENANT/GPU_TYPE`.
pub fn discount_id(kind: CommitmentKind, region: &str, commitment_id: &str) -> String {
    match kind {
        CommitmentKind::Guarantee => format!("guarantee/{region}/{commitment_id}"),
        k => format!("{}/{commitment_id}", k.as_str()),
    }
}

/// A page of committed capacity (`GET /v1/admin/usage/commitments`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct CommitmentRecords {
    pub commitments: Vec<CommitmentRecord>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Uuid>,
    /// For the copies a region holds of a peer's (`home=`): when it last
    /// heard from that peer. A commitment still in force there counts to
    /// then, so the copy heard last is the most complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard_at: Option<DateTime<Utc>>,
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
/// of the same scope (a TOML file, docs/billing.md); and what a committed
/// GPU-hour costs, by commitment kind, GPU type and (optionally) region,
/// with the price of usage the commitment covers:
///
/// ```toml
/// currency = "USD"
/// provider = "Example GPU Cloud"  # FOCUS ProviderName etc. (default "Gangway")
/// [[price]]
/// gpu_type = "h100"
/// priority = "normal"   # low, normal, high, or "*" (the default)
/// region = "*"          # a region's name, or "*" (the default)
/// effective = "2026-11-01T00:00:00Z"
/// per_gpu_hour = 2.50
/// [[commitment]]
/// kind = "reservation"  # guarantee, reservation or cluster
/// gpu_type = "h100"
/// region = "*"
/// effective = "2026-11-01T00:00:00Z"
/// per_gpu_hour = 2.00                # each committed GPU-hour, used or not
/// covered_usage_per_gpu_hour = 0.0   # usage it covers (the default: 0)
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceBook {
    pub currency: String,
    /// Who sells the GPU-hours and issues the invoice: the export's
    /// `ProviderName`, `PublisherName` and `InvoiceIssuerName`.
    #[serde(default = "default_provider")]
    pub provider: String,
    #[serde(rename = "price", default)]
    pub prices: Vec<Price>,
    /// Committed capacity (optional: a book without it is valid until
    /// a month has commitments to bill).
    #[serde(rename = "commitment", default, skip_serializing_if = "Vec::is_empty")]
    pub commitments: Vec<CommitmentPrice>,
}

/// One commitment price of a [`PriceBook`]: a committed GPU-hour of a
/// kind and GPU type (in a region, or any), and the price of a GPU-hour
/// of usage the commitment covers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitmentPrice {
    pub kind: CommitmentKind,
    pub gpu_type: String,
    #[serde(default = "any")]
    pub region: String,
    pub effective: DateTime<Utc>,
    pub per_gpu_hour: Decimal,
    #[serde(default)]
    pub covered_usage_per_gpu_hour: Decimal,
}

impl CommitmentPrice {
    /// Its FOCUS `SkuPriceId`: the SKU, the region it applies to (`*`:
    /// any) and the day it took effect.
    pub fn sku_price_id(&self) -> String {
        format!(
            "commit-{}-{}:{}:{}",
            self.kind.as_str(),
            self.gpu_type,
            self.region,
            self.effective.format("%Y-%m-%d")
        )
    }
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
    pub per_gpu_hour: Decimal,
}

impl Price {
    /// Its FOCUS `SkuPriceId`: the SKU (`gpu-TYPE-PRIORITY`, the priority
    /// it was billed at), the region and priority it applies to (`*`:
    /// any) and the day it took effect.
    pub fn sku_price_id(&self, sku: &str) -> String {
        format!(
            "{sku}:{}:{}:{}",
            self.region,
            self.priority,
            self.effective.format("%Y-%m-%d")
        )
    }
}

fn any() -> String {
    "*".into()
}

fn default_provider() -> String {
    "Gangway".into()
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
            if p.per_gpu_hour.is_sign_negative() {
                return Err(format!(
                    "price book: per_gpu_hour {} of {} is not a price",
                    p.per_gpu_hour, p.gpu_type
                ));
            }
        }
        for c in &book.commitments {
            for (name, v) in [
                ("per_gpu_hour", c.per_gpu_hour),
                ("covered_usage_per_gpu_hour", c.covered_usage_per_gpu_hour),
            ] {
                if v.is_sign_negative() {
                    return Err(format!(
                        "price book: {name} {v} of the {} commitment of {} is not a price",
                        c.kind.as_str(),
                        c.gpu_type
                    ));
                }
            }
        }
        Ok(book)
    }

    /// The price of a committed GPU-hour of `kind` and `gpu_type` in
    /// `region` at `at`: of those in force then, a region named over any,
    /// and of those the latest.
    pub fn commitment_price(
        &self,
        kind: CommitmentKind,
        gpu_type: &str,
        region: &str,
        at: DateTime<Utc>,
    ) -> Option<&CommitmentPrice> {
        (self.commitments.iter())
            .filter(|p| p.kind == kind && p.gpu_type == gpu_type && p.effective <= at)
            .filter(|p| p.region == "*" || p.region == region)
            .max_by_key(|p| (p.region != "*", p.effective))
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

/// GPU-seconds as the ledger metered them (to the microsecond), exactly,
/// in decimal.
pub fn decimal_seconds(gpu_seconds: f64) -> Decimal {
    Decimal::from_f64(gpu_seconds)
        .unwrap_or_default()
        .round_dp(6)
}

/// GPU-seconds in GPU-hours (28 significant digits).
pub fn hours_of(seconds: Decimal) -> Decimal {
    seconds / Decimal::from(3600)
}

/// How the export writes a quantity or an amount: to 9 decimal places,
/// half away from zero (docs/billing.md, "Rounding").
pub fn rounded(x: Decimal) -> Decimal {
    let mut d = x.round_dp_with_strategy(9, RoundingStrategy::MidpointAwayFromZero);
    d.rescale(9);
    d
}

/// An amount to the cent, half away from zero: what an invoice shows of
/// a sum of lines.
pub fn cents(x: Decimal) -> Decimal {
    let mut d = x.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
    d.rescale(2);
    d
}

/// What finance checks first of a tenant's lines: GPU-hours and cost net
/// of credits and corrections, the credits, and what commitments cost —
/// the sums of the lines as written (`gangway billing export`'s summary
/// per tenant, and `GET /v1/costs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineTotals {
    pub hours: Decimal,
    pub cost: Decimal,
    pub credit_hours: Decimal,
    pub credit: Decimal,
    pub committed_hours: Decimal,
    pub committed: Decimal,
}

impl LineTotals {
    pub fn add(&mut self, row: &FocusRow) {
        let consumed = row.ConsumedQuantity.unwrap_or_default();
        self.hours += consumed;
        self.cost += row.BilledCost;
        if row.ChargeCategory == "Credit" {
            self.credit_hours -= consumed;
            self.credit -= row.BilledCost;
        }
        if row.ChargeCategory == "Purchase" {
            self.committed_hours += row.PricingQuantity;
            self.committed += row.BilledCost;
        }
    }
}

/// FOCUS's date-time form: ISO 8601 in UTC, here to the microsecond.
mod focus_time {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One line of a billing export: the columns of FinOps FOCUS 1.0 (every
/// one the specification defines, in its names) and Gangway's own,
/// `x_`-prefixed (among them the commitment and capacity-reservation
/// columns FOCUS added only in 1.1): one ledger record, priced. Money and
/// quantities are exact decimals ([`rounded`] to 9 places), written as
/// decimal strings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(non_snake_case)]
pub struct FocusRow {
    pub BillingAccountId: String,
    /// The tenant's display name where the export knows it, else its id.
    pub BillingAccountName: String,
    pub SubAccountId: String,
    pub SubAccountName: String,
    /// [`PriceBook::provider`], as are `PublisherName` and
    /// `InvoiceIssuerName`.
    pub ProviderName: String,
    pub PublisherName: String,
    pub InvoiceIssuerName: String,
    #[serde(with = "focus_time")]
    pub BillingPeriodStart: DateTime<Utc>,
    #[serde(with = "focus_time")]
    pub BillingPeriodEnd: DateTime<Utc>,
    #[serde(with = "focus_time")]
    pub ChargePeriodStart: DateTime<Utc>,
    #[serde(with = "focus_time")]
    pub ChargePeriodEnd: DateTime<Utc>,
    /// `Usage`, `Purchase` (a commitment's hour) or `Credit`.
    pub ChargeCategory: String,
    /// `Correction` on a line correcting an earlier (closed) month; null
    /// otherwise.
    pub ChargeClass: Option<String>,
    pub ChargeDescription: String,
    /// `Usage-Based` (usage, its credits and corrections, a commitment's
    /// unused part) or `Recurring` (a commitment's hourly charge).
    pub ChargeFrequency: String,
    pub ResourceId: String,
    /// A job's id (the ledger does not keep its name), a commitment's.
    pub ResourceName: String,
    pub ResourceType: String,
    pub RegionId: String,
    pub RegionName: String,
    /// `AI and Machine Learning`.
    pub ServiceCategory: String,
    pub ServiceName: String,
    pub SkuId: String,
    /// The price book entry that priced the line ([`Price::sku_price_id`]).
    pub SkuPriceId: Option<String>,
    /// `Committed` on the part of usage a commitment covered and on a
    /// commitment's unused part, `Standard` otherwise.
    pub PricingCategory: Option<String>,
    /// GPU-hours used (negative on a credit or correction); null on a
    /// commitment's purchase.
    pub ConsumedQuantity: Option<Decimal>,
    pub ConsumedUnit: Option<String>,
    pub PricingQuantity: Decimal,
    pub PricingUnit: String,
    pub ListUnitPrice: Decimal,
    pub ListCost: Decimal,
    /// The price book's price: Gangway negotiates nothing beside it (a
    /// commitment is its own SKU), so contracted is list.
    pub ContractedUnitPrice: Decimal,
    pub ContractedCost: Decimal,
    pub BilledCost: Decimal,
    pub EffectiveCost: Decimal,
    pub BillingCurrency: String,
    /// The commitment (docs/billing.md) a line covers, is covered by, or
    /// is the unused part of.
    pub CommitmentDiscountId: Option<String>,
    pub CommitmentDiscountName: Option<String>,
    /// `guarantee`, `reservation` or `cluster`.
    pub CommitmentDiscountType: Option<String>,
    /// `Usage` (commitments are of GPU-hours).
    pub CommitmentDiscountCategory: Option<String>,
    /// `Used` (usage the commitment covered) or `Unused` (what it left
    /// idle); null on its purchase.
    pub CommitmentDiscountStatus: Option<String>,
    /// A JSON object: the GPU type, and the priority class or the
    /// commitment's kind.
    pub Tags: String,
    /// The FinOps Foundation's validator for 1.0 (`focus-validator`
    /// 1.0.0, its only release) checks these five columns under their
    /// 1.0-preview names: the same values as `ProviderName`,
    /// `PublisherName`, `InvoiceIssuerName`, `ResourceId` and
    /// `ChargeCategory` ([`FocusRow::as_written`] copies them), so that the
    /// export passes it.
    #[serde(rename = "Provider")]
    pub PreviewProvider: String,
    #[serde(rename = "Publisher")]
    pub PreviewPublisher: String,
    #[serde(rename = "InvoiceIssuer")]
    pub PreviewInvoiceIssuer: String,
    #[serde(rename = "ResourceID")]
    pub PreviewResourceId: String,
    #[serde(rename = "ChargeType")]
    pub PreviewChargeType: String,
    /// GPU-hours of the commitment the line bought, used or left unused
    /// (FOCUS 1.1's `CommitmentDiscountQuantity`).
    pub x_CommitmentDiscountQuantity: Option<Decimal>,
    pub x_CommitmentDiscountUnit: Option<String>,
    /// A reservation's or cluster's id: the capacity it holds (FOCUS
    /// 1.1's `CapacityReservationId`).
    pub x_CapacityReservationId: Option<String>,
    pub x_CapacityReservationStatus: Option<String>,
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

/// The columns every line has whatever it prices.
#[allow(clippy::too_many_arguments)]
pub(crate) fn focus_base(
    tenant: &str,
    book: &PriceBook,
    period: (DateTime<Utc>, DateTime<Utc>),
    charge: (DateTime<Utc>, DateTime<Utc>),
    category: &str,
    description: String,
    resource: (String, &str),
    region: &str,
    sku: String,
    tags: serde_json::Value,
) -> FocusRow {
    let (resource_id, resource_type) = resource;
    FocusRow {
        BillingAccountId: tenant.to_string(),
        BillingAccountName: tenant.to_string(),
        SubAccountId: tenant.to_string(),
        SubAccountName: tenant.to_string(),
        ProviderName: book.provider.clone(),
        PublisherName: book.provider.clone(),
        InvoiceIssuerName: book.provider.clone(),
        BillingPeriodStart: period.0,
        BillingPeriodEnd: period.1,
        ChargePeriodStart: charge.0,
        ChargePeriodEnd: charge.1,
        ChargeCategory: category.into(),
        ChargeClass: None,
        ChargeDescription: description,
        ChargeFrequency: "Usage-Based".into(),
        ResourceName: resource_id.clone(),
        PreviewResourceId: String::new(),
        ResourceId: resource_id,
        ResourceType: resource_type.into(),
        RegionId: region.to_string(),
        RegionName: region.to_string(),
        ServiceCategory: "AI and Machine Learning".into(),
        ServiceName: "Gangway GPU".into(),
        SkuId: sku,
        SkuPriceId: None,
        PricingCategory: Some("Standard".into()),
        ConsumedQuantity: None,
        ConsumedUnit: None,
        PricingQuantity: Decimal::ZERO,
        PricingUnit: "GPU-Hours".into(),
        ListUnitPrice: Decimal::ZERO,
        ListCost: Decimal::ZERO,
        ContractedUnitPrice: Decimal::ZERO,
        ContractedCost: Decimal::ZERO,
        BilledCost: Decimal::ZERO,
        EffectiveCost: Decimal::ZERO,
        BillingCurrency: book.currency.clone(),
        CommitmentDiscountId: None,
        CommitmentDiscountName: None,
        CommitmentDiscountType: None,
        CommitmentDiscountCategory: None,
        CommitmentDiscountStatus: None,
        Tags: tags.to_string(),
        PreviewProvider: String::new(),
        PreviewPublisher: String::new(),
        PreviewInvoiceIssuer: String::new(),
        PreviewChargeType: String::new(),
        x_CommitmentDiscountQuantity: None,
        x_CommitmentDiscountUnit: None,
        x_CapacityReservationId: None,
        x_CapacityReservationStatus: None,
        x_UsageId: Uuid::nil(),
        x_Epoch: 0,
        x_Attempt: 0,
        x_Rank: 0,
        x_Gpus: 0,
        x_EndedBy: String::new(),
        x_Cause: String::new(),
        x_CreditedUsageId: String::new(),
    }
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
        let sku = format!("gpu-{}-{priority}", r.gpu_type);
        let mut row = focus_base(
            &r.tenant,
            book,
            period,
            (r.started_at, r.ended_at),
            "Usage",
            format!(
                "{} × {} GPU ({priority} priority), job {} rank {}",
                r.gpus, r.gpu_type, r.job_id, r.rank
            ),
            (r.job_id.to_string(), "TrainingJob"),
            &r.region,
            sku.clone(),
            serde_json::json!({"gangway/gpu-type": r.gpu_type, "gangway/priority": priority}),
        );
        row.SkuPriceId = Some(price.sku_price_id(&sku));
        row.set_usage(hours_of(decimal_seconds(r.gpu_seconds)), price.per_gpu_hour);
        row.x_UsageId = r.usage_id;
        row.x_Epoch = r.epoch;
        row.x_Attempt = r.attempt;
        row.x_Rank = r.rank;
        row.x_Gpus = r.gpus;
        row.x_EndedBy = r.ended_by.clone();
        row.x_Cause = r.cause.clone().unwrap_or_default();
        Some(row)
    }

    /// `q` GPU-hours (negative: taken off) at `unit` a GPU-hour, nothing
    /// of it committed: list, contracted, billed and effective alike.
    pub(crate) fn set_usage(&mut self, q: Decimal, unit: Decimal) {
        self.ConsumedQuantity = Some(q);
        self.ConsumedUnit = Some("GPU-Hours".into());
        self.PricingQuantity = q;
        self.ListUnitPrice = unit;
        self.ContractedUnitPrice = unit;
        self.ListCost = q * unit;
        self.ContractedCost = q * unit;
        self.BilledCost = q * unit;
        self.EffectiveCost = q * unit;
    }

    /// The line as the export writes it: every quantity and amount
    /// [`rounded`], the 1.0-preview duplicates filled in.
    pub fn as_written(mut self) -> FocusRow {
        self.PreviewProvider = self.ProviderName.clone();
        self.PreviewPublisher = self.PublisherName.clone();
        self.PreviewInvoiceIssuer = self.InvoiceIssuerName.clone();
        self.PreviewResourceId = self.ResourceId.clone();
        self.PreviewChargeType = self.ChargeCategory.clone();
        for x in [
            &mut self.PricingQuantity,
            &mut self.ListCost,
            &mut self.ContractedCost,
            &mut self.BilledCost,
            &mut self.EffectiveCost,
        ] {
            *x = rounded(*x);
        }
        for x in [
            &mut self.ConsumedQuantity,
            &mut self.x_CommitmentDiscountQuantity,
        ]
        .into_iter()
        .flatten()
        {
            *x = rounded(*x);
        }
        self
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
        let since = match c.checkpointed_at {
            Some(t) => format!(
                "work since checkpoint at {}",
                t.format("%Y-%m-%dT%H:%M:%SZ")
            ),
            None => "no checkpoint".to_string(),
        };
        let sku = format!("gpu-{}-{priority}", c.gpu_type);
        let mut row = focus_base(
            &c.tenant,
            book,
            period,
            (c.started_at, c.ended_at),
            "Credit",
            format!(
                "credit: {} × {} GPU ({priority} priority) lost to {}, job {} rank {} ({since})",
                c.gpus, c.gpu_type, c.cause, c.job_id, c.rank
            ),
            (c.job_id.to_string(), "TrainingJob"),
            &c.region,
            sku.clone(),
            serde_json::json!({"gangway/gpu-type": c.gpu_type, "gangway/priority": priority}),
        );
        row.SkuPriceId = Some(price.sku_price_id(&sku));
        row.set_usage(
            -hours_of(decimal_seconds(c.gpu_seconds)),
            price.per_gpu_hour,
        );
        row.x_UsageId = c.credit_id;
        row.x_Epoch = c.epoch;
        row.x_Attempt = c.attempt;
        row.x_Rank = c.rank;
        row.x_Gpus = c.gpus;
        row.x_EndedBy = c.ended_by.clone();
        row.x_Cause = c.cause.clone();
        row.x_CreditedUsageId = c.usage_id.to_string();
        Some(row)
    }

    /// The CSV header: the field names, in order (a test checks them
    /// against what serde writes).
    pub const COLUMNS: &'static [&'static str] = &[
        "BillingAccountId",
        "BillingAccountName",
        "SubAccountId",
        "SubAccountName",
        "ProviderName",
        "PublisherName",
        "InvoiceIssuerName",
        "BillingPeriodStart",
        "BillingPeriodEnd",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "ChargeCategory",
        "ChargeClass",
        "ChargeDescription",
        "ChargeFrequency",
        "ResourceId",
        "ResourceName",
        "ResourceType",
        "RegionId",
        "RegionName",
        "ServiceCategory",
        "ServiceName",
        "SkuId",
        "SkuPriceId",
        "PricingCategory",
        "ConsumedQuantity",
        "ConsumedUnit",
        "PricingQuantity",
        "PricingUnit",
        "ListUnitPrice",
        "ListCost",
        "ContractedUnitPrice",
        "ContractedCost",
        "BilledCost",
        "EffectiveCost",
        "BillingCurrency",
        "CommitmentDiscountId",
        "CommitmentDiscountName",
        "CommitmentDiscountType",
        "CommitmentDiscountCategory",
        "CommitmentDiscountStatus",
        "Tags",
        "Provider",
        "Publisher",
        "InvoiceIssuer",
        "ResourceID",
        "ChargeType",
        "x_CommitmentDiscountQuantity",
        "x_CommitmentDiscountUnit",
        "x_CapacityReservationId",
        "x_CapacityReservationStatus",
        "x_UsageId",
        "x_Epoch",
        "x_Attempt",
        "x_Rank",
        "x_Gpus",
        "x_EndedBy",
        "x_Cause",
        "x_CreditedUsageId",
    ];

    /// A CSV writer of lines to `w`: the header now (so an export with
    /// no line still has it), then [`csv::Writer::serialize`] each line.
    pub fn csv_writer<W: std::io::Write>(w: W) -> csv::Result<csv::Writer<W>> {
        let mut out = csv::WriterBuilder::new().has_headers(false).from_writer(w);
        out.write_record(FocusRow::COLUMNS)?;
        Ok(out)
    }

    /// The row as one CSV line (no line end; RFC 4180 quoting where
    /// needed).
    pub fn csv(&self) -> String {
        let mut out = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(Vec::new());
        out.serialize(self).expect("a row serializes");
        let mut text = String::from_utf8(out.into_inner().expect("a buffer")).expect("UTF-8");
        text.truncate(text.trim_end_matches(['\r', '\n']).len());
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    /// A normal-priority h100 row of acme's in us-east, `gpus` GPUs held
    /// from `start` to `end`.
    fn usage(gpus: i32, start: &str, end: &str) -> UsageRecord {
        let (started_at, ended_at) = (at(start), at(end));
        UsageRecord {
            usage_id: Uuid::nil(),
            job_id: Uuid::nil(),
            epoch: 1,
            attempt: 1,
            rank: 0,
            tenant: "acme".into(),
            region: "us-east".into(),
            gpu_type: "h100".into(),
            priority: 1,
            gpus,
            started_at,
            ended_at,
            gpu_seconds: f64::from(gpus) * (ended_at - started_at).num_seconds() as f64,
            ended_by: "succeeded".into(),
            cause: None,
            checkpointed_at: None,
            reservation_id: None,
            cluster_id: None,
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
        assert_eq!(p("normal", "us-east", "2026-11-01T00:00:00Z"), Some(d("3")));
        // A later effective date takes over from then on.
        assert_eq!(
            p("normal", "us-east", "2026-11-15T00:00:00Z"),
            Some(d("2.5"))
        );
        // A named priority, or region, beats any.
        assert_eq!(p("low", "us-east", "2026-11-20T00:00:00Z"), Some(d("1")));
        assert_eq!(
            p("normal", "eu-central", "2026-11-20T00:00:00Z"),
            Some(d("4"))
        );
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
        let r = usage(8, "2026-11-20T10:00:00Z", "2026-11-20T10:45:00Z");
        let period = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let row = FocusRow::of(&r, &b, period).unwrap();
        // 8 GPUs × 0.75 h × 2.50 = 15.00
        assert_eq!(row.ConsumedQuantity, Some(d("6")));
        assert_eq!(row.BilledCost, d("15"));
        assert_eq!(row.SkuId, "gpu-h100-normal");
        assert_eq!(
            row.SkuPriceId.as_deref(),
            Some("gpu-h100-normal:*:*:2026-11-15")
        );
        let line = row.as_written().csv();
        assert!(
            line.starts_with(
                "acme,acme,acme,acme,Gangway,Gangway,Gangway,2026-11-01T00:00:00.000000Z,"
            ),
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
        assert_eq!(row.ConsumedQuantity, Some(d("-4")));
        assert_eq!(row.BilledCost, d("-12"));
        assert_eq!(row.EffectiveCost, row.BilledCost);
        assert_eq!(row.ListUnitPrice, d("3"));
        assert_eq!(row.SkuId, "gpu-h100-normal");
        assert_eq!(row.x_Cause, "node_lost");
        assert_eq!(row.x_UsageId, c.credit_id);
        assert_eq!(row.x_CreditedUsageId, c.usage_id.to_string());
        assert!(row.ChargeDescription.contains("lost to node_lost"));
        let line = row.clone().as_written().csv();
        assert_eq!(
            line.matches(',').count(),
            FocusRow::COLUMNS.len() - 1 + 2,
            "one comma inside the quoted description, one in the tags: {line}"
        );
        assert!(line.contains(",-12.000000000,"), "{line}");
        // No price for its SKU: none.
        let mut other = c.clone();
        other.gpu_type = "a100".into();
        assert!(FocusRow::credit(&other, &b, period).is_none());
    }

    /// The header is serde's names, in order; a line has as many fields;
    /// money with a binary-awkward price stays exact.
    #[test]
    fn the_csv_header_is_the_rows_fields_and_money_is_exact() {
        let b =
            PriceBook::parse(&BOOK.replace("per_gpu_hour = 2.5", "per_gpu_hour = 0.07")).unwrap();
        let r = usage(3, "2026-11-20T10:00:00Z", "2026-11-20T10:06:00Z");
        let period = (at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z"));
        let row = FocusRow::of(&r, &b, period).unwrap().as_written();
        // 0.3 GPU-hours × 0.07 = 0.021 exactly (in binary: 0.021000000000000001).
        assert_eq!(row.BilledCost.to_string(), "0.021000000");
        assert_eq!(row.ConsumedQuantity.unwrap().to_string(), "0.300000000");
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(&row).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        let mut rd = csv::Reader::from_reader(text.as_bytes());
        let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
        assert_eq!(header, FocusRow::COLUMNS);
        let back: FocusRow = rd.deserialize().next().unwrap().unwrap();
        assert_eq!(back, row);
        assert!(
            text.contains(r#","{""gangway/gpu-type"":""h100"",""gangway/priority"":""normal""}","#),
            "{text}"
        );
    }
}
