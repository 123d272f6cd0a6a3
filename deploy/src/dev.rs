//! `gangway dev up`: a complete local cloud in the foreground.
//!
//! Per region: a private PostgreSQL cluster (system binaries, run as user
//! `postgres` when started as root), a `gangway region` process and a
//! `gangway agent` process serving a simulated fleet. In front of them, one
//! `gangway global` on HTTPS with a dev CA. State (databases, CA, signing
//! keys, logs) lives under the state dir; starting again on the same dir
//! resumes with the data and keys kept.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_devkit::{free_port, PgCluster, PgOptions};
use gangway_shared::client::Client;
use gangway_shared::tokens;
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
    #[serde(default)]
    global: GlobalPorts,
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
    for p in [&mut state.global.api, &mut state.global.metrics] {
        if *p == 0 || !port_free(*p) {
            *p = free_port();
        }
    }
    std::fs::write(&state_file, serde_json::to_vec_pretty(&state)?)?;
    let auth = DevMaterial::load_or_create(&dir)
        .map_err(|e| anyhow::anyhow!("cannot prepare the dev CA and keys: {e}"))?;

    let shutdown = shutdown_token();
    let mut runs: Vec<RegionRun> = Vec::new();
    let mut global: Option<Child> = None;
    let result = async {
        start_all(&args, &dir, &exe, &fleet, &state, &auth, &mut runs).await?;
        global = Some(start_global(&dir, &exe, &state, &auth, &runs).await?);
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        terminate(global.take()).await;
        stop_all(&mut runs).await;
        return Err(e);
    }
    let tokens = Tokens::mint(&auth)?;
    let env_file = write_env(&dir, &runs, state.global, &auth, &tokens)?;
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
    println!(
        "\nGlobal tier: https://127.0.0.1:{} (metrics http://127.0.0.1:{}/metrics)",
        state.global.api, state.global.metrics
    );
    println!("\nReady. In another shell:\n  source {}\n  gangway job submit --wait --gpus 8 --gpu-type h100 -- sh -c 'echo rank $RANK of $WORLD_SIZE'\nLogs: {}/logs. Ctrl-C stops everything.", env_file.display(), dir.display());

    // Run until Ctrl-C or until a process dies under us.
    let died = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if let Some(what) = find_dead(&mut runs) {
            break Some(what);
        }
        if let Some(g) = global.as_mut() {
            if let Ok(Some(status)) = g.try_wait() {
                global = None;
                break Some(format!("the global tier exited ({status})"));
            }
        }
    };
    println!("stopping…");
    terminate(global.take()).await;
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
    auth: &DevMaterial,
    runs: &mut Vec<RegionRun>,
) -> anyhow::Result<()> {
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
    for name in &args.regions {
        let ports = state.regions[name];
        let region_dir = dir.join("regions").join(name);
        std::fs::create_dir_all(&region_dir)?;
        println!(
            "{name}: starting PostgreSQL on 127.0.0.1:{}",
            ports.postgres
        );
        let pg_dir = region_dir.join("pg");
        // The region's checkpoint store, shared by its control plane and
        // its agent (docs/jobs.md).
        let checkpoint_store = format!(
            "file://{}",
            std::path::absolute(region_dir.join("checkpoints"))?.display()
        );
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
                "--service-key",
                &service_key,
                // Regions watch each other and hold each other's job
                // intent (docs/failover.md); with peers, agents fence after
                // the regions' lease (8 s) and a dead region's jobs run
                // elsewhere after about 16 s.
                "--peer-signing-key",
                &signing_key,
                "--checkpoint-store",
                &checkpoint_store,
            ]
            .into_iter()
            .map(String::from)
            .chain(peer_args(args, state, name))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
            &[],
            &logs.join(format!("{name}-region.log")),
        )?);
        let agent_token = auth
            .service_key
            .sign(&claims_for(
                Role::Agent,
                &format!("{name}-agent-0"),
                None,
                Some(name),
                tokens::ISSUER,
                tokens::REGION_AUDIENCE,
                DEV_TOKEN_TTL,
            ))
            .map_err(|e| anyhow::anyhow!("cannot sign the agent token: {e}"))?;
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
                "--checkpoint-store",
                &checkpoint_store,
            ],
            &[("GANGWAY_AGENT_TOKEN", agent_token.as_str())],
            &logs.join(format!("{name}-agent.log")),
        )?);
    }
    for run in runs.iter_mut() {
        wait_ready(run, auth).await?;
        println!("{}: ready", run.name);
    }
    Ok(())
}

/// Waits until the region answers and its agent has registered GPUs.
async fn wait_ready(run: &mut RegionRun, auth: &DevMaterial) -> anyhow::Result<()> {
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
    let client =
        Client::new(format!("http://127.0.0.1:{}", run.ports.api), "acme").with_token(token);
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

fn spawn(exe: &Path, args: &[&str], env: &[(&str, &str)], log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open log {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .envs(env.iter().copied())
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

/// The dev tokens written to the env file.
struct Tokens {
    acme: String,
    globex: String,
    admin: String,
}

impl Tokens {
    fn mint(auth: &DevMaterial) -> anyhow::Result<Tokens> {
        let sign = |role, sub: &str, tenant: Option<&str>| {
            auth.tenant_key
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

/// Starts the global tier over HTTPS and waits until it sees every region.
async fn start_global(
    dir: &Path,
    exe: &Path,
    state: &DevState,
    auth: &DevMaterial,
    runs: &[RegionRun],
) -> anyhow::Result<Child> {
    println!(
        "global: starting the public API on https://127.0.0.1:{}",
        state.global.api
    );
    let mut args: Vec<String> = vec![
        "global".into(),
        "--listen".into(),
        format!("127.0.0.1:{}", state.global.api),
        "--metrics-listen".into(),
        format!("127.0.0.1:{}", state.global.metrics),
        "--tls-cert".into(),
        auth.server_cert.to_string_lossy().into_owned(),
        "--tls-key".into(),
        auth.server_key.to_string_lossy().into_owned(),
        "--tenant-key".into(),
        format!(
            "{}={}",
            auth.tenant_key.kid(),
            dir.join("keys/tenant-signing.pub.pem").display()
        ),
        "--service-signing-key".into(),
        format!(
            "{}={}",
            auth.service_key.kid(),
            dir.join("keys/service-signing.pem").display()
        ),
    ];
    for r in runs {
        args.push("--region".into());
        args.push(format!("{}=http://127.0.0.1:{}", r.name, r.ports.api));
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = spawn(exe, &argv, &[], &dir.join("logs/global.log"))?;
    let ca = std::fs::read(&auth.ca_cert)?;
    let token = Tokens::mint(auth)?.acme;
    let client = Client::public(
        format!("https://127.0.0.1:{}", state.global.api),
        token,
        Some(&ca),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(list) = client.regions().await {
            if list.regions.iter().all(|r| r.healthy) {
                println!("global: ready");
                return Ok(child);
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "the global tier exited ({status}); see {}/logs/global.log",
                dir.display()
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill().await;
            bail!("the global tier did not see every region healthy within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_env(
    dir: &Path,
    runs: &[RegionRun],
    global: GlobalPorts,
    auth: &DevMaterial,
    tokens: &Tokens,
) -> anyhow::Result<PathBuf> {
    let mut s = String::from("# Written by `gangway dev up`; source it in a shell.\n");
    s.push_str(&format!(
        "export GANGWAY_URL=https://127.0.0.1:{}\n",
        global.api
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
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
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

/// `--peer NAME=URL` for every other region of the dev cloud.
fn peer_args(args: &UpArgs, state: &DevState, me: &str) -> Vec<String> {
    (args.regions.iter())
        .filter(|r| *r != me)
        .flat_map(|r| {
            [
                "--peer".to_string(),
                format!("{r}=http://127.0.0.1:{}", state.regions[r].api),
            ]
        })
        .collect()
}
