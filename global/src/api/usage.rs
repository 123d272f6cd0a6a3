//! `GET /v1/usage`: a tenant's GPU time from every region's usage ledger,
//! merged so that each ledger row counts once (docs/billing.md).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::future::join_all;
use gangway_shared::api::{Usage, UsageQuery, UsageRow};
use gangway_shared::error::{codes, ErrorBody};
use gangway_shared::http::{ApiError, Query};

use super::responses;
use crate::auth::TenantCaller;
use crate::regions::Call;
use crate::state::GlobalState;

/// Usage
///
/// The tenant's GPU-seconds per period (hour, day or month), grouped by
/// GPU type, job or region, from every region's usage ledger: each row
/// counted once (a region's own copy; a buddy's copy when the region does
/// not answer), split into billed, credited (lost to provider-caused
/// events, not charged) and pending (running placements not metered yet).
/// A tenant sees only its own: another tenant's job has no usage.
#[utoipa::path(
    get,
    path = "/v1/usage",
    operation_id = "get_usage",
    tag = "usage",
    security(("bearer" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "The tenant's usage.", body = Usage),
        (status = 400, description = responses::errors(
            "The period or a parameter is malformed (`from` not before `to`, an unknown \
             granularity or grouping, a period too long for the granularity).",
            &[codes::INVALID_QUERY]), body = ErrorBody),
        (status = 401, response = responses::Unauthenticated),
        (status = 403, response = responses::Forbidden),
        (status = 429, response = responses::RateLimited),
    )
)]
pub async fn usage(
    State(state): State<GlobalState>,
    caller: TenantCaller,
    Query(q): Query<UsageQuery>,
) -> Result<axum::Json<Usage>, ApiError> {
    let window = q
        .resolve(chrono::Utc::now())
        .map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, codes::INVALID_QUERY, m))?;
    let (from, to, granularity, group_by) = window;
    // Every region answers for the same window, whatever its clock says.
    let mut query = format!(
        "from={}&to={}&granularity={}&group_by={}",
        from.to_rfc3339_opts(SecondsFormat::Micros, true),
        to.to_rfc3339_opts(SecondsFormat::Micros, true),
        granularity.as_str(),
        group_by.as_str()
    );
    if let Some(job) = q.job {
        query.push_str(&format!("&job={job}"));
    }
    let (state, tenant, query) = (&state, &caller.tenant, &query);
    let asks = state.regions.list.iter().map(|r| async move {
        let a = state
            .regions
            .call(
                r,
                Method::GET,
                "/v1/usage",
                Call {
                    tenant: Some(tenant),
                    query: Some(query),
                    ..Default::default()
                },
            )
            .await;
        (r, a)
    });
    let mut answered: BTreeMap<String, Usage> = BTreeMap::new();
    let mut unavailable_regions = Vec::new();
    for (region, answer) in join_all(asks).await {
        let part = answer
            .ok()
            .filter(|a| a.status == StatusCode::OK)
            .and_then(|a| serde_json::from_slice::<Usage>(&a.body).ok());
        match part {
            Some(u) => {
                answered.insert(region.name.clone(), u);
            }
            None => unavailable_regions.push(region.name.clone()),
        }
    }
    let (rows, replicated_regions) = merge(&answered);
    let mut usage = Usage::of(window, rows);
    usage.unavailable_regions = unavailable_regions;
    usage.replicated_regions = replicated_regions;
    Ok(axum::Json(usage))
}

/// The regions' answers merged, each ledger row once: a region's rows are
/// its own answer's (it holds every row it wrote); those of a region that
/// did not answer, the copies the others hold for it (a row is copied to
/// one buddy only). Returns the rows and the regions read from copies.
fn merge(answered: &BTreeMap<String, Usage>) -> (Vec<UsageRow>, Vec<String>) {
    let mut merged: BTreeMap<(DateTime<Utc>, String), UsageRow> = BTreeMap::new();
    let mut add = |row: &UsageRow| {
        merged
            .entry((row.period_start, row.key.clone()))
            .or_insert_with(|| UsageRow {
                period_start: row.period_start,
                key: row.key.clone(),
                ..UsageRow::default()
            })
            .add(row)
    };
    let mut replicated = std::collections::BTreeSet::new();
    for u in answered.values() {
        u.rows.iter().for_each(&mut add);
        for (origin, rows) in &u.held_for {
            if !answered.contains_key(origin) {
                rows.iter().for_each(&mut add);
                replicated.insert(origin.clone());
            }
        }
    }
    (
        merged.into_values().collect(),
        replicated.into_iter().collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gangway_shared::api::{Granularity, UsageGroup};

    fn row(key: &str, billed: f64, credited: f64) -> UsageRow {
        UsageRow {
            period_start: "2026-11-02T00:00:00Z".parse().unwrap(),
            key: key.into(),
            gpu_seconds: billed + credited,
            billed_gpu_seconds: billed,
            credited_gpu_seconds: credited,
            pending_gpu_seconds: 0.0,
        }
    }

    fn answer(own: Vec<UsageRow>, held: &[(&str, Vec<UsageRow>)]) -> Usage {
        let t = "2026-11-02T00:00:00Z".parse().unwrap();
        let mut u = Usage::of((t, t, Granularity::Day, UsageGroup::Region), own);
        u.held_for = held
            .iter()
            .map(|(o, r)| (o.to_string(), r.clone()))
            .collect();
        u
    }

    #[test]
    fn a_row_held_by_its_region_and_its_buddy_counts_once() {
        // r1's rows, also held by r2 (its buddy); r2's own.
        let r1 = answer(vec![row("r1", 100.0, 10.0)], &[]);
        let r2 = answer(
            vec![row("r2", 50.0, 0.0)],
            &[("r1", vec![row("r1", 100.0, 10.0)])],
        );
        let both: BTreeMap<String, Usage> =
            [("r1".to_string(), r1), ("r2".to_string(), r2.clone())].into();
        let (rows, copies) = merge(&both);
        assert_eq!(rows, vec![row("r1", 100.0, 10.0), row("r2", 50.0, 0.0)]);
        assert!(copies.is_empty());
        // r1 does not answer: its rows come from r2's copies, once.
        let alone: BTreeMap<String, Usage> = [("r2".to_string(), r2)].into();
        let (rows, copies) = merge(&alone);
        assert_eq!(rows, vec![row("r1", 100.0, 10.0), row("r2", 50.0, 0.0)]);
        assert_eq!(copies, ["r1"]);
    }
}
