//! `gangway`: the one binary. Servers (`global`, `region`, `agent`), the local cloud
//! (`dev up`) and the tenant client (`job …`).
//!
//! # Layout
//! - `main.rs`: the command line and dispatch.
//! - `servers.rs`: `gangway region` and `gangway agent`.
//! - `dev.rs`: `gangway dev up`, the local cloud launcher.
//! - `jobs_cli.rs`: `gangway job …`, tables and `--json`.
//! - `reservations_cli.rs`: `gangway reservation …` (create, get, list,
//!   resize, delete).
//! - `clusters_cli.rs`: `gangway cluster …` (create, get, list, resize,
//!   delete, with `--wait`).
//! - `billing_cli.rs`: `gangway billing export` (FOCUS rows, priced).
//! - `admin_cli.rs`: `gangway admin …` (quotas, admission limits, job
//!   preemption, nodes, maintenance, audit).
//! - `region_cli.rs`: `gangway region evacuate | failback | status`.
//! - `conn.rs`: URL, token and CA for the client commands.
//! - `signals.rs`: Ctrl-C / SIGTERM as a cancellation token.
//! - `sim_cli.rs`: `gangway sim`, the trace simulator's command line.

mod admin_cli;
mod billing_cli;
mod clusters_cli;
mod config_file;
mod conn;
mod dev;
mod jobs_cli;
mod keys_cli;
mod loadgen;
mod login;
mod region_cli;
mod reservations_cli;
mod servers;
mod signals;
mod sim_cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gangway",
    version,
    about = "Gangway: a multi-region GPU cloud control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How servers write their log lines: `text` for people, `json` (one
    /// object a line, with a request's id, tenant and job id as fields)
    /// for a log pipeline. `dev up` passes it on to what it starts.
    #[arg(
        long,
        global = true,
        env = "GANGWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    /// Run one region's control plane (API, scheduler, reconcilers); or,
    /// with a subcommand, evacuate a whole region and fail it back
    /// (operators).
    Region(region_cli::RegionCli),
    /// Run the global tier (public HTTPS API).
    Global(servers::GlobalArgs),
    /// Run a node agent: this machine as itself (its hostname or --node-name, GPUs from NVML or --gpus/--gpu-type), or a simulated fleet (--simulate FLEET_FILE).
    Agent(servers::AgentArgs),
    /// The local cloud.
    Dev {
        #[command(subcommand)]
        command: dev::DevCommand,
    },
    /// Operator commands.
    Admin {
        #[command(subcommand)]
        command: admin_cli::AdminCommand,
    },
    /// Finance: the month's usage of every tenant, priced (docs/billing.md).
    Billing {
        #[command(subcommand)]
        command: billing_cli::BillingCommand,
    },
    /// Submit and inspect jobs.
    Job {
        #[command(subcommand)]
        command: jobs_cli::JobCommand,
    },
    /// Reserve capacity ahead of time, and manage your reservations.
    Reservation {
        #[command(subcommand)]
        command: reservations_cli::ReservationCommand,
    },
    /// Dedicated clusters: whole nodes bound to you, that only your jobs
    /// naming them run on.
    Cluster {
        #[command(subcommand)]
        command: clusters_cli::ClusterCommand,
    },
    /// Load generator for job submissions (benchmarks).
    Loadgen(loadgen::LoadgenArgs),
    /// Replay a workload trace through the scheduler core.
    Sim(sim_cli::SimArgs),
    /// Your allocated GPU time, per period, by GPU type, job or region.
    Usage(jobs_cli::UsageArgs),
    /// Your costs of a month so far, per day and SKU, as you will be billed.
    Costs(jobs_cli::CostsArgs),
    /// Failure drills: run trainer jobs on a local cloud of three regions
    /// (one of its own, or with --dev the running `gangway dev up`), break
    /// it, check the invariants, report recovery and lost work
    /// (docs/failover.md). Exits 1 when an invariant broke.
    Chaos {
        /// `region-kill`, `agent-kill`, `global-kill`, `control-plane-kill`,
        /// `database-kill`, `partition` or `database-failover` (docs/failover.md).
        drill: gangway_chaos::Drill,
        /// The short timers CI uses (leases of 3–4 s) instead of the
        /// defaults (a cloud of the drill's own; a dev cloud runs its own
        /// timers: `gangway dev up --short-timers`).
        #[arg(long, conflicts_with = "dev")]
        short_timers: bool,
        /// Drill on the running `gangway dev up` (of --state-dir) rather
        /// than on a cloud of the drill's own; what the drill breaks is
        /// mended afterwards.
        #[arg(long)]
        dev: bool,
        /// The dev cloud's state dir (with --dev).
        #[arg(long, env = "GANGWAY_STATE_DIR", default_value = ".gangway")]
        state_dir: std::path::PathBuf,
        /// Drill on a lab of machines of the drill's own (25 network
        /// namespaces, TLS on every hop, CI's short timers; needs root):
        /// the faults come from the network and the hosts — a region's
        /// every host loses power, its router leaves the WAN, or its
        /// database's primary host loses power. `region-kill`,
        /// `partition` and `database-failover` only (its timers are always
        /// CI's, or the HA ones for database-failover: --short-timers
        /// changes nothing).
        #[arg(long, conflicts_with = "dev")]
        lab: bool,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Store credentials for the CLI as a named profile (in
    /// ~/.config/gangway/credentials.toml, mode 0600), checked against the
    /// API first: `gangway login --url URL [--profile prod] [--admin]`,
    /// the token on standard input.
    Login(login::LoginArgs),
    /// API keys: `gangway key create --name ci [--scope read] [--expires 90d]`
    /// (the secret printed once), `list` with last use, `revoke`.
    Key {
        #[command(subcommand)]
        command: keys_cli::KeyCommand,
    },
    /// Forget a stored profile.
    Logout(login::LogoutArgs),
    /// Every region's health and capacity.
    Regions {
        #[command(flatten)]
        conn: conn::Conn,
    },
}

/// Logs to standard error, filtered by `GANGWAY_LOG` (an `EnvFilter`:
/// `info,gangway::access=debug` adds a line per request); and, where
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`) is set, exports
/// spans by OTLP over HTTP as service `gangway-ROLE` (or
/// `OTEL_SERVICE_NAME`): requests, the global tier's calls to regions (one
/// trace across tiers) and a region's database work (`gangway::db`). The
/// provider is flushed when the process ends.
fn init_tracing(
    format: LogFormat,
    role: &str,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter = || {
        EnvFilter::try_from_env("GANGWAY_LOG")
            .unwrap_or_else(|_| EnvFilter::new("info,tower_http=warn,refinery_core=warn"))
    };
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    // The event's fields under `fields`, its request's (request_id,
    // tenant, job_id, method, path) under `span`.
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(false)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    let provider = otlp_provider(role);
    let traces = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider;
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("gangway"))
            .with_filter(EnvFilter::new(
                "info,gangway::db=debug,tower_http=warn,refinery_core=warn",
            ))
    });
    tracing_subscriber::registry()
        .with(text)
        .with(json)
        .with(traces)
        .init();
    provider
}

/// The OTLP exporter and tracer provider, if one is configured.
fn otlp_provider(role: &str) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    let configured = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    if !configured {
        return None;
    }
    use opentelemetry_otlp::WithExportConfig;
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("warning: OTLP traces are off: {e}");
            return None;
        }
    };
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("gangway-{role}"));
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name)
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    Some(provider)
}

/// The command line, with a server role's `--config FILE` expanded
/// (`config_file.rs`); a refused setting from the file is named as such.
fn parse_cli() -> Cli {
    use clap::CommandFactory;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (args, from_file) = match config_file::expand(Cli::command, args) {
        Ok(expanded) => expanded,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            if let Some((file, keys)) = &from_file {
                let text = e.to_string();
                for key in keys.iter().filter(|k| text.contains(&format!("--{k}"))) {
                    eprintln!("error: in {}: key `{key}`:", file.display());
                }
            }
            e.exit()
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = parse_cli();
    let log_format = cli.log_format;
    if log_format == LogFormat::Json {
        // What `dev up` starts logs the same way (children inherit it);
        // no thread runs yet.
        std::env::set_var("GANGWAY_LOG_FORMAT", "json");
    }
    // A client command makes a request or a few and exits: one thread is
    // enough, and starting worker threads is a measurable part of a
    // `gangway job submit` (issue 23). Servers, drills and the load
    // generator get a worker per core.
    let one_shot = matches!(
        cli.command,
        Command::Job { .. }
            | Command::Admin { .. }
            | Command::Billing { .. }
            | Command::Reservation { .. }
            | Command::Cluster { .. }
            | Command::Regions { .. }
            | Command::Login(_)
            | Command::Key { .. }
            | Command::Logout(_)
            | Command::Usage(_)
            | Command::Costs(_)
    );
    let mut builder = if one_shot {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    // Servers log (and export traces); before the runtime, which the OTLP
    // exporter's own thread does not use.
    let role = match &cli.command {
        Command::Region(region_cli::RegionCli { command: None, .. }) => Some("region"),
        Command::Global(_) => Some("global"),
        Command::Agent(_) => Some("agent"),
        Command::Dev { .. } => Some("dev"),
        _ => None,
    };
    let traces = role.and_then(|role| init_tracing(log_format, role));
    let runtime = builder.enable_all().build().expect("a tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Region(region_cli::RegionCli {
                command: Some(command),
                ..
            }) => region_cli::run(command).await,
            Command::Region(region_cli::RegionCli { server, .. }) => {
                let args = server.ok_or_else(|| {
                    anyhow::anyhow!("gangway region: give --name and --database-url to run one, or a subcommand (evacuate, failback, status)")
                })?;
                servers::run_region(args).await.map(|()| 0)
            }
            Command::Global(args) => {
                servers::run_global(args).await.map(|()| 0)
            }
            Command::Agent(args) => {
                servers::run_agent(args).await.map(|()| 0)
            }
            Command::Dev { command } => {
                dev::run(command).await.map(|()| 0)
            }
            Command::Job { command } => jobs_cli::run(command).await,
            Command::Admin { command } => admin_cli::run(command).await,
            Command::Billing { command } => billing_cli::run(command).await,
            Command::Reservation { command } => reservations_cli::run(command).await,
            Command::Cluster { command } => clusters_cli::run(command).await,
            Command::Regions { conn } => jobs_cli::regions(&conn).await,
            Command::Login(args) => login::login(args).await.map(|()| 0),
            Command::Key { command } => keys_cli::run(command).await,
            Command::Logout(args) => login::logout(args).map(|()| 0),
            Command::Usage(args) => jobs_cli::usage(args).await,
            Command::Costs(args) => jobs_cli::costs(args).await,
            Command::Sim(args) => sim_cli::run(args),
            Command::Loadgen(args) => loadgen::run(args).await,
            Command::Chaos {
                drill,
                short_timers,
                dev,
                state_dir,
                lab,
                json,
            } => {
                let bin = std::env::current_exe()?;
                let on = if lab {
                    eprintln!(
                        "starting a lab of machines (25 network namespaces{}) for the drill…",
                        if drill == gangway_chaos::Drill::DatabaseFailover {
                            ", 29 with the Patroni cluster's"
                        } else {
                            ""
                        }
                    );
                    gangway_chaos::On::Lab { bin: &bin }
                } else if dev {
                    eprintln!(
                        "drilling {} on the dev cloud of {}…",
                        drill.as_str(),
                        state_dir.display()
                    );
                    gangway_chaos::On::Dev(&state_dir)
                } else {
                    eprintln!("starting a local cloud of three regions for the drill…");
                    gangway_chaos::On::Own {
                        bin: &bin,
                        short: short_timers,
                    }
                };
                let report = gangway_chaos::run_on(drill, on).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{report}");
                }
                Ok(if report.passed() { 0 } else { 1 })
            }
        }
    });
    if let Some(provider) = traces {
        // What the batch still holds goes out before the process ends.
        let _ = provider.shutdown();
    }
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
