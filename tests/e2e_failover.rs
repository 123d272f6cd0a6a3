//! A region dies and its jobs go on elsewhere, across real processes: three
//! `gangway region`s (each with its own database, peers of each other),
//! each with a `gangway agent` serving a simulated fleet, and a
//! `gangway global` on HTTPS in front. A job is acknowledged only once its
//! buddy region holds its intent; when its home region (control plane and
//! agents) is killed, the buddy adopts it once a majority of regions has
//! not heard from the home for the adoption time, at the next ownership
//! epoch, and runs it; a retried create with the job's key returns the
//! adopted job. A region cut off from the others and the global tier (its
//! links through proxies that can be cut) fences itself and stops its job,
//! which its buddy adopts; sampled every 100 ms, the job never runs in two
//! regions at once, and once healed the home releases its copy. See
//! docs/failover.md.

mod support;

use support::{log_file, Proc, BIN};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_shared::api::{Job, JobSpec, JobState};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use uuid::Uuid;

/// Two nodes × 8 h100 per region.
const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 2
  gpu_type = "h100"
  gpus_per_node = 8
"#;

const REGIONS: [&str; 3] = ["r1", "r2", "r3"];

struct Region {
    control: Option<Proc>,
    agent: Option<Proc>,
}

struct Cloud {
    dir: tempfile::TempDir,
    tenant: Client,
    regions: Vec<Region>,
    /// The regions' API ports (agents and direct checks use them).
    ports: Vec<u16>,
    /// Every link between regions, and from the global tier to each
    /// region (`from` = "global"), through a proxy that can be cut.
    links: Vec<(&'static str, &'static str, support::Proxy)>,
    /// A service token, to ask regions directly.
    service: String,
    _global: Proc,
}

impl Cloud {
    async fn start() -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, FLEET).unwrap();
        let ports: Vec<u16> = REGIONS
            .iter()
            .map(|_| gangway_devkit::free_port())
            .collect();
        let global_port = gangway_devkit::free_port();
        let service_pub = support::key_arg(&auth, "service-signing.pub.pem");
        let service_priv = support::key_arg(&auth, "service-signing.pem");
        let mut links = Vec::new();
        for (j, to) in REGIONS.iter().enumerate() {
            for from in REGIONS.iter().chain(["global"].iter()) {
                if from != to {
                    links.push((*from, *to, support::Proxy::start(ports[j]).await));
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
        let mut regions = Vec::new();
        for (i, name) in REGIONS.iter().enumerate() {
            let db = gangway_devkit::fresh_database(&format!("e2e_failover_{name}")).await;
            let mut cmd = Command::new(BIN);
            cmd.args(["region", "--name", name, "--database-url", &db])
                .args(["--service-key", &service_pub])
                .args(["--peer-signing-key", &service_priv])
                .args(["--listen", &format!("127.0.0.1:{}", ports[i])])
                .args([
                    "--schedule-interval-ms",
                    "100",
                    "--agent-sync-interval-ms",
                    "200",
                ])
                .args(["--grace-period-s", "2", "--checkpoint-deadline-s", "10"]);
            // Short timers keep the test short; GANGWAY_FAILOVER_DEFAULT_TIMERS=1
            // runs it with the defaults (the measurement in
            // docs/benchmarks.md).
            if std::env::var_os("GANGWAY_FAILOVER_DEFAULT_TIMERS").is_none() {
                cmd.args(["--fence-after-s", "4", "--fence-checkpoint-s", "3"])
                    .args(["--peer-heartbeat-ms", "250", "--peer-lease-s", "3"]);
            }
            for peer in REGIONS.iter().filter(|p| *p != name) {
                cmd.arg("--peer").arg(format!("{peer}={}", via(name, peer)));
            }
            let control = Proc(
                cmd.env("GANGWAY_LOG", "info")
                    .stdout(Stdio::null())
                    .stderr(log_file(dir.path(), &format!("{name}-region.log")))
                    .spawn()
                    .unwrap(),
            );
            let agent_token = auth
                .service_key
                .sign(&claims_for(
                    Role::Agent,
                    &format!("{name}-agent"),
                    None,
                    Some(name),
                    tokens::ISSUER,
                    tokens::REGION_AUDIENCE,
                    Duration::from_secs(3600),
                ))
                .unwrap();
            let agent = Proc(
                Command::new(BIN)
                    .env("GANGWAY_AGENT_TOKEN", agent_token)
                    .args([
                        "agent",
                        "--region",
                        name,
                        "--agent-id",
                        &format!("{name}-agent"),
                    ])
                    .arg("--region-url")
                    .arg(format!("http://127.0.0.1:{}", ports[i]))
                    .arg("--fleet")
                    .arg(&fleet)
                    .args(["--executor", "sim", "--time-factor", "0.05"])
                    .arg("--work-dir")
                    .arg(dir.path().join(format!("{name}-agent")))
                    .env("GANGWAY_LOG", "info")
                    .stdout(Stdio::null())
                    .stderr(log_file(dir.path(), &format!("{name}-agent.log")))
                    .spawn()
                    .unwrap(),
            );
            regions.push(Region {
                control: Some(control),
                agent: Some(agent),
            });
        }
        let urls: Vec<(&str, String)> = REGIONS.iter().map(|n| (*n, via("global", n))).collect();
        let global = support::spawn_global(dir.path(), &auth, global_port, &urls);
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
        let tenant =
            Client::public(format!("https://127.0.0.1:{global_port}"), token, Some(&ca)).unwrap();
        let service = support::token(&auth.service_key, Role::Service, None);
        let cloud = Cloud {
            dir,
            tenant,
            regions,
            ports,
            links,
            service,
            _global: global,
        };
        // Ready: every region healthy with its 16 GPUs schedulable.
        support::until_ready(&cloud.tenant, 3, 16, cloud.dir.path()).await;
        cloud
    }

    async fn wait_for(
        &self,
        id: Uuid,
        what: &str,
        within: Duration,
        cond: impl Fn(&Job) -> bool,
    ) -> Job {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(job) = self.tenant.get(id).await {
                if cond(&job) {
                    return job;
                }
            }
            assert!(
                Instant::now() < deadline,
                "job {id}: {what} never happened; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Cuts (or heals) every link of region `name` to the other regions
    /// and from the global tier; its agents still reach it.
    fn partition(&self, name: &str, cut: bool) {
        for (from, to, p) in &self.links {
            if *from == name || *to == name {
                p.set_cut(cut);
            }
        }
    }

    /// The job as region `name` itself has it (its own copy), if it has one.
    async fn copy_in(&self, name: &str, id: Uuid) -> Option<Job> {
        let i = REGIONS.iter().position(|r| *r == name).unwrap();
        let c = Client::new(format!("http://127.0.0.1:{}", self.ports[i]), "acme")
            .with_token(self.service.clone());
        c.get(id).await.ok()
    }

    /// Kills a whole region: its control plane and its agent (and with it
    /// every worker the agent runs).
    fn kill(&mut self, name: &str) {
        let i = REGIONS.iter().position(|r| *r == name).unwrap();
        self.regions[i].control.take();
        self.regions[i].agent.take();
    }
}

fn spec(name: &str) -> JobSpec {
    // 8 GPUs; 1200 s estimated × 0.05 = 60 s of simulated run.
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 1200, "command": ["train"]
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_regions_jobs_are_adopted_by_their_buddy_and_run_on() {
    let mut cloud = Cloud::start().await;
    // Two keyed jobs (any buddy has room for both if their home dies).
    let mut jobs = Vec::new();
    for i in 0..2 {
        let key = format!("fo-{i}");
        let job = cloud.tenant.submit(&spec(&key), Some(&key)).await.unwrap();
        assert_eq!(job.epoch, 1);
        jobs.push((key, job.id, job.region.clone()));
    }
    let home = jobs[0].2.clone();
    let theirs: Vec<(String, Uuid)> = (jobs.iter())
        .filter(|(_, _, r)| *r == home)
        .map(|(k, id, _)| (k.clone(), *id))
        .collect();
    for (_, id, _) in &jobs {
        cloud
            .wait_for(*id, "running", Duration::from_secs(60), |j| {
                j.state == JobState::Running
            })
            .await;
    }

    // The whole home region dies.
    let died = Instant::now();
    cloud.kill(&home);
    // Each of its jobs runs again in another region, adopted at epoch 2.
    let mut recovered = Vec::new();
    for (_, id) in &theirs {
        let job = cloud
            .wait_for(
                *id,
                "adopted and running elsewhere",
                Duration::from_secs(90),
                |j| j.state == JobState::Running && j.region != home,
            )
            .await;
        assert_eq!(job.epoch, 2, "{job:?}");
        assert_eq!(job.adopted_from.as_deref(), Some(home.as_str()), "{job:?}");
        recovered.push(died.elapsed());
    }
    eprintln!(
        "region {home} died; its {} job(s) ran again elsewhere after {:?}",
        theirs.len(),
        recovered
    );
    // A create retried with the key of a job the dead region had
    // acknowledged returns the adopted job, not a second one.
    let (key, id) = &theirs[0];
    let again = cloud.tenant.submit(&spec(key), Some(key)).await.unwrap();
    assert_eq!(again.id, *id);
    assert_ne!(again.region, home);
    // The other regions' jobs were never disturbed.
    for (_, id, region) in jobs.iter().filter(|(_, _, r)| *r != home) {
        let j = cloud.tenant.get(*id).await.unwrap();
        assert_eq!((j.region.as_str(), j.epoch), (region.as_str(), 1), "{j:?}");
    }
    // The adopted jobs finish.
    for (_, id) in &theirs {
        cloud
            .wait_for(*id, "succeeded", Duration::from_secs(120), |j| {
                j.state == JobState::Succeeded
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_region_fences_its_job_moves_and_it_never_runs_in_two_regions() {
    let cloud = std::sync::Arc::new(Cloud::start().await);
    let job = cloud
        .tenant
        .submit(&spec("part"), Some("part"))
        .await
        .unwrap();
    let id = job.id;
    let home = job.region.clone();
    cloud
        .wait_for(id, "running", Duration::from_secs(60), |j| {
            j.state == JobState::Running
        })
        .await;
    // Every 100 ms, every region's own copy: never two starting or running.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let (cloud, stop) = (cloud.clone(), stop.clone());
        tokio::spawn(async move {
            let mut twice = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut live = Vec::new();
                for r in REGIONS {
                    if let Some(j) = cloud.copy_in(r, id).await {
                        if matches!(j.state, JobState::Starting | JobState::Running) {
                            live.push(r);
                        }
                    }
                }
                if live.len() > 1 {
                    twice.push(live);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            twice
        })
    };

    // Cut the home off from the other regions and the global tier (its
    // agent still reaches it): it fences, its job stops, and the job is
    // adopted by its buddy once the adoption time has passed.
    cloud.partition(&home, true);
    let moved = cloud
        .wait_for(id, "adopted elsewhere", Duration::from_secs(60), |j| {
            j.state == JobState::Running && j.region != home
        })
        .await;
    assert_eq!(moved.epoch, 2, "{moved:?}");
    let theirs = cloud.copy_in(&home, id).await.unwrap();
    assert!(
        !matches!(theirs.state, JobState::Starting | JobState::Running),
        "the cut-off home still runs it: {theirs:?}"
    );

    // Healed: the home learns its job moved, releases its copy (cancelled,
    // naming the new owner) and takes work again.
    cloud.partition(&home, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let copy = cloud.copy_in(&home, id).await.unwrap();
        if copy.state == JobState::Cancelled
            && copy.moved_to.as_deref() == Some(moved.region.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the home never released its copy: {copy:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let twice = watch.await.unwrap();
    assert!(
        twice.is_empty(),
        "running in two regions at once: {twice:?}"
    );
    // The global tier answers with the owner's copy.
    let now = cloud.tenant.get(id).await.unwrap();
    assert_eq!((now.region.as_str(), now.epoch), (moved.region.as_str(), 2));
    let again = cloud
        .tenant
        .submit(&spec("part"), Some("part"))
        .await
        .unwrap();
    assert_eq!(
        (again.id, again.region.as_str()),
        (id, moved.region.as_str())
    );
}
