//! The usage ledger over HTTP (docs/billing.md): a home region's rows and
//! credits held by its buddy (`POST /internal/v1/replicas/usage`,
//! `POST /internal/v1/replicas/usage/credits`), and the rows and credits an
//! operator or the global tier's billing export reads
//! (`GET /v1/admin/usage/records`, `GET /v1/admin/usage/credits`), and the
//! capacity tenants committed (`GET /v1/admin/usage/commitments`).

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use gangway_shared::billing::{
    AllocatedUsage, CommitmentRecords, CreditRecord, CreditRecords, UsageRecord, UsageRecords,
};
use gangway_shared::error::codes;
use serde::Deserialize;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Json, Query};
use super::AppState;

/// Most rows a peer sends, or a page holds.
const MAX_ROWS: usize = 5000;

/// `POST /internal/v1/replicas/usage`: holds a home's ledger rows. A row
/// held already changes nothing.
pub async fn hold(
    State(state): State<AppState>,
    Json(rows): Json<Vec<UsageRecord>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if rows.len() > MAX_ROWS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::INVALID_SPEC,
            format!(
                "at most {MAX_ROWS} usage rows at a time, not {}",
                rows.len()
            ),
        ));
    }
    if let Some(r) = rows.iter().find(|r| state.peers.peer(&r.region).is_none()) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "usage row {} is of {:?}, not a peer of this region",
                r.usage_id, r.region
            ),
        ));
    }
    if let Some(r) = rows
        .iter()
        .find(|r| !(r.ended_at >= r.started_at && r.gpus > 0))
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "usage row {} ends before it starts or holds no GPU",
                r.usage_id
            ),
        ));
    }
    let held = state.store.hold_usage(&rows).await?;
    Ok(axum::Json(serde_json::json!({ "held": held })))
}

/// The query of `GET /v1/admin/usage/records`.
#[derive(Debug, Deserialize)]
pub struct RecordsQuery {
    /// Rows overlapping [from, to) (RFC 3339).
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// The previous page's `next`.
    pub after: Option<Uuid>,
    /// Rows per page (default and most: 5000).
    pub limit: Option<usize>,
    /// Records only: `id` (the default) or `time`, (`started_at`,
    /// `usage_id`) order — the rows hour by hour, as the billing export
    /// streams them. (The credits and commitments page in id order.)
    pub order: Option<String>,
    /// Records in time order: the previous page's `next_start`, with its
    /// `next` as `after`.
    pub after_start: Option<DateTime<Utc>>,
    /// Commitments only: those of this peer, from the copies this region
    /// holds of its commitments (docs/billing.md, "A region that does not
    /// come back"), instead of this region's own.
    pub home: Option<String>,
}

impl RecordsQuery {
    /// Rows per page: `limit`, at most (and by default) [`MAX_ROWS`].
    fn page_limit(&self) -> i64 {
        self.limit.unwrap_or(MAX_ROWS).clamp(1, MAX_ROWS) as i64
    }
}

/// A period's `from` must come before its `to`.
fn check_period(from: DateTime<Utc>, to: DateTime<Utc>) -> Result<(), ApiError> {
    if from >= to {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "`from` must be before `to`",
        ));
    }
    Ok(())
}

/// `GET /v1/admin/usage/records`: the ledger rows overlapping a period —
/// this region's own and those it holds for its peers — a page at a time
/// in id order (`next`: the next page's `after`), or with `order=time` in
/// (`started_at`, `usage_id`) order (`next` and `next_start`: the next
/// page's `after` and `after_start`).
pub async fn records(
    State(state): State<AppState>,
    Query(q): Query<RecordsQuery>,
) -> Result<axum::Json<UsageRecords>, ApiError> {
    check_period(q.from, q.to)?;
    let limit = q.page_limit();
    let bad = |msg: &str| {
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            msg.to_string(),
        ))
    };
    let page = match q.order.as_deref() {
        None | Some("id") if q.after_start.is_some() => {
            return bad("`after_start` is for `order=time`");
        }
        None | Some("id") => {
            (state.store)
                .usage_records(q.from, q.to, q.tenant.as_deref(), q.after, limit)
                .await?
        }
        Some("time") => {
            let after = match (q.after_start, q.after) {
                (Some(t), Some(id)) => Some((t, id)),
                (None, None) => None,
                _ => return bad("in time order, `after` and `after_start` go together"),
            };
            (state.store)
                .usage_records_by_time(q.from, q.to, q.tenant.as_deref(), after, limit)
                .await?
        }
        Some(_) => return bad("`order` is `id` or `time`"),
    };
    Ok(axum::Json(page))
}

/// `POST /internal/v1/replicas/usage/credits`: holds a home's credits. A
/// credit held already changes nothing.
pub async fn hold_credits(
    State(state): State<AppState>,
    Json(credits): Json<Vec<CreditRecord>>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if credits.len() > MAX_ROWS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::INVALID_SPEC,
            format!(
                "at most {MAX_ROWS} credits at a time, not {}",
                credits.len()
            ),
        ));
    }
    if let Some(c) = credits
        .iter()
        .find(|c| state.peers.peer(&c.region).is_none())
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "credit {} is of {:?}, not a peer of this region",
                c.credit_id, c.region
            ),
        ));
    }
    if let Some(c) = credits.iter().find(|c| {
        !(c.ended_at >= c.started_at
            && c.gpus > 0
            && c.gpu_seconds.is_finite()
            && c.gpu_seconds >= 0.0)
    }) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SPEC,
            format!(
                "credit {} ends before it starts, holds no GPU or credits no time",
                c.credit_id
            ),
        ));
    }
    let held = state.store.hold_credits(&credits).await?;
    Ok(axum::Json(serde_json::json!({ "held": held })))
}

/// `GET /v1/admin/usage/credits`: the credits whose lost time overlaps a
/// period or that were issued in it — this region's own and those it
/// holds for its peers — a page at a time in id order (same query as
/// `GET /v1/admin/usage/records`).
pub async fn credits(
    State(state): State<AppState>,
    Query(q): Query<RecordsQuery>,
) -> Result<axum::Json<CreditRecords>, ApiError> {
    check_period(q.from, q.to)?;
    let limit = q.page_limit();
    let page = (state.store)
        .usage_credits(q.from, q.to, q.tenant.as_deref(), q.after, limit)
        .await?;
    Ok(axum::Json(page))
}

/// The query of `GET /v1/admin/usage/allocated`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocatedQuery {
    /// [from, to), RFC 3339.
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// `GET /v1/admin/usage/allocated`: per tenant, the GPU-seconds this
/// region's allocations held in a period (live placements up to the
/// meter's watermark), and its live placements — what `gangway billing
/// reconcile` compares with the merged ledger.
pub async fn allocated(
    State(state): State<AppState>,
    Query(q): Query<AllocatedQuery>,
) -> Result<axum::Json<AllocatedUsage>, ApiError> {
    check_period(q.from, q.to)?;
    Ok(axum::Json(state.store.allocated_usage(q.from, q.to).await?))
}

/// `GET /v1/admin/usage/commitments`: what each tenant had committed in
/// this region (guaranteed quotas, reservations, dedicated clusters) in a
/// period, one record per commitment and clock hour, a page at a time in
/// id order (same query as `GET /v1/admin/usage/records`); with `home`,
/// what that peer had committed, from the copies held here.
pub async fn commitments(
    State(state): State<AppState>,
    Query(q): Query<RecordsQuery>,
) -> Result<axum::Json<CommitmentRecords>, ApiError> {
    check_period(q.from, q.to)?;
    let limit = q.page_limit();
    let page = match q.home.as_deref() {
        None => {
            (state.store)
                .usage_commitments(q.from, q.to, q.tenant.as_deref(), q.after, limit)
                .await?
        }
        Some(home) if state.peers.peer(home).is_none() => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                codes::INVALID_QUERY,
                format!("{home:?} is not a peer of this region: it holds no copies of its"),
            ))
        }
        Some(home) => {
            (state.store)
                .held_usage_commitments(home, q.from, q.to, q.tenant.as_deref(), q.after, limit)
                .await?
        }
    };
    Ok(axum::Json(page))
}
