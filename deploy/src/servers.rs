//! `gangway region` and `gangway agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gangway_agent::{
    nodes_from_fleet, AgentConfig, ExecutorKind, IsolationConfig, IsolationMode, SandboxBind,
};
use gangway_regional::RegionConfig;
use gangway_shared::fleet::FleetFile;

use crate::signals::{shutdown_token, Install, Reload};

#[derive(Args, Debug)]
pub struct RegionArgs {
    /// A TOML file of settings (deploy/config/): the flags below without
    /// their dashes; a flag or its environment variable overrides one.
    #[arg(long, env = "GANGWAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The region's name.
    #[arg(long, env = "GANGWAY_REGION")]
    pub name: String,
    /// Address of the regional API.
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen: SocketAddr,
    /// The region's TLS certificate chain (PEM), served to the global
    /// tier, agents and peer regions.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The region's TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) that signs the peer regions' certificates:
    /// calls to peers trust it alone, over HTTPS only.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Serve plain HTTP and call peers over plain HTTP: INSECURE, for a
    /// network you trust (a laptop, a benchmark), never across machines.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "ca"])]
    pub insecure_http: bool,
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
    /// Seconds a worker asked to checkpoint (SIGUSR1) has before it is
    /// stopped anyway.
    #[arg(long, default_value_t = 120)]
    pub checkpoint_deadline_s: u64,
    /// Never preempt running jobs for waiting ones (priority or a tenant
    /// taking back its guarantee); operators still may.
    #[arg(long)]
    pub no_preemption: bool,
    /// Seconds a job must have run before the scheduler may preempt it.
    #[arg(long, default_value_t = gangway_sched::PreemptionPolicy::default().min_run_s)]
    pub preemption_min_run_s: u64,
    /// A job preempted this many times is no longer preempted for priority.
    #[arg(long, default_value_t = gangway_sched::PreemptionPolicy::default().max_preemptions)]
    pub preemption_max_per_job: u32,
    /// Half-life, in hours, of the past usage fair sharing counts.
    #[arg(long, default_value_t = 24.0)]
    pub fair_share_half_life_h: f64,
    /// Seconds to wait for the database at start-up.
    #[arg(long, default_value_t = 60)]
    pub database_wait_s: u64,
    /// The node-health policy (TOML: XID classes, ECC, thermal and NVLink
    /// limits, suspect/lost silences, flap damping, repair); unset fields
    /// keep their defaults (docs/operations.md).
    #[arg(long)]
    pub health_policy: Option<PathBuf>,
    /// The agents' lease, in seconds: an agent with no successful sync for
    /// this long checkpoints and stops its workers and starts nothing until
    /// it syncs again. Must be below the health policy's lost_after_s by
    /// more than --fence-checkpoint-s (default: lost_after_s − 30).
    #[arg(long)]
    pub fence_after_s: Option<u64>,
    /// Seconds a fenced agent's workers have to checkpoint before they are
    /// stopped (default: two thirds of the rest below lost_after_s, at most
    /// 20).
    #[arg(long)]
    pub fence_checkpoint_s: Option<u64>,
    /// A public key (PEM) that verifies service and agent tokens, as
    /// KEY_ID=PATH; repeat it while keys rotate.
    #[arg(long = "service-key", value_name = "KID=PATH")]
    pub service_keys: Vec<String>,
    /// Accept calls without tokens (benchmarks only; never in production).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// The region's checkpoint store, the URL its agents are given too:
    /// file:///path or s3://bucket/prefix (AWS_* variables configure S3).
    /// With one, a checkpoint an agent reports is recorded only once its
    /// manifest is read back from the store; without, reports are trusted
    /// (restoring agents still verify every file).
    #[arg(long)]
    pub checkpoint_store: Option<String>,
    /// Another region, as NAME=URL; repeat for each (docs/failover.md).
    /// Regions with peers hold each other's job intent, fence themselves
    /// when cut off from a majority, and adopt the jobs of a dead peer.
    #[arg(long = "peer", value_name = "NAME=URL")]
    pub peers: Vec<String>,
    /// The private key (PEM) that signs this region's tokens for its peers
    /// (the key whose public half they verify service tokens with), as
    /// KEY_ID=PATH.
    #[arg(long, value_name = "KID=PATH")]
    pub peer_signing_key: Option<String>,
    /// Milliseconds between heartbeats to each peer.
    #[arg(long, default_value_t = 1000)]
    pub peer_heartbeat_ms: u64,
    /// The regions' lease, in seconds: with no round trip to a majority of
    /// regions for this long, a region fences itself.
    #[arg(long, default_value_t = 8)]
    pub peer_lease_s: u64,
    /// Seconds of silence to a majority after which a peer's jobs are
    /// adopted (default, and least: the longer of the regions' and the
    /// agents' lease, plus the fenced checkpoint time, plus 2).
    #[arg(long)]
    pub adopt_after_s: Option<u64>,
    /// Seconds a queued job waits here before it goes to its buddy region
    /// when that one has room for it now (0: jobs stay where they were
    /// submitted). A job that arrived by a move waits as long again.
    #[arg(long, default_value_t = 60)]
    pub balance_after_s: u64,
    /// The region's inventory: a fleet file (TOML) of the machines that
    /// belong here and where each sits, loaded into the inventory at every
    /// start (an operator's own entries, `gangway admin node add`, stay).
    /// Machines listed by name are served by an agent of their own name;
    /// counted (simulated) ones by --inventory-agent. A machine not in the
    /// inventory is refused when it registers (`unknown_node`).
    #[arg(long, value_name = "FLEET_FILE")]
    pub inventory: Option<PathBuf>,
    /// The agent that serves the inventory's simulated (counted) nodes:
    /// the subject of its token (default: `{name}-agent`).
    #[arg(long, value_name = "AGENT_ID")]
    pub inventory_agent: Option<String>,
    /// The inventory's simulated nodes are served by one agent per leaf
    /// (rack), `{inventory-agent}-{leaf}`, as a real region's are by many
    /// machines' agents (the agent's `--simulate-per-leaf`).
    #[arg(long)]
    pub inventory_agent_per_leaf: bool,
}

/// The agent serving a leaf's simulated nodes when each leaf has its own.
pub fn leaf_agent(agent: &str, leaf: &str) -> String {
    format!("{agent}-{leaf}")
}

/// Loads the region's `--inventory` fleet file into its store.
async fn load_inventory(
    state: &gangway_regional::AppState,
    args: &RegionArgs,
) -> anyhow::Result<()> {
    let Some(path) = &args.inventory else {
        return Ok(());
    };
    let fleet = FleetFile::load(path)
        .with_context(|| format!("cannot load the inventory {}", path.display()))?;
    let sim_agent =
        (args.inventory_agent.clone()).unwrap_or_else(|| format!("{}-agent", args.name));
    let nodes: Vec<_> = (fleet.expand(fleet.region_or(&args.name)).iter())
        .map(|n| {
            let agent = if args.inventory_agent_per_leaf {
                leaf_agent(&sim_agent, &n.leaf)
            } else {
                sim_agent.clone()
            };
            gangway_regional::store::InventoryNode::from_fleet(n, &agent)
        })
        .collect();
    let written = state
        .store
        .load_inventory(&nodes, "fleet")
        .await
        .context("cannot load the inventory")?;
    tracing::info!(path = %path.display(), nodes = nodes.len(), written, %sim_agent, "inventory loaded");
    Ok(())
}

/// Reads `KID=PATH` key arguments into (kid, PEM) pairs.
pub fn read_keys(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| {
            let (kid, path) = a
                .split_once('=')
                .with_context(|| format!("{a:?} is not KEY_ID=PATH"))?;
            let pem =
                std::fs::read_to_string(path).with_context(|| format!("cannot read key {path}"))?;
            Ok((kid.to_string(), pem))
        })
        .collect()
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
    config.checkpoint_deadline = Duration::from_secs(args.checkpoint_deadline_s);
    config.preemption.enabled = !args.no_preemption;
    config.preemption.min_run_s = args.preemption_min_run_s;
    config.preemption.max_preemptions = args.preemption_max_per_job;
    anyhow::ensure!(
        args.fair_share_half_life_h > 0.0 && args.fair_share_half_life_h <= 87_600.0,
        "--fair-share-half-life-h must be a number of hours above 0 and at most 87600 (ten years)"
    );
    config.fair_share_half_life = Duration::from_secs_f64(args.fair_share_half_life_h * 3600.0);
    if let Some(path) = &args.health_policy {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --health-policy {}", path.display()))?;
        config.health =
            toml::from_str(&text).with_context(|| format!("--health-policy {}", path.display()))?;
    }
    if let Some(url) = &args.checkpoint_store {
        let store = gangway_checkpoint::CheckpointStore::open(url)
            .map_err(|e| anyhow::anyhow!("--checkpoint-store: {e}"))?;
        tracing::info!(url = %store.url(), "checkpoint store");
        config.checkpoint_store = Some(store);
    }
    config.fence_after = args.fence_after_s.map(Duration::from_secs);
    config.fence_checkpoint = args.fence_checkpoint_s.map(Duration::from_secs);
    // Installed first: a SIGHUP while the region waits for its database
    // reloads what there is by then rather than kill it.
    let reload = Reload::default();
    reload.on_hangup()?;
    let files = RegionKeyFiles::from(&args);
    let ca_pem = region_tls(&args, &mut config, &reload)?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid region configuration: {e}"))?;
    config.auth = match (args.service_keys.is_empty(), args.insecure_no_auth) {
        (false, _) => files.verifier()?,
        (true, true) => {
            tracing::warn!("--insecure-no-auth: this region accepts calls from anyone");
            None
        }
        (true, false) => anyhow::bail!(
            "pass --service-key KID=PATH (the public key that signs the global tier's and agents' tokens), or --insecure-no-auth for a benchmark"
        ),
    };
    config.peers = gangway_regional::config::PeerConfig {
        peers: args
            .peers
            .iter()
            .map(|p| {
                let (name, url) = p
                    .split_once('=')
                    .with_context(|| format!("--peer {p:?} is not NAME=URL"))?;
                anyhow::ensure!(
                    name != args.name,
                    "--peer names this region itself ({name})"
                );
                Ok(gangway_regional::config::Peer {
                    name: name.to_string(),
                    url: url.to_string(),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        signing_key: files.peer_signing_key()?,
        heartbeat_interval: Duration::from_millis(args.peer_heartbeat_ms.max(10)),
        lease: Duration::from_secs(args.peer_lease_s),
        adopt_after: args.adopt_after_s.map(Duration::from_secs),
        balance_after: (args.balance_after_s > 0)
            .then(|| Duration::from_secs(args.balance_after_s)),
        ca_pem,
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid region configuration: {e}"))?;
    let shutdown = shutdown_token();
    let state =
        gangway_regional::prepare(config, Duration::from_secs(args.database_wait_s)).await?;
    let credentials = state.credentials.clone();
    reload.part(
        "the service keys, the peer signing key and the peers' CA (--service-key, --peer-signing-key, --ca)",
        move || {
            let material = credentials
                .prepare(
                    files.verifier()?,
                    files.peer_signing_key()?,
                    files.ca()?.as_deref(),
                )
                .map_err(|e| anyhow::anyhow!(e))?;
            let credentials = credentials.clone();
            Ok(Box::new(move || credentials.install(material)) as Install)
        },
    );
    load_inventory(&state, &args).await?;
    gangway_regional::serve(state, shutdown).await
}

/// The region's TLS from its flags: its certificate and key for serving,
/// and the CA its peers' certificates are checked against (returned). Plain
/// HTTP only behind `--insecure-http`; a certificate or CA that cannot be
/// read or parsed stops the start with the flag's name.
fn region_tls(
    args: &RegionArgs,
    config: &mut RegionConfig,
    reload: &Reload,
) -> anyhow::Result<Option<String>> {
    if args.insecure_http {
        tracing::warn!(
            "--insecure-http: the regional API and the calls to peers are plain HTTP; anyone on the network can read and forge them"
        );
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        anyhow::bail!(
            "pass --tls-cert and --tls-key (the region's certificate and key) and --ca (the CA that signs its peers' certificates), or --insecure-http on a network you trust"
        );
    };
    config.tls = Some(reloadable_tls(cert, key, reload)?);
    match &args.ca {
        Some(p) => Ok(Some(read_file(p, "--ca")?)),
        None if args.peers.is_empty() => Ok(None),
        None => anyhow::bail!(
            "a region with peers over TLS needs --ca, the CA that signs its peers' certificates"
        ),
    }
}

/// The server's TLS from its certificate chain and key files, read again
/// on every SIGHUP (a part of `reload`): new connections get the rotated
/// certificate, open ones carry on with theirs. A pair that cannot be read
/// or does not match at start stops the start; on a SIGHUP it leaves the
/// one in use.
fn reloadable_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
    reload: &Reload,
) -> anyhow::Result<axum_server::tls_rustls::RustlsConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let load = {
        let (cert, key) = (cert.to_owned(), key.to_owned());
        move || -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
            let read = |p: &std::path::Path, flag: &str| {
                std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read {flag} {}", p.display()))
            };
            gangway_auth::tls::server_config(&read(&cert, "--tls-cert")?, &read(&key, "--tls-key")?)
                .map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key: {e}"))
        }
    };
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(load()?);
    let reloaded = tls.clone();
    reload.part("the TLS certificate (--tls-cert, --tls-key)", move || {
        let config = load()?;
        let tls = reloaded.clone();
        Ok(Box::new(move || tls.reload_from_config(config)) as Install)
    });
    Ok(tls)
}

/// A file's text, or an error naming its flag.
fn read_file(path: &std::path::Path, flag: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

/// Reads a `KID=PATH` private key argument (`flag` names it in errors).
fn read_signing_key(arg: &str, flag: &str) -> anyhow::Result<gangway_auth::jwt::SigningKey> {
    let (kid, path) = arg
        .split_once('=')
        .with_context(|| format!("{flag} is not KEY_ID=PATH"))?;
    let pem = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    gangway_auth::jwt::SigningKey::from_pem(kid, &pem).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// The region's key and CA files, read at start and again on every
/// SIGHUP, the same way both times.
#[derive(Clone)]
struct RegionKeyFiles {
    service_keys: Vec<String>,
    peer_signing_key: Option<String>,
    ca: Option<PathBuf>,
}

impl RegionKeyFiles {
    fn from(args: &RegionArgs) -> Self {
        RegionKeyFiles {
            service_keys: args.service_keys.clone(),
            peer_signing_key: args.peer_signing_key.clone(),
            ca: args.ca.clone(),
        }
    }

    /// `--service-key`: the verifier of callers' tokens (`None` without).
    fn verifier(&self) -> anyhow::Result<Option<gangway_auth::jwt::Verifier>> {
        if self.service_keys.is_empty() {
            return Ok(None);
        }
        let verifier = gangway_auth::jwt::Verifier::new(
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            &read_keys(&self.service_keys)?,
        )
        .map_err(|e| anyhow::anyhow!("--service-key: {e}"))?;
        Ok(Some(verifier))
    }

    /// `--peer-signing-key`.
    fn peer_signing_key(&self) -> anyhow::Result<Option<gangway_auth::jwt::SigningKey>> {
        (self.peer_signing_key.as_deref())
            .map(|k| read_signing_key(k, "--peer-signing-key"))
            .transpose()
    }

    /// `--ca`, the peers' CA.
    fn ca(&self) -> anyhow::Result<Option<String>> {
        (self.ca.as_deref())
            .map(|p| read_file(p, "--ca"))
            .transpose()
    }
}

/// A region's metrics on `addr`.
fn metrics_exporter_prometheus_install(addr: SocketAddr) -> anyhow::Result<()> {
    gangway_regional::telemetry::install_prometheus(addr)
        .with_context(|| format!("cannot serve metrics on {addr}"))
}

/// The global tier's or an agent's metrics on `addr`.
fn serve_metrics(addr: SocketAddr) -> anyhow::Result<()> {
    gangway_regional::telemetry::serve_prometheus(addr)
        .with_context(|| format!("cannot serve metrics on {addr}"))
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// A TOML file of settings (deploy/config/): the flags below without
    /// their dashes; a flag or its environment variable overrides one.
    #[arg(long, env = "GANGWAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The regional control plane's URL (https://, checked against
    /// --region-ca).
    #[arg(long, env = "GANGWAY_REGION_URL")]
    pub region_url: String,
    /// The CA certificate (PEM) that signs the region's certificate: the
    /// agent trusts it alone.
    #[arg(long, env = "GANGWAY_REGION_CA")]
    pub region_ca: Option<PathBuf>,
    /// Call the region over plain HTTP: INSECURE, for a network you trust.
    #[arg(long, conflicts_with = "region_ca")]
    pub insecure_http: bool,
    /// The region's name (a simulated fleet's node ids derive from it).
    #[arg(long, env = "GANGWAY_REGION")]
    pub region: Option<String>,
    /// Simulated mode: serve the simulated (counted) nodes of this fleet
    /// file (TOML) instead of this machine (dev clouds, drills, large-fleet
    /// tests). `--fleet` is an old name for it.
    #[arg(long, alias = "fleet", value_name = "FLEET_FILE")]
    pub simulate: Option<PathBuf>,
    /// Real mode: the name this machine registers under, as the region's
    /// inventory knows it (default: its hostname, lowercased).
    #[arg(long, conflicts_with = "simulate")]
    pub node_name: Option<String>,
    /// Real mode, on a machine without an NVIDIA driver (a GPU-less test
    /// host): the GPUs to declare. Where NVML loads, the GPUs it finds are
    /// registered instead.
    #[arg(long, conflicts_with = "simulate")]
    pub gpus: Option<u32>,
    /// Real mode: the GPU type to register (default: from NVML's model
    /// name, `NVIDIA H100 80GB HBM3` → `h100`); required with --gpus.
    #[arg(long, conflicts_with = "simulate")]
    pub gpu_type: Option<String>,
    /// This agent's id, the subject of its token (stable across restarts;
    /// default: the node name in real mode, `{region}-agent` simulated).
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
    /// The agent token (role agent, naming this region) for the region.
    #[arg(long, env = "GANGWAY_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The machine boot id to report (default: the kernel's for the real
    /// executor, a new one at each start for the sim executor).
    #[arg(long)]
    pub boot_id: Option<String>,
    /// Seconds between NVML polls of GPU health (ECC, row remaps,
    /// temperature, NVLink errors); XID events are reported as they come.
    #[arg(long, default_value_t = 10)]
    pub health_poll_interval_s: u64,
    /// The lease, in seconds: with no successful sync for this long the
    /// agent checkpoints and stops its workers (fences) and starts nothing
    /// until it syncs again. The region names one when the agent registers
    /// (its lost_after_s − 30 by default); the shorter of the two applies.
    #[arg(long)]
    pub fence_after_s: Option<u64>,
    /// Real executor: the region's checkpoint store (the region's
    /// --checkpoint-store URL): file:///path or s3://bucket/prefix. Rank 0's
    /// checkpoints are uploaded there, and a restarted worker's fetched
    /// from there. Default: WORK_DIR/checkpoint-store, which serves only
    /// restarts on this machine.
    #[arg(long)]
    pub checkpoint_store: Option<String>,
    /// A file holding the agent token (read at start; keep it 0600): a
    /// token in a file or the environment is out of other users' sight,
    /// one on the command line is not.
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Simulated mode: run one agent per leaf (rack) of the fleet in this
    /// process, `{agent-id}-{leaf}`, each syncing on its own as the
    /// machines of a real region would (the region's
    /// `--inventory-agent-per-leaf`). Each needs its own token: from
    /// `--tokens-file`.
    #[arg(long, requires = "simulate", requires = "tokens_file")]
    pub simulate_per_leaf: bool,
    /// With `--simulate-per-leaf`: a JSON object of agent id → token
    /// (keep it 0600).
    #[arg(long, requires = "simulate_per_leaf")]
    pub tokens_file: Option<PathBuf>,
    /// Real executor: how workers are isolated (docs/jobs.md): `auto`
    /// (a bubblewrap sandbox as the tenant's user where bubblewrap is
    /// installed, else the tenant's user alone), `sandbox`, `user`, or
    /// `off` (workers run as the agent's user: insecure).
    #[arg(long, default_value = "auto", env = "GANGWAY_ISOLATION")]
    pub isolation: String,
    /// TENANT=USER: run TENANT's workers as this existing user instead of
    /// the system user the agent creates for it (gw-TENANT). Repeatable.
    #[arg(long = "tenant-user", value_name = "TENANT=USER")]
    pub tenant_users: Vec<String>,
    /// A path bound read-write into every sandbox at the same place (a
    /// shared scratch volume). Repeatable.
    #[arg(long = "sandbox-bind", value_name = "PATH")]
    pub sandbox_binds: Vec<PathBuf>,
    /// A path bound read-only into every sandbox (a shared dataset).
    /// Repeatable.
    #[arg(long = "sandbox-bind-ro", value_name = "PATH")]
    pub sandbox_binds_ro: Vec<PathBuf>,
    /// A path sandboxed workers see as empty, besides the agent's work
    /// directory and a local checkpoint store. Repeatable.
    #[arg(long = "sandbox-hide", value_name = "PATH")]
    pub sandbox_hide: Vec<PathBuf>,
    /// Serve Prometheus metrics (workers, sync latency, checkpoint
    /// uploads, health signals) on this address, at /metrics.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// The agent's isolation settings from its flags.
fn isolation_config(args: &AgentArgs) -> anyhow::Result<IsolationConfig> {
    let mode = IsolationMode::parse(&args.isolation).with_context(|| {
        format!(
            "--isolation {:?}: use auto, sandbox, user or off",
            args.isolation
        )
    })?;
    let mut tenant_users = std::collections::BTreeMap::new();
    for m in &args.tenant_users {
        let (tenant, user) = m
            .split_once('=')
            .filter(|(t, u)| gangway_shared::ids::valid_tenant(t) && !u.is_empty())
            .with_context(|| format!("--tenant-user {m:?}: use TENANT=USER"))?;
        tenant_users.insert(tenant.to_string(), user.to_string());
    }
    let absolute = |p: &PathBuf, flag: &str| -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            p.is_absolute(),
            "{flag} {}: the path must be absolute",
            p.display()
        );
        Ok(p.clone())
    };
    let mut binds = Vec::new();
    for (paths, writable, flag) in [
        (&args.sandbox_binds, true, "--sandbox-bind"),
        (&args.sandbox_binds_ro, false, "--sandbox-bind-ro"),
    ] {
        for p in paths {
            binds.push(SandboxBind {
                path: absolute(p, flag)?,
                writable,
            });
        }
    }
    let hide = (args.sandbox_hide.iter())
        .map(|p| absolute(p, "--sandbox-hide"))
        .collect::<anyhow::Result<_>>()?;
    Ok(IsolationConfig {
        mode,
        tenant_users,
        binds,
        hide,
    })
}

pub async fn run_agent(mut args: AgentArgs) -> anyhow::Result<()> {
    // The link to the region first: HTTPS checked against its CA, or
    // plain HTTP only when the operator said so.
    gangway_shared::client::check_internal_url(
        &args.region_url,
        args.region_ca.is_some(),
        args.insecure_http,
        "--region-url",
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr)?;
    }
    let reload = Reload::default();
    reload.on_hangup()?;
    let files = AgentKeyFiles::from(&args);
    let region_ca_pem = files.region_ca()?;
    let isolation = isolation_config(&args)?;
    args.token = files.token()?;
    let (agent_id, nodes) = agent_nodes(&args)?;
    let executor = match args.executor.as_str() {
        "real" => ExecutorKind::Real,
        "sim" => ExecutorKind::Sim,
        other => anyhow::bail!("unknown executor {other:?}: use real or sim"),
    };
    let config = AgentConfig {
        region_url: args.region_url.clone(),
        region_ca_pem,
        agent_id,
        nodes,
        executor,
        time_factor: args.time_factor,
        work_dir: args.work_dir.clone(),
        default_sync_interval: Duration::from_secs(1),
        token: args.token.clone(),
        machine_boot_id: args.boot_id.clone(),
        health_poll_interval: Duration::from_secs(args.health_poll_interval_s.max(1)),
        fence_after: args.fence_after_s.map(Duration::from_secs),
        checkpoint_store: args.checkpoint_store.clone(),
        isolation,
    };
    let link = |token: Option<&str>| {
        gangway_agent::RegionLink::new(token, config.region_ca_pem.as_deref())
            .map_err(|e| anyhow::anyhow!("building the client for the region: {e}"))
    };
    if !args.simulate_per_leaf {
        let link = link(config.token.as_deref())?;
        let relinked = link.clone();
        reload.part(
            "the region's CA and the agent token (--region-ca, --token-file)",
            move || {
                let prepared = relinked
                    .prepare(files.token()?.as_deref(), files.region_ca()?.as_deref())
                    .map_err(|e| anyhow::anyhow!(e))?;
                let link = relinked.clone();
                Ok(Box::new(move || link.install(prepared)) as Install)
            },
        );
        return gangway_agent::run_with_link(config, link, shutdown_token()).await;
    }
    // One agent per leaf, each with its nodes, work dir and token.
    let tokens = files.leaf_tokens()?;
    let mut leaves: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    for n in &config.nodes {
        leaves.entry(n.leaf.clone()).or_default().push(n.clone());
    }
    let shutdown = shutdown_token();
    let mut agents = tokio::task::JoinSet::new();
    let mut links = Vec::new();
    for (leaf, nodes) in leaves {
        let agent_id = leaf_agent(&config.agent_id, &leaf);
        let token = files.leaf_token(&tokens, &agent_id)?;
        let one = AgentConfig {
            agent_id: agent_id.clone(),
            nodes,
            work_dir: config.work_dir.join(&leaf),
            token: Some(token.clone()),
            ..config.clone()
        };
        let leaf_link = link(Some(&token))?;
        links.push((agent_id, leaf_link.clone()));
        agents.spawn(gangway_agent::run_with_link(
            one,
            leaf_link,
            shutdown.clone(),
        ));
    }
    reload.part(
        "the region's CA and the agents' tokens (--region-ca, --tokens-file)",
        move || {
            let (ca, tokens) = (files.region_ca()?, files.leaf_tokens()?);
            let mut prepared = Vec::new();
            for (agent_id, link) in &links {
                let token = files.leaf_token(&tokens, agent_id)?;
                let new =
                    (link.prepare(Some(&token), ca.as_deref())).map_err(|e| anyhow::anyhow!(e))?;
                prepared.push((link.clone(), new));
            }
            Ok(Box::new(move || {
                for (link, new) in prepared {
                    link.install(new);
                }
            }) as Install)
        },
    );
    while let Some(done) = agents.join_next().await {
        done.context("an agent panicked")??;
    }
    Ok(())
}

/// The agent's CA and token files, read at start and again on every
/// SIGHUP, the same way both times. A token given as `--token` (or its
/// environment variable) cannot be re-read: it stays.
#[derive(Clone)]
struct AgentKeyFiles {
    region_ca: Option<PathBuf>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    tokens_file: Option<PathBuf>,
}

impl AgentKeyFiles {
    fn from(args: &AgentArgs) -> Self {
        AgentKeyFiles {
            region_ca: args.region_ca.clone(),
            token: args.token.clone(),
            token_file: args.token_file.clone(),
            tokens_file: args.tokens_file.clone(),
        }
    }

    /// `--region-ca`.
    fn region_ca(&self) -> anyhow::Result<Option<String>> {
        (self.region_ca.as_deref())
            .map(|p| read_file(p, "--region-ca"))
            .transpose()
    }

    /// The agent's token: `--token-file`'s, else `--token`.
    fn token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(self.token.clone());
        };
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the agent token file {}", path.display()))?;
        Ok(Some(token.trim().to_string()))
    }

    /// `--tokens-file`: agent id → token.
    fn leaf_tokens(&self) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
        let path = self.tokens_file.as_ref().context("no --tokens-file")?;
        serde_json::from_slice(
            &std::fs::read(path)
                .with_context(|| format!("cannot read the tokens file {}", path.display()))?,
        )
        .with_context(|| {
            format!(
                "{}: expected a JSON object of agent id → token",
                path.display()
            )
        })
    }

    fn leaf_token(
        &self,
        tokens: &std::collections::BTreeMap<String, String>,
        agent_id: &str,
    ) -> anyhow::Result<String> {
        let path = self
            .tokens_file
            .as_deref()
            .unwrap_or(std::path::Path::new(""));
        tokens
            .get(agent_id)
            .cloned()
            .with_context(|| format!("{}: no token for agent {agent_id}", path.display()))
    }
}

/// The agent's id and the nodes it serves: a simulated fleet's
/// (`--simulate`), or this machine as itself.
fn agent_nodes(
    args: &AgentArgs,
) -> anyhow::Result<(String, Vec<gangway_shared::agent::AgentNode>)> {
    if let Some(path) = &args.simulate {
        let region = (args.region.as_deref())
            .context("--simulate needs --region (a simulated fleet's node ids derive from it)")?;
        let fleet = FleetFile::load(path)
            .with_context(|| format!("cannot load fleet file {}", path.display()))?;
        let agent_id = (args.agent_id.clone()).unwrap_or_else(|| format!("{region}-agent"));
        return Ok((agent_id, nodes_from_fleet(&fleet, region, &args.address)));
    }
    use gangway_agent::identity;
    let name = match &args.node_name {
        Some(n) => n.clone(),
        None => identity::hostname()?,
    };
    let declared = identity::Declared {
        gpus: args.gpus,
        gpu_type: args.gpu_type.clone(),
    };
    let node = identity::real_node(&name, &args.address, identity::nvml_gpus(), &declared)?;
    tracing::info!(
        node = %node.node_id,
        gpus = node.gpus.len(),
        gpu_type = %node.gpu_type,
        nvml = node.gpus.iter().any(|g| g.pci_bus_id.is_some()),
        "this machine"
    );
    Ok((args.agent_id.clone().unwrap_or(name), vec![node]))
}

#[derive(Args, Debug)]
pub struct GlobalArgs {
    /// A TOML file of settings (deploy/config/): the flags below without
    /// their dashes; a flag or its environment variable overrides one.
    #[arg(long, env = "GANGWAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the public HTTPS API.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// Address of the Prometheus /metrics listener.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// TLS certificate chain (PEM).
    #[arg(long)]
    pub tls_cert: PathBuf,
    /// TLS private key (PEM).
    #[arg(long)]
    pub tls_key: PathBuf,
    /// A region, as NAME=URL; repeat for each region.
    #[arg(long = "region", value_name = "NAME=URL", required = true)]
    pub regions: Vec<String>,
    /// The CA certificate (PEM) that signs the regions' certificates: calls
    /// to regions trust it alone, over HTTPS only.
    #[arg(long)]
    pub region_ca: Option<PathBuf>,
    /// Call regions over plain HTTP: INSECURE, for a network you trust.
    #[arg(long, conflicts_with = "region_ca")]
    pub insecure_http: bool,
    /// A public key (PEM) that verifies tenant tokens, as KEY_ID=PATH;
    /// repeat it while keys rotate.
    #[arg(long = "tenant-key", value_name = "KID=PATH", required = true)]
    pub tenant_keys: Vec<String>,
    /// A public key (PEM) that verifies operator (admin) tokens, as
    /// KEY_ID=PATH; repeat it while keys rotate. Never a tenant key: tenant
    /// keys vouch for tenant tokens only. Without one, no admin endpoint
    /// answers.
    #[arg(long = "operator-key", value_name = "KID=PATH")]
    pub operator_keys: Vec<String>,
    /// The private key (PEM) that signs this tier's tokens for regions, as
    /// KEY_ID=PATH.
    #[arg(long, value_name = "KID=PATH")]
    pub service_signing_key: String,
    /// An OpenID Connect issuer whose tokens are tenants' (its URL, as its
    /// tokens' `iss`): its keys are read from its discovery document and
    /// JWKS, and fetched again as they rotate.
    #[arg(long, value_name = "URL", requires = "oidc_audience")]
    pub oidc_issuer: Option<String>,
    /// The audience (client id) the tenants' issuer's tokens must name.
    #[arg(long, value_name = "AUD")]
    pub oidc_audience: Option<String>,
    /// The claim of the tenants' issuer's tokens that names the tenant.
    #[arg(long, value_name = "CLAIM", default_value = "tenant")]
    pub oidc_tenant_claim: String,
    /// An OpenID Connect issuer whose tokens are operators' (never the
    /// tenants' issuer).
    #[arg(long, value_name = "URL", requires = "operator_oidc_audience")]
    pub operator_oidc_issuer: Option<String>,
    /// The audience (client id) the operators' issuer's tokens must name.
    #[arg(long, value_name = "AUD")]
    pub operator_oidc_audience: Option<String>,
    /// A claim value every operator token must carry, as CLAIM=VALUE (a
    /// string claim equal to it, or an array holding it: `groups=sre`).
    #[arg(long, value_name = "CLAIM=VALUE")]
    pub operator_oidc_require: Option<String>,
    /// The console's client secret at the tenants' issuer (a file holding
    /// it), for single sign-on in a browser; without it the console signs
    /// in as a public client (PKCE). Register
    /// `https://<this tier>/sign-in/sso/callback` as its redirect URI.
    #[arg(long, value_name = "PATH", requires = "oidc_issuer")]
    pub oidc_client_secret_file: Option<PathBuf>,
    /// The same at the operators' issuer.
    #[arg(long, value_name = "PATH", requires = "operator_oidc_issuer")]
    pub operator_oidc_client_secret_file: Option<PathBuf>,
    /// The CA (PEM) the issuers' HTTPS servers chain to, for a private
    /// identity provider; without it, the usual public roots.
    #[arg(long, value_name = "PATH")]
    pub oidc_ca: Option<PathBuf>,
    /// How often the issuers' keys are fetched again, in seconds (and at
    /// once, at most every 10 s, for a token naming a key not seen yet).
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub oidc_refresh_s: u64,
    /// Requests per second each tenant may make (per replica).
    #[arg(long, default_value_t = 200)]
    pub rate_limit: u32,
    /// Burst each tenant may make above the rate.
    #[arg(long, default_value_t = 400)]
    pub rate_burst: u32,
    /// A tenant's own limit, as TENANT=PER_SECOND[:BURST]; repeatable.
    #[arg(long = "tenant-rate", value_name = "TENANT=RATE[:BURST]")]
    pub tenant_rates: Vec<String>,
    /// Regions a tenant may use, as TENANT=REGION[,REGION…]; repeatable.
    /// Tenants not named may use every region.
    #[arg(long = "tenant-regions", value_name = "TENANT=REGIONS")]
    pub tenant_regions: Vec<String>,
    /// The price book (docs/billing.md) that prices tenants' own costs
    /// (`GET /v1/costs`), read at each request; without it, costs answer
    /// 503.
    #[arg(long, value_name = "FILE")]
    pub price_book: Option<PathBuf>,
}

pub async fn run_global(args: GlobalArgs) -> anyhow::Result<()> {
    use gangway_global::config::{GlobalConfig, RateLimit, RegionEndpoint};
    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr)?;
    }
    let regions = args
        .regions
        .iter()
        .map(|r| {
            let (name, url) = r
                .split_once('=')
                .with_context(|| format!("--region {r:?} is not NAME=URL"))?;
            Ok(RegionEndpoint {
                name: name.to_string(),
                url: url.to_string(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for r in &regions {
        let what = format!("--region {}", r.name);
        gangway_shared::client::check_internal_url(
            &r.url,
            args.region_ca.is_some(),
            args.insecure_http,
            &what,
        )
        .map_err(|e| anyhow::anyhow!(e))?;
    }
    let reload = Reload::default();
    reload.on_hangup()?;
    let files = GlobalKeyFiles::from(&args);
    let mut config = GlobalConfig::new(
        read_file(&args.tls_cert, "--tls-cert")?,
        read_file(&args.tls_key, "--tls-key")?,
        regions,
        read_keys(&args.tenant_keys)?,
        files.service_signing_key()?,
    );
    config.region_ca_pem = files.region_ca()?;
    config.operator_keys = read_keys(&files.operator_keys)?;
    config.oidc = oidc_issuers(&args)?;
    config.price_book = args.price_book.clone();
    config.default_rate = RateLimit {
        per_second: args.rate_limit,
        burst: args.rate_burst,
    };
    for t in &args.tenant_rates {
        let (tenant, rate) = t
            .split_once('=')
            .with_context(|| format!("--tenant-rate {t:?} is not TENANT=RATE[:BURST]"))?;
        let (per, burst) = rate.split_once(':').unwrap_or((rate, rate));
        config.tenant_rates.insert(
            tenant.to_string(),
            RateLimit {
                per_second: per.parse().with_context(|| format!("bad rate in {t:?}"))?,
                burst: burst
                    .parse()
                    .with_context(|| format!("bad burst in {t:?}"))?,
            },
        );
    }
    for t in &args.tenant_regions {
        let (tenant, regions) = t
            .split_once('=')
            .with_context(|| format!("--tenant-regions {t:?} is not TENANT=REGION[,REGION…]"))?;
        config.tenant_regions.insert(
            tenant.to_string(),
            regions.split(',').map(str::to_string).collect(),
        );
    }
    let tls = reloadable_tls(&args.tls_cert, &args.tls_key, &reload)?;
    let state = gangway_global::GlobalState::new(config)?;
    let credentials = state.credentials.clone();
    reload.part(
        "the tenant and operator keys, the service signing key and the regions' CA (--tenant-key, --operator-key, --service-signing-key, --region-ca)",
        move || {
            let material = credentials.prepare(
                (
                    &read_keys(&files.tenant_keys)?,
                    &read_keys(&files.operator_keys)?,
                ),
                files.service_signing_key()?,
                files.region_ca()?.as_deref(),
            )?;
            let credentials = credentials.clone();
            Ok(Box::new(move || credentials.install(material)) as Install)
        },
    );
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    gangway_global::serve_state(listener, state, tls, shutdown_token()).await
}

/// A client secret from its file (one line, surrounding blanks ignored).
fn secret_file(path: &Option<PathBuf>, flag: &str) -> anyhow::Result<Option<String>> {
    path.as_deref()
        .map(|p| {
            let s = read_file(p, flag)?.trim().to_string();
            anyhow::ensure!(!s.is_empty(), "{flag} {}: the file is empty", p.display());
            Ok(s)
        })
        .transpose()
}

/// The OpenID Connect issuers the flags name.
fn oidc_issuers(args: &GlobalArgs) -> anyhow::Result<Vec<gangway_global::oidc::OidcIssuer>> {
    use gangway_global::oidc::{OidcIssuer, OidcKind};
    let ca_pem = (args.oidc_ca.as_deref())
        .map(|p| read_file(p, "--oidc-ca"))
        .transpose()?;
    let refresh = Duration::from_secs(args.oidc_refresh_s.max(1));
    let mut out = Vec::new();
    if let (Some(issuer), Some(audience)) = (&args.oidc_issuer, &args.oidc_audience) {
        out.push(OidcIssuer {
            issuer: issuer.clone(),
            audience: audience.clone(),
            kind: OidcKind::Tenants {
                tenant_claim: args.oidc_tenant_claim.clone(),
            },
            ca_pem: ca_pem.clone(),
            refresh,
            client_secret: secret_file(&args.oidc_client_secret_file, "--oidc-client-secret-file")?,
        });
    }
    if let (Some(issuer), Some(audience)) =
        (&args.operator_oidc_issuer, &args.operator_oidc_audience)
    {
        let require = (args.operator_oidc_require.as_deref())
            .map(|r| {
                r.split_once('=')
                    .filter(|(c, v)| !c.is_empty() && !v.is_empty())
                    .map(|(c, v)| (c.to_string(), v.to_string()))
                    .with_context(|| format!("--operator-oidc-require {r:?} is not CLAIM=VALUE"))
            })
            .transpose()?;
        out.push(OidcIssuer {
            issuer: issuer.clone(),
            audience: audience.clone(),
            kind: OidcKind::Operators { require },
            ca_pem,
            refresh,
            client_secret: secret_file(
                &args.operator_oidc_client_secret_file,
                "--operator-oidc-client-secret-file",
            )?,
        });
    }
    Ok(out)
}

/// The global tier's key and CA files, read at start and again on every
/// SIGHUP, the same way both times.
struct GlobalKeyFiles {
    tenant_keys: Vec<String>,
    operator_keys: Vec<String>,
    service_signing_key: String,
    region_ca: Option<PathBuf>,
}

impl GlobalKeyFiles {
    fn from(args: &GlobalArgs) -> Self {
        GlobalKeyFiles {
            tenant_keys: args.tenant_keys.clone(),
            operator_keys: args.operator_keys.clone(),
            service_signing_key: args.service_signing_key.clone(),
            region_ca: args.region_ca.clone(),
        }
    }

    /// `--service-signing-key`.
    fn service_signing_key(&self) -> anyhow::Result<gangway_auth::jwt::SigningKey> {
        read_signing_key(&self.service_signing_key, "--service-signing-key")
    }

    /// `--region-ca`, the regions' CA.
    fn region_ca(&self) -> anyhow::Result<Option<String>> {
        (self.region_ca.as_deref())
            .map(|p| read_file(p, "--region-ca"))
            .transpose()
    }
}
