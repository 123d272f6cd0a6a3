//! A tenant's pages: its jobs (filtered, live), a job's life (timeline,
//! where it runs, why it waits, its output) and its GPU time and costs
//! this month.

use askama::Template;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{Datelike, TimeZone, Utc};
use gangway_shared::api::{
    Costs, Explanation, Job, JobEvent, JobEvents, JobList, JobLogs, JobState, RegionList, Usage,
};
use serde::Deserialize;
use uuid::Uuid;

use super::api::encode;
use super::chart::{bars, BarChart};
use super::{duration, failed, html, require, when, Chrome, ErrorPage, Role, Session};

#[derive(Deserialize, Default)]
pub struct JobsFilter {
    #[serde(default)]
    state: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    region: String,
    #[serde(default)]
    cursor: String,
}

/// A job as a row of the list.
pub struct JobRow {
    pub id: String,
    pub name: String,
    pub state: &'static str,
    pub region: String,
    pub gpus: i64,
    pub gpu_type: String,
    pub created: String,
    pub ran_for: String,
    pub preemptions: u32,
}

impl JobRow {
    fn of(j: &Job) -> JobRow {
        let end = j.finished_at.unwrap_or_else(Utc::now);
        JobRow {
            id: j.id.to_string(),
            name: j.name.clone(),
            state: j.state.as_str(),
            region: j.region.clone(),
            gpus: j.spec.gpus,
            gpu_type: j.spec.gpu_type.clone(),
            created: when(&j.created_at),
            ran_for: j
                .started_at
                .map(|s| duration((end - s).num_milliseconds() as f64 / 1000.0))
                .unwrap_or_else(|| "–".into()),
            preemptions: j.preemptions,
        }
    }
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    chrome: Chrome,
    rows: Vec<JobRow>,
    states: Vec<&'static str>,
    regions: Vec<String>,
    state: String,
    name: String,
    region: String,
    next: Option<String>,
    unavailable: Vec<String>,
}

pub async fn jobs(session: Session, Query(f): Query<JobsFilter>) -> Response {
    if let Some(r) = require(&session, Role::Tenant) {
        return r;
    }
    let mut q = String::from("/v1/jobs?limit=100");
    for (k, v) in [
        ("state", &f.state),
        ("name", &f.name),
        ("region", &f.region),
        ("cursor", &f.cursor),
    ] {
        if !v.is_empty() {
            q.push_str(&format!("&{k}={}", encode(v)));
        }
    }
    let (list, regions) = tokio::join!(
        session.api.get::<JobList>(&q),
        session.api.get::<RegionList>("/v1/regions")
    );
    let list = match list {
        Ok(l) => l,
        Err(e) => return failed(&session, e),
    };
    let next = list.next_cursor.as_ref().map(|c| {
        let mut link = format!("/jobs?cursor={}", encode(c));
        for (k, v) in [
            ("state", &f.state),
            ("name", &f.name),
            ("region", &f.region),
        ] {
            if !v.is_empty() {
                link.push_str(&format!("&{k}={}", encode(v)));
            }
        }
        link
    });
    html(
        StatusCode::OK,
        &JobsPage {
            chrome: Chrome::new(&session, "Jobs", "jobs").live(3),
            rows: list.jobs.iter().map(JobRow::of).collect(),
            states: JobState::ALL.iter().map(|s| s.as_str()).collect(),
            regions: regions
                .map(|r| r.regions.into_iter().map(|r| r.name).collect())
                .unwrap_or_default(),
            state: f.state,
            name: f.name,
            region: f.region,
            next,
            unavailable: list.unavailable_regions,
        },
    )
}

/// One entry of a job's timeline, for people.
pub struct Step {
    pub at: String,
    pub kind: String,
    pub message: String,
    /// For a placement: the level it spans and each node with its GPUs.
    pub level: String,
    pub nodes: Vec<(String, String)>,
    /// The class that colours its marker.
    pub class: &'static str,
}

impl Step {
    fn of(e: &JobEvent) -> Step {
        let nodes = e
            .detail
            .get("nodes")
            .and_then(|n| n.as_array())
            .map(|ns| {
                ns.iter()
                    .filter_map(|n| {
                        let node = n.get("node")?.as_str()?.to_string();
                        let gpus = n
                            .get("gpus")?
                            .as_array()?
                            .iter()
                            .filter_map(|g| g.as_u64().map(|g| g.to_string()))
                            .collect::<Vec<_>>()
                            .join(", ");
                        Some((node, gpus))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let class = match e.kind.as_str() {
            "queued" | "requeued" => "k-wait",
            "placed" | "started" => "k-run",
            "finished" => "k-end",
            "preempted" | "cancel_requested" | "worker_exited" => "k-stop",
            "handover" | "handed_over" | "spare_swap" => "k-move",
            _ => "k-other",
        };
        Step {
            at: when(&e.at),
            kind: e.kind.clone(),
            message: e.message.clone(),
            level: e
                .detail
                .get("level")
                .and_then(|l| l.as_str())
                .unwrap_or_default()
                .to_string(),
            nodes,
            class,
        }
    }
}

pub struct WorkerRow {
    pub rank: u32,
    pub state: String,
    pub node: String,
    pub gpus: String,
    pub exit: String,
}

pub struct LogLine {
    pub head: String,
    pub text: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    chrome: Chrome,
    job: JobRow,
    spec_gpus: String,
    reason: String,
    goodput: String,
    checkpoint: String,
    moved: String,
    steps: Vec<Step>,
    workers: Vec<WorkerRow>,
    explain: Option<(String, String, String)>,
    logs: Vec<LogLine>,
    logs_note: String,
    logs_next: Option<String>,
}

#[derive(Deserialize, Default)]
pub struct LogsAt {
    #[serde(default)]
    after: String,
}

pub async fn job(session: Session, Path(id): Path<String>, Query(at): Query<LogsAt>) -> Response {
    if let Some(r) = require(&session, Role::Tenant) {
        return r;
    }
    let Ok(id) = Uuid::parse_str(&id) else {
        return html(
            StatusCode::NOT_FOUND,
            &ErrorPage {
                chrome: Chrome::new(&session, "No such job", ""),
                message: "That is not a job id.".into(),
                hint: "Job ids look like 6f1c…-…: open one from the list of jobs.",
            },
        );
    };
    let job = match session.api.get::<Job>(&format!("/v1/jobs/{id}")).await {
        Ok(j) => j,
        Err(e) => return failed(&session, e),
    };
    let logs_q = if at.after.is_empty() {
        format!("/v1/jobs/{id}/logs")
    } else {
        format!("/v1/jobs/{id}/logs?after={}", encode(&at.after))
    };
    let waiting = !job.state.is_terminal() && job.state != JobState::Running;
    let events_q = format!("/v1/jobs/{id}/events");
    let (events, explain, logs) = tokio::join!(
        session.api.get::<JobEvents>(&events_q),
        async {
            if waiting {
                (session.api)
                    .get::<Explanation>(&format!("/v1/jobs/{id}/explain"))
                    .await
                    .ok()
            } else {
                None
            }
        },
        session.api.get::<JobLogs>(&logs_q),
    );
    let steps = match events {
        Ok(e) => e.events.iter().map(Step::of).collect(),
        Err(e) => return failed(&session, e),
    };
    let (logs, logs_note, logs_next) = match logs {
        Ok(l) => {
            let lines = l
                .chunks
                .iter()
                .map(|c| LogLine {
                    head: format!(
                        "{} · attempt {} · rank {} · {}",
                        c.region, c.attempt, c.rank, c.stream
                    ),
                    text: c.text.clone(),
                })
                .collect::<Vec<_>>();
            let mut note = format!("{} bytes kept", l.kept_bytes);
            if l.dropped_bytes > 0 {
                note.push_str(&format!(
                    ", {} bytes over the {} byte limit not kept",
                    l.dropped_bytes, l.limit_bytes
                ));
            }
            if !l.regions_unavailable.is_empty() {
                note.push_str(&format!(
                    "; not answering, may hold more: {}",
                    l.regions_unavailable.join(", ")
                ));
            }
            let next = (l.more || !l.finished)
                .then(|| format!("/jobs/{id}?after={}#logs", encode(&l.next_after)));
            (lines, note, next)
        }
        Err(e) => (Vec::new(), e.message(), None),
    };
    let live = if job.state.is_terminal() { 0 } else { 3 };
    let page = JobPage {
        chrome: Chrome::new(&session, format!("Job {}", job.name), "jobs").live(live),
        spec_gpus: format!(
            "{} {} GPUs: {} worker(s) of {}",
            job.spec.gpus,
            job.spec.gpu_type,
            job.spec.gpus / job.spec.gpus_per_worker().max(1),
            job.spec.gpus_per_worker()
        ),
        reason: job.reason.clone().unwrap_or_default(),
        goodput: job
            .goodput
            .map(|g| format!("{:.1} %", g * 100.0))
            .unwrap_or_else(|| "–".into()),
        checkpoint: job
            .checkpoint
            .as_ref()
            .map(|c| format!("{} (epoch {}, {} bytes)", c.name, c.epoch, c.size_bytes))
            .unwrap_or_default(),
        moved: match (&job.adopted_from, &job.moved_to) {
            (_, Some(to)) => format!("moved to {to}"),
            (Some(from), None) => format!("adopted from {from}"),
            (None, None) => String::new(),
        },
        workers: job
            .workers
            .iter()
            .map(|w| WorkerRow {
                rank: w.rank,
                state: format!("{:?}", w.state).to_lowercase(),
                node: w.node.clone().unwrap_or_else(|| "–".into()),
                gpus: w
                    .gpus
                    .iter()
                    .map(|g| g.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                exit: w.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            })
            .collect(),
        explain: explain.map(|e| {
            (
                e.code,
                e.message,
                e.estimated_start.map(|t| when(&t)).unwrap_or_default(),
            )
        }),
        job: JobRow::of(&job),
        steps,
        logs,
        logs_note,
        logs_next,
    };
    html(StatusCode::OK, &page)
}

/// An exact amount (the export's) as a number for charts.
fn money(d: &impl std::fmt::Display) -> f64 {
    d.to_string().parse().unwrap_or(0.0)
}

/// A month's costs for people: amounts to the cent (the export and `GET
/// /v1/costs` keep every digit), GPU-hours to two decimals.
pub struct CostView {
    pub currency: String,
    pub billed: String,
    pub billed_exact: String,
    pub credits: String,
    pub commitments: String,
    pub gpu_hours: String,
    pub skus: Vec<(String, String, String)>,
    pub as_of: String,
}

impl CostView {
    fn of(c: Costs) -> CostView {
        let cents = |d: &dyn std::fmt::Display| format!("{:.2}", money(&d.to_string()));
        CostView {
            billed: cents(&c.billed),
            billed_exact: c.billed.to_string(),
            credits: cents(&c.credits),
            commitments: cents(&c.commitments),
            gpu_hours: cents(&c.gpu_hours),
            skus: (c.skus.iter())
                .map(|s| (s.sku.clone(), cents(&s.quantity), cents(&s.billed)))
                .collect(),
            as_of: when(&c.as_of),
            currency: c.currency,
        }
    }
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    chrome: Chrome,
    month: String,
    gpu_hours: String,
    by_type: Vec<(String, String)>,
    chart: BarChart,
    costs: Option<CostView>,
    cost_chart: Option<BarChart>,
    costs_note: String,
    unavailable: Vec<String>,
}

pub async fn usage(session: Session) -> Response {
    if let Some(r) = require(&session, Role::Tenant) {
        return r;
    }
    let now = Utc::now();
    let start = Utc
        .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(now);
    let from = start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // One read: GPU time per day and GPU type, summed per day for the
    // chart and per type for the line above it.
    let usage_q = format!(
        "/v1/usage?from={}&granularity=day&group_by=gpu_type",
        encode(&from)
    );
    let (daily, costs) = tokio::join!(
        session.api.get::<Usage>(&usage_q),
        session.api.get::<Costs>("/v1/costs"),
    );
    let daily = match daily {
        Ok(u) => u,
        Err(e) => return failed(&session, e),
    };
    // Every day of the month so far is drawn, with nothing as 0.
    let days = (now - start).num_days() + 1;
    let per_day = |value: &dyn Fn(chrono::NaiveDate) -> f64| -> Vec<(String, f64)> {
        (0..days)
            .map(|d| {
                let day = (start + chrono::Duration::days(d)).date_naive();
                (day.format("%d").to_string(), value(day))
            })
            .collect()
    };
    let points = per_day(&|day| {
        (daily.rows.iter())
            .filter(|r| r.period_start.date_naive() == day)
            .map(|r| r.gpu_seconds / 3600.0)
            .sum()
    });
    let mut types: std::collections::BTreeMap<&str, f64> = Default::default();
    for r in &daily.rows {
        *types.entry(r.key.as_str()).or_default() += r.gpu_seconds;
    }
    let by_type = (types.into_iter())
        .map(|(t, s)| (t.to_string(), format!("{:.2}", s / 3600.0)))
        .collect();
    let (costs, cost_chart, costs_note) = match costs {
        Ok(c) => {
            let pts = per_day(&|day| {
                (c.days.iter())
                    .filter(|x| x.day == day)
                    .map(|x| money(&x.billed))
                    .sum()
            });
            let chart = bars(&pts, &c.currency);
            (Some(CostView::of(c)), Some(chart), String::new())
        }
        Err(e) => (None, None, e.message()),
    };
    html(
        StatusCode::OK,
        &UsagePage {
            chrome: Chrome::new(&session, "Usage", "usage").live(30),
            month: start.format("%B %Y").to_string(),
            gpu_hours: format!("{:.2}", daily.total_gpu_seconds / 3600.0),
            by_type,
            chart: bars(&points, "GPU-hours"),
            costs,
            cost_chart,
            costs_note,
            unavailable: daily.unavailable_regions,
        },
    )
}
