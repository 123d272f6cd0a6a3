//! `gangway region …`: with no subcommand, runs a region's control plane
//! (`servers.rs`); with one, operators evacuate a whole region and fail it
//! back through the global tier (docs/failover.md, "Planned evacuation and
//! fail back").

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use gangway_shared::api::{Evacuation, EvacuationState};
use reqwest::Method;

use crate::conn::Conn;
use crate::jobs_cli::table;
use crate::servers::RegionArgs;

/// `gangway region`: a server's flags, or an operator's subcommand.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct RegionCli {
    #[command(subcommand)]
    pub command: Option<RegionCommand>,
    #[command(flatten)]
    pub server: Option<RegionArgs>,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum RegionCommand {
    /// Evacuate a whole region: it takes no new jobs (they go to the other
    /// regions), places nothing, and hands every live job to another
    /// region through a checkpoint, with zero lost work. Prints progress
    /// until the region is evacuated (or `--no-wait`).
    Evacuate {
        #[command(flatten)]
        conn: Conn,
        /// The region.
        name: String,
        /// Why, for the audit log.
        #[arg(long)]
        reason: Option<String>,
        /// Return once the evacuation has started.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting (exit 1) after this many seconds.
        #[arg(long, default_value_t = 3600)]
        wait_s: u64,
    },
    /// Fail a region back: it takes work again, and the jobs moved away
    /// from it come back the same way. Prints progress until every one is
    /// back (or `--no-wait`).
    Failback {
        #[command(flatten)]
        conn: Conn,
        name: String,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        no_wait: bool,
        #[arg(long, default_value_t = 3600)]
        wait_s: u64,
    },
    /// Where a region's evacuation (or fail back) stands: state, jobs left,
    /// moved and held, each job's step and where it goes.
    Status {
        #[command(flatten)]
        conn: Conn,
        name: String,
    },
}

/// Runs an operator's subcommand; the exit code.
pub async fn run(cmd: RegionCommand) -> anyhow::Result<u8> {
    match cmd {
        RegionCommand::Evacuate {
            conn,
            name,
            reason,
            no_wait,
            wait_s,
        } => {
            let wait = (!no_wait).then_some(Duration::from_secs(wait_s));
            act(
                &conn,
                &name,
                "evacuate",
                reason,
                wait,
                EvacuationState::Evacuated,
            )
            .await
        }
        RegionCommand::Failback {
            conn,
            name,
            reason,
            no_wait,
            wait_s,
        } => {
            let wait = (!no_wait).then_some(Duration::from_secs(wait_s));
            act(
                &conn,
                &name,
                "failback",
                reason,
                wait,
                EvacuationState::None,
            )
            .await
        }
        RegionCommand::Status { conn, name } => {
            let client = conn.admin_client()?;
            let e = fetch(&client, &name).await?;
            print_final(&conn, &e)?;
            Ok(0)
        }
    }
}

fn path(name: &str, what: &str) -> String {
    format!("/v1/admin/regions/{name}/{what}")
}

async fn fetch(client: &gangway_shared::client::Client, name: &str) -> anyhow::Result<Evacuation> {
    let doc = client
        .call_json(Method::GET, &path(name, "evacuation"), None)
        .await?;
    Ok(serde_json::from_value(doc)?)
}

/// Asks for the evacuation or the fail back, then (waiting) polls its
/// progress until the region is `done`, printing each change.
async fn act(
    conn: &Conn,
    name: &str,
    what: &str,
    reason: Option<String>,
    wait: Option<Duration>,
    done: EvacuationState,
) -> anyhow::Result<u8> {
    let client = conn.admin_client()?;
    let body = serde_json::json!({ "reason": reason });
    let doc = client
        .call_json(Method::POST, &path(name, what), Some(&body))
        .await?;
    let mut e: Evacuation = serde_json::from_value(doc)?;
    let Some(wait) = wait else {
        print_final(conn, &e)?;
        return Ok(0);
    };
    let deadline = Instant::now() + wait;
    let mut last = String::new();
    loop {
        let line = progress(&e);
        if line != last {
            // Progress goes where it does not mix with `--json`'s document.
            if conn.json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            last = line;
        }
        if e.state == done && e.jobs_left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            print_final(conn, &e)?;
            eprintln!(
                "region {name} is not {} after {} s; `gangway region status {name}` follows it",
                done.as_str(),
                wait.as_secs()
            );
            return Ok(1);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        match fetch(&client, name).await {
            Ok(now) => e = now,
            // The region may not answer for a moment: keep following.
            Err(err) => eprintln!("(cannot read the progress now: {err})"),
        }
    }
    print_final(conn, &e)?;
    Ok(0)
}

/// One line of progress: the state, the counts, and where each job in
/// flight or moved goes.
fn progress(e: &Evacuation) -> String {
    let mut line = format!(
        "region {}: {} — {} left, {} moved, {} held",
        e.region,
        e.state.as_str(),
        e.jobs_left,
        e.moved,
        e.held
    );
    let jobs: Vec<String> = e
        .jobs
        .iter()
        .filter(|j| j.step != "held")
        .map(|j| match &j.to {
            Some(to) => format!("{} {} {to}", short(j.job_id), j.step),
            None => format!("{} {}", short(j.job_id), j.step),
        })
        .collect();
    if !jobs.is_empty() {
        line.push_str(&format!(" [{}]", jobs.join(", ")));
    }
    line
}

fn short(id: uuid::Uuid) -> String {
    id.to_string()[..8].to_string()
}

fn print_final(conn: &Conn, e: &Evacuation) -> anyhow::Result<()> {
    if conn.json {
        println!("{}", serde_json::to_string_pretty(e)?);
        return Ok(());
    }
    println!(
        "region {}: {} ({} left, {} moved, {} held){}",
        e.region,
        e.state.as_str(),
        e.jobs_left,
        e.moved,
        e.held,
        match (&e.actor, e.since) {
            (Some(a), Some(t)) => format!(", asked by {a} at {}", t.to_rfc3339()),
            _ => String::new(),
        }
    );
    if !e.jobs.is_empty() {
        let rows: Vec<Vec<String>> = e
            .jobs
            .iter()
            .map(|j| {
                vec![
                    j.job_id.to_string(),
                    j.tenant.clone(),
                    j.name.clone(),
                    j.step.clone(),
                    j.to.clone().unwrap_or_default(),
                    j.epoch.to_string(),
                    j.restore_from.clone().unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "JOB",
                    "TENANT",
                    "NAME",
                    "STEP",
                    "REGION",
                    "EPOCH",
                    "RESUMES FROM"
                ],
                &rows
            )
        );
    }
    Ok(())
}
