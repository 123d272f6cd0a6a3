//! `gangway dev up`: a complete local cloud in the foreground.
//!
//! Per region: a private PostgreSQL cluster (system binaries, run as user
//! `postgres` when started as root), a `gangway region` process and a
//! `gangway agent` process serving a simulated fleet. State lives under the
//! state dir; starting again on the same dir resumes with the data kept.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gangway_devkit::{free_port, PgCluster, PgOptions};
use gangway_shared::client::Client;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::jobs_cli::table;
use crate::signals::shutdown_token;

/// The small fleet every dev region simulates unless `--fleet` says otherwise.
const DEV_FLEET: &str = include_str!("../fleets/dev.toml");
const DEFAULT_REGIONS: [&str; 3] = ["us-east", "us-west", "eu-central"];

#[derive(Subcommand, Debug)]
pub enum DevCommand {
    /// Start the local cloud in the foreground; Ctrl-C stops it.
    Up(UpArgs),
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where the cloud keeps its state (databases, logs, the env file).
    #[arg(long, default_value = ".gangway")]
    state_dir: PathBuf,
    /// Regions to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_REGIONS.map(String::from))]
    regions: Vec<String>,
    /// Fleet file each region's agent simulates (default: the built-in dev fleet).
    #[arg(long)]
    fleet: Option<PathBuf>,
    /// `real` runs jobs' commands; `sim` only waits out their estimated duration.
    #[arg(long, default_value = "real")]
    executor: String,
    /// Sim executor: a job runs `estimated_duration_s × time_factor` seconds.
    #[arg(long, default_value_t = 1.0)]
    time_factor: f64,
}

/// Ports chosen on the first start, kept so URLs stay stable across restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DevState {
    regions: BTreeMap<String, RegionPorts>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RegionPorts {
    api: u16,
    metrics: u16,
    postgres: u16,
}

struct RegionRun {
    name: String,
    ports: RegionPorts,
    pg: PgCluster,
    region: Option<Child>,
    agent: Option<Child>,
}

pub async fn run(cmd: DevCommand) -> anyhow::Result<()> {
    match cmd {
        DevCommand::Up(args) => up(args).await,
    }
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    if args.regions.is_empty() {
        bail!("--regions needs at least one region");
    }
    let dir = absolute(&args.state_dir)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create state dir {}", dir.display()))?;
    let exe = std::env::current_exe().context("cannot find the gangway binary")?;
    let fleet = match &args.fleet {
        Some(f) => absolute(f)?,
        None => {
            let path = dir.join("fleet-dev.toml");
            std::fs::write(&path, DEV_FLEET)?;
            path
        }
    };
    let state_file = dir.join("dev.json");
    let mut state: DevState = match std::fs::read(&state_file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is corrupt; delete it", state_file.display()))?,
        Err(_) => DevState::default(),
    };
    for r in &args.regions {
        let ports = state.regions.entry(r.clone()).or_insert(RegionPorts {
            api: 0,
            metrics: 0,
            postgres: 0,
        });
        for p in [&mut ports.api, &mut ports.metrics, &mut ports.postgres] {
            if *p == 0 || !port_free(*p) {
                *p = free_port();
            }
        }
    }
    std::fs::write(&state_file, serde_json::to_vec_pretty(&state)?)?;

    let shutdown = shutdown_token();
    let mut runs: Vec<RegionRun> = Vec::new();
    let result = start_all(&args, &dir, &exe, &fleet, &state, &mut runs).await;
    if let Err(e) = result {
        stop_all(&mut runs).await;
        return Err(e);
    }
    let env_file = write_env(&dir, &runs)?;
    println!();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                format!("http://127.0.0.1:{}", r.ports.api),
                format!("http://127.0.0.1:{}/metrics", r.ports.metrics),
                format!("127.0.0.1:{}", r.ports.postgres),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["REGION", "API", "METRICS", "POSTGRES"], &rows)
    );
    println!("\nReady. In another shell:\n  source {}\n  gangway job submit --gpus 8 --gpu-type h100 -- sh -c 'echo rank $RANK of $WORLD_SIZE'\nLogs: {}/logs. Ctrl-C stops everything.", env_file.display(), dir.display());

    // Run until Ctrl-C or until a process dies under us.
    let died = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if let Some(what) = find_dead(&mut runs) {
            break Some(what);
        }
    };
    println!("stopping…");
    stop_all(&mut runs).await;
    let _ = std::fs::remove_file(dir.join("env"));
    match died {
        None => {
            println!("stopped; state kept in {}", dir.display());
            Ok(())
        }
        Some(what) => bail!("{what}; see the logs in {}/logs", dir.display()),
    }
}

async fn start_all(
    args: &UpArgs,
    dir: &Path,
    exe: &Path,
    fleet: &Path,
    state: &DevState,
    runs: &mut Vec<RegionRun>,
) -> anyhow::Result<()> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    for name in &args.regions {
        let ports = state.regions[name];
        let region_dir = dir.join("regions").join(name);
        std::fs::create_dir_all(&region_dir)?;
        println!(
            "{name}: starting PostgreSQL on 127.0.0.1:{}",
            ports.postgres
        );
        let pg_dir = region_dir.join("pg");
        let opts = PgOptions {
            port: Some(ports.postgres),
            ..PgOptions::default()
        };
        let pg = tokio::task::spawn_blocking(move || -> anyhow::Result<PgCluster> {
            let mut pg = PgCluster::init_or_open(&pg_dir, opts)?;
            pg.start()?;
            Ok(pg)
        })
        .await??;
        pg.create_database("gangway").await?;
        let db = pg.connection_string("gangway");
        runs.push(RegionRun {
            name: name.clone(),
            ports,
            pg,
            region: None,
            agent: None,
        });
        let run = runs.last_mut().expect("just pushed");
        println!(
            "{name}: starting the control plane on 127.0.0.1:{}",
            ports.api
        );
        run.region = Some(spawn(
            exe,
            &[
                "region",
                "--name",
                name,
                "--listen",
                &format!("127.0.0.1:{}", ports.api),
                "--metrics-listen",
                &format!("127.0.0.1:{}", ports.metrics),
                "--database-url",
                &db,
            ],
            &logs.join(format!("{name}-region.log")),
        )?);
        println!(
            "{name}: starting the node agent ({} executor)",
            args.executor
        );
        let work_dir = region_dir.join("agent");
        run.agent = Some(spawn(
            exe,
            &[
                "agent",
                "--region-url",
                &format!("http://127.0.0.1:{}", ports.api),
                "--region",
                name,
                "--fleet",
                &fleet.to_string_lossy(),
                "--agent-id",
                &format!("{name}-agent-0"),
                "--executor",
                &args.executor,
                "--time-factor",
                &args.time_factor.to_string(),
                "--work-dir",
                &work_dir.to_string_lossy(),
            ],
            &logs.join(format!("{name}-agent.log")),
        )?);
    }
    for run in runs.iter_mut() {
        wait_ready(run).await?;
        println!("{}: ready", run.name);
    }
    Ok(())
}

/// Waits until the region answers and its agent has registered GPUs.
async fn wait_ready(run: &mut RegionRun) -> anyhow::Result<()> {
    let client = Client::new(format!("http://127.0.0.1:{}", run.ports.api), "acme");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(status) = client.region_status().await {
            if status.capacity.iter().any(|c| c.schedulable > 0) {
                return Ok(());
            }
        }
        if let Some(what) = dead_child(run) {
            bail!("{what}");
        }
        if Instant::now() > deadline {
            bail!(
                "{}: not ready after 120 s (no agent registered GPUs)",
                run.name
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn spawn(exe: &Path, args: &[&str], log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open log {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: prctl is async-signal-safe; the child dies with us even if we
    // are killed without a chance to stop it.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    Ok(Command::from(cmd).kill_on_drop(true).spawn()?)
}

fn dead_child(run: &mut RegionRun) -> Option<String> {
    for (what, child) in [
        ("control plane", &mut run.region),
        ("agent", &mut run.agent),
    ] {
        if let Some(c) = child {
            if let Ok(Some(status)) = c.try_wait() {
                *child = None;
                return Some(format!("{}: the {what} exited ({status})", run.name));
            }
        }
    }
    None
}

fn find_dead(runs: &mut [RegionRun]) -> Option<String> {
    runs.iter_mut().find_map(dead_child)
}

/// Stops agents first (they stop their workers), then control planes, then
/// databases.
async fn stop_all(runs: &mut [RegionRun]) {
    for run in runs.iter_mut() {
        terminate(run.agent.take()).await;
    }
    for run in runs.iter_mut() {
        terminate(run.region.take()).await;
    }
    for run in runs.iter_mut() {
        if let Err(e) = run.pg.stop() {
            eprintln!("{}: stopping PostgreSQL: {e:#}", run.name);
        }
    }
}

async fn terminate(child: Option<Child>) {
    let Some(mut child) = child else { return };
    if let Some(pid) = child.id() {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

fn write_env(dir: &Path, runs: &[RegionRun]) -> anyhow::Result<PathBuf> {
    let mut s = String::from("# Written by `gangway dev up`; source it in a shell.\n");
    let first = &runs[0];
    s.push_str(&format!(
        "export GANGWAY_URL=http://127.0.0.1:{}\n",
        first.ports.api
    ));
    s.push_str("export GANGWAY_TENANT=acme\n");
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    s.push_str(&format!("export GANGWAY_REGIONS={}\n", names.join(",")));
    for r in runs {
        let var = r.name.to_uppercase().replace('-', "_");
        s.push_str(&format!(
            "export GANGWAY_REGION_{var}_URL=http://127.0.0.1:{}\n",
            r.ports.api
        ));
        s.push_str(&format!(
            "export GANGWAY_REGION_{var}_METRICS_URL=http://127.0.0.1:{}/metrics\n",
            r.ports.metrics
        ));
    }
    let path = dir.join("env");
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, s)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}
