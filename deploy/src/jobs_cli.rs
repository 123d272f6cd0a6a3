//! `gangway job …`: the tenant's client. Tables for people, `--json` for
//! machines; every error says what to do next.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gangway_shared::api::{Job, JobMode, JobSpec, JobState, Priority, TopologyLevel, TopologySpec};
use gangway_shared::client::ListQuery;

use crate::conn::Conn;
use uuid::Uuid;

#[derive(Subcommand, Debug)]
#[command(defer = true)]
#[allow(clippy::large_enum_variant)] // parsed once a process
pub enum JobCommand {
    /// Submit a job: `gangway job submit --gpus 8 --gpu-type h100 -- python train.py`.
    Submit {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        spec: SubmitArgs,
    },
    /// Why a job waits (or what it is doing).
    Explain {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// Show one job.
    Get {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// List jobs, newest first.
    List {
        #[command(flatten)]
        conn: Conn,
        /// Only jobs in this state.
        #[arg(long)]
        state: Option<JobState>,
        /// Only jobs with this name.
        #[arg(long)]
        name: Option<String>,
        /// At most this many jobs.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Continue after this cursor (from the previous page).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Cancel a job (its workers get SIGTERM, then SIGKILL).
    Cancel {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// A job's timeline.
    Events {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
    },
    /// A job's output: its workers' stdout and stderr, every attempt (kept
    /// off the node as they are written; 16 MiB a job at most).
    Logs {
        #[command(flatten)]
        conn: Conn,
        id: Uuid,
        /// Only this rank's (default: every rank's, each line prefixed
        /// with its rank).
        #[arg(long)]
        rank: Option<u32>,
        /// Only this attempt's.
        #[arg(long)]
        attempt: Option<i32>,
        /// Keep printing new output until the job has ended.
        #[arg(short = 'f', long)]
        follow: bool,
    },
}

/// Prints a job's output (and follows it): stdout chunks to standard
/// output, stderr chunks to standard error, prefixed `[rank N] ` per line
/// unless one rank was asked for. Exits 0.
async fn print_logs(
    conn: &Conn,
    id: Uuid,
    rank: Option<u32>,
    attempt: Option<i32>,
    follow: bool,
) -> anyhow::Result<u8> {
    use std::io::Write;
    let client = conn.client()?;
    let (mut after, mut quiet) = (String::new(), 0);
    let mut region: Option<String> = None;
    let mut missing = std::collections::BTreeSet::new();
    loop {
        let logs = client.logs(id, rank, attempt, &after).await?;
        after = logs.next_after;
        if conn.json {
            for c in &logs.chunks {
                println!("{}", serde_json::to_string(c)?);
            }
        } else {
            for r in &logs.regions_unavailable {
                if missing.insert(r.clone()) {
                    eprintln!(
                        "(region {r} did not answer: output of attempts that ran there may be \
                         missing; run this again later)"
                    );
                }
            }
            for c in &logs.chunks {
                // A job that moved between regions: say where each part ran.
                if region.as_ref().is_some_and(|r| *r != c.region) {
                    std::io::stdout().flush()?;
                    eprintln!(
                        "(from here on, output of the attempt in region {})",
                        c.region
                    );
                }
                region = Some(c.region.clone());
                let text = match rank {
                    Some(_) => c.text.clone(),
                    None => prefixed(&c.text, c.rank),
                };
                if c.stream == "stderr" {
                    eprint!("{text}");
                } else {
                    print!("{text}");
                }
            }
            std::io::stdout().flush()?;
        }
        if logs.more {
            continue;
        }
        // Followed: done once the job has ended and three reads in a row
        // found nothing more (its agent's last sync may still carry some).
        quiet = if logs.finished && logs.chunks.is_empty() {
            quiet + 1
        } else {
            0
        };
        if !follow || quiet >= 3 {
            if logs.dropped_bytes > 0 {
                eprintln!(
                    "({} bytes of output not kept: a job keeps {} bytes at most in a region)",
                    logs.dropped_bytes, logs.limit_bytes
                );
            }
            return Ok(0);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// `text` with `[rank N] ` before each line.
fn prefixed(text: &str, rank: u32) -> String {
    text.split_inclusive('\n')
        .map(|l| format!("[rank {rank}] {l}"))
        .collect()
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// A JSON job spec; flags below override its fields.
    #[arg(long)]
    file: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Total GPUs.
    #[arg(long)]
    gpus: Option<i64>,
    #[arg(long)]
    gpu_type: Option<String>,
    /// GPUs per worker process (default 1).
    #[arg(long)]
    gpus_per_worker: Option<i64>,
    /// Make the gang elastic: start with the most workers that fit, at
    /// least this many GPUs' worth (a multiple of --gpus-per-worker), and
    /// grow by a checkpointed restart as capacity frees.
    #[arg(long)]
    min_gpus: Option<i64>,
    #[arg(long)]
    priority: Option<Priority>,
    /// Estimated run time in seconds.
    #[arg(long)]
    estimated_duration_s: Option<i64>,
    /// Hard run-time limit in seconds.
    #[arg(long)]
    max_duration_s: Option<i64>,
    /// `gang` (all workers together) or `array` (independent workers).
    #[arg(long)]
    mode: Option<String>,
    /// The gang must fit in one domain of this level: nvlink, leaf, spine.
    #[arg(long)]
    require: Option<TopologyLevel>,
    /// The level the gang would like.
    #[arg(long)]
    prefer: Option<TopologyLevel>,
    /// Environment for every worker, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Idempotency key. The CLI always sends one (a fresh one by default);
    /// pass your own to make a retried submit safe across invocations.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Pin the job to a region.
    #[arg(long)]
    region: Option<String>,
    /// Run the job in this capacity reservation of yours (`gangway
    /// reservation list`); it goes to the reservation's region.
    #[arg(long, conflicts_with = "cluster")]
    reservation: Option<Uuid>,
    /// Run the job on this dedicated cluster of yours (`gangway cluster
    /// list`), and only there; it goes to the cluster's region.
    #[arg(long)]
    cluster: Option<Uuid>,
    /// Wait for the job to end, showing its progress. Exit status: 0 when
    /// it succeeded, 3 when it failed, 4 when it was cancelled.
    #[arg(long)]
    wait: bool,
    /// Show where the job would go and when it would start, without
    /// creating it.
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
    /// The command each worker runs.
    #[arg(last = true)]
    command: Vec<String>,
}

impl SubmitArgs {
    fn spec(&self) -> anyhow::Result<JobSpec> {
        let mut spec = match &self.file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                serde_json::from_str::<JobSpec>(&text)
                    .with_context(|| format!("{} is not a valid job spec", path.display()))?
            }
            None => JobSpec {
                name: String::new(),
                gpus: 0,
                gpu_type: String::new(),
                priority: Priority::Normal,
                estimated_duration_s: 3600,
                max_duration_s: None,
                command: Vec::new(),
                env: BTreeMap::new(),
                gpus_per_worker: None,
                mode: JobMode::Gang,
                min_gpus: None,
                topology: TopologySpec::default(),
                region: None,
                reservation: None,
                cluster: None,
            },
        };
        if let Some(v) = &self.name {
            spec.name = v.clone();
        }
        if let Some(v) = self.gpus {
            spec.gpus = v;
        }
        if let Some(v) = &self.gpu_type {
            spec.gpu_type = v.clone();
        }
        if self.gpus_per_worker.is_some() {
            spec.gpus_per_worker = self.gpus_per_worker;
        }
        if self.min_gpus.is_some() {
            spec.min_gpus = self.min_gpus;
        }
        if let Some(v) = self.priority {
            spec.priority = v;
        }
        if let Some(v) = self.estimated_duration_s {
            spec.estimated_duration_s = v;
        }
        if self.max_duration_s.is_some() {
            spec.max_duration_s = self.max_duration_s;
        }
        match self.mode.as_deref() {
            None => {}
            Some("gang") => spec.mode = JobMode::Gang,
            Some("array") => spec.mode = JobMode::Array,
            Some(other) => bail!("unknown mode {other:?}: use gang or array"),
        }
        if self.require.is_some() {
            spec.topology.required = self.require;
        }
        if self.prefer.is_some() {
            spec.topology.preferred = self.prefer;
        }
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
            spec.env.insert(k.to_string(), v.to_string());
        }
        if !self.command.is_empty() {
            spec.command = self.command.clone();
        }
        if self.region.is_some() {
            spec.region = self.region.clone();
        }
        if self.reservation.is_some() {
            spec.reservation = self.reservation;
        }
        if self.cluster.is_some() {
            spec.cluster = self.cluster;
        }
        if spec.name.is_empty() {
            spec.name = spec
                .command
                .first()
                .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
                .unwrap_or_else(|| "job".into());
        }
        if spec.gpus == 0 {
            bail!("say how many GPUs: --gpus N");
        }
        if spec.gpu_type.is_empty() {
            bail!("say which GPU type: --gpu-type h100 (see the region's capacity for the types it has)");
        }
        if spec.command.is_empty() {
            bail!("say what to run after `--`, for example: -- python train.py");
        }
        Ok(spec)
    }
}

/// Exit status when `--wait` saw the job fail.
pub const EXIT_JOB_FAILED: u8 = 3;
/// Exit status when `--wait` saw the job cancelled.
pub const EXIT_JOB_CANCELLED: u8 = 4;

pub async fn run(cmd: JobCommand) -> anyhow::Result<u8> {
    match cmd {
        JobCommand::Submit { conn, spec } => {
            let client = conn.client()?;
            if spec.dry_run {
                let d = client.dry_run(&spec.spec()?).await?;
                if conn.json {
                    println!("{}", serde_json::to_string_pretty(&d)?);
                } else {
                    println!("region {}: {} ({})", d.region, d.message, d.code);
                    for n in &d.nodes {
                        let gpus: Vec<String> = n.gpus.iter().map(|g| g.to_string()).collect();
                        println!("  {}  GPUs {}", n.node, gpus.join(","));
                    }
                    if let Some(at) = d.estimated_start {
                        println!("estimated start: {}", at.format("%Y-%m-%d %H:%M:%S UTC"));
                    }
                    print!("{}", would_preempt_text(&d.would_preempt));
                }
                return Ok(0);
            }
            let key = spec
                .idempotency_key
                .clone()
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            let job = client.submit(&spec.spec()?, Some(&key)).await?;
            if !spec.wait {
                print_jobs(&conn, &[job], true)?;
                return Ok(0);
            }
            eprintln!(
                "submitted {} to {} (idempotency key {key})",
                job.id, job.region
            );
            let done = wait_for(&client, job.id).await?;
            print_jobs(&conn, std::slice::from_ref(&done), true)?;
            Ok(match done.state {
                JobState::Succeeded => 0,
                JobState::Cancelled => EXIT_JOB_CANCELLED,
                _ => EXIT_JOB_FAILED,
            })
        }
        JobCommand::Get { conn, id } => {
            let job = conn.client()?.get(id).await?;
            print_jobs(&conn, &[job], true)?;
            Ok(0)
        }
        JobCommand::Explain { conn, id } => {
            let e = conn.client()?.explain(id).await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&e)?);
            } else {
                println!("{} is {} ({}): {}", e.job_id, e.state, e.code, e.message);
                if let Some(at) = e.estimated_start {
                    println!("estimated start: {}", at.format("%Y-%m-%d %H:%M:%S UTC"));
                }
            }
            Ok(0)
        }
        JobCommand::List {
            conn,
            state,
            name,
            limit,
            cursor,
        } => {
            let list = conn
                .client()?
                .list(&ListQuery {
                    name,
                    state,
                    limit: Some(limit),
                    cursor,
                })
                .await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            print_jobs(&conn, &list.jobs, false)?;
            warn_unavailable("jobs", &list.unavailable_regions);
            if let Some(c) = list.next_cursor {
                eprintln!("more: gangway job list --cursor {c}");
            }
            Ok(0)
        }
        JobCommand::Cancel { conn, id } => {
            let job = conn.client()?.cancel(id).await?;
            print_jobs(&conn, &[job], true)?;
            Ok(0)
        }
        JobCommand::Logs {
            conn,
            id,
            rank,
            attempt,
            follow,
        } => print_logs(&conn, id, rank, attempt, follow).await,
        JobCommand::Events { conn, id } => {
            let events = conn.client()?.events(id).await?;
            if conn.json {
                println!("{}", serde_json::to_string_pretty(&events)?);
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = events.events.iter().map(event_row).collect();
            print!("{}", table(&["AT", "EVENT", "DETAIL"], &rows));
            Ok(0)
        }
    }
}

/// The dry run's would-be victims, one per line; nothing when there are none.
fn would_preempt_text(victims: &[Uuid]) -> String {
    if victims.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "would preempt {} running job(s) (asked to checkpoint and stop, then requeued):\n",
        victims.len()
    );
    for v in victims {
        out.push_str(&format!("  {v}\n"));
    }
    out
}

fn event_row(e: &gangway_shared::api::JobEvent) -> Vec<String> {
    vec![
        e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
        e.kind.clone(),
        e.message.clone(),
    ]
}

/// Follows a job until it ends, printing each new event on stderr.
async fn wait_for(client: &gangway_shared::client::Client, id: Uuid) -> anyhow::Result<Job> {
    let mut seen = 0usize;
    let mut failures = 0u32;
    loop {
        // The job first, then its events: a job seen ended has its
        // `finished` event committed with that state, so it is printed.
        let step = async {
            let job = client.get(id).await?;
            let events = client.events(id).await?;
            anyhow::Ok((events, job))
        };
        match step.await {
            Ok((events, job)) => {
                failures = 0;
                for e in events.events.iter().skip(seen) {
                    let r = event_row(e);
                    eprintln!("{}  {:<16} {}", r[0], r[1], r[2]);
                }
                seen = seen.max(events.events.len());
                if job.state.is_terminal() {
                    return Ok(job);
                }
            }
            // Keep following through a blip; give up after a minute.
            Err(e) if failures < 60 => {
                failures += 1;
                tracing::debug!(error = %e, "waiting: will retry");
            }
            Err(e) => return Err(e.context("lost track of the job; `gangway job get` it later")),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

fn print_jobs(conn: &Conn, jobs: &[Job], single: bool) -> anyhow::Result<()> {
    let headers = ["ID", "NAME", "STATE", "GPUS", "REGION", "NODES", "REASON"];
    print_rows(conn, jobs, single, &headers, |j| {
        let nodes: std::collections::BTreeSet<&str> =
            j.workers.iter().filter_map(|w| w.node.as_deref()).collect();
        vec![
            j.id.to_string(),
            j.name.clone(),
            j.state.to_string(),
            gpus_cell(j),
            j.region.clone(),
            nodes.len().to_string(),
            j.reason.clone().unwrap_or_default(),
        ]
    })
}

/// `items` as JSON (one as an object when `single`, else an array), or as
/// a table of `headers` with a `row` each.
pub fn print_rows<T: serde::Serialize>(
    conn: &Conn,
    items: &[T],
    single: bool,
    headers: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if conn.json {
        if single && items.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&items[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(items)?);
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items.iter().map(row).collect();
    print!("{}", table(headers, &rows));
    Ok(())
}

/// The warning a merged list gives when some regions did not answer.
pub fn warn_unavailable(what: &str, regions: &[String]) {
    if !regions.is_empty() {
        eprintln!(
            "warning: regions not answering, their {what} are missing: {}",
            regions.join(", ")
        );
    }
}

/// `16×h100`; an elastic gang running with fewer workers: `8/16×h100`.
fn gpus_cell(j: &Job) -> String {
    let per = j.spec.gpus_per_worker();
    match j.run_workers {
        Some(n) if j.spec.min_gpus.is_some() && i64::from(n) * per < j.spec.gpus => {
            format!("{}/{}×{}", i64::from(n) * per, j.spec.gpus, j.spec.gpu_type)
        }
        _ => format!("{}×{}", j.spec.gpus, j.spec.gpu_type),
    }
}

/// Left-aligned columns separated by two spaces, no borders (what a
/// terminal shows and `awk` reads), however wide the terminal: the header,
/// then a line per row.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table};
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(headers.iter().copied())
        .add_rows(rows.iter().map(|r| r.iter().map(String::as_str)));
    let last = headers.len().saturating_sub(1);
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        column.set_cell_alignment(CellAlignment::Left);
    }
    (t.lines())
        .map(|l| l.trim_end().to_string() + "\n")
        .collect()
}

/// `gangway regions`: health and capacity per region.
pub async fn regions(conn: &Conn) -> anyhow::Result<u8> {
    let list = conn.client()?.regions().await?;
    if conn.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let mut rows = Vec::new();
    for r in &list.regions {
        let health = if r.healthy { "healthy" } else { "UNREACHABLE" };
        match &r.status {
            Some(s) if !s.capacity.is_empty() => {
                for c in &s.capacity {
                    rows.push(vec![
                        r.name.clone(),
                        health.to_string(),
                        c.gpu_type.clone(),
                        c.free.to_string(),
                        c.allocated.to_string(),
                        c.schedulable.to_string(),
                        s.queued_jobs.to_string(),
                    ]);
                }
            }
            _ => rows.push(vec![
                r.name.clone(),
                health.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
        }
    }
    print!(
        "{}",
        table(
            &[
                "REGION",
                "HEALTH",
                "GPU TYPE",
                "FREE",
                "ALLOCATED",
                "SCHEDULABLE",
                "QUEUED JOBS"
            ],
            &rows
        )
    );
    Ok(0)
}

#[derive(Args, Debug)]
pub struct UsageArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Start of the period (RFC 3339, e.g. 2026-11-01T00:00:00Z); default 7 days before --to.
    #[arg(long)]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// End of the period, exclusive; default now.
    #[arg(long)]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// hour, day or month.
    #[arg(long, value_parser = ["hour", "day", "month"])]
    pub granularity: Option<String>,
    /// gpu_type, job or region.
    #[arg(long, value_parser = ["gpu_type", "job", "region"])]
    pub group_by: Option<String>,
    /// Only this job's usage.
    #[arg(long)]
    pub job: Option<Uuid>,
}

/// `gangway usage`: the tenant's GPU time from the usage ledger: billed,
/// credited (lost to provider-caused events, not charged) and running
/// time not metered yet.
pub async fn usage(args: UsageArgs) -> anyhow::Result<u8> {
    use gangway_shared::api::{Granularity, UsageGroup, UsageQuery};
    let q = UsageQuery {
        from: args.from,
        to: args.to,
        granularity: match args.granularity.as_deref() {
            Some("hour") => Some(Granularity::Hour),
            Some("month") => Some(Granularity::Month),
            Some(_) => Some(Granularity::Day),
            None => None,
        },
        group_by: match args.group_by.as_deref() {
            Some("job") => Some(UsageGroup::Job),
            Some("region") => Some(UsageGroup::Region),
            Some(_) => Some(UsageGroup::GpuType),
            None => None,
        },
        job: args.job,
    };
    let u = args.conn.client()?.usage(&q).await?;
    if args.conn.json {
        println!("{}", serde_json::to_string_pretty(&u)?);
        return Ok(0);
    }
    let h = |s: f64| format!("{:.2}", s / 3600.0);
    let rows: Vec<Vec<String>> = u
        .rows
        .iter()
        .map(|r| {
            vec![
                r.period_start.format("%Y-%m-%d %H:%M").to_string(),
                r.key.clone(),
                h(r.gpu_seconds),
                h(r.billed_gpu_seconds),
                h(r.credited_gpu_seconds),
                h(r.pending_gpu_seconds),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "PERIOD",
                u.group_by.as_str().to_uppercase().as_str(),
                "GPU-HOURS",
                "BILLED",
                "CREDITED",
                "NOT METERED YET"
            ],
            &rows
        )
    );
    println!(
        "total {} GPU-hours from {} to {}: {} billed, {} credited, {} not metered yet",
        h(u.total_gpu_seconds),
        u.from.format("%Y-%m-%d %H:%M"),
        u.to.format("%Y-%m-%d %H:%M"),
        h(u.total_billed_gpu_seconds),
        h(u.total_credited_gpu_seconds),
        h(u.total_pending_gpu_seconds),
    );
    if u.total_credited_gpu_seconds > 0.0 {
        println!(
            "credited: GPU time lost to provider-caused events (a node lost, a drain, a region \
             failure, …) is not charged"
        );
    }
    if !u.unavailable_regions.is_empty() {
        eprintln!(
            "warning: regions not answering: {}{}",
            u.unavailable_regions.join(", "),
            if u.replicated_regions.is_empty() {
                String::new()
            } else {
                format!(
                    "; the usage of {} is from their buddies' copies (their newest rows may \
                     be missing)",
                    u.replicated_regions.join(", ")
                )
            }
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Columns as wide as their widest cell, two spaces apart, nothing
    /// after a line's last cell; a table of no rows is its header.
    #[test]
    fn a_table_is_left_aligned_columns_two_spaces_apart() {
        let rows = vec![
            vec!["a1".to_string(), "train".into(), "8×h100".into()],
            vec!["b".into(), "x".into(), "".into()],
        ];
        assert_eq!(
            table(&["JOB", "NAME", "GPUS"], &rows),
            "JOB  NAME   GPUS\na1   train  8×h100\nb    x\n"
        );
        assert_eq!(table(&["JOB", "NAME"], &[]), "JOB  NAME\n");
    }
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Submit {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn spec_of(argv: &[&str]) -> anyhow::Result<JobSpec> {
        let mut all = vec!["submit"];
        all.extend_from_slice(argv);
        Submit::try_parse_from(all)?.args.spec()
    }

    #[test]
    fn min_gpus_makes_the_gang_elastic() {
        let s = spec_of(&[
            "--gpus",
            "32",
            "--gpus-per-worker",
            "8",
            "--min-gpus",
            "16",
            "--gpu-type",
            "h100",
            "--",
            "train",
        ])
        .unwrap();
        assert_eq!(s.min_gpus, Some(16));
        assert_eq!(s.min_workers(), Some(2));
        let plain = spec_of(&["--gpus", "8", "--gpu-type", "h100", "--", "train"]).unwrap();
        assert_eq!(plain.min_gpus, None);
        assert!(!serde_json::to_string(&plain).unwrap().contains("min_gpus"));
    }

    #[test]
    fn the_dry_run_text_names_the_jobs_it_would_preempt() {
        assert_eq!(would_preempt_text(&[]), "");
        let a = Uuid::new_v4();
        let text = would_preempt_text(&[a]);
        assert!(text.starts_with("would preempt 1 running job(s)"), "{text}");
        assert!(text.contains(&format!("  {a}\n")), "{text}");
    }
}

#[derive(Args, Debug)]
pub struct CostsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The month, YYYY-MM (default: this month, UTC).
    #[arg(long)]
    pub month: Option<String>,
}

/// `gangway costs`: the tenant's costs of a month so far, per day and SKU,
/// as the billing export will bill them; money to the cent (the answer's
/// exact sums with `--json`).
pub async fn costs(args: CostsArgs) -> anyhow::Result<u8> {
    use gangway_shared::billing::cents;
    let c = args.conn.client()?.costs(args.month.as_deref()).await?;
    if args.conn.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(0);
    }
    let h = |x: gangway_shared::billing::Decimal| format!("{:.2}", x.round_dp(2));
    let cur = &c.currency;
    let days: Vec<Vec<String>> = (c.days.iter())
        .map(|d| {
            vec![
                d.day.to_string(),
                h(d.gpu_hours),
                cents(d.billed).to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["DAY", "GPU-HOURS", &format!("BILLED ({cur})")], &days)
    );
    println!();
    let skus: Vec<Vec<String>> = (c.skus.iter())
        .map(|s| vec![s.sku.clone(), h(s.quantity), cents(s.billed).to_string()])
        .collect();
    print!(
        "{}",
        table(&["SKU", "GPU-HOURS", &format!("BILLED ({cur})")], &skus)
    );
    println!(
        "{} for {}: {} {cur} so far ({} GPU-hours), of which credits {} {cur} ({} GPU-hours lost \
         to provider-caused events, not charged) and committed capacity {} {cur} ({} GPU-hours); \
         as of {} (jobs still running are added as each clock hour of theirs closes)",
        c.tenant,
        c.month,
        cents(c.billed),
        h(c.gpu_hours),
        cents(c.credits),
        h(c.credited_gpu_hours),
        cents(c.commitments),
        h(c.committed_gpu_hours),
        c.as_of.format("%Y-%m-%d %H:%M UTC"),
    );
    if !c.regions_unavailable.is_empty() {
        eprintln!(
            "warning: regions not answering: {}: their part is missing; run this again later",
            c.regions_unavailable.join(", ")
        );
    }
    Ok(0)
}
