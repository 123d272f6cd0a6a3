//! A local cloud for drills: three `gangway region`s, each with a
//! PostgreSQL of its own (so a drill can kill one), peers of each other,
//! an agent each serving two 8-GPU nodes — running real trainer processes
//! ([`Executor::Real`], with a checkpoint store per region) or simulated
//! workers — and two `gangway global` replicas on HTTPS in front; every
//! link between regions, and from the global tier to each, goes through a
//! proxy that can be cut. Its processes are held by a
//! [`Supervisor`] of its own ([`Cloud::start_with`]); or the cloud is a
//! running `gangway dev up`'s, whose supervisor breaks and mends its parts
//! when asked through its control API ([`Cloud::attach`]); or the cloud is
//! a lab of machines' ([`Cloud::start_lab`], [`crate::lab`]): 25 hosts, each a
//! network namespace, whose faults come from the network and the hosts
//! (links down, power cut), not from a proxy.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_devkit::{PatroniCluster, PatroniOptions, PgCluster, PgOptions};
use gangway_shared::api::{Job, JobSpec};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use uuid::Uuid;

use crate::control::Remote;
use crate::lab::Lab;
use crate::procs::{agent_launch, global_launch, key_arg, until_ready, Proxy};
use crate::supervisor::{Launch, Link, RegionInfo, RegionParts, Supervisor, Target};

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

/// What breaks and mends the cloud's parts: a supervisor of its own, a
/// running `gangway dev up`'s, through its control API, or a lab of
/// machines.
#[allow(clippy::large_enum_variant)] // one per cloud: boxing would buy nothing
enum Parts {
    Own(Supervisor),
    Dev(Remote),
    Lab(Lab),
}

/// How long the harness waits for one answer of a lab region's replica
/// about its status or a job (a host without power answers nothing, and
/// the watch of the other regions must not wait for it), and for the
/// ledgers' pages at the end.
const LAB_PROBE: Duration = Duration::from_millis(750);
const LAB_READ: Duration = Duration::from_secs(15);

/// The timers every drill cloud runs with: a fast scheduler and agent
/// syncs, short grace periods.
pub const DRILL_TIMERS: [&str; 8] = [
    "--schedule-interval-ms",
    "100",
    "--agent-sync-interval-ms",
    "200",
    "--grace-period-s",
    "2",
    "--checkpoint-deadline-s",
    "10",
];

/// The short leases CI's drills use (`short`), instead of the defaults
/// docs/benchmarks.md measures.
pub const SHORT_TIMERS: [&str; 8] = [
    "--fence-after-s",
    "4",
    "--fence-checkpoint-s",
    "3",
    "--peer-heartbeat-ms",
    "250",
    "--peer-lease-s",
    "3",
];

pub struct Cloud {
    /// First, so that it drops first: an own cloud's processes stop
    /// before its directory goes.
    parts: Parts,
    /// The region whose database is a Patroni cluster, and the cluster
    /// ([`Cloud::start_ha`]); second, so that it stops before the
    /// directory it keeps its data in goes.
    patroni: Option<(String, Arc<PatroniCluster>)>,
    /// Where the drill keeps its trainer logs (for its own cloud, also the
    /// processes' logs and state).
    pub dir: tempfile::TempDir,
    /// A tenant's client of the first global replica.
    pub tenant: Client,
    /// The same tenant's client of each global replica.
    pub tenants: Vec<Client>,
    pub executor: Executor,
    /// The regions, in order.
    regions: Vec<RegionInfo>,
    /// A service token, to ask regions directly.
    service: String,
    /// The cloud's dev CA and keys.
    auth: DevMaterial,
    /// Where the processes log.
    process_logs: PathBuf,
    /// Whether [`Cloud::dir`] outlives the cloud (for a failed drill's logs).
    keep: std::sync::atomic::AtomicBool,
}

/// A region's database as a drill cloud starts it.
#[allow(clippy::large_enum_variant)] // one per region of a drill
enum Database {
    Single(PgCluster),
    Patroni(Arc<PatroniCluster>),
}

/// The timers of a cloud whose database may fail over ([`Cloud::start_ha`]):
/// CI's short ones, but leases (the regions', and so the agents') of 30 s,
/// longer than a failover takes even on a loaded machine (a killed
/// primary's PostgreSQL restarted in place by Patroni took 21 s once), so
/// that the region rides it out rather than fencing.
pub const HA_TIMERS: [&str; 6] = [
    "--fence-checkpoint-s",
    "3",
    "--peer-heartbeat-ms",
    "250",
    "--peer-lease-s",
    "30",
];

impl Drop for Cloud {
    fn drop(&mut self) {
        if *self.keep.get_mut() {
            self.dir.disable_cleanup(true);
        }
    }
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
        let timers: &[&str] = if short { &SHORT_TIMERS } else { &[] };
        Cloud::start_inner(bin, timers, executor, None).await
    }

    /// Starts the cloud with region `ha`'s database a three-member Patroni
    /// cluster (the others a single server each), and [`HA_TIMERS`], so
    /// that its database can fail over without the region fencing; its
    /// agents run real workers. [`Cloud::patroni`] is the cluster.
    pub async fn start_ha(bin: &Path, ha: &str) -> Cloud {
        Cloud::start_inner(bin, &HA_TIMERS, Executor::Real, Some(ha)).await
    }

    async fn start_inner(
        bin: &Path,
        timers: &[&str],
        executor: Executor,
        ha: Option<&str>,
    ) -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        // Traversable by the `postgres` user when we run as root.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, FLEET).unwrap();
        write_trainer(dir.path());
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
                    links.push(Link {
                        from: from.to_string(),
                        to: to.to_string(),
                        proxy: Proxy::start(ports[j]).await,
                    });
                }
            }
        }
        let via = |from: &str, to: &str| {
            let l = links.iter().find(|l| l.from == from && l.to == to).unwrap();
            format!("https://127.0.0.1:{}", l.proxy.port)
        };
        // The regions' databases, started side by side.
        let pgs = futures_util::future::join_all(REGIONS.iter().map(|name| {
            let data = dir.path().join(format!("{name}-pg"));
            let ha = ha == Some(*name);
            tokio::task::spawn_blocking(move || -> anyhow::Result<(Database, String)> {
                if ha {
                    let c = PatroniCluster::start(&data, PatroniOptions::for_tests())?;
                    c.create_database_blocking("gangway")?;
                    let url = c.connection_url("gangway");
                    return Ok((Database::Patroni(Arc::new(c)), url));
                }
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
                            return Ok((Database::Single(pg), url));
                        }
                        Err(e) if tries < 5 && format!("{e:#}").contains("already in use") => {}
                        Err(e) => return Err(e),
                    }
                }
            })
        }))
        .await;
        let mut regions = Vec::new();
        let mut patroni = None;
        for (i, (name, pg)) in REGIONS.iter().zip(pgs).enumerate() {
            let (pg, db) = pg
                .unwrap()
                .unwrap_or_else(|e| panic!("{name}'s PostgreSQL: {e:#}"));
            let pg = match pg {
                Database::Single(pg) => Some(pg),
                Database::Patroni(c) => {
                    patroni = Some((name.to_string(), c));
                    None
                }
            };
            let store = store_url(dir.path(), name);
            let mut control = Launch::new(bin, dir.path().join(format!("{name}-region.log")))
                .env("GANGWAY_LOG", "info")
                // The URL holds the database's password: in the environment,
                // out of other users' sight (a command line is not).
                .env("GANGWAY_DATABASE_URL", &db)
                .args(["region", "--name", name])
                .args(["--service-key", &service_pub])
                .args(["--peer-signing-key", &service_priv])
                // TLS on every link, with the dev certificate and CA.
                .args(crate::procs::region_tls(&auth))
                .args(["--listen", &format!("127.0.0.1:{}", ports[i])])
                .args(DRILL_TIMERS)
                .args(["--checkpoint-store", &store])
                // Its inventory: the fleet its agent (`{name}-agent`) serves.
                .arg("--inventory")
                .arg(&fleet);
            // Short timers keep CI short; the defaults are what
            // docs/benchmarks.md measures.
            control = control.args(timers);
            for peer in REGIONS.iter().filter(|p| *p != name) {
                control = control
                    .arg("--peer")
                    .arg(format!("{peer}={}", via(name, peer)));
            }
            let log = format!("{name}-agent");
            let agent = agent_launch(bin, dir.path(), &auth, name, ports[i], &fleet, &log);
            let agent = match executor {
                Executor::Real => agent.args(["--executor", "real"]),
                Executor::Sim => agent.args(["--executor", "sim", "--time-factor", "0.05"]),
            };
            regions.push(RegionParts {
                info: RegionInfo {
                    name: name.to_string(),
                    url: format!("https://127.0.0.1:{}", ports[i]),
                    database: db,
                    store_dir: dir.path().join(format!("{name}-store")),
                    agent_dir: dir.path().join(&log),
                    broken: Vec::new(),
                },
                control,
                agent: agent.args(["--checkpoint-store", &store]),
                database: pg,
            });
        }
        let urls: Vec<(&str, String)> = REGIONS.iter().map(|n| (*n, via("global", n))).collect();
        let globals: Vec<Launch> = (global_ports.iter().enumerate())
            .map(|(i, port)| {
                let name = format!("global-{i}");
                global_launch(bin, dir.path(), &auth, *port, &urls, &name)
            })
            .collect();
        let infos: Vec<RegionInfo> = regions.iter().map(|r| r.info.clone()).collect();
        let sup = Supervisor::new(regions, globals, links);
        sup.start_regions().unwrap();
        sup.start_globals().unwrap();
        let global_urls: Vec<String> = (global_ports.iter())
            .map(|port| format!("https://127.0.0.1:{port}"))
            .collect();
        let mut cloud = Cloud::new(dir, auth, executor, infos, &global_urls, Parts::Own(sup));
        cloud.patroni = patroni;
        // Ready: every region healthy with its 16 GPUs schedulable (or the
        // logs are kept for whoever reads the failure).
        cloud.dir.disable_cleanup(true);
        until_ready(&cloud.tenant, 3, 16, cloud.dir.path()).await;
        cloud.dir.disable_cleanup(false);
        cloud
    }

    /// The cloud a running `gangway dev up` with state dir `state_dir`
    /// holds, broken and mended through its control API; the drill keeps
    /// its logs in a directory under `state_dir/chaos`. Mends first what
    /// an earlier drill left broken.
    pub async fn attach(state_dir: &Path) -> anyhow::Result<Cloud> {
        let remote = Remote::of(state_dir)?;
        let info = remote.info().await?;
        if info.executor != "real" {
            anyhow::bail!(
                "the dev cloud runs the {} executor; the drills run real trainer processes: \
                 start it with `gangway dev up --executor real`",
                info.executor
            );
        }
        let broken: Vec<String> = (info.regions.iter())
            .flat_map(|r| r.broken.iter().map(move |b| format!("{}'s {b}", r.name)))
            .chain(
                (info.globals.iter().enumerate())
                    .filter(|(_, g)| g.broken)
                    .map(|(i, _)| format!("global replica {i}")),
            )
            .collect();
        if !broken.is_empty() {
            eprintln!(
                "mending what an earlier drill left broken: {}",
                broken.join(", ")
            );
            remote.mend_all().await?;
        }
        let auth = DevMaterial::load_or_create(&info.state_dir)
            .map_err(|e| anyhow::anyhow!("cannot read the dev cloud's keys: {e}"))?;
        let parent = info.state_dir.join("chaos");
        std::fs::create_dir_all(&parent)?;
        let dir = tempfile::Builder::new()
            .prefix("drill-")
            .tempdir_in(&parent)?;
        // dev up binds `chaos` into its sandboxes: its jobs cross this
        // directory to the shared one.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        write_trainer(dir.path());
        let global_urls: Vec<String> = info.globals.iter().map(|g| g.url.clone()).collect();
        let cloud = Cloud::new(
            dir,
            auth,
            Executor::Real,
            info.regions,
            &global_urls,
            Parts::Dev(remote),
        );
        // Ready: the global tier sees every region healthy.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(list) = cloud.tenant.regions().await {
                if list.regions.len() == cloud.regions.len()
                    && list.regions.iter().all(|r| r.healthy)
                {
                    return Ok(cloud);
                }
            }
            if Instant::now() >= deadline {
                anyhow::bail!("the dev cloud's global tier does not see every region healthy");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A cloud on a lab of machines of its own ([`crate::lab`]), started
    /// with `bin`: three regions of two control-plane replicas, a
    /// PostgreSQL host and four GPU machines each (real executor), two
    /// global replicas, TLS on every hop, CI's short timers. A region is
    /// killed by a power cut of every one of its hosts and brought back by
    /// booting them; its links are cut at its router. The drill's trainer
    /// logs are under the lab's shared directory, bound into every
    /// sandbox.
    pub async fn start_lab(bin: &Path) -> anyhow::Result<Cloud> {
        Cloud::start_lab_with(bin, crate::lab::LabOptions::default()).await
    }

    /// [`Cloud::start_lab`] with region `ha`'s database a Patroni cluster
    /// on hosts of its own (an etcd and three PostgreSQL hosts) and every
    /// region on [`HA_TIMERS`]; [`Cloud::patroni`] is the cluster, its
    /// members named as their hosts.
    pub async fn start_lab_ha(bin: &Path, ha: &str) -> anyhow::Result<Cloud> {
        let opts = crate::lab::LabOptions {
            patroni: Some(ha.to_string()),
        };
        Cloud::start_lab_with(bin, opts).await
    }

    async fn start_lab_with(bin: &Path, opts: crate::lab::LabOptions) -> anyhow::Result<Cloud> {
        let lab = Lab::start_with(bin, opts).await?;
        let dir = tempfile::Builder::new()
            .prefix("drill-")
            .tempdir_in(lab.shared())?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        write_trainer(dir.path());
        let regions: Vec<RegionInfo> = (crate::lab::REGIONS.iter())
            .map(|r| {
                let gpu = &lab.hosts_of(r, crate::lab::HostRole::Agent)[0];
                RegionInfo {
                    name: r.to_string(),
                    url: lab.replica_urls(r)[0].clone(),
                    database: lab.database_url(r),
                    store_dir: lab.store_dir(r),
                    agent_dir: gpu.dir.join("var/agent"),
                    broken: Vec::new(),
                }
            })
            .collect();
        let globals = lab.global_urls();
        let auth = lab.auth().clone();
        Ok(Cloud::new(
            dir,
            auth,
            Executor::Real,
            regions,
            &globals,
            Parts::Lab(lab),
        ))
    }

    fn new(
        dir: tempfile::TempDir,
        auth: DevMaterial,
        executor: Executor,
        regions: Vec<RegionInfo>,
        global_urls: &[String],
        parts: Parts,
    ) -> Cloud {
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
        let tenants: Vec<Client> = (global_urls.iter())
            .map(|url| Client::public(url.clone(), token.clone(), Some(&ca)).unwrap())
            .collect();
        let service = crate::procs::token(&auth.service_key, Role::Service, None);
        let process_logs = match &parts {
            Parts::Own(_) => dir.path().to_path_buf(),
            Parts::Dev(_) => auth.dir.join("logs"),
            Parts::Lab(lab) => lab.dir.path().join("hosts"),
        };
        Cloud {
            process_logs,
            keep: Default::default(),
            patroni: None,
            parts,
            dir,
            tenant: tenants[0].clone(),
            tenants,
            executor,
            regions,
            service,
            auth,
        }
    }

    /// The regions' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.regions.iter().map(|r| r.name.as_str()).collect()
    }

    /// Keeps [`Cloud::dir`] once the cloud is gone (and a lab's files).
    pub fn keep_logs(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Parts::Lab(lab) = &self.parts {
            lab.keep();
        }
    }

    /// Where the drill's and the processes' logs are, in words.
    pub fn logs(&self) -> String {
        let dir = self.dir.path().display();
        if self.process_logs == self.dir.path() {
            dir.to_string()
        } else {
            format!(
                "{dir} (the trainers') and {} (the cloud's)",
                self.process_logs.display()
            )
        }
    }

    /// Whether this is a running `gangway dev up`'s cloud (not the drill's
    /// own).
    pub fn is_dev(&self) -> bool {
        matches!(self.parts, Parts::Dev(_))
    }

    /// The lab of machines this cloud runs on, if it does.
    pub fn lab(&self) -> Option<&Lab> {
        match &self.parts {
            Parts::Lab(lab) => Some(lab),
            _ => None,
        }
    }

    /// Breaks `target` (`broken`) or mends it.
    pub async fn apply(&self, target: Target, broken: bool) -> anyhow::Result<()> {
        match &self.parts {
            Parts::Own(sup) => sup.apply(&target, broken).await,
            Parts::Dev(remote) => remote.apply(&target, broken).await,
            // Links and processes by the dozen: off the runtime's threads.
            Parts::Lab(lab) => tokio::task::block_in_place(|| lab.apply(&target, broken)),
        }
    }

    /// Mends everything broken.
    pub async fn mend_all(&self) -> anyhow::Result<()> {
        match &self.parts {
            Parts::Own(sup) => sup.mend_all().await,
            Parts::Dev(remote) => remote.mend_all().await,
            Parts::Lab(lab) => tokio::task::block_in_place(|| lab.mend_all()),
        }
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
    pub async fn partition(&self, name: &str, cut: bool) -> anyhow::Result<()> {
        self.apply(
            Target::Links {
                region: name.into(),
            },
            cut,
        )
        .await
    }

    /// The job as region `name` itself has it (its own copy), if it has one.
    pub async fn copy_in(&self, name: &str, id: Uuid) -> Option<Job> {
        (self
            .ask(name, LAB_PROBE, |c| async move { Ok(c.get(id).await?) })
            .await)
            .ok()
    }

    /// Region `name`'s usage ledger: its own rows and those it holds for
    /// its peers, of the last day.
    pub async fn usage_in(
        &self,
        name: &str,
    ) -> anyhow::Result<Vec<gangway_shared::billing::UsageRecord>> {
        let now = chrono::Utc::now();
        let day = chrono::Duration::days(1);
        self.ask(name, LAB_READ, |c| async move {
            Ok(c.usage_records(now - day, now + day, None).await?)
        })
        .await
    }

    /// What region `name` closed of `home`'s placements in the last day,
    /// as the adopter of its jobs (docs/billing.md, "A region that does
    /// not come back").
    pub async fn closings_in(
        &self,
        name: &str,
        home: &str,
    ) -> anyhow::Result<gangway_shared::billing::Closings> {
        let now = chrono::Utc::now();
        let day = chrono::Duration::days(1);
        let q = [
            ("from", (now - day).to_rfc3339()),
            ("to", (now + day).to_rfc3339()),
            ("home", home.to_string()),
        ];
        let path = format!(
            "/v1/admin/usage/closings?{}",
            gangway_shared::http::query_string(&q)
        );
        let path = &path;
        let doc = self
            .ask(name, LAB_READ, |c| async move {
                Ok(c.call_json(reqwest::Method::GET, path, None).await?)
            })
            .await?;
        Ok(serde_json::from_value(doc)?)
    }

    /// Region `name`'s corrections of the last day (credits with cause
    /// `correction`, its own and those it holds for peers): for each usage
    /// row a back-dated release corrected, where the row's time stopped
    /// counting.
    pub async fn corrections_in(
        &self,
        name: &str,
    ) -> anyhow::Result<std::collections::BTreeMap<Uuid, chrono::DateTime<chrono::Utc>>> {
        self.ask(name, LAB_READ, Self::corrections_of).await
    }

    /// [`Cloud::corrections_in`] of the region `client` calls.
    async fn corrections_of(
        client: Client,
    ) -> anyhow::Result<std::collections::BTreeMap<Uuid, chrono::DateTime<chrono::Utc>>> {
        let now = chrono::Utc::now();
        let day = chrono::Duration::days(1);
        let mut cut = std::collections::BTreeMap::new();
        let mut after: Option<Uuid> = None;
        loop {
            let mut q = vec![
                ("from", (now - day).to_rfc3339()),
                ("to", (now + day).to_rfc3339()),
            ];
            if let Some(a) = after {
                q.push(("after", a.to_string()));
            }
            let path = format!(
                "/v1/admin/usage/credits?{}",
                gangway_shared::http::query_string(&q)
            );
            let doc = client.call_json(reqwest::Method::GET, &path, None).await?;
            let page: gangway_shared::billing::CreditRecords = serde_json::from_value(doc)?;
            for c in page.credits.iter().filter(|c| c.cause == "correction") {
                let at = cut.entry(c.usage_id).or_insert(c.started_at);
                *at = (*at).min(c.started_at);
            }
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(cut),
            }
        }
    }

    /// Whether region `name` says it is fenced (`None`: it did not say).
    /// A lab region answers through each of its replicas, which fence each
    /// on its own: it is unfenced when one says so (that one would place
    /// and run what its database holds).
    pub async fn fenced(&self, name: &str) -> Option<bool> {
        let said: Vec<bool> = (self.each(name, LAB_PROBE, |c| async move {
            Ok(c.region_status().await?.fenced)
        }))
        .await
        .into_iter()
        .flatten()
        .collect();
        match said.is_empty() {
            true => None,
            false => Some(said.iter().all(|f| *f)),
        }
    }

    /// Asks region `name` itself with `f`. A lab region is asked through
    /// every replica at once, each given `within` (a host without power
    /// answers nothing): the first answer is the region's.
    async fn ask<T, Fut>(
        &self,
        name: &str,
        within: Duration,
        f: impl Fn(Client) -> Fut,
    ) -> anyhow::Result<T>
    where
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        if self.lab().is_none() {
            return f(self.direct(name)).await;
        }
        let calls = self.directs(name).into_iter().map(|c| {
            let call = f(c);
            Box::pin(async move {
                match tokio::time::timeout(within, call).await {
                    Ok(answer) => answer,
                    Err(_) => Err(anyhow::anyhow!("no answer within {within:?}")),
                }
            })
        });
        let (answer, _) = futures_util::future::select_ok(calls)
            .await
            .map_err(|e| e.context(format!("no replica of {name} answered")))?;
        Ok(answer)
    }

    /// What each replica of region `name` answers `f` (one for a cloud
    /// on loopback), as [`Cloud::ask`] asks.
    async fn each<T, Fut>(
        &self,
        name: &str,
        within: Duration,
        f: impl Fn(Client) -> Fut,
    ) -> Vec<Option<T>>
    where
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        if self.lab().is_none() {
            return vec![f(self.direct(name)).await.ok()];
        }
        let calls = self.directs(name).into_iter().map(|c| {
            let call = f(c);
            async move { (tokio::time::timeout(within, call).await).ok()?.ok() }
        });
        futures_util::future::join_all(calls).await
    }

    /// A client of each control-plane replica of region `name` (a lab
    /// region has two; a cloud on loopback, one).
    fn directs(&self, name: &str) -> Vec<Client> {
        let urls = match &self.parts {
            Parts::Lab(lab) => lab.replica_urls(name),
            _ => vec![self.region(name).url.clone()],
        };
        let ca = self.auth.ca_pem().expect("the cloud's CA is readable");
        (urls.into_iter())
            .map(|url| {
                Client::region(url, "acme", Some(ca.as_bytes()))
                    .expect("the cloud's CA is valid PEM")
                    .with_token(self.service.clone())
            })
            .collect()
    }

    /// A connection to region `name`'s PostgreSQL, as the drills check it
    /// (a lab's takes TLS alone, under the lab's CA).
    pub async fn database_client(&self, name: &str) -> anyhow::Result<tokio_postgres::Client> {
        let url = self.database(name);
        let client = match &self.parts {
            Parts::Lab(lab) => {
                let config = gangway_auth::tls::client_config(lab.ca_pem())?;
                let tls = tokio_postgres_rustls::MakeRustlsConnect::new(
                    std::sync::Arc::unwrap_or_clone(config),
                );
                let (client, conn) = tokio_postgres::connect(url, tls).await?;
                tokio::spawn(conn);
                client
            }
            _ => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                client
            }
        };
        Ok(client)
    }

    fn region(&self, name: &str) -> &RegionInfo {
        (self.regions.iter())
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name}"))
    }

    /// A client of region `name` itself, not through the global tier.
    fn direct(&self, name: &str) -> Client {
        // Regions serve TLS with the cloud's certificate: trust its CA.
        let ca = self.auth.ca_pem().expect("the cloud's CA is readable");
        Client::region(self.region(name).url.clone(), "acme", Some(ca.as_bytes()))
            .expect("the cloud's CA is valid PEM")
            .with_token(self.service.clone())
    }

    /// Kills a whole region with SIGKILL, as a power cut would: its
    /// control plane, its PostgreSQL, its agent, and every worker process
    /// the agent started (they run in process groups of their own and
    /// would outlive the agent).
    pub async fn kill(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Region {
                region: name.into(),
            },
            true,
        )
        .await
    }

    /// Kills region `name`'s control plane only (its agents and workers go
    /// on, and fence themselves once their lease runs out).
    pub async fn kill_control(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Control {
                region: name.into(),
            },
            true,
        )
        .await
    }

    /// Starts region `name`'s control plane again, as it was started.
    pub async fn restart_control(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Control {
                region: name.into(),
            },
            false,
        )
        .await
    }

    /// A client of the global tier with an operator's token, and the
    /// command-line flags that give the CLI the same.
    pub fn operator(&self) -> (Client, Vec<String>) {
        let (client, token) = self.public_client(Role::Admin, "ops-e2e", None);
        let url = self.tenant.base().to_string();
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

    /// A tenant's token for the global tier, and the command-line flags
    /// that give the CLI the same (as [`Cloud::operator`] does an
    /// operator's).
    pub fn tenant_cli(&self, tenant: &str) -> (String, Vec<String>) {
        let (_, token) = self.public_client(Role::Tenant, &format!("{tenant}-e2e"), Some(tenant));
        let flags = vec![
            "--url".into(),
            self.tenant.base().to_string(),
            "--token".into(),
            token.clone(),
            "--ca-cert".into(),
            self.auth.ca_cert.display().to_string(),
            "--state-dir".into(),
            self.dir.path().join("no-dev-state").display().to_string(),
        ];
        (token, flags)
    }

    /// Kills global replica `i` with SIGKILL.
    pub async fn kill_global(&self, i: usize) -> anyhow::Result<()> {
        self.apply(Target::Global { index: i }, true).await
    }

    /// Kills region `name`'s agent with SIGKILL, as a crash would: its
    /// workers go on (process groups of their own).
    pub async fn kill_agent(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Agent {
                region: name.into(),
            },
            true,
        )
        .await
    }

    /// Starts region `name`'s agent again, as it was started.
    pub async fn restart_agent(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Agent {
                region: name.into(),
            },
            false,
        )
        .await
    }

    /// The region whose database is a Patroni cluster, and the cluster
    /// (a cloud of [`Cloud::start_ha`], or the lab's of
    /// [`Cloud::start_lab_ha`]).
    pub fn patroni(&self) -> Option<(&str, &Arc<PatroniCluster>)> {
        (self.patroni.as_ref().map(|(n, c)| (n.as_str(), c)))
            .or_else(|| self.lab().and_then(|lab| lab.patroni()))
    }

    /// Where region `name`'s checkpoint store keeps its objects.
    pub fn store_dir(&self, name: &str) -> PathBuf {
        self.region(name).store_dir.clone()
    }

    /// Kills region `name`'s PostgreSQL with SIGKILL (its control plane
    /// goes on, without a database).
    pub async fn kill_database(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Database {
                region: name.into(),
            },
            true,
        )
        .await
    }

    /// Starts region `name`'s PostgreSQL again on its data (crash
    /// recovery) and port.
    pub async fn restart_database(&self, name: &str) -> anyhow::Result<()> {
        self.apply(
            Target::Database {
                region: name.into(),
            },
            false,
        )
        .await
    }

    /// Region `name`'s database, as a connection string.
    pub fn database(&self, name: &str) -> &str {
        &self.region(name).database
    }

    /// Where region `name`'s agent runs its workers.
    pub fn agent_dir(&self, name: &str) -> PathBuf {
        self.region(name).agent_dir.clone()
    }

    /// The example trainer's path in the cloud's directory.
    pub fn trainer(&self) -> PathBuf {
        shared_dir(self.dir.path()).join("trainer")
    }

    /// Where jobs write what the drill reads (the trainers' logs): the one
    /// directory of the cloud's that its agents bind into every sandbox,
    /// writable by every tenant's user.
    pub fn shared(&self) -> PathBuf {
        shared_dir(self.dir.path())
    }

    /// A client of the first global replica for `tenant`.
    pub fn tenant_client(&self, tenant: &str) -> Client {
        self.public_client(Role::Tenant, &format!("{tenant}-e2e"), Some(tenant))
            .0
    }

    /// A client of the first global replica with a token of `role` for
    /// `subject` (and `tenant`), and the token.
    fn public_client(&self, role: Role, subject: &str, tenant: Option<&str>) -> (Client, String) {
        let token = (self.auth.public_key_for(role))
            .sign(&claims_for(
                role,
                subject,
                tenant,
                None,
                tokens::ISSUER,
                tokens::PUBLIC_AUDIENCE,
                Duration::from_secs(3600),
            ))
            .unwrap();
        let ca = std::fs::read(&self.auth.ca_cert).unwrap();
        let client =
            Client::public(self.tenant.base().to_string(), token.clone(), Some(&ca)).unwrap();
        (client, token)
    }

    /// The pid of region `name`'s agent, as this machine numbers it.
    pub fn agent_pid(&self, name: &str) -> Option<u32> {
        let dir = self.agent_dir(name);
        let needle = dir.to_string_lossy().into_owned();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(p.path().join("cmdline")).ok()?;
            let args: Vec<String> = (cmdline.split(|b| *b == 0))
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let agent = args.iter().any(|a| a == "agent") && args.contains(&needle);
            agent.then_some(pid)
        })
    }
}

/// The cloud's directory bound into every sandbox (see [`Cloud::shared`]).
pub fn shared_dir(dir: &Path) -> PathBuf {
    dir.join("shared")
}

/// Writes the trainer into the shared directory, made writable by every
/// tenant's user (1777, as /tmp).
fn write_trainer(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let shared = shared_dir(dir);
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let trainer = shared.join("trainer");
    std::fs::write(&trainer, TRAINER).unwrap();
    std::fs::set_permissions(&trainer, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Region `name`'s checkpoint store, shared by its control plane and agent.
fn store_url(dir: &Path, name: &str) -> String {
    format!("file://{}", dir.join(format!("{name}-store")).display())
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
