//! `gangway dev up`: a complete local cloud in the foreground.
//!
//! Per region: a private PostgreSQL cluster (system binaries, run as user
//! `postgres` when started as root), a `gangway region` process and a
//! `gangway agent` process serving a simulated fleet. In front of them,
//! `gangway global` replicas on HTTPS with a dev CA. State (databases, CA,
//! signing keys, logs) lives under the state dir; starting again on the
//! same dir resumes with the data and keys kept.
//!
//! The processes are held by a [`Supervisor`]: one that exits on its own
//! is started again. Links between regions, and from the global tier to
//! each, go through proxies, and a control API on loopback
//! ([`gangway_chaos::control`]) lets `gangway chaos <drill> --dev` break
//! and mend any part of the running cloud.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_chaos::cloud::{DRILL_TIMERS, HA_TIMERS, SHORT_TIMERS};
use gangway_chaos::control;
use gangway_chaos::procs::Proxy;
use gangway_chaos::supervisor::{Launch, Link, RegionInfo, RegionParts, Supervisor};
use gangway_devkit::{free_port, PatroniCluster, PatroniOptions, PgCluster, PgOptions};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use serde::{Deserialize, Serialize};

use crate::jobs_cli::table;
use crate::signals::shutdown_token;

/// The small fleet every dev region simulates unless `--fleet` says otherwise.
const DEV_FLEET: &str = include_str!("../fleets/dev.toml");
const DEFAULT_REGIONS: [&str; 3] = ["us-east", "us-west", "eu-central"];

#[derive(Subcommand, Debug)]
#[command(defer = true)]
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
    /// Replicas of the global tier (the env file's GANGWAY_URL is the
    /// first; GANGWAY_GLOBAL_REPLICAS lists all).
    #[arg(long, default_value_t = 2)]
    globals: usize,
    /// The short timers CI's drills use (regions' leases of 3–4 s, a fast
    /// scheduler) instead of the defaults.
    #[arg(long)]
    short_timers: bool,
    /// One simulated agent per leaf (rack) instead of one per region, so
    /// that syncs arrive as they would from many machines (each region's
    /// agent process runs them all; each has its own token).
    #[arg(long)]
    agent_per_leaf: bool,
    /// Seconds a queued job waits in its region before it goes to its
    /// buddy region when that one has room for it now (each region's
    /// `--balance-after-s`; 0: never; default: the region's).
    #[arg(long)]
    balance_after_s: Option<u64>,
    /// Each region's database: `single`, one PostgreSQL server (kept
    /// across restarts); `ha`, a three-member Patroni cluster (a primary
    /// and a synchronous standby, one etcd per region; needs the Debian
    /// packages `patroni` and `etcd-server`), fresh on every start, with
    /// the regions' lease at 30 s so that a failover passes without
    /// fencing (docs/operations.md).
    #[arg(long, value_enum, default_value_t = DbKind::Single)]
    db: DbKind,
    /// A further PostgreSQL setting for every region's database, as
    /// `NAME=VALUE` (repeat the flag for more), e.g.
    /// `shared_preload_libraries=pg_stat_statements` to see where a
    /// request's database time goes (docs/benchmarks.md).
    #[arg(long = "pg-setting", value_name = "NAME=VALUE", value_parser = pg_setting)]
    pg_settings: Vec<(String, String)>,
}

/// `NAME=VALUE` of `--pg-setting`.
fn pg_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v)) if !n.trim().is_empty() => Ok((n.trim().to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not NAME=VALUE (e.g. track_functions=pl)")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DbKind {
    Single,
    Ha,
}

/// The regions' lease with `--db ha`: longer than a Patroni failover
/// (ttl 10 s, loop_wait 2 s: about 10–12 s), so a region rides it out.
const HA_LEASE_S: &str = "30";

/// Ports chosen on the first start, kept so URLs stay stable across restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DevState {
    regions: BTreeMap<String, RegionPorts>,
    /// The global tier's first replica (the env file's `GANGWAY_URL`).
    #[serde(default)]
    global: GlobalPorts,
    /// Its other replicas.
    #[serde(default)]
    more_globals: Vec<GlobalPorts>,
    /// The control API the drills use (`gangway chaos <drill> --dev`).
    #[serde(default)]
    control: u16,
}

#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
struct GlobalPorts {
    api: u16,
    metrics: u16,
}

/// How long the tokens written to the env file live.
const DEV_TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RegionPorts {
    api: u16,
    metrics: u16,
    postgres: u16,
    /// The region's agent's metrics (a state file from before it had one
    /// gets one chosen).
    #[serde(default)]
    agent_metrics: u16,
}

/// How long a stopping process has after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A process that exits on its own this often within [`CRASH_WINDOW`]
/// stops the cloud instead of being started again.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);

pub async fn run(cmd: DevCommand) -> anyhow::Result<()> {
    match cmd {
        DevCommand::Up(args) => up(args).await,
    }
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Keeps a port chosen earlier if it is still free, or chooses another.
fn keep_or_choose(port: &mut u16) {
    if *port == 0 || !port_free(*port) {
        *port = free_port();
    }
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    if args.regions.is_empty() {
        bail!("--regions needs at least one region");
    }
    if args.globals == 0 {
        bail!("--globals needs at least one replica");
    }
    let dir = absolute(&args.state_dir)?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create state dir {}", dir.display()))?;
    // The drills' shared directory, bound into every sandbox: jobs cross
    // it to their drill's, which they may write (docs/failover.md).
    let chaos = dir.join("chaos");
    std::fs::create_dir_all(&chaos)?;
    std::fs::set_permissions(&chaos, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    if args.executor == "real" {
        if !is_root() {
            println!(
                "not running as root: workers run as your own user, with this cloud's keys and \
                 tokens in their reach (run as root for per-tenant users and the sandbox)"
            );
        } else if !on_path("bwrap") {
            bail!(
                "workers run in a bubblewrap sandbox as their tenants' users (docs/jobs.md), and \
                 bwrap is not installed: apt-get update && apt-get install -y bubblewrap \
                 (or use --executor sim, which runs no processes)"
            );
        }
    }
    let exe = std::env::current_exe().context("cannot find the gangway binary")?;
    let fleet = match &args.fleet {
        Some(f) => absolute(f)?,
        None => {
            let path = dir.join("fleet-dev.toml");
            std::fs::write(&path, DEV_FLEET)?;
            path
        }
    };
    // The price book tenants' costs are priced by (`gangway costs`), and
    // the billing export can use: written once, kept as the operator edits it.
    let prices = dir.join("prices.toml");
    if !prices.exists() {
        std::fs::write(&prices, DEV_PRICES)?;
    }
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
            agent_metrics: 0,
        });
        for p in [
            &mut ports.api,
            &mut ports.metrics,
            &mut ports.postgres,
            &mut ports.agent_metrics,
        ] {
            keep_or_choose(p);
        }
    }
    state
        .more_globals
        .resize(args.globals - 1, GlobalPorts::default());
    for g in std::iter::once(&mut state.global).chain(state.more_globals.iter_mut()) {
        keep_or_choose(&mut g.api);
        keep_or_choose(&mut g.metrics);
    }
    keep_or_choose(&mut state.control);
    std::fs::write(&state_file, serde_json::to_vec_pretty(&state)?)?;
    let auth = DevMaterial::load_or_create(&dir)
        .map_err(|e| anyhow::anyhow!("cannot prepare the dev CA and keys: {e}"))?;

    let shutdown = shutdown_token();
    // Declared before the supervisor, so dropped after it: the regions
    // stop before their databases do.
    let ha = match args.db {
        DbKind::Single => BTreeMap::new(),
        DbKind::Ha => start_ha_databases(&args.regions, &dir, &args.pg_settings).await?,
    };
    let sup = Arc::new(assemble(&args, &dir, &exe, &fleet, &state, &auth, &ha).await?);
    let result = async {
        sup.start_regions()?;
        for name in &args.regions {
            wait_ready(&sup, name, state.regions[name], &auth).await?;
            println!("{name}: ready");
        }
        sup.start_globals()?;
        wait_global(&sup, &dir, &state, &auth).await
    }
    .await;
    if let Err(e) = result {
        stop(&sup).await;
        return Err(e);
    }
    let tokens = Tokens::mint(&auth)?;
    // The env file is what says the cloud is ready (scripts and tests wait
    // for it), so everything it leads to, the drills' endpoint included,
    // exists before it is written.
    let control = match start_control(&sup, &args, &dir, &state, &shutdown).await {
        Ok(control) => control,
        Err(e) => {
            stop(&sup).await;
            return Err(e);
        }
    };
    let env_file = write_env(&dir, &args.regions, &state, &auth, &tokens)?;
    println!();
    let rows: Vec<Vec<String>> = (args.regions.iter())
        .map(|name| {
            let ports = state.regions[name];
            vec![
                name.clone(),
                format!("https://127.0.0.1:{}", ports.api),
                format!("http://127.0.0.1:{}/metrics", ports.metrics),
                match ha.get(name) {
                    Some(c) => ha_summary(c),
                    None => format!("127.0.0.1:{}", ports.postgres),
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["REGION", "API", "METRICS", "POSTGRES"], &rows)
    );
    let replicas: Vec<String> = (global_ports(&state).iter())
        .map(|g| format!("https://127.0.0.1:{}", g.api))
        .collect();
    println!(
        "\nGlobal tier: {} (metrics http://127.0.0.1:{}/metrics)",
        replicas.join(", "),
        state.global.metrics
    );
    if let Some(first) = replicas.first() {
        println!(
            "Console: {first}/ (sign in with $GANGWAY_TOKEN, tenant acme, or $GANGWAY_ADMIN_TOKEN \
             from {}; the browser must trust the dev CA {} or be told to go on)",
            env_file.display(),
            auth.ca_cert.display()
        );
    }
    println!("\nReady. In another shell:\n  source {}\n  gangway job submit --wait --gpus 8 --gpu-type h100 -- sh -c 'echo rank $RANK of $WORLD_SIZE'\nFailure drills against this cloud: gangway chaos region-kill --dev --state-dir {}\nLogs: {}/logs. Ctrl-C stops everything.", env_file.display(), dir.display(), dir.display());

    // Run until Ctrl-C; a process that exits on its own (not broken by a
    // drill) is started again, unless it keeps exiting.
    let mut exits: std::collections::VecDeque<Instant> = Default::default();
    let died = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let gone = sup.exited();
        if gone.is_empty() {
            continue;
        }
        for what in &gone {
            println!("{what}");
            exits.push_back(Instant::now());
        }
        while exits.front().is_some_and(|t| t.elapsed() > CRASH_WINDOW) {
            exits.pop_front();
        }
        if exits.len() > CRASH_LIMIT {
            break Some(format!(
                "processes exited {} times within {} s (last: {})",
                exits.len(),
                CRASH_WINDOW.as_secs(),
                gone.join("; ")
            ));
        }
        for said in sup.restart_exited() {
            println!("{said}");
        }
    };
    println!("stopping…");
    let _ = std::fs::remove_file(&control);
    let _ = std::fs::remove_file(dir.join("env"));
    stop(&sup).await;
    match died {
        None => {
            println!("stopped; state kept in {}", dir.display());
            Ok(())
        }
        Some(what) => bail!("{what}; see the logs in {}/logs", dir.display()),
    }
}

/// Stops the whole cloud, gently.
async fn stop(sup: &Arc<Supervisor>) {
    let sup = sup.clone();
    let _ = tokio::task::spawn_blocking(move || sup.stop(STOP_GRACE)).await;
}

/// Every replica's ports, the first first.
fn global_ports(state: &DevState) -> Vec<GlobalPorts> {
    std::iter::once(state.global)
        .chain(state.more_globals.iter().copied())
        .collect()
}

/// Starts every region's PostgreSQL and the links' proxies, and returns
/// the cloud's supervisor holding them and how to start the rest: per
/// region a control plane and an agent, and the global tier's replicas.
/// Every link between regions, and from the global tier to each region,
/// goes through a proxy that a drill can cut (a partition); agents and
/// the env file's URLs reach the regions straight.
async fn assemble(
    args: &UpArgs,
    dir: &Path,
    exe: &Path,
    fleet: &Path,
    state: &DevState,
    auth: &DevMaterial,
    ha: &BTreeMap<String, PatroniCluster>,
) -> anyhow::Result<Supervisor> {
    let service_key = format!(
        "{}={}",
        auth.service_key.kid(),
        dir.join("keys/service-signing.pub.pem").display()
    );
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let signing_key = format!(
        "{}={}",
        auth.service_key.kid(),
        dir.join("keys/service-signing.pem").display()
    );
    let mut links = Vec::new();
    for to in &args.regions {
        let froms = (args.regions.iter().map(String::as_str)).chain(std::iter::once("global"));
        for from in froms.filter(|f| f != to) {
            links.push(Link {
                from: from.to_string(),
                to: to.clone(),
                proxy: Proxy::start(state.regions[to].api).await,
            });
        }
    }
    let via = |from: &str, to: &str| {
        let l = (links.iter())
            .find(|l| l.from == from && l.to == to)
            .expect("a link between every two");
        format!("https://127.0.0.1:{}", l.proxy.port)
    };
    let mut regions = Vec::new();
    for name in &args.regions {
        let ports = state.regions[name];
        let region_dir = dir.join("regions").join(name);
        std::fs::create_dir_all(&region_dir)?;
        // The region's checkpoint store, shared by its control plane and
        // its agent (docs/jobs.md).
        let store_dir = std::path::absolute(region_dir.join("checkpoints"))?;
        let checkpoint_store = format!("file://{}", store_dir.display());
        let (pg, db) = match ha.get(name) {
            // Held by `up`; the supervisor neither breaks nor mends it.
            Some(c) => (None, c.connection_url("gangway")),
            None => {
                println!(
                    "{name}: starting PostgreSQL on 127.0.0.1:{}",
                    ports.postgres
                );
                let pg_dir = pg_data_dir(dir, &region_dir, name)?;
                let opts = PgOptions {
                    port: Some(ports.postgres),
                    extra_settings: args.pg_settings.clone(),
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
                (Some(pg), db)
            }
        };
        let launch = |what: &str| {
            let mut l = Launch::new(exe, logs.join(format!("{name}-{what}.log")));
            l.die_with_parent = true;
            l
        };
        let mut control = launch("region")
            .args(["region", "--name", name])
            .args(["--listen", &format!("127.0.0.1:{}", ports.api)])
            .args(["--metrics-listen", &format!("127.0.0.1:{}", ports.metrics)])
            // It holds the database's password: in the environment, out
            // of other users' sight (a command line is not).
            .env("GANGWAY_DATABASE_URL", &db)
            .args(["--service-key", &service_key])
            // TLS on every link: the dev certificate (localhost,
            // 127.0.0.1), and the dev CA for calls to peers.
            .arg("--tls-cert")
            .arg(&auth.server_cert)
            .arg("--tls-key")
            .arg(&auth.server_key)
            .arg("--ca")
            .arg(&auth.ca_cert)
            // Regions watch each other and hold each other's job intent
            // (docs/failover.md); with peers, agents fence after the
            // regions' lease (8 s) and a dead region's jobs run elsewhere
            // after about 16 s.
            .args(["--peer-signing-key", &signing_key])
            .args(["--checkpoint-store", &checkpoint_store])
            // The region's inventory is the fleet its simulated agent
            // serves, bound to that agent.
            .arg("--inventory")
            .arg(fleet)
            .args(["--inventory-agent", &format!("{name}-agent-0")]);
        if args.agent_per_leaf {
            control = control.arg("--inventory-agent-per-leaf");
        }
        if let Some(s) = args.balance_after_s {
            control = control.args(["--balance-after-s", &s.to_string()]);
        }
        match (args.short_timers, args.db) {
            (true, DbKind::Single) => control = control.args(DRILL_TIMERS).args(SHORT_TIMERS),
            // CI's short timers but a lease a failover fits in.
            (true, DbKind::Ha) => control = control.args(DRILL_TIMERS).args(HA_TIMERS),
            (false, DbKind::Ha) => control = control.args(["--peer-lease-s", HA_LEASE_S]),
            (false, DbKind::Single) => {}
        }
        for peer in args.regions.iter().filter(|p| *p != name) {
            control = control
                .arg("--peer")
                .arg(format!("{peer}={}", via(name, peer)));
        }
        let agent_id = format!("{name}-agent-0");
        let agent_token = auth
            .service_key
            .sign(&claims_for(
                Role::Agent,
                &agent_id,
                None,
                Some(name),
                tokens::ISSUER,
                tokens::REGION_AUDIENCE,
                DEV_TOKEN_TTL,
            ))
            .map_err(|e| anyhow::anyhow!("cannot sign the agent token: {e}"))?;
        let agent_dir = region_dir.join("agent");
        // One agent per leaf: a token for each, in a file only we read.
        let tokens_file = region_dir.join("agent-tokens.json");
        if args.agent_per_leaf {
            let fleet_file = gangway_shared::fleet::FleetFile::load(fleet)?;
            let leaves: std::collections::BTreeSet<String> =
                (fleet_file.expand(fleet_file.region_or(name)).iter())
                    .filter(|n| !n.named)
                    .map(|n| n.leaf.clone())
                    .collect();
            let mut tokens = std::collections::BTreeMap::new();
            for leaf in leaves {
                let id = crate::servers::leaf_agent(&agent_id, &leaf);
                let token = auth
                    .service_key
                    .sign(&claims_for(
                        Role::Agent,
                        &id,
                        None,
                        Some(name),
                        tokens::ISSUER,
                        tokens::REGION_AUDIENCE,
                        DEV_TOKEN_TTL,
                    ))
                    .map_err(|e| anyhow::anyhow!("cannot sign an agent token: {e}"))?;
                tokens.insert(id, token);
            }
            write_private(&tokens_file, &serde_json::to_vec(&tokens)?)?;
        }
        let mut agent = launch("agent")
            .env("GANGWAY_AGENT_TOKEN", agent_token)
            .arg("agent")
            .args(["--region-url", &format!("https://127.0.0.1:{}", ports.api)])
            .arg("--region-ca")
            .arg(&auth.ca_cert)
            .args(["--region", name, "--agent-id", &agent_id])
            .arg("--simulate")
            .arg(fleet)
            .args(["--executor", &args.executor])
            .args(["--time-factor", &args.time_factor.to_string()])
            .args([
                "--metrics-listen",
                &format!("127.0.0.1:{}", ports.agent_metrics),
            ])
            .arg("--work-dir")
            .arg(&agent_dir)
            .args(["--checkpoint-store", &checkpoint_store])
            // Jobs see nothing of the state dir (keys, tokens, databases,
            // other jobs) but the drills' shared directory.
            .arg("--sandbox-hide")
            .arg(dir)
            .arg("--sandbox-bind")
            .arg(dir.join("chaos"));
        if args.agent_per_leaf {
            agent = agent
                .arg("--simulate-per-leaf")
                .arg("--tokens-file")
                .arg(&tokens_file);
        }
        if !is_root() {
            agent = agent.args(["--isolation", "off"]);
        }
        println!(
            "{name}: the control plane on 127.0.0.1:{}, a node agent ({} executor)",
            ports.api, args.executor
        );
        regions.push(RegionParts {
            info: RegionInfo {
                name: name.clone(),
                url: format!("https://127.0.0.1:{}", ports.api),
                database: db,
                store_dir,
                agent_dir,
                broken: Vec::new(),
            },
            control,
            agent,
            database: pg,
        });
    }
    let mut globals = Vec::new();
    for (i, g) in global_ports(state).iter().enumerate() {
        let log = match i {
            0 => "global.log".to_string(),
            i => format!("global-{i}.log"),
        };
        let mut l = Launch::new(exe, logs.join(log))
            .arg("global")
            .args(["--listen", &format!("127.0.0.1:{}", g.api)])
            .args(["--metrics-listen", &format!("127.0.0.1:{}", g.metrics)])
            .arg("--tls-cert")
            .arg(&auth.server_cert)
            .arg("--tls-key")
            .arg(&auth.server_key)
            .arg("--tenant-key")
            .arg(format!(
                "{}={}",
                auth.tenant_key.kid(),
                dir.join("keys/tenant-signing.pub.pem").display()
            ))
            .arg("--operator-key")
            .arg(format!(
                "{}={}",
                auth.operator_key.kid(),
                dir.join("keys/operator-signing.pub.pem").display()
            ))
            .args(["--service-signing-key", &signing_key])
            .arg("--region-ca")
            .arg(&auth.ca_cert)
            .arg("--price-book")
            .arg(dir.join("prices.toml"));
        l.die_with_parent = true;
        for r in &args.regions {
            l = l.arg("--region").arg(format!("{r}={}", via("global", r)));
        }
        globals.push(l);
    }
    Ok(Supervisor::new(regions, globals, links))
}

/// Whether `program` is on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `--db ha`: each region's database a three-member Patroni cluster of its
/// own (scope = the region's name, one etcd each), started side by side in
/// `<region's database dir>/../patroni`, fresh (what an earlier start left
/// is removed first), with the database `gangway` created.
async fn start_ha_databases(
    regions: &[String],
    dir: &Path,
    pg_settings: &[(String, String)],
) -> anyhow::Result<BTreeMap<String, PatroniCluster>> {
    let mut starts = Vec::new();
    for name in regions {
        let region_dir = dir.join("regions").join(name);
        std::fs::create_dir_all(&region_dir)?;
        let root = pg_data_dir(dir, &region_dir, name)?.with_file_name("patroni");
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("cannot remove {}", root.display()))?;
        }
        println!(
            "{name}: starting a Patroni cluster of three PostgreSQL servers (a synchronous \
             standby, etcd) in {}",
            root.display()
        );
        let opts = PatroniOptions {
            scope: name.clone(),
            extra_settings: pg_settings.to_vec(),
            ..PatroniOptions::default()
        };
        let name = name.clone();
        starts.push(tokio::task::spawn_blocking(move || {
            let c = PatroniCluster::start(&root, opts)
                .with_context(|| format!("{name}'s Patroni cluster did not start"))?;
            c.create_database_blocking("gangway")?;
            anyhow::Ok((name, c))
        }));
    }
    let mut out = BTreeMap::new();
    // Already running side by side: each awaited in turn.
    for started in starts {
        let (name, c) = started.await??;
        println!("{name}: {}", ha_summary(&c));
        out.insert(name, c);
    }
    Ok(out)
}

/// A Patroni cluster in a line: its members' ports and who is primary.
fn ha_summary(c: &PatroniCluster) -> String {
    let ports: Vec<String> = (c.member_names().iter())
        .map(|m| c.pg_port(m).to_string())
        .collect();
    format!(
        "127.0.0.1:{} (Patroni; primary {})",
        ports.join(","),
        c.primary().unwrap_or_else(|| "none now".into())
    )
}

/// Where region `name`'s PostgreSQL keeps its data: in the region's
/// directory, unless the server's user (`postgres`, when dev up runs as
/// root) cannot reach it there — a checkout under `/root` — and then under
/// `/var/tmp`, named after the state dir so that the next start finds it.
fn pg_data_dir(state_dir: &Path, region_dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    if gangway_devkit::server_can_reach(region_dir) {
        return Ok(region_dir.join("pg"));
    }
    let hash = gangway_shared::ids::short_hash(state_dir.as_os_str().as_encoded_bytes());
    let label: String = (state_dir
        .iter()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev())
    .map(|c| {
        c.to_string_lossy()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "")
    })
    .filter(|c| !c.is_empty())
    .collect::<Vec<_>>()
    .join("-");
    let base = PathBuf::from(format!("/var/tmp/gangway-{label}-{hash:08x}"));
    std::fs::create_dir_all(&base)?;
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    let dir = base.join(name).join("pg");
    println!(
        "{name}: user postgres cannot reach {}: its database lives in {}",
        region_dir.display(),
        dir.display()
    );
    Ok(dir)
}

/// Waits until region `name` answers and its agent has registered GPUs.
async fn wait_ready(
    sup: &Supervisor,
    name: &str,
    ports: RegionPorts,
    auth: &DevMaterial,
) -> anyhow::Result<()> {
    let token = auth
        .service_key
        .sign(&claims_for(
            Role::Service,
            "gangway-dev",
            None,
            None,
            tokens::ISSUER,
            tokens::REGION_AUDIENCE,
            Duration::from_secs(600),
        ))
        .map_err(|e| anyhow::anyhow!("cannot sign a service token: {e}"))?;
    let ca = auth.ca_pem()?;
    let client = Client::region(
        format!("https://127.0.0.1:{}", ports.api),
        "acme",
        Some(ca.as_bytes()),
    )
    .map_err(|e| anyhow::anyhow!(e))?
    .with_token(token);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(status) = client.region_status().await {
            if status.capacity.iter().any(|c| c.schedulable > 0) {
                return Ok(());
            }
        }
        if let Some(what) = sup.exited().first() {
            bail!("{what}");
        }
        if Instant::now() > deadline {
            bail!("{name}: not ready after 120 s (no agent registered GPUs)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The dev tokens written to the env file.
struct Tokens {
    acme: String,
    globex: String,
    admin: String,
}

impl Tokens {
    fn mint(auth: &DevMaterial) -> anyhow::Result<Tokens> {
        let sign = |role, sub: &str, tenant: Option<&str>| {
            auth.public_key_for(role)
                .sign(&claims_for(
                    role,
                    sub,
                    tenant,
                    None,
                    tokens::ISSUER,
                    tokens::PUBLIC_AUDIENCE,
                    DEV_TOKEN_TTL,
                ))
                .map_err(|e| anyhow::anyhow!("cannot sign a dev token: {e}"))
        };
        Ok(Tokens {
            acme: sign(Role::Tenant, "acme-dev", Some("acme"))?,
            globex: sign(Role::Tenant, "globex-dev", Some("globex"))?,
            admin: sign(Role::Admin, "operator", None)?,
        })
    }
}

/// Waits until every replica of the global tier answers over HTTPS and
/// sees every region healthy.
async fn wait_global(
    sup: &Supervisor,
    dir: &Path,
    state: &DevState,
    auth: &DevMaterial,
) -> anyhow::Result<()> {
    let ca = std::fs::read(&auth.ca_cert)?;
    let token = Tokens::mint(auth)?.acme;
    for (i, g) in global_ports(state).iter().enumerate() {
        let url = format!("https://127.0.0.1:{}", g.api);
        println!("global {i}: the public API on {url}");
        let client =
            Client::public(url, token.clone(), Some(&ca)).map_err(|e| anyhow::anyhow!(e))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(list) = client.regions().await {
                if list.regions.iter().all(|r| r.healthy) {
                    println!("global {i}: ready");
                    break;
                }
            }
            if let Some(what) = sup.exited().first() {
                bail!("{what}; see {}/logs", dir.display());
            }
            if Instant::now() > deadline {
                bail!("global replica {i} did not see every region healthy within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Serves the drills' control API on loopback and writes its endpoint
/// The local cloud's price book (docs/billing.md): every GPU type of the
/// dev fleets, by priority, and their commitments.
const DEV_PRICES: &str = r#"# Written by `gangway dev up`: prices of the local cloud (docs/billing.md).
currency = "USD"
provider = "Gangway (dev)"

[[price]]
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.49
[[price]]
gpu_type = "h100"
priority = "low"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.10
[[price]]
gpu_type = "a100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.29
[[price]]
gpu_type = "a100"
priority = "low"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 0.59

[[commitment]]
kind = "guarantee"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.60
covered_usage_per_gpu_hour = 0.40
[[commitment]]
kind = "reservation"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.20
[[commitment]]
kind = "cluster"
gpu_type = "h100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 2.00
[[commitment]]
kind = "guarantee"
gpu_type = "a100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 0.90
covered_usage_per_gpu_hour = 0.20
[[commitment]]
kind = "reservation"
gpu_type = "a100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.10
[[commitment]]
kind = "cluster"
gpu_type = "a100"
effective = "2020-01-01T00:00:00Z"
per_gpu_hour = 1.00
"#;

/// file (returned) into the state dir.
async fn start_control(
    sup: &Arc<Supervisor>,
    args: &UpArgs,
    dir: &Path,
    state: &DevState,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<PathBuf> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", state.control))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", state.control))?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let fixed = control::Fixed {
        state_dir: dir.to_path_buf(),
        executor: args.executor.clone(),
        short_timers: args.short_timers,
        globals: (global_ports(state).iter())
            .map(|g| format!("https://127.0.0.1:{}", g.api))
            .collect(),
    };
    let stopped = shutdown.clone();
    tokio::spawn(control::serve(
        sup.clone(),
        fixed,
        token.clone(),
        listener,
        async move { stopped.cancelled().await },
    ));
    let endpoint = control::Endpoint {
        url: format!("http://127.0.0.1:{}", state.control),
        token,
    };
    control::write_endpoint(dir, &endpoint)
}

fn write_env(
    dir: &Path,
    regions: &[String],
    state: &DevState,
    auth: &DevMaterial,
    tokens: &Tokens,
) -> anyhow::Result<PathBuf> {
    let global = state.global;
    let mut s = String::from("# Written by `gangway dev up`; source it in a shell.\n");
    s.push_str(&format!(
        "export GANGWAY_URL=https://127.0.0.1:{}\n",
        global.api
    ));
    let replicas: Vec<String> = (global_ports(state).iter())
        .map(|g| format!("https://127.0.0.1:{}", g.api))
        .collect();
    s.push_str(&format!(
        "export GANGWAY_GLOBAL_REPLICAS={}\n",
        replicas.join(",")
    ));
    s.push_str(&format!(
        "export GANGWAY_CA_CERT={}\n",
        auth.ca_cert.display()
    ));
    s.push_str(&format!("export GANGWAY_TOKEN={}\n", tokens.acme));
    s.push_str(&format!("export GANGWAY_TOKEN_GLOBEX={}\n", tokens.globex));
    s.push_str(&format!("export GANGWAY_ADMIN_TOKEN={}\n", tokens.admin));
    s.push_str(&format!(
        "export GANGWAY_GLOBAL_METRICS_URL=http://127.0.0.1:{}/metrics\n",
        global.metrics
    ));
    s.push_str(&format!("export GANGWAY_REGIONS={}\n", regions.join(",")));
    for name in regions {
        let ports = state.regions[name];
        let var = name.to_uppercase().replace('-', "_");
        s.push_str(&format!(
            "export GANGWAY_REGION_{var}_URL=https://127.0.0.1:{}\n",
            ports.api
        ));
        s.push_str(&format!(
            "export GANGWAY_REGION_{var}_METRICS_URL=http://127.0.0.1:{}/metrics\n",
            ports.metrics
        ));
        s.push_str(&format!(
            "export GANGWAY_REGION_{var}_AGENT_METRICS_URL=http://127.0.0.1:{}/metrics\n",
            ports.agent_metrics
        ));
    }
    let path = dir.join("env");
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, s)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Writes `bytes` to `path`, readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local cloud's price book prices every GPU type of its fleet,
    /// usage and every kind of commitment.
    #[test]
    fn the_dev_price_book_prices_the_dev_fleet() {
        use gangway_shared::billing::{CommitmentKind, PriceBook};
        let book = PriceBook::parse(DEV_PRICES).unwrap();
        let at = "2026-12-01T00:00:00Z".parse().unwrap();
        let fleet: gangway_shared::fleet::FleetFile = toml::from_str(DEV_FLEET).unwrap();
        let types: std::collections::BTreeSet<String> = (fleet.spine.iter())
            .flat_map(|s| s.leaf.iter().map(|l| l.gpu_type.clone()))
            .collect();
        assert!(!types.is_empty());
        for ty in &types {
            for prio in ["low", "normal", "high"] {
                assert!(book.price(ty, prio, "us-east", at).is_some(), "{ty} {prio}");
            }
            for kind in CommitmentKind::ALL {
                assert!(
                    book.commitment_price(kind, ty, "us-east", at).is_some(),
                    "{ty}"
                );
            }
        }
    }
}
