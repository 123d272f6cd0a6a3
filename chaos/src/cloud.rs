//! A local cloud for drills: three `gangway region`s, each with a
//! PostgreSQL of its own (so a drill can kill one), peers of each other,
//! an agent each serving two 8-GPU nodes — running real trainer processes
//! ([`Executor::Real`], with a checkpoint store per region) or simulated
//! workers — and two `gangway global` replicas on HTTPS in front; every
//! link between
//! regions, and from the global tier to each, goes through a proxy that
//! can be cut.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_devkit::{PgCluster, PgOptions};
use gangway_shared::api::{Job, JobSpec};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use uuid::Uuid;

use crate::procs::{
    key_arg, kill_processes_under, log_file, spawn_agent, spawn_global_as, until_ready, Proc, Proxy,
};

/// Two nodes × 8 h100 per region.
const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 2
  gpu_type = "h100"
  gpus_per_node = 8
"#;

/// The example trainer (deploy/examples/trainer), written into the cloud's
/// directory so that the installed `gangway` binary carries it.
const TRAINER: &str = include_str!("../../deploy/examples/trainer");

pub const REGIONS: [&str; 3] = ["r1", "r2", "r3"];

/// Replicas of the global tier.
pub const GLOBALS: usize = 2;

/// How the agents run workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executor {
    /// Real processes (the example trainer), checkpoints through each
    /// region's store.
    Real,
    /// No processes: a job runs for its estimate × 0.05.
    Sim,
}

struct Region {
    control: Option<Proc>,
    agent: Option<Proc>,
    /// The region's own PostgreSQL (`None` while a drill restarts it).
    pg: Option<PgCluster>,
    /// How its control plane is started (to restart it).
    control_args: Vec<OsString>,
}

pub struct Cloud {
    pub dir: tempfile::TempDir,
    /// A tenant's client of the first global replica.
    pub tenant: Client,
    /// The same tenant's client of each global replica.
    pub tenants: Vec<Client>,
    pub executor: Executor,
    regions: Mutex<Vec<Region>>,
    /// The regions' API ports (agents and direct checks use them).
    ports: Vec<u16>,
    /// Every region's database, as a connection string.
    dbs: Vec<String>,
    /// Every link between regions, and from the global tier to each
    /// region (`from` = "global"), through a proxy that can be cut.
    links: Vec<(&'static str, &'static str, Proxy)>,
    /// A service token, to ask regions directly.
    service: String,
    bin: PathBuf,
    /// What agents are started with (to restart one).
    auth: DevMaterial,
    fleet: PathBuf,
    /// The global tier's replicas (`None`: killed).
    globals: Mutex<Vec<Option<Proc>>>,
}

impl Cloud {
    /// Starts the cloud with simulated workers; see [`Cloud::start_with`].
    pub async fn start(bin: &Path, short: bool) -> Cloud {
        Cloud::start_with(bin, short, Executor::Sim).await
    }

    /// Starts the cloud with `bin` (the `gangway` binary), its timers
    /// short (`short`, for CI) or the defaults, its agents running workers
    /// with `executor`.
    pub async fn start_with(bin: &Path, short: bool, executor: Executor) -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        // Traversable by the `postgres` user when we run as root.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, FLEET).unwrap();
        let trainer = dir.path().join("trainer");
        std::fs::write(&trainer, TRAINER).unwrap();
        let ports: Vec<u16> = REGIONS
            .iter()
            .map(|_| gangway_devkit::free_port())
            .collect();
        let global_ports: Vec<u16> = (0..GLOBALS).map(|_| gangway_devkit::free_port()).collect();
        let service_pub = key_arg(&auth, "service-signing.pub.pem");
        let service_priv = key_arg(&auth, "service-signing.pem");
        let mut links = Vec::new();
        for (j, to) in REGIONS.iter().enumerate() {
            for from in REGIONS.iter().chain(["global"].iter()) {
                if from != to {
                    links.push((*from, *to, Proxy::start(ports[j]).await));
                }
            }
        }
        let via = |from: &str, to: &str| {
            let (_, _, p) = links
                .iter()
                .find(|(f, t, _)| *f == from && *t == to)
                .unwrap();
            format!("http://127.0.0.1:{}", p.port)
        };
        // The regions' databases, started side by side.
        let pgs = futures_util::future::join_all(REGIONS.iter().map(|name| {
            let data = dir.path().join(format!("{name}-pg"));
            tokio::task::spawn_blocking(move || -> anyhow::Result<(PgCluster, String)> {
                // A fixed port (a restart keeps the region's URL), so one
                // some other process took meanwhile is tried again.
                let mut tries = 0;
                loop {
                    tries += 1;
                    let opts = PgOptions {
                        port: Some(gangway_devkit::free_port()),
                        ..PgOptions::for_tests()
                    };
                    let mut pg = PgCluster::init_or_open(&data, opts)?;
                    match pg.start() {
                        Ok(()) => {
                            pg.create_database_blocking("gangway")?;
                            let url = pg.connection_string("gangway");
                            return Ok((pg, url));
                        }
                        Err(e) if tries < 5 && format!("{e:#}").contains("already in use") => {}
                        Err(e) => return Err(e),
                    }
                }
            })
        }))
        .await;
        let mut regions = Vec::new();
        let mut dbs = Vec::new();
        for (i, (name, pg)) in REGIONS.iter().zip(pgs).enumerate() {
            let (pg, db) = pg
                .unwrap()
                .unwrap_or_else(|e| panic!("{name}'s PostgreSQL: {e:#}"));
            let store = store_url(dir.path(), name);
            let mut args: Vec<OsString> = Vec::new();
            let mut arg = |a: &str| args.push(a.into());
            for a in ["region", "--name", name, "--database-url", &db] {
                arg(a);
            }
            for a in [
                "--service-key",
                &service_pub,
                "--peer-signing-key",
                &service_priv,
            ] {
                arg(a);
            }
            arg("--listen");
            arg(&format!("127.0.0.1:{}", ports[i]));
            for a in [
                "--schedule-interval-ms",
                "100",
                "--agent-sync-interval-ms",
                "200",
                "--grace-period-s",
                "2",
                "--checkpoint-deadline-s",
                "10",
                "--checkpoint-store",
                &store,
            ] {
                arg(a);
            }
            // Short timers keep CI short; the defaults are what
            // docs/benchmarks.md measures.
            if short {
                for a in [
                    "--fence-after-s",
                    "4",
                    "--fence-checkpoint-s",
                    "3",
                    "--peer-heartbeat-ms",
                    "250",
                    "--peer-lease-s",
                    "3",
                ] {
                    arg(a);
                }
            }
            for peer in REGIONS.iter().filter(|p| *p != name) {
                arg("--peer");
                arg(&format!("{peer}={}", via(name, peer)));
            }
            let control = spawn_control(bin, dir.path(), name, &args);
            let agent = spawn_agent(
                bin,
                dir.path(),
                &auth,
                name,
                ports[i],
                &fleet,
                executor,
                &store,
            );
            regions.push(Region {
                control: Some(control),
                agent: Some(agent),
                pg: Some(pg),
                control_args: args,
            });
            dbs.push(db);
        }
        let urls: Vec<(&str, String)> = REGIONS.iter().map(|n| (*n, via("global", n))).collect();
        let globals: Vec<Option<Proc>> = (global_ports.iter().enumerate())
            .map(|(i, port)| {
                let name = format!("global-{i}");
                Some(spawn_global_as(bin, dir.path(), &auth, *port, &urls, &name))
            })
            .collect();
        let token = auth
            .tenant_key
            .sign(&claims_for(
                Role::Tenant,
                "acme-e2e",
                Some("acme"),
                None,
                tokens::ISSUER,
                tokens::PUBLIC_AUDIENCE,
                Duration::from_secs(3600),
            ))
            .unwrap();
        let ca = std::fs::read(&auth.ca_cert).unwrap();
        let tenants: Vec<Client> = (global_ports.iter())
            .map(|port| {
                Client::public(
                    format!("https://127.0.0.1:{port}"),
                    token.clone(),
                    Some(&ca),
                )
                .unwrap()
            })
            .collect();
        let service = crate::procs::token(&auth.service_key, Role::Service, None);
        let cloud = Cloud {
            dir,
            tenant: tenants[0].clone(),
            tenants,
            executor,
            regions: Mutex::new(regions),
            ports,
            dbs,
            links,
            service,
            bin: bin.to_path_buf(),
            auth,
            fleet,
            globals: Mutex::new(globals),
        };
        // Ready: every region healthy with its 16 GPUs schedulable (or the
        // logs are kept for whoever reads the failure).
        let mut cloud = cloud;
        cloud.dir.disable_cleanup(true);
        until_ready(&cloud.tenant, 3, 16, cloud.dir.path()).await;
        cloud.dir.disable_cleanup(false);
        cloud
    }

    /// Waits (polling the global tier) until `cond` holds for the job.
    pub async fn wait_for(
        &self,
        id: Uuid,
        what: &str,
        within: Duration,
        cond: impl Fn(&Job) -> bool,
    ) -> anyhow::Result<Job> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(job) = self.tenant.get(id).await {
                if cond(&job) {
                    return Ok(job);
                }
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "job {id}: {what} never happened; logs in {}",
                    self.dir.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Cuts (or heals) every link of region `name` to the other regions
    /// and from the global tier; its agents still reach it.
    pub fn partition(&self, name: &str, cut: bool) {
        for (from, to, p) in &self.links {
            if *from == name || *to == name {
                p.set_cut(cut);
            }
        }
    }

    /// The job as region `name` itself has it (its own copy), if it has one.
    pub async fn copy_in(&self, name: &str, id: Uuid) -> Option<Job> {
        self.direct(name).get(id).await.ok()
    }

    /// Region `name`'s usage ledger: its own rows and those it holds for
    /// its peers, of the last day.
    pub async fn usage_in(
        &self,
        name: &str,
    ) -> anyhow::Result<Vec<gangway_shared::billing::UsageRecord>> {
        let now = chrono::Utc::now();
        let day = chrono::Duration::days(1);
        Ok(self
            .direct(name)
            .usage_records(now - day, now + day, None)
            .await?)
    }

    /// Whether region `name` says it is fenced (`None`: it did not say).
    pub async fn fenced(&self, name: &str) -> Option<bool> {
        self.direct(name)
            .region_status()
            .await
            .ok()
            .map(|s| s.fenced)
    }

    /// A client of region `name` itself, not through the global tier.
    fn direct(&self, name: &str) -> Client {
        Client::new(
            format!("http://127.0.0.1:{}", self.ports[index(name)]),
            "acme",
        )
        .with_token(self.service.clone())
    }

    /// Kills a whole region with SIGKILL, as a power cut would: its
    /// control plane, its PostgreSQL, its agent, and every worker process
    /// the agent started (they run in process groups of their own and
    /// would outlive the agent).
    pub fn kill(&self, name: &str) {
        self.kill_control(name);
        self.kill_database(name);
        let mut regions = self.regions.lock().expect("regions lock");
        regions[index(name)].agent.take();
        drop(regions);
        kill_processes_under(&self.agent_dir(name));
    }

    /// Kills region `name`'s control plane only (its agents and workers go
    /// on, and fence themselves once their lease runs out).
    pub fn kill_control(&self, name: &str) {
        self.regions.lock().expect("regions lock")[index(name)]
            .control
            .take();
    }

    /// Starts region `name`'s control plane again, as it was started.
    pub fn restart_control(&self, name: &str) {
        let mut regions = self.regions.lock().expect("regions lock");
        let r = &mut regions[index(name)];
        assert!(r.control.is_none(), "{name}'s control plane is running");
        r.control = Some(spawn_control(
            &self.bin,
            self.dir.path(),
            name,
            &r.control_args,
        ));
    }

    /// A client of the global tier with an operator's token, and the
    /// command-line flags that give the CLI the same.
    pub fn operator(&self) -> (Client, Vec<String>) {
        let token = (self.auth.tenant_key)
            .sign(&claims_for(
                Role::Admin,
                "ops-e2e",
                None,
                None,
                tokens::ISSUER,
                tokens::PUBLIC_AUDIENCE,
                Duration::from_secs(3600),
            ))
            .unwrap();
        let ca = std::fs::read(&self.auth.ca_cert).unwrap();
        let url = self.tenant.base().to_string();
        let client = Client::public(url.clone(), token.clone(), Some(&ca)).unwrap();
        let flags = vec![
            "--url".into(),
            url,
            "--admin-token".into(),
            token,
            "--ca-cert".into(),
            self.auth.ca_cert.display().to_string(),
            "--state-dir".into(),
            self.dir.path().join("no-dev-state").display().to_string(),
        ];
        (client, flags)
    }

    /// Kills global replica `i` with SIGKILL.
    pub fn kill_global(&self, i: usize) {
        self.globals.lock().expect("globals lock")[i].take();
    }

    /// Kills region `name`'s agent with SIGKILL, as a crash would: its
    /// workers go on (process groups of their own).
    pub fn kill_agent(&self, name: &str) {
        self.regions.lock().expect("regions lock")[index(name)]
            .agent
            .take();
    }

    /// Starts region `name`'s agent again, as it was started.
    pub fn restart_agent(&self, name: &str) {
        let i = index(name);
        let agent = spawn_agent(
            &self.bin,
            self.dir.path(),
            &self.auth,
            name,
            self.ports[i],
            &self.fleet,
            self.executor,
            &store_url(self.dir.path(), name),
        );
        let mut regions = self.regions.lock().expect("regions lock");
        assert!(regions[i].agent.is_none(), "{name}'s agent is running");
        regions[i].agent = Some(agent);
    }

    /// Where region `name`'s checkpoint store keeps its objects.
    pub fn store_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}-store"))
    }

    /// Kills region `name`'s PostgreSQL with SIGKILL (its control plane
    /// goes on, without a database).
    pub fn kill_database(&self, name: &str) {
        let regions = self.regions.lock().expect("regions lock");
        if let Some(pid) = regions[index(name)]
            .pg
            .as_ref()
            .and_then(PgCluster::postmaster_pid)
        {
            // SAFETY: signalling a process of ours; its backends exit when
            // they see the postmaster gone.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Starts region `name`'s PostgreSQL again on its data (crash
    /// recovery) and port.
    pub async fn restart_database(&self, name: &str) -> anyhow::Result<()> {
        let mut pg = (self.regions.lock().expect("regions lock")[index(name)]
            .pg
            .take())
        .ok_or_else(|| anyhow::anyhow!("{name}'s database is being restarted already"))?;
        let (pg, started) = tokio::task::spawn_blocking(move || {
            let started = pg.start();
            (pg, started)
        })
        .await?;
        self.regions.lock().expect("regions lock")[index(name)].pg = Some(pg);
        started
    }

    /// Region `name`'s database, as a connection string.
    pub fn database(&self, name: &str) -> &str {
        &self.dbs[index(name)]
    }

    /// Where region `name`'s agent runs its workers.
    pub fn agent_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}-agent"))
    }

    /// The example trainer's path in the cloud's directory.
    pub fn trainer(&self) -> PathBuf {
        self.dir.path().join("trainer")
    }
}

impl Drop for Cloud {
    /// Everything stops before the directory goes (fields drop after
    /// this, `dir` first): the agents and their workers (in process
    /// groups of their own, they would outlive the agents), the control
    /// planes, the global tier, and the databases (killed: they are
    /// thrown away, and a database whose directory is gone takes its
    /// stop timeout to notice).
    fn drop(&mut self) {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        for (name, r) in REGIONS.iter().zip(regions.iter_mut()) {
            r.agent.take();
            kill_processes_under(&self.dir.path().join(format!("{name}-agent")));
            r.control.take();
        }
        (self.globals.lock().unwrap_or_else(|e| e.into_inner())).clear();
        for r in regions.iter_mut() {
            if let Some(pg) = r.pg.take() {
                pg.kill_for_exit(Duration::from_secs(5));
            }
        }
    }
}

/// Region `name`'s checkpoint store, shared by its control plane and agent.
fn store_url(dir: &Path, name: &str) -> String {
    format!("file://{}", dir.join(format!("{name}-store")).display())
}

fn index(name: &str) -> usize {
    REGIONS
        .iter()
        .position(|r| *r == name)
        .unwrap_or_else(|| panic!("no region {name}"))
}

/// Region `name`'s control plane, logging to `{name}-region.log`.
fn spawn_control(bin: &Path, dir: &Path, name: &str, args: &[OsString]) -> Proc {
    Proc(
        Command::new(bin)
            .args(args)
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir, &format!("{name}-region.log")))
            .spawn()
            .unwrap(),
    )
}

/// An 8-GPU job named `name`: 1200 s estimated × 0.05 = 60 s simulated.
pub fn spec(name: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 1200, "command": ["train"]
    }))
    .unwrap()
}

/// How a drill's trainer job trains.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Training {
    /// Seconds a step takes.
    pub step_s: f64,
    /// A checkpoint every this many steps.
    pub every: u32,
    /// Steps to train.
    pub total: u32,
    /// MiB of weights in each checkpoint.
    pub checkpoint_mb: u32,
}

/// An 8-GPU job named `name` running the example trainer with `t`,
/// logging every step to `log`.
pub fn trainer_spec(trainer: &Path, name: &str, t: Training, log: &Path) -> JobSpec {
    let run_s = (f64::from(t.total) * t.step_s).ceil() as i64;
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": run_s.max(1),
        "command": [
            "sh", trainer, "--step-s", t.step_s.to_string(),
            "--every", t.every.to_string(), "--total", t.total.to_string(),
            "--checkpoint-mb", t.checkpoint_mb.to_string()
        ],
        "env": {"TRAINER_LOG": log, "TRAINER_LOG_STEPS": "1"}
    }))
    .unwrap()
}
