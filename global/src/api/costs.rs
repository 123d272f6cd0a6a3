//! `GET /v1/costs`: a tenant's month so far, priced as the billing export
//! prices it (docs/billing.md): the same ledgers read from every region
//! (only this tenant's rows, credits and commitments; each id once, a
//! region's own and the copies its peers hold alike), the same price book
//! (`gangway global --price-book`), the same pricing
//! (`gangway_shared::billing::bill::price`), summed per day and SKU. So a
//! tenant's costs are the sums of its lines in the operator's export.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use gangway_shared::api::{CostDay, CostSku, Costs};
use gangway_shared::billing::bill::{self, Period};
use gangway_shared::billing::{
    CommitmentRecords, CreditRecords, Decimal, LedgerPage, LineTotals, PriceBook, UsageRecords,
};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Query};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::relay::RETRY_AFTER_S;
use super::responses;
use crate::auth::TenantCaller;
use crate::regions::{Call, Region};
use crate::state::GlobalState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CostsParams {
    /// `YYYY-MM` (default: this month, UTC).
    month: Option<String>,
}

/// Your costs
///
/// The tenant's costs of a calendar month so far: its usage, credits and
/// commitments, priced by the operator's price book exactly as the
/// billing export prices them (its lines of the export, summed: per day
/// and per SKU). Usage is metered by clock hour, so the hour under way is
/// not in it yet. A region that does not answer is named in
/// `regions_unavailable`, and its part is missing.
#[utoipa::path(
    get,
    path = "/v1/costs",
    operation_id = "get_costs",
    tag = "usage",
    security(("bearer" = [])),
    params(CostsParams),
    responses(
        (status = 200, description = "The month's costs so far.", body = Costs),
        (status = 400, description = responses::errors(
            "The month is not YYYY-MM.", &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
        (status = 503, description = responses::errors(
            "No price book is configured, it lacks a price the month needs, or no region \
             answered.",
            &[codes::COSTS_UNAVAILABLE, codes::REGION_UNAVAILABLE]), body = ErrorBody),
    )
)]
pub async fn costs(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Query(p): Query<CostsParams>,
) -> Result<axum::Json<Costs>, ApiError> {
    let now = Utc::now();
    let month = p.month.unwrap_or_else(|| now.format("%Y-%m").to_string());
    let period = bill::month_named(&month).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            format!("month {month:?} is not YYYY-MM"),
        )
    })?;
    let book = read_book(&state).await?;
    let ledgers = Ledgers {
        state: &state,
        tenant: &caller.tenant,
    };
    // As the export reads: the month's credits first (a credit is priced
    // as its row was billed, which can lie in an earlier month), then the
    // rows and commitments from the oldest hour one offsets.
    let (credits, mut down) = ledgers
        .read::<CreditRecords>("/v1/admin/usage/credits", period)
        .await;
    let from = bill::reads_from(period, credits.values());
    let wider = (from, period.1);
    let (credits, more_down) = if from < period.0 {
        ledgers
            .read::<CreditRecords>("/v1/admin/usage/credits", wider)
            .await
    } else {
        (credits, Vec::new())
    };
    down.extend(more_down);
    let ((commitments, commitments_down), (rows, rows_down)) = tokio::join!(
        ledgers.read::<CommitmentRecords>("/v1/admin/usage/commitments", wider),
        ledgers.read::<UsageRecords>("/v1/admin/usage/records", wider),
    );
    down.extend(commitments_down.into_iter().chain(rows_down));
    down.sort();
    down.dedup();
    if down.len() == state.regions.list.len() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::REGION_UNAVAILABLE,
            "no region answered; retry shortly",
        )
        .with_retry_after(RETRY_AFTER_S));
    }
    let lines = bill::price(
        period,
        rows.values(),
        credits.values(),
        commitments.values(),
        &book,
    )
    .map_err(|unpriced| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::COSTS_UNAVAILABLE,
            format!("the operator's price book lacks a price this month needs: {unpriced}"),
        )
    })?;
    let mut totals = LineTotals::default();
    let mut days: BTreeMap<chrono::NaiveDate, (Decimal, Decimal)> = BTreeMap::new();
    let mut skus: BTreeMap<String, (Decimal, Decimal)> = BTreeMap::new();
    for l in lines.iter().filter(|l| l.BillingAccountId == caller.tenant) {
        totals.add(l);
        let day = days.entry(l.ChargePeriodStart.date_naive()).or_default();
        day.0 += l.BilledCost;
        day.1 += l.ConsumedQuantity.unwrap_or_default();
        let sku = skus.entry(l.SkuId.clone()).or_default();
        sku.0 += l.BilledCost;
        sku.1 += l.PricingQuantity;
    }
    Ok(axum::Json(Costs {
        tenant: caller.tenant.clone(),
        month,
        currency: book.currency.clone(),
        billed: totals.cost,
        credits: -totals.credit,
        commitments: totals.committed,
        gpu_hours: totals.hours,
        credited_gpu_hours: totals.credit_hours,
        committed_gpu_hours: totals.committed_hours,
        days: (days.into_iter())
            .map(|(day, (billed, gpu_hours))| CostDay {
                day,
                billed,
                gpu_hours,
            })
            .collect(),
        skus: (skus.into_iter())
            .map(|(sku, (billed, quantity))| CostSku {
                sku,
                billed,
                quantity,
            })
            .collect(),
        regions_unavailable: down,
        as_of: now,
    }))
}

/// The operator's price book, read now (a new one applies at once).
async fn read_book(state: &GlobalState) -> Result<PriceBook, ApiError> {
    let unavailable = |why: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::COSTS_UNAVAILABLE,
            why,
        )
    };
    let path = (state.price_book.as_ref()).ok_or_else(|| {
        unavailable("this cloud prices no costs: its operator configured no price book".into())
    })?;
    let text = tokio::fs::read_to_string(path.as_path())
        .await
        .map_err(|e| {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the price book");
            unavailable("the operator's price book cannot be read; ask them".into())
        })?;
    PriceBook::parse(&text).map_err(|e| {
        tracing::warn!(path = %path.display(), error = %e, "the price book is not valid");
        unavailable("the operator's price book is not valid; ask them".into())
    })
}

/// One tenant's ledgers in every region.
struct Ledgers<'a> {
    state: &'a GlobalState,
    tenant: &'a str,
}

impl Ledgers<'_> {
    /// Every region's items of `path` over `period` (each region's own
    /// and those it holds for its peers), each id once; and the regions
    /// that did not give theirs.
    async fn read<P: LedgerPage>(
        &self,
        path: &str,
        period: Period,
    ) -> (BTreeMap<Uuid, P::Item>, Vec<String>) {
        let reads = (self.state.regions.list.iter()).map(|r| self.region::<P>(r, path, period));
        let mut items = BTreeMap::new();
        let mut down = Vec::new();
        for (region, read) in self.state.regions.list.iter().zip(join_all(reads).await) {
            match read {
                Some(page) => {
                    for item in page {
                        items.entry(P::id(&item)).or_insert(item);
                    }
                }
                None => down.push(region.name.clone()),
            }
        }
        (items, down)
    }

    /// One region's, page by page; `None` if it did not give them all.
    async fn region<P: LedgerPage>(
        &self,
        region: &Region,
        path: &str,
        period: Period,
    ) -> Option<Vec<P::Item>> {
        let time = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let actor = format!("costs:{}", self.tenant);
        let mut out = Vec::new();
        let mut after: Option<Uuid> = None;
        loop {
            let mut q = vec![
                ("from", time(period.0)),
                ("to", time(period.1)),
                ("tenant", self.tenant.to_string()),
            ];
            q.extend(after.map(|a| ("after", a.to_string())));
            let query = gangway_shared::http::query_string(&q);
            let call = Call {
                actor: Some(&actor),
                query: Some(&query),
                ..Default::default()
            };
            let answer = (self.state.regions)
                .call(region, Method::GET, path, call)
                .await
                .ok()
                .filter(|a| a.status == StatusCode::OK)?;
            let (items, next) = serde_json::from_slice::<P>(&answer.body).ok()?.into_items();
            out.extend(items);
            match next {
                Some(n) => after = Some(n),
                None => return Some(out),
            }
        }
    }
}
