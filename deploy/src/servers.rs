//! `gangway region` and `gangway agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gangway_agent::{nodes_from_fleet, AgentConfig, ExecutorKind};
use gangway_regional::RegionConfig;
use gangway_shared::fleet::FleetFile;

use crate::signals::shutdown_token;

#[derive(Args, Debug)]
pub struct RegionArgs {
    /// The region's name.
    #[arg(long, env = "GANGWAY_REGION")]
    pub name: String,
    /// Address of the regional API.
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen: SocketAddr,
    /// Address of the Prometheus /metrics listener (kept apart from the API).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// The region's PostgreSQL, as a libpq connection string.
    #[arg(long, env = "GANGWAY_DATABASE_URL")]
    pub database_url: String,
    /// Longest time between scheduling passes, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub schedule_interval_ms: u64,
    /// How often agents sync, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub agent_sync_interval_ms: u64,
    /// Seconds of agent silence after which its nodes take no new work.
    #[arg(long, default_value_t = 15)]
    pub agent_timeout_s: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping a worker.
    #[arg(long, default_value_t = 10)]
    pub grace_period_s: u64,
    /// Seconds to wait for the database at start-up.
    #[arg(long, default_value_t = 60)]
    pub database_wait_s: u64,
}

pub async fn run_region(args: RegionArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics_listen {
        metrics_exporter_prometheus_install(addr)?;
    }
    let mut config = RegionConfig::new(&args.name, args.listen, &args.database_url);
    config.schedule_interval = Duration::from_millis(args.schedule_interval_ms);
    config.agent_sync_interval = Duration::from_millis(args.agent_sync_interval_ms);
    config.agent_timeout = Duration::from_secs(args.agent_timeout_s);
    config.grace_period = Duration::from_secs(args.grace_period_s);
    let shutdown = shutdown_token();
    let state =
        gangway_regional::prepare(config, Duration::from_secs(args.database_wait_s)).await?;
    gangway_regional::serve(state, shutdown).await
}

fn metrics_exporter_prometheus_install(addr: SocketAddr) -> anyhow::Result<()> {
    gangway_regional::telemetry::install_prometheus(addr)
        .with_context(|| format!("cannot serve metrics on {addr}"))
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// The regional control plane's URL.
    #[arg(long, env = "GANGWAY_REGION_URL")]
    pub region_url: String,
    /// The region's name (node ids derive from it).
    #[arg(long, env = "GANGWAY_REGION")]
    pub region: String,
    /// Fleet file (TOML) describing the simulated nodes this agent serves.
    #[arg(long)]
    pub fleet: PathBuf,
    /// This agent's id (stable across restarts).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// `real` runs each worker's command; `sim` only waits out its duration.
    #[arg(long, default_value = "real")]
    pub executor: String,
    /// Sim executor: a job runs `estimated_duration_s × time_factor` seconds.
    #[arg(long, default_value_t = 1.0)]
    pub time_factor: f64,
    /// Where real workers run and log.
    #[arg(long, default_value = ".gangway/agent")]
    pub work_dir: PathBuf,
    /// Address workers of this agent's nodes reach each other at.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
}

pub async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let fleet = FleetFile::load(&args.fleet)
        .with_context(|| format!("cannot load fleet file {}", args.fleet.display()))?;
    let executor = match args.executor.as_str() {
        "real" => ExecutorKind::Real,
        "sim" => ExecutorKind::Sim,
        other => anyhow::bail!("unknown executor {other:?}: use real or sim"),
    };
    let config = AgentConfig {
        region_url: args.region_url,
        agent_id: args
            .agent_id
            .unwrap_or_else(|| format!("{}-agent", args.region)),
        nodes: nodes_from_fleet(&fleet, &args.region, &args.address),
        executor,
        time_factor: args.time_factor,
        work_dir: args.work_dir,
        default_sync_interval: Duration::from_secs(1),
    };
    gangway_agent::run(config, shutdown_token()).await
}
