//! Goodput, and the usage ledger for finance: records, credits,
//! commitments, allocated GPU time and closings, page by page from every
//! region (or one).

use axum::extract::State;
use axum::http::{Method, StatusCode};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Query};
use serde::Deserialize;
use utoipa::IntoParams;

use super::responses;
use crate::auth::AdminCaller;
use crate::state::GlobalState;

use super::{fan_out, PerRegion, RegionParam};

/// Goodput per tenant
///
/// Per region (or the one named), each tenant's allocated GPU time, the
/// part of it lost to restarts (work after the last checkpoint of runs
/// that were stopped and requeued), and goodput: useful over allocated.
#[utoipa::path(
    get,
    path = "/v1/admin/goodput",
    operation_id = "goodput",
    tag = "admin",
    security(("bearer" = [])),
    params(RegionParam),
    responses(
        (status = 200, description = "Each region's `GoodputList`, by region name.", body = PerRegion),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn goodput(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<RegionParam>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    Ok(axum::Json(
        fan_out(
            &state,
            p.region.as_deref(),
            Method::GET,
            "/v1/admin/goodput",
            None,
            Some(&admin.subject),
            None,
        )
        .await?,
    ))
}

/// The query of `GET /v1/admin/usage/records` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageRecordsParams {
    /// The region whose ledger to read (its own rows and those it holds
    /// for its peers); default: every region's first page.
    pub region: Option<String>,
    /// Rows overlapping [from, to), RFC 3339.
    pub from: String,
    pub to: String,
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// The previous page's `next`.
    pub after: Option<String>,
    /// Rows per page (at most 5000).
    pub limit: Option<u32>,
    /// Usage records only: `id` (the default) or `time` — in
    /// (`started_at`, `usage_id`) order, so clock hour by clock hour, as
    /// the billing export streams them.
    pub order: Option<String>,
    /// Usage records in time order: the previous page's `next_start`
    /// (RFC 3339), with its `next` as `after`.
    pub after_start: Option<String>,
    /// Commitments only: those of this region, from the copies its peers
    /// hold (every peer holds them: docs/billing.md, "A region that does
    /// not come back"); each answer says when that peer last heard from
    /// it (`heard_at`).
    pub home: Option<String>,
}

/// A period of the ledger endpoints, checked here so that a bad one is
/// one 400 `invalid_query`, not an error from every region.
fn check_period(from: &str, to: &str) -> Result<(), ApiError> {
    let parse = |name: &str, v: &str| {
        chrono::DateTime::parse_from_rfc3339(v).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_QUERY,
                format!("`{name}` is not an RFC 3339 time ({e})"),
            )
        })
    };
    if parse("from", from)? >= parse("to", to)? {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "`from` must be before `to`",
        ));
    }
    Ok(())
}

/// Read a region's usage ledger
///
/// One page of the usage ledger rows of one region, or of each (its own
/// and those it holds for its peers), overlapping a period, in id order
/// — or with `order=time` in (`started_at`, `usage_id`) order, clock hour
/// by clock hour: what the billing export merges from every region as a
/// stream (`gangway billing export`). A region's next page is asked of it
/// by name with `after` (its `next`) and, in time order, `after_start`
/// (its `next_start`).
#[utoipa::path(
    get,
    path = "/v1/admin/usage/records",
    operation_id = "usage_records",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: UsageRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_records(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/records").await
}

/// Read a region's credits
///
/// One page of the credits of one region, or of each (its own and those
/// it holds for its peers): GPU time lost to provider-caused events, not
/// charged (docs/billing.md). Those whose lost time overlaps [from, to) or
/// that were issued in it, in id order; the same query as
/// `/v1/admin/usage/records`.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/credits",
    operation_id = "usage_credits",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: CreditRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_credits(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/credits").await
}

/// Read a region's committed capacity
///
/// One page of what each tenant had committed in one region, or in each —
/// guaranteed quotas, capacity reservations and dedicated clusters, billed
/// whether used or not (docs/billing.md) — one record per commitment and
/// clock hour of [from, to): its GPU-seconds (a reservation resized
/// mid-hour holds each size for its part; a deleted one, until it was
/// deleted), in id order; the same query as `/v1/admin/usage/records`.
/// What the billing export prices as commitments.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/commitments",
    operation_id = "usage_commitments",
    tag = "admin",
    security(("bearer" = [])),
    params(UsageRecordsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: CommitmentRecords}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_commitments(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<UsageRecordsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    ledger_page(&state, &admin, &p, "/v1/admin/usage/commitments").await
}

/// The order of a ledger page, checked here like its period: `order` and
/// `after_start` are the usage records' (`order` `id` or `time`;
/// `after_start` an RFC 3339 time, in time order only).
fn check_order(p: &UsageRecordsParams, path: &str) -> Result<(), ApiError> {
    let bad = |msg: String| {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            msg,
        ))
    };
    if path != "/v1/admin/usage/commitments" && p.home.is_some() {
        return bad(format!(
            "`home` is for /v1/admin/usage/commitments (for closed placements: \
             /v1/admin/usage/closings), not {path}"
        ));
    }
    if path != "/v1/admin/usage/records" && (p.order.is_some() || p.after_start.is_some()) {
        return bad(format!(
            "`order` and `after_start` are for /v1/admin/usage/records; {path} pages in id order"
        ));
    }
    match p.order.as_deref() {
        None | Some("id") if p.after_start.is_some() => {
            bad("`after_start` is for `order=time`".into())
        }
        None | Some("id") => Ok(()),
        Some("time") => match (&p.after_start, &p.after) {
            (Some(t), Some(_)) => match chrono::DateTime::parse_from_rfc3339(t) {
                Ok(_) => Ok(()),
                Err(e) => bad(format!("`after_start` is not an RFC 3339 time ({e})")),
            },
            (None, None) => Ok(()),
            _ => bad("in time order, `after` and `after_start` go together".into()),
        },
        Some(o) => bad(format!("`order` is `id` or `time`, not {o:?}")),
    }
}

/// One page of a ledger of one region, or of each (`path`: the region's
/// records, credits or commitments), for the query `p`.
async fn ledger_page(
    state: &GlobalState,
    admin: &AdminCaller,
    p: &UsageRecordsParams,
    path: &str,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    check_order(p, path)?;
    let mut q = vec![("from", p.from.clone()), ("to", p.to.clone())];
    q.extend(p.tenant.clone().map(|t| ("tenant", t)));
    q.extend(p.after.clone().map(|a| ("after", a)));
    q.extend(p.limit.map(|l| ("limit", l.to_string())));
    q.extend(p.order.clone().map(|o| ("order", o)));
    q.extend(p.after_start.clone().map(|t| ("after_start", t)));
    q.extend(p.home.clone().map(|h| ("home", h)));
    usage_of_each(state, admin, p.region.as_deref(), path, &q).await
}

/// The query of `GET /v1/admin/usage/allocated` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AllocatedParams {
    /// Only this region (default: every region).
    pub region: Option<String>,
    /// [from, to), RFC 3339.
    pub from: String,
    pub to: String,
}

/// GPU time the allocations held
///
/// Per region (or the one named), each tenant's GPU-seconds its
/// allocations held in [from, to) — a live placement only up to the hour
/// the region's meter has written (`metered_until`) — and the placements
/// live at the read, all from one snapshot of the region's database: what
/// `gangway billing reconcile` compares with the merged usage ledger.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/allocated",
    operation_id = "usage_allocated",
    tag = "admin",
    security(("bearer" = [])),
    params(AllocatedParams),
    responses(
        (status = 200, description = "`{regions: {NAME: AllocatedUsage}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_allocated(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<AllocatedParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    let q = [("from", p.from.clone()), ("to", p.to.clone())];
    usage_of_each(
        &state,
        &admin,
        p.region.as_deref(),
        "/v1/admin/usage/allocated",
        &q,
    )
    .await
}

/// `GET path?query` of one region (`region`) or of each, as the admin
/// `admin`: the usage endpoints' fan-out.
async fn usage_of_each(
    state: &GlobalState,
    admin: &AdminCaller,
    region: Option<&str>,
    path: &str,
    query: &[(&str, String)],
) -> Result<axum::Json<PerRegion>, ApiError> {
    let query = gangway_shared::http::query_string(query);
    Ok(axum::Json(
        fan_out(
            state,
            region,
            Method::GET,
            path,
            None,
            Some(&admin.subject),
            Some(&query),
        )
        .await?,
    ))
}

/// The query of `GET /v1/admin/usage/closings` (docs/billing.md).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ClosingsParams {
    /// Only this region (default: every region).
    pub region: Option<String>,
    /// [from, to), RFC 3339.
    pub from: String,
    pub to: String,
    /// Only the closings of this home's placements.
    pub home: Option<String>,
}

/// Read the placements adopters closed
///
/// Per region (or the one named), the hours of a dead home's last
/// placements that the region closed when it adopted their jobs —
/// shaped as ledger rows of the home, from the newest row it held of each
/// to the last time it heard from the home — and the credits of the work
/// those placements lost (docs/billing.md, "A region that does not come
/// back"). They count only where the home is billed from its copies
/// (`gangway billing export --from-copies HOME`): a home that answers
/// bills its own placements.
#[utoipa::path(
    get,
    path = "/v1/admin/usage/closings",
    operation_id = "usage_closings",
    tag = "admin",
    security(("bearer" = [])),
    params(ClosingsParams),
    responses(
        (status = 200, description = "`{regions: {NAME: Closings}}`.", body = PerRegion),
        (status = 400, description = responses::errors(
            "A query parameter is missing or malformed, or `from` is not before `to`.",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 422, description = responses::errors(
            "No region has the name given in `region`.",
            &[codes::WRONG_REGION]), body = ErrorBody),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage_closings(
    State(state): State<GlobalState>,
    admin: AdminCaller,
    Query(p): Query<ClosingsParams>,
) -> Result<axum::Json<PerRegion>, ApiError> {
    check_period(&p.from, &p.to)?;
    let mut q = vec![("from", p.from.clone()), ("to", p.to.clone())];
    q.extend(p.home.clone().map(|h| ("home", h)));
    usage_of_each(
        &state,
        &admin,
        p.region.as_deref(),
        "/v1/admin/usage/closings",
        &q,
    )
    .await
}
