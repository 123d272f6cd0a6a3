//! A local cloud for drills: three `gangway region`s (each with its own
//! throwaway database, peers of each other), an agent each serving a
//! simulated fleet, and a `gangway global` on HTTPS in front — every link
//! between regions, and from the global tier to each, through a proxy that
//! can be cut.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_shared::api::{Job, JobSpec};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use uuid::Uuid;

use crate::procs::{key_arg, log_file, spawn_global, spawn_sim_agent, until_ready, Proc, Proxy};

/// Two nodes × 8 h100 per region.
const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 2
  gpu_type = "h100"
  gpus_per_node = 8
"#;

pub const REGIONS: [&str; 3] = ["r1", "r2", "r3"];

pub struct Region {
    control: Option<Proc>,
    agent: Option<Proc>,
}

pub struct Cloud {
    pub dir: tempfile::TempDir,
    pub tenant: Client,
    regions: std::sync::Mutex<Vec<Region>>,
    /// The regions' API ports (agents and direct checks use them).
    ports: Vec<u16>,
    /// Every link between regions, and from the global tier to each
    /// region (`from` = "global"), through a proxy that can be cut.
    links: Vec<(&'static str, &'static str, Proxy)>,
    /// A service token, to ask regions directly.
    service: String,
    _global: Proc,
}

impl Cloud {
    /// Starts the cloud with `bin` (the `gangway` binary), its timers
    /// short (`short`, for CI) or the defaults.
    pub async fn start(bin: &Path, short: bool) -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, FLEET).unwrap();
        let ports: Vec<u16> = REGIONS
            .iter()
            .map(|_| gangway_devkit::free_port())
            .collect();
        let global_port = gangway_devkit::free_port();
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
        let mut regions = Vec::new();
        for (i, name) in REGIONS.iter().enumerate() {
            let db = gangway_devkit::fresh_database(&format!("e2e_failover_{name}")).await;
            let mut cmd = Command::new(bin);
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
            // Short timers keep CI short; the defaults are what
            // docs/benchmarks.md measures.
            if short {
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
            let log = format!("{name}-agent");
            let agent = spawn_sim_agent(bin, dir.path(), &auth, name, ports[i], &fleet, &log);
            regions.push(Region {
                control: Some(control),
                agent: Some(agent),
            });
        }
        let urls: Vec<(&str, String)> = REGIONS.iter().map(|n| (*n, via("global", n))).collect();
        let global = spawn_global(bin, dir.path(), &auth, global_port, &urls);
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
        let service = crate::procs::token(&auth.service_key, Role::Service, None);
        let cloud = Cloud {
            dir,
            tenant,
            regions: std::sync::Mutex::new(regions),
            ports,
            links,
            service,
            _global: global,
        };
        // Ready: every region healthy with its 16 GPUs schedulable.
        until_ready(&cloud.tenant, 3, 16, cloud.dir.path()).await;
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
        let i = REGIONS.iter().position(|r| *r == name).unwrap();
        let c = Client::new(format!("http://127.0.0.1:{}", self.ports[i]), "acme")
            .with_token(self.service.clone());
        c.get(id).await.ok()
    }

    /// Kills a whole region: its control plane and its agent (and with it
    /// every worker the agent runs).
    pub fn kill(&self, name: &str) {
        let i = REGIONS.iter().position(|r| *r == name).unwrap();
        let mut regions = self.regions.lock().expect("regions lock");
        regions[i].control.take();
        regions[i].agent.take();
    }
}

/// An 8-GPU job named `name`: 1200 s estimated × 0.05 = 60 s simulated.
pub fn spec(name: &str) -> JobSpec {
    // 8 GPUs; 1200 s estimated × 0.05 = 60 s of simulated run.
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 1200, "command": ["train"]
    }))
    .unwrap()
}
