//! An operator's pages: the regions (health, leases, replication lag),
//! each region's fleet map, the queue by tenant and GPU type, maintenance
//! plans with their waves, and the audit log.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use gangway_shared::api::{
    AuditList, MaintenancePlanList, NodeList, QueueSummary, RegionInfo, RegionList,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::api::encode;
use super::fleet::{self, FleetMap, Segment, BAR_WIDTH};
use super::{duration, failed, html, require, when, Chrome, ErrorPage, Role, Session};

/// An operator endpoint's answer: each region's document, or its error.
#[derive(Deserialize)]
struct PerRegion {
    regions: BTreeMap<String, serde_json::Value>,
}

/// Each region's answer read as `T`; a region that gave an error (or
/// something else) is named with its message.
fn split<T: DeserializeOwned>(answer: PerRegion) -> (Vec<(String, T)>, Vec<String>) {
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for (region, v) in answer.regions {
        // An error is `{code, message}` (read without copying the answer:
        // a large region's node list is most of a megabyte).
        if v.get("code").is_some() {
            let why = v["message"]
                .as_str()
                .unwrap_or("an error without a message");
            failed.push(format!("{region}: {why}"));
            continue;
        }
        match serde_json::from_value::<T>(v) {
            Ok(t) => ok.push((region, t)),
            Err(_) => failed.push(format!("{region}: an answer the console cannot read")),
        }
    }
    (ok, failed)
}

pub struct PeerCell {
    pub region: String,
    pub age: String,
    /// Within the lease.
    pub fresh: bool,
}

pub struct RegionCard {
    pub name: String,
    pub state: &'static str,
    pub last_seen: String,
    pub error: String,
    pub queued: u64,
    pub running: u64,
    pub capacity: Vec<gangway_shared::api::GpuTypeCapacity>,
    pub peers: Vec<PeerCell>,
    pub lease: String,
    pub lag: String,
    pub lag_high: bool,
}

impl RegionCard {
    fn of(r: RegionInfo) -> RegionCard {
        let status = r.status.as_ref();
        let state = match status {
            _ if !r.healthy => "unreachable",
            Some(s) if s.fenced => "fenced",
            Some(s) if s.evacuating => "evacuating",
            Some(_) => "serving",
            None => "unknown",
        };
        let lease_s = status.and_then(|s| s.lease_s);
        RegionCard {
            name: r.name.clone(),
            state,
            last_seen: r
                .last_seen_ms
                .map(|ms| duration(ms as f64 / 1000.0) + " ago")
                .unwrap_or_else(|| "never".into()),
            error: r.last_error.clone().unwrap_or_default(),
            queued: status.map_or(0, |s| s.queued_jobs),
            running: status.map_or(0, |s| s.running_jobs),
            capacity: status.map(|s| s.capacity.clone()).unwrap_or_default(),
            peers: status
                .map(|s| {
                    s.peers
                        .iter()
                        .map(|p| PeerCell {
                            region: p.region.clone(),
                            age: p
                                .round_trip_age_s
                                .map(|a| format!("{a:.1} s"))
                                .unwrap_or_else(|| "never".into()),
                            fresh: match (p.round_trip_age_s, lease_s) {
                                (Some(a), Some(l)) => a <= l,
                                _ => false,
                            },
                        })
                        .collect()
                })
                .unwrap_or_default(),
            lease: lease_s.map(|l| format!("{l:.0} s")).unwrap_or_default(),
            lag: status
                .and_then(|s| s.replication_lag_s)
                .map(|l| format!("{l:.1} s"))
                .unwrap_or_else(|| "–".into()),
            lag_high: status
                .and_then(|s| s.replication_lag_s)
                .is_some_and(|l| l > 10.0),
        }
    }
}

#[derive(Template)]
#[template(path = "regions.html")]
struct RegionsPage {
    chrome: Chrome,
    regions: Vec<RegionCard>,
}

pub async fn regions(session: Session) -> Response {
    if let Some(r) = require(&session, Role::Operator) {
        return r;
    }
    match session.api.get::<RegionList>("/v1/admin/regions").await {
        Ok(list) => html(
            StatusCode::OK,
            &RegionsPage {
                chrome: Chrome::new(&session, "Regions", "regions").live(5),
                regions: list.regions.into_iter().map(RegionCard::of).collect(),
            },
        ),
        Err(e) => failed(&session, e),
    }
}

#[derive(Deserialize, Default)]
pub struct Zoom {
    #[serde(default)]
    leaf: String,
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    chrome: Chrome,
    region: String,
    leaf: String,
    map: FleetMap,
    bar_width: f64,
    unknown: usize,
}

impl FleetPage {
    /// The link that zooms into `leaf`.
    fn zoom(&self, leaf: &str) -> String {
        format!("/fleet/{}?leaf={}", encode(&self.region), encode(leaf))
    }
}

pub async fn fleet(
    session: Session,
    Path(region): Path<String>,
    Query(z): Query<Zoom>,
) -> Response {
    if let Some(r) = require(&session, Role::Operator) {
        return r;
    }
    // Zoomed into a leaf, only its nodes are read.
    let mut q = format!("/v1/admin/nodes?region={}", encode(&region));
    if !z.leaf.is_empty() {
        q.push_str(&format!("&leaf={}", encode(&z.leaf)));
    }
    let answer = match session.api.get::<PerRegion>(&q).await {
        Ok(a) => a,
        Err(e) => return failed(&session, e),
    };
    let (mut lists, errors) = split::<NodeList>(answer);
    let Some((_, nodes)) = lists.pop() else {
        return html(
            StatusCode::BAD_GATEWAY,
            &ErrorPage {
                chrome: Chrome::new(&session, "Fleet", "regions"),
                message: format!(
                    "Region {region} did not give its nodes: {}",
                    errors.join("; ")
                ),
                hint: "A region may be unavailable: reload in a moment.",
            },
        );
    };
    let leaf = (!z.leaf.is_empty()).then_some(z.leaf.as_str());
    let map = fleet::map(&nodes.nodes, leaf);
    html(
        StatusCode::OK,
        &FleetPage {
            chrome: Chrome::new(&session, format!("Fleet of {region}"), "regions").live(5),
            region,
            leaf: z.leaf.clone(),
            map,
            bar_width: BAR_WIDTH,
            unknown: nodes.unknown.len(),
        },
    )
}

pub struct QueueLine {
    pub region: String,
    pub tenant: String,
    pub gpu_type: String,
    pub queued_jobs: u64,
    pub queued_gpus: u64,
    pub active_jobs: u64,
    pub active_gpus: u64,
    pub waiting_for: String,
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    chrome: Chrome,
    lines: Vec<QueueLine>,
    /// By tenant: queued GPUs, active GPUs (every region and type).
    tenants: Vec<(String, u64, u64)>,
    errors: Vec<String>,
}

pub async fn queue(session: Session) -> Response {
    if let Some(r) = require(&session, Role::Operator) {
        return r;
    }
    let answer = match session.api.get::<PerRegion>("/v1/admin/queue").await {
        Ok(a) => a,
        Err(e) => return failed(&session, e),
    };
    let (summaries, errors) = split::<QueueSummary>(answer);
    let now = chrono::Utc::now();
    let mut tenants: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut lines = Vec::new();
    for (region, s) in summaries {
        for r in s.rows {
            let t = tenants.entry(r.tenant.clone()).or_default();
            t.0 += r.queued_gpus;
            t.1 += r.active_gpus;
            lines.push(QueueLine {
                region: region.clone(),
                waiting_for: r
                    .oldest_queued_at
                    .map(|t| duration((now - t).num_milliseconds() as f64 / 1000.0))
                    .unwrap_or_else(|| "–".into()),
                tenant: r.tenant,
                gpu_type: r.gpu_type,
                queued_jobs: r.queued_jobs,
                queued_gpus: r.queued_gpus,
                active_jobs: r.active_jobs,
                active_gpus: r.active_gpus,
            });
        }
    }
    html(
        StatusCode::OK,
        &QueuePage {
            chrome: Chrome::new(&session, "Queue", "queue").live(5),
            lines,
            tenants: tenants.into_iter().map(|(k, (q, a))| (k, q, a)).collect(),
            errors,
        },
    )
}

pub struct PlanCard {
    pub region: String,
    pub id: String,
    pub state: String,
    pub created_by: String,
    pub created_at: String,
    pub total: u32,
    pub done: u32,
    pub steps: Vec<(String, u32)>,
    pub bar: Vec<Segment>,
    pub skipped: Vec<(String, String)>,
    pub held: String,
    pub per_leaf: u32,
    pub region_percent: u32,
}

/// Width of a plan's bar, in SVG units.
const PLAN_BAR_WIDTH: f64 = 2.0 * BAR_WIDTH;

/// The colour of a node's step in a plan's bar.
fn step_class(step: &str) -> &'static str {
    match step {
        "done" => "s-free",
        "pending" | "waiting" => "s-spare",
        "skipped" => "s-failed",
        "draining" => "s-draining",
        _ => "s-busy",
    }
}

#[derive(Template)]
#[template(path = "maintenance.html")]
struct MaintenancePage {
    chrome: Chrome,
    plans: Vec<PlanCard>,
    bar_width: f64,
    errors: Vec<String>,
}

pub async fn maintenance(session: Session) -> Response {
    if let Some(r) = require(&session, Role::Operator) {
        return r;
    }
    let answer = match session.api.get::<PerRegion>("/v1/admin/maintenance").await {
        Ok(a) => a,
        Err(e) => return failed(&session, e),
    };
    let (lists, errors) = split::<MaintenancePlanList>(answer);
    let mut all: Vec<(String, gangway_shared::api::MaintenancePlan)> = (lists.into_iter())
        .flat_map(|(r, l)| l.plans.into_iter().map(move |p| (r.clone(), p)))
        .collect();
    // Running plans first, then newest first.
    all.sort_by_key(|(_, p)| (p.state != "running", std::cmp::Reverse(p.created_at)));
    let plans: Vec<PlanCard> = (all.into_iter())
        .map(|(region, p)| PlanCard {
            bar: fleet::stacked(
                p.steps
                    .iter()
                    .map(|(step, n)| (*n as usize, step_class(step), format!("{n} {step}"))),
                p.total.max(1) as usize,
                PLAN_BAR_WIDTH,
            ),
            region,
            id: p.plan_id.to_string(),
            state: p.state.clone(),
            created_by: p.created_by.clone(),
            created_at: when(&p.created_at),
            total: p.total,
            done: p.steps.get("done").copied().unwrap_or(0),
            steps: p.steps.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            skipped: (p.skipped.iter())
                .map(|s| (s.node_id.clone(), s.reason.clone()))
                .collect(),
            held: p.held.as_ref().map(|h| h.to_string()).unwrap_or_default(),
            per_leaf: p.per_leaf,
            region_percent: p.region_percent,
        })
        .collect();
    html(
        StatusCode::OK,
        &MaintenancePage {
            chrome: Chrome::new(&session, "Maintenance", "maintenance").live(5),
            plans,
            bar_width: PLAN_BAR_WIDTH,
            errors,
        },
    )
}

pub struct AuditLine {
    pub region: String,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub reason: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    lines: Vec<AuditLine>,
    action: String,
    errors: Vec<String>,
}

#[derive(Deserialize, Default)]
pub struct AuditFilter {
    #[serde(default)]
    action: String,
}

pub async fn audit(session: Session, Query(f): Query<AuditFilter>) -> Response {
    if let Some(r) = require(&session, Role::Operator) {
        return r;
    }
    let mut q = "/v1/admin/audit?limit=200".to_string();
    if !f.action.is_empty() {
        q.push_str(&format!("&action={}", encode(&f.action)));
    }
    let answer = match session.api.get::<PerRegion>(&q).await {
        Ok(a) => a,
        Err(e) => return failed(&session, e),
    };
    let (lists, errors) = split::<AuditList>(answer);
    let mut entries: Vec<(String, gangway_shared::api::AuditEntry)> = lists
        .into_iter()
        .flat_map(|(r, l)| l.entries.into_iter().map(move |e| (r.clone(), e)))
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.1.at));
    entries.truncate(200);
    html(
        StatusCode::OK,
        &AuditPage {
            chrome: Chrome::new(&session, "Audit log", "audit").live(10),
            lines: entries
                .into_iter()
                .map(|(region, e)| AuditLine {
                    region,
                    at: when(&e.at),
                    actor: e.actor,
                    action: e.action,
                    target: e.target,
                    reason: e.reason.unwrap_or_default(),
                })
                .collect(),
            action: f.action,
            errors,
        },
    )
}
