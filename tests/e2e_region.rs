//! End to end across real processes: a `gangway region` on a real,
//! throwaway PostgreSQL, and a `gangway agent` serving a simulated fleet,
//! driven over HTTP as a tenant would.

mod support;

use support::{agent_token, log_file, shared_out, token, Proc, BIN};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::jwt::{Role, SigningKey};
use gangway_shared::api::{
    Job, JobMode, JobSpec, JobState, LimitsUpdate, Priority, QuotaUpdate, ReservationResize,
    ReservationSpec, ReservationState, TopologyLevel, WorkerState,
};
use gangway_shared::client::{Client, ListQuery};
use uuid::Uuid;

/// One spine, one leaf, 3 nodes × 8 h100, the last a spare: 16 schedulable GPUs.
const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 3
  gpu_type = "h100"
  gpus_per_node = 8
  spares = 1
"#;

struct Cloud {
    key: SigningKey,
    dir: tempfile::TempDir,
    db: String,
    port: u16,
    /// Where the region serves its Prometheus metrics.
    metrics: u16,
    region: Option<Proc>,
    /// The agents' sync interval the region hands out.
    sync_ms: u64,
    _agent: Proc,
    client: Client,
}

impl Cloud {
    async fn start(executor: &str) -> Cloud {
        Cloud::start_syncing_every(executor, 200).await
    }

    /// With the agents told to sync every `sync_ms`; at 10 s or more the
    /// region's health policy waits for silent nodes long enough
    /// (`DIR/health.toml`).
    async fn start_syncing_every(executor: &str, sync_ms: u64) -> Cloud {
        let db = gangway_devkit::fresh_database("e2e").await;
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, FLEET).unwrap();
        let port = gangway_devkit::free_port();
        // Regions accept only tokens signed by this key: the global tier's
        // (role service) and their agents' (role agent, naming the region).
        let key = SigningKey::generate("e2e-service");
        std::fs::write(dir.path().join("service.pub.pem"), key.public_pem()).unwrap();
        let metrics = gangway_devkit::free_port();
        let region = spawn_region(dir.path(), &db, (port, metrics), sync_ms);
        let agent = Proc(
            Command::new(BIN)
                .env(
                    "GANGWAY_AGENT_TOKEN",
                    agent_token(&key, "test-agent", "test"),
                )
                .args(["agent", "--region", "test", "--agent-id", "test-agent"])
                .arg("--region-url")
                .arg(format!("http://127.0.0.1:{port}"))
                .arg("--insecure-http")
                .arg("--simulate")
                .arg(&fleet)
                .args(["--executor", executor, "--time-factor", "0.05"])
                .arg("--work-dir")
                .arg(dir.path().join("agent"))
                .arg("--checkpoint-store")
                .arg(format!("file://{}", dir.path().join("store").display()))
                .arg("--sandbox-bind")
                .arg(shared_out(dir.path()))
                .env("GANGWAY_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "agent.log"))
                .spawn()
                .unwrap(),
        );
        let client = Client::new(format!("http://127.0.0.1:{port}"), "acme").with_token(token(
            &key,
            Role::Service,
            None,
        ));
        let cloud = Cloud {
            key,
            dir,
            db,
            port,
            metrics,
            region: Some(region),
            sync_ms,
            _agent: agent,
            client,
        };
        cloud.wait_capacity().await;
        cloud
    }

    async fn wait_capacity(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(s) = self.client.region_status().await {
                if s.capacity.iter().any(|c| c.schedulable == 16) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "region never saw the agent's GPUs; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn tenant(&self, tenant: &str) -> Client {
        Client::new(format!("http://127.0.0.1:{}", self.port), tenant).with_token(token(
            &self.key,
            Role::Service,
            None,
        ))
    }

    /// Kills the control plane without warning and starts it again on the
    /// same database and port.
    async fn restart_region(&mut self) {
        let mut old = self.region.take().unwrap();
        old.0.kill().unwrap();
        old.0.wait().unwrap();
        self.region = Some(spawn_region(
            self.dir.path(),
            &self.db,
            (self.port, self.metrics),
            self.sync_ms,
        ));
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.client.region_status().await.is_err() {
            assert!(Instant::now() < deadline, "region did not come back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The region's scheduling passes so far with this outcome
    /// (`gangway_schedule_passes_total`, every partition).
    async fn passes(&self, outcome: &str) -> u64 {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let label = format!("outcome=\"{outcome}\"");
        text.lines()
            .filter(|l| l.starts_with("gangway_schedule_passes_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    async fn allocated_gpus(&self) -> u32 {
        let s = self.client.region_status().await.unwrap();
        s.capacity.iter().map(|c| c.allocated).sum()
    }

    /// Waits until the region's status shows `gpus` allocated: the status
    /// is read at most once a second (`api/jobs.rs` `STATUS_TTL`), so it
    /// may lag a change by that much. Panics after 10 s with what it shows.
    async fn expect_allocated(&self, gpus: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.allocated_gpus().await;
            if now == gpus {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{now} GPUs allocated, expected {gpus}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The region of a test cloud, with the checkpoint store its agents share
/// (`DIR/store`) and its inventory `DIR/fleet.toml` (the simulated nodes
/// served by agent `test-agent`, machines by name by their own).
/// A region on `port`, its metrics on `metrics`.
fn spawn_region(dir: &Path, db: &str, (port, metrics): (u16, u16), sync_ms: u64) -> Proc {
    let mut region = Command::new(BIN);
    region.args(["region", "--name", "test", "--database-url", db]);
    if sync_ms >= 10_000 {
        // Nodes heard every sync_ms are neither suspect nor lost between
        // two syncs, and the agents' lease is three intervals.
        let policy = dir.join("health.toml");
        let s = sync_ms / 1000;
        std::fs::write(
            &policy,
            format!("suspect_after_s = {}\nlost_after_s = {}\n", 3 * s, 10 * s),
        )
        .unwrap();
        region
            .arg("--health-policy")
            .arg(&policy)
            .args(["--fence-after-s", &(3 * s).to_string()])
            .args(["--agent-timeout-s", &(3 * s).to_string()]);
    }
    Proc(
        region
            .arg("--inventory")
            .arg(dir.join("fleet.toml"))
            .arg("--checkpoint-store")
            .arg(format!("file://{}", dir.join("store").display()))
            .arg("--service-key")
            .arg(format!(
                "e2e-service={}",
                dir.join("service.pub.pem").display()
            ))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            // Plain HTTP on loopback: this test is about the region, not its links.
            .arg("--insecure-http")
            .args(["--schedule-interval-ms", "100"])
            .args(["--agent-sync-interval-ms", &sync_ms.to_string()])
            .args(["--grace-period-s", "2", "--checkpoint-deadline-s", "10"])
            // Jobs here run for seconds: let the scheduler preempt at once.
            .args(["--preemption-min-run-s", "0"])
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir, "region.log"))
            .spawn()
            .unwrap(),
    )
}

fn spec(gpus: i64, estimated_s: i64, command: &[&str]) -> JobSpec {
    JobSpec {
        name: "e2e".into(),
        gpus,
        gpu_type: "h100".into(),
        priority: Default::default(),
        estimated_duration_s: estimated_s,
        max_duration_s: None,
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        gpus_per_worker: None,
        mode: JobMode::Gang,
        min_gpus: None,
        topology: Default::default(),
        region: None,
        reservation: None,
        cluster: None,
    }
}

async fn wait_state(client: &Client, id: Uuid, want: JobState) -> Job {
    wait_state_within(client, id, want, Duration::from_secs(60)).await
}

async fn wait_state_within(client: &Client, id: Uuid, want: JobState, within: Duration) -> Job {
    let what = format!("to be {want}");
    wait_job_within(client, id, within, &what, |job| job.state == want).await
}

/// Job `id` once `done` holds of it; fails after `within`, saying it
/// waited for `what`.
async fn wait_job_within(
    client: &Client,
    id: Uuid,
    within: Duration,
    what: &str,
    done: impl Fn(&Job) -> bool,
) -> Job {
    let deadline = Instant::now() + within;
    loop {
        let job = client.get(id).await.unwrap();
        if done(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not come {what} within {within:?}: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_job_goes_queued_running_succeeded_on_the_agents() {
    let cloud = Cloud::start("sim").await;
    // 20 s estimated × time factor 0.05 = about a second of simulated run.
    let job = cloud
        .client
        .submit(&spec(8, 20, &["train"]), Some("first"))
        .await
        .unwrap();
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.region, "test");
    wait_state(&cloud.client, job.id, JobState::Running).await;
    let done = wait_state(&cloud.client, job.id, JobState::Succeeded).await;
    assert_eq!(done.reason.as_deref(), Some("succeeded"));
    assert!(done
        .workers
        .iter()
        .all(|w| w.state == WorkerState::Succeeded));
    // A whole 8-GPU gang fits on one node: one NVLink domain.
    let nodes: std::collections::BTreeSet<_> =
        done.workers.iter().filter_map(|w| w.node.clone()).collect();
    assert_eq!(nodes.len(), 1);

    let events = cloud.client.events(job.id).await.unwrap().events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["queued", "placed", "started", "finished"]);
    assert_eq!(events[1].detail["level"], "nvlink");
    cloud.expect_allocated(0).await;
}

#[tokio::test]
async fn placements_cancels_drains_and_preemptions_reach_the_agent_at_once_not_at_its_next_sync() {
    // The agent syncs once a minute. The region tells it as soon as a plan
    // places work on its nodes (its long poll of `changes`), it syncs then
    // and, having launched the workers, at once again to say they run.
    let cloud = Cloud::start_syncing_every("sim", 60_000).await;
    // The agent has registered and synced (its GPUs are schedulable): its
    // next sync on the interval is about a minute away, each time.
    // (Each job would run for 5 minutes: 6,000 s at the time factor 0.05.)
    let within = Duration::from_secs(30);
    let mut jobs = Vec::new();
    for _ in 0..2 {
        let job = cloud
            .client
            .submit(&spec(8, 6000, &["train"]), None)
            .await
            .unwrap();
        let running = wait_state_within(&cloud.client, job.id, JobState::Running, within).await;
        assert!(running
            .workers
            .iter()
            .all(|w| w.state == WorkerState::Running));
        jobs.push(job.id);
    }
    cloud.expect_allocated(16).await;
    // A cancel reaches the agent the same way: its workers stop, and the
    // job is cancelled, long before the agent's next sync.
    cloud.client.cancel(jobs[0]).await.unwrap();
    wait_state_within(&cloud.client, jobs[0], JobState::Cancelled, within).await;
    // So does an operator's drain: the job on the drained node writes its
    // checkpoint now and moves to the node the cancel freed.
    let on = |j: &Job| j.workers[0].node.clone().unwrap();
    let drained = on(&cloud.client.get(jobs[1]).await.unwrap());
    let drain = serde_json::json!({"mode": "checkpoint", "reason": "e2e"});
    (cloud.client)
        .call_json(
            reqwest::Method::POST,
            &format!("/v1/admin/nodes/{drained}/drain"),
            Some(&drain),
        )
        .await
        .unwrap();
    let all_running = |j: &Job| {
        j.state == JobState::Running && j.workers.iter().all(|w| w.state == WorkerState::Running)
    };
    let moved = wait_job_within(&cloud.client, jobs[1], within, "to run elsewhere", |j| {
        all_running(j) && on(j) != drained
    })
    .await;
    assert_eq!((moved.preemptions, moved.node_moves), (1, 1), "{moved:?}");
    // And an operator's preemption of the job: it checkpoints now and runs
    // again (on the one node in service).
    (cloud.client)
        .call_json(
            reqwest::Method::POST,
            &format!("/v1/admin/jobs/{}/preempt", jobs[1]),
            None,
        )
        .await
        .unwrap();
    wait_job_within(&cloud.client, jobs[1], within, "to run again", |j| {
        all_running(j) && j.preemptions == 2
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_job_frees_its_gpus_for_the_next() {
    let cloud = Cloud::start("sim").await;
    let big = cloud
        .client
        .submit(&spec(16, 3600, &["train"]), None)
        .await
        .unwrap();
    wait_state(&cloud.client, big.id, JobState::Running).await;
    cloud.expect_allocated(16).await;
    let next = cloud
        .client
        .submit(&spec(8, 3600, &["train"]), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        cloud.client.get(next.id).await.unwrap().state,
        JobState::Queued
    );
    // While nothing that waits fits in the free GPUs, the timed rounds
    // (every 100 ms here) do not plan: the pass that placed nothing is
    // not run again and again.
    let before = (
        cloud.passes("idle").await,
        cloud.passes("nothing_fits").await,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = (
        cloud.passes("idle").await,
        cloud.passes("nothing_fits").await,
    );
    assert!(
        after.1 > before.1,
        "no round found that nothing fits: {before:?} → {after:?}"
    );
    assert!(
        after.0 - before.0 <= 1,
        "passes placed nothing while nothing could fit: {before:?} → {after:?}"
    );

    cloud.client.cancel(big.id).await.unwrap();
    let cancelled = wait_state(&cloud.client, big.id, JobState::Cancelled).await;
    assert!(cancelled
        .workers
        .iter()
        .all(|w| w.state == WorkerState::Cancelled));
    wait_state(&cloud.client, next.id, JobState::Running).await;
    cloud.expect_allocated(8).await;
    // Cancelling again changes nothing.
    let again = cloud.client.cancel(big.id).await.unwrap();
    assert_eq!(again.state, JobState::Cancelled);
}

#[tokio::test]
async fn the_real_executor_runs_the_command_with_the_contract_env_and_reports_exit_codes() {
    let cloud = Cloud::start("real").await;
    let out: PathBuf = cloud.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mut ok = spec(
        4,
        60,
        &[
            "sh",
            "-c",
            "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $CUDA_VISIBLE_DEVICES $MASTER_ADDR $GANGWAY_JOB_ID\" > \"$OUT/rank-$RANK\"",
        ],
    );
    ok.gpus_per_worker = Some(2);
    ok.env
        .insert("OUT".into(), out.to_string_lossy().into_owned());
    let job = cloud.client.submit(&ok, None).await.unwrap();
    let done = wait_state(&cloud.client, job.id, JobState::Succeeded).await;
    for w in &done.workers {
        let line = std::fs::read_to_string(out.join(format!("rank-{}", w.rank))).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        let gpus: Vec<String> = w.gpus.iter().map(|g| g.to_string()).collect();
        assert_eq!(f[0], w.rank.to_string());
        assert_eq!(f[1], "2", "WORLD_SIZE is the worker count");
        assert_eq!(f[3], gpus.join(","), "CUDA_VISIBLE_DEVICES");
        assert_eq!(f[4], "127.0.0.1");
        assert_eq!(f[5], job.id.to_string());
    }

    let failing = cloud
        .client
        .submit(&spec(1, 60, &["sh", "-c", "exit 3"]), None)
        .await
        .unwrap();
    let failed = wait_state(&cloud.client, failing.id, JobState::Failed).await;
    assert_eq!(failed.workers[0].exit_code, Some(3));
    assert_eq!(failed.reason.as_deref(), Some("worker_failed"));

    // Cancel stops a real process (SIGTERM) and frees its GPUs.
    let sleeper = cloud
        .client
        .submit(&spec(2, 600, &["sleep", "600"]), None)
        .await
        .unwrap();
    wait_state(&cloud.client, sleeper.id, JobState::Running).await;
    cloud.client.cancel(sleeper.id).await.unwrap();
    wait_state(&cloud.client, sleeper.id, JobState::Cancelled).await;
    cloud.expect_allocated(0).await;
}

#[tokio::test]
async fn an_array_job_runs_each_worker_on_its_own() {
    let cloud = Cloud::start("real").await;
    let mut s = spec(3, 60, &["sh", "-c", "exit $RANK"]);
    s.mode = JobMode::Array;
    let job = cloud.client.submit(&s, None).await.unwrap();
    let done = wait_state(&cloud.client, job.id, JobState::Failed).await;
    let codes: Vec<Option<i32>> = done.workers.iter().map(|w| w.exit_code).collect();
    assert_eq!(codes, [Some(0), Some(1), Some(2)]);
    assert_eq!(done.workers[0].state, WorkerState::Succeeded);
    assert_eq!(done.workers[2].state, WorkerState::Failed);
    let placed = cloud
        .client
        .events(job.id)
        .await
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "placed")
        .count();
    assert_eq!(placed, 3, "each worker is placed on its own");
}

#[tokio::test]
async fn a_region_restarted_mid_run_keeps_its_jobs_and_allocations() {
    let mut cloud = Cloud::start("sim").await;
    let job = cloud
        .client
        .submit(&spec(8, 3600, &["train"]), Some("keep-me"))
        .await
        .unwrap();
    let before = wait_state(&cloud.client, job.id, JobState::Running).await;
    cloud.restart_region().await;
    let after = cloud.client.get(job.id).await.unwrap();
    assert_eq!(after.state, JobState::Running);
    assert_eq!(after.workers, before.workers, "same nodes and GPUs");
    cloud.expect_allocated(8).await;
    // The retried create finds the same job after the restart.
    let retried = cloud
        .client
        .submit(&spec(8, 3600, &["train"]), Some("keep-me"))
        .await
        .unwrap();
    assert_eq!(retried.id, job.id);
    // And the restarted region still drives the agent.
    cloud.client.cancel(job.id).await.unwrap();
    wait_state(&cloud.client, job.id, JobState::Cancelled).await;
    cloud.expect_allocated(0).await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let cloud = Cloud::start("sim").await;
    let c = &cloud.client;
    let code = |r: Result<serde_json::Value, gangway_shared::client::ClientError>| {
        let e = r.unwrap_err();
        (
            e.status().unwrap().as_u16(),
            e.code().unwrap_or("none").to_string(),
        )
    };
    let valid = r#""name":"x","gpu_type":"h100","estimated_duration_s":60,"command":["true"]"#;
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "malformed_json"),
        ("".into(), 400, "malformed_json"),
        (r#"{"name":"x"}"#.into(), 422, "invalid_spec"),
        (r#"[1,2,3]"#.into(), 422, "invalid_spec"),
        (format!(r#"{{"gpus":0,{valid}}}"#), 422, "invalid_gpus"),
        (format!(r#"{{"gpus":-8,{valid}}}"#), 422, "invalid_gpus"),
        (format!(r#"{{"gpus":1000000000,{valid}}}"#), 422, "invalid_gpus"),
        (format!(r#"{{"gpus":99999999999999999999999,{valid}}}"#), 422, "invalid_spec"),
        (format!(r#"{{"gpus":1.5,{valid}}}"#), 422, "invalid_spec"),
        (format!(r#"{{"gpus":6,"gpus_per_worker":4,{valid}}}"#), 422, "invalid_gpus"),
        (format!(r#"{{"gpus":17,{valid}}}"#), 422, "exceeds_region_capacity"),
        (format!(r#"{{"gpus":16,"gpus_per_worker":16,{valid}}}"#), 422, "exceeds_region_capacity"),
        (format!(r#"{{"gpus":16,"topology":{{"required":"nvlink"}},{valid}}}"#), 422, "unsatisfiable_topology"),
        (format!(r#"{{"gpus":8,"surprise":true,{valid}}}"#), 422, "invalid_spec"),
        (format!(r#"{{"gpus":8,"priority":"urgent",{valid}}}"#), 422, "invalid_spec"),
        (r#"{"gpus":8,"name":"x","gpu_type":"tpu","estimated_duration_s":60,"command":["true"]}"#.into(), 422, "unknown_gpu_type"),
        (r#"{"gpus":8,"name":"x","gpu_type":"h100","estimated_duration_s":60,"command":[]}"#.into(), 422, "invalid_spec"),
        (r#"{"gpus":8,"name":"x","gpu_type":"h100","estimated_duration_s":-5,"command":["x"]}"#.into(), 422, "invalid_spec"),
        (r#"{"gpus":8,"name":"x","gpu_type":"h100","estimated_duration_s":5,"command":["x"],"env":{"RANK":"0"}}"#.into(), 422, "invalid_spec"),
        (format!(r#"{{"gpus":16,"gpus_per_worker":8,"min_gpus":12,{valid}}}"#), 422, "invalid_min_gpus"),
        (format!(r#"{{"gpus":16,"gpus_per_worker":8,"min_gpus":24,{valid}}}"#), 422, "invalid_min_gpus"),
        (format!(r#"{{"gpus":8,"min_gpus":0,{valid}}}"#), 422, "invalid_min_gpus"),
        (format!(r#"{{"gpus":4,"mode":"array","min_gpus":2,{valid}}}"#), 422, "invalid_min_gpus"),
    ];
    for (body, status, want) in cases {
        let got = code(
            c.post_raw("/v1/jobs", "application/json", body.clone())
                .await,
        );
        assert_eq!(got, (status, want.to_string()), "body {body}");
    }
    // Wrong content type, and a body over the limit.
    let e = c
        .post_raw("/v1/jobs", "text/plain", "{}")
        .await
        .unwrap_err();
    assert_eq!(e.status().unwrap().as_u16(), 415);
    let huge = format!(r#"{{"name":"{}"}}"#, "x".repeat(2 * 1024 * 1024));
    let e = c
        .post_raw("/v1/jobs", "application/json", huge)
        .await
        .unwrap_err();
    assert_eq!(e.status().unwrap().as_u16(), 413);
    // Headers: a bad idempotency key, a missing tenant.
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/v1/jobs", cloud.port);
    let service = token(&cloud.key, Role::Service, None);
    let r = http
        .post(&url)
        .bearer_auth(&service)
        .header("x-gangway-tenant", "acme")
        .header("idempotency-key", "")
        .json(&spec(1, 60, &["true"]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["code"],
        "invalid_idempotency_key"
    );
    let r = http.get(&url).bearer_auth(&service).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["code"],
        "invalid_tenant"
    );
    // Unknown and malformed ids are 404s; so is another tenant's job.
    assert_eq!(
        c.get(Uuid::new_v4()).await.unwrap_err().code(),
        Some("not_found")
    );
    let r = http
        .get(format!("{url}/not-a-uuid"))
        .bearer_auth(&service)
        .header("x-gangway-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let bad_query = c
        .list(&ListQuery {
            limit: Some(100_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_query.code(), Some("invalid_query"));

    // Nothing was stored, and the server is fine.
    let list = c.list(&ListQuery::default()).await.unwrap();
    assert!(list.jobs.is_empty(), "{:?}", list.jobs);
    let mine = c.submit(&spec(1, 60, &["true"]), None).await.unwrap();
    let other = cloud.tenant("globex");
    assert_eq!(
        other.get(mine.id).await.unwrap_err().code(),
        Some("not_found")
    );
    assert_eq!(
        other.cancel(mine.id).await.unwrap_err().code(),
        Some("not_found")
    );
    assert_eq!(
        other.events(mine.id).await.unwrap_err().code(),
        Some("not_found")
    );
    assert!(other
        .list(&ListQuery::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
}

fn cap(guaranteed: i64, max: Option<i64>) -> QuotaUpdate {
    QuotaUpdate {
        guaranteed_gpus: guaranteed,
        max_gpus: max,
        weight: None,
    }
}

#[tokio::test]
async fn a_tenant_over_its_quota_waits_while_others_run() {
    let cloud = Cloud::start("sim").await;
    cloud
        .client
        .set_quota("acme", "h100", &cap(0, Some(8)))
        .await
        .unwrap();
    let a = cloud
        .client
        .submit(&spec(8, 3600, &["t"]), None)
        .await
        .unwrap();
    let b = cloud
        .client
        .submit(&spec(8, 3600, &["t"]), None)
        .await
        .unwrap();
    let globex = cloud.tenant("globex");
    let g = globex.submit(&spec(8, 3600, &["t"]), None).await.unwrap();
    wait_state(&cloud.client, a.id, JobState::Running).await;
    wait_state(&globex, g.id, JobState::Running).await;
    assert_eq!(
        cloud.client.get(b.id).await.unwrap().state,
        JobState::Queued
    );
    assert_eq!(cloud.client.explain(b.id).await.unwrap().code, "over_quota");
    // Raising the cap lets the waiting job in once GPUs free up.
    globex.cancel(g.id).await.unwrap();
    cloud
        .client
        .set_quota("acme", "h100", &cap(0, Some(16)))
        .await
        .unwrap();
    wait_state(&cloud.client, b.id, JobState::Running).await;
    let quotas = cloud.client.list_quotas().await.unwrap().quotas;
    assert_eq!(quotas.len(), 1);
    assert_eq!(quotas[0].max_gpus, Some(16));
    assert_eq!(quotas[0].weight, 1.0);
    let bad = cloud
        .client
        .set_quota("acme", "h100", &cap(-1, None))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some("invalid_gpus"));
    let bad = cloud
        .client
        .set_quota("acme", "h100", &cap(8, Some(4)))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some("invalid_quota"));
    assert_eq!(
        cloud.client.list_quotas().await.unwrap().quotas[0].max_gpus,
        Some(16),
        "a refused update changes nothing"
    );
    cloud.client.delete_quota("acme", "h100").await.unwrap();
    assert!(cloud.client.list_quotas().await.unwrap().quotas.is_empty());
}

fn limits(max_queued_jobs: Option<i64>, max_gpus: Option<i64>) -> LimitsUpdate {
    LimitsUpdate {
        max_queued_jobs,
        max_gpus,
    }
}

/// Issue 6's CI test: "admission limits refuse with their code".
#[tokio::test]
async fn admission_limits_refuse_with_their_code() {
    let cloud = Cloud::start("sim").await;
    let c = &cloud.client;
    let set = c
        .set_limits("acme", &limits(Some(1), Some(24)))
        .await
        .unwrap();
    assert_eq!(
        (set.tenant.as_str(), set.max_queued_jobs, set.max_gpus),
        ("acme", Some(1), Some(24))
    );

    // Bad limits are refused with their code and change nothing.
    let put = |path: &'static str, body: serde_json::Value| {
        let c = c.clone();
        async move {
            c.call_json(reqwest::Method::PUT, path, Some(&body))
                .await
                .unwrap_err()
        }
    };
    let acme = "/v1/admin/limits/acme";
    let cases = [
        (
            acme,
            serde_json::json!({"max_queued_jobs": -1}),
            "invalid_limits",
        ),
        (
            acme,
            serde_json::json!({"max_gpus": 20_000_000}),
            "invalid_limits",
        ),
        (acme, serde_json::json!({}), "invalid_limits"),
        (
            acme,
            serde_json::json!({"max_queued_jobs": null, "max_gpus": null}),
            "invalid_limits",
        ),
        (
            acme,
            serde_json::json!({"max_queued_jobs": "2"}),
            "invalid_spec",
        ),
        (acme, serde_json::json!({"max_gpus": 1.5}), "invalid_spec"),
        (
            acme,
            serde_json::json!({"max_gpus": 8, "surprise": true}),
            "invalid_spec",
        ),
        (acme, serde_json::json!([1, 2]), "invalid_spec"),
        (
            "/v1/admin/limits/Not%20A%20Tenant",
            serde_json::json!({"max_gpus": 8}),
            "invalid_spec",
        ),
    ];
    for (path, body, want) in cases {
        let e = put(path, body.clone()).await;
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(422), Some(want)),
            "{path} {body}"
        );
    }
    let listed = c.list_limits().await.unwrap().limits;
    assert_eq!(
        listed,
        vec![set.clone()],
        "a refused update changes nothing"
    );

    // 16 GPUs running, 8 queued: one queued job, the limit.
    let running = c
        .submit(&spec(16, 3600, &["t"]), Some("big"))
        .await
        .unwrap();
    wait_state(c, running.id, JobState::Running).await;
    let queued = c.submit(&spec(8, 3600, &["t"]), None).await.unwrap();
    let e = c.submit(&spec(1, 60, &["t"]), None).await.unwrap_err();
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(429), Some("queued_jobs_limit"))
    );
    let message = e.to_string();
    assert!(
        message.contains("1 queued job(s) in region test") && message.contains("limit there is 1"),
        "{message}"
    );
    // A dry run says the same and creates nothing.
    let e = c.dry_run(&spec(1, 60, &["t"])).await.unwrap_err();
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(429), Some("queued_jobs_limit"))
    );
    // A retry of the create that was accepted still gets its job.
    let again = c
        .submit(&spec(16, 3600, &["t"]), Some("big"))
        .await
        .unwrap();
    assert_eq!(again.id, running.id);
    // Another tenant is not limited by acme's limits.
    cloud
        .tenant("globex")
        .submit(&spec(1, 60, &["t"]), None)
        .await
        .unwrap();

    // No job queued, but 16 GPUs asked by unfinished jobs: 16 more is over 24.
    c.cancel(queued.id).await.unwrap();
    let e = c.submit(&spec(16, 60, &["t"]), None).await.unwrap_err();
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(429), Some("requested_gpus_limit"))
    );
    let message = e.to_string();
    assert!(
        message.contains("16 GPUs") && message.contains("32 in all") && message.contains("24"),
        "{message}"
    );
    let e = c.dry_run(&spec(16, 60, &["t"])).await.unwrap_err();
    assert_eq!(e.code(), Some("requested_gpus_limit"));
    // 8 fits exactly.
    let fits = c.submit(&spec(8, 60, &["t"]), None).await.unwrap();

    // Nothing refused was stored.
    let mine: Vec<Uuid> = c
        .list(&ListQuery::default())
        .await
        .unwrap()
        .jobs
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(mine, vec![fits.id, queued.id, running.id]);

    // Removed, the limits no longer refuse; removing them again is 404.
    c.delete_limits("acme").await.unwrap();
    assert!(c.list_limits().await.unwrap().limits.is_empty());
    assert_eq!(
        c.delete_limits("acme").await.unwrap_err().code(),
        Some("not_found")
    );
    c.submit(&spec(16, 60, &["t"]), None).await.unwrap();
    // Each change is in the audit log.
    let log = c
        .call_json(reqwest::Method::GET, "/v1/admin/audit?target=acme", None)
        .await
        .unwrap();
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["limits.delete", "limits.set"]);
}

#[tokio::test]
async fn a_region_refuses_callers_without_a_service_or_agent_token() {
    let cloud = Cloud::start("sim").await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", cloud.port);
    let code = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap();
        (status, body["code"].as_str().unwrap_or("").to_string())
    };
    // No token at all.
    let r = http
        .get(format!("{base}/v1/jobs"))
        .header("x-gangway-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, (401, "missing_token".to_string()));
    // A token signed by some other key.
    let stranger = SigningKey::generate("e2e-service");
    let r = http
        .get(format!("{base}/v1/jobs"))
        .bearer_auth(token(&stranger, Role::Service, None))
        .header("x-gangway-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, (401, "bad_signature".to_string()));
    // An agent token may not use the job API...
    let agent = token(&cloud.key, Role::Agent, Some("test"));
    let r = http
        .get(format!("{base}/v1/jobs"))
        .bearer_auth(&agent)
        .header("x-gangway-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, (403, "forbidden".to_string()));
    // ...and an agent of another region may not sync here.
    let other = token(&cloud.key, Role::Agent, Some("elsewhere"));
    let r = http
        .post(format!("{base}/internal/v1/agents/x/sync"))
        .bearer_auth(&other)
        .json(&serde_json::json!({"boot_id": Uuid::new_v4(), "workers": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(code(r).await, (403, "forbidden".to_string()));
    // Nor may another agent, or an agent of another region, wait on this
    // agent's assignment changes; its own token may.
    let changes = format!("{base}/internal/v1/agents/test-agent/changes");
    let wait = serde_json::json!({"wait_ms": 10});
    for (who, want) in [
        (agent_token(&cloud.key, "intruder", "test"), "wrong_agent"),
        (other.clone(), "forbidden"),
    ] {
        let r = (http.post(&changes).bearer_auth(&who).json(&wait).send())
            .await
            .unwrap();
        assert_eq!(code(r).await, (403, want.to_string()));
    }
    let own = agent_token(&cloud.key, "test-agent", "test");
    let r = (http.post(&changes).bearer_auth(&own).json(&wait).send())
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["changed"], false, "nothing was placed");
    // Health needs nothing.
    let r = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// A trainer as docs/jobs.md describes it: resumes from
/// GANGWAY_RESTORE_FROM, checkpoints on SIGUSR1 by writing under a dot-name
/// and renaming it into place, and otherwise trains forever.
const TRAINER: &str = r#"
    echo "attempt $GANGWAY_ATTEMPT restore ${GANGWAY_RESTORE_FROM:-none}" >> "$OUT/rank-$RANK.log"
    checkpoint() {
        # Rank 0 writes the job's checkpoint, as trainers do: one
        # checkpoint per job, not one per rank racing to be the newest.
        [ "$RANK" = 0 ] || return 0
        tmp="$GANGWAY_CHECKPOINT_DIR/.tmp-$RANK-$$"
        mkdir -p "$tmp" && echo "attempt $GANGWAY_ATTEMPT" > "$tmp/state"
        mv "$tmp" "$GANGWAY_CHECKPOINT_DIR/ckpt-attempt-$GANGWAY_ATTEMPT-rank-$RANK"
    }
    trap 'checkpoint; exit 0' USR1
    while true; do sleep 0.05; done
"#;

#[tokio::test]
async fn a_preempted_job_checkpoints_stops_requeues_and_resumes_from_its_checkpoint() {
    let cloud = Cloud::start("real").await;
    let out: PathBuf = cloud.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mut s = spec(2, 600, &["sh", "-c", TRAINER]);
    s.env
        .insert("OUT".into(), out.to_string_lossy().into_owned());
    let job = cloud.client.submit(&s, None).await.unwrap();
    wait_state(&cloud.client, job.id, JobState::Running).await;

    // An operator (through the global tier, here straight to the region)
    // preempts it.
    let http = reqwest::Client::new();
    let r = http
        .post(format!(
            "http://127.0.0.1:{}/v1/admin/jobs/{}/preempt",
            cloud.port, job.id
        ))
        .bearer_auth(token(&cloud.key, Role::Service, None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());

    // It checkpoints, stops, requeues and runs again from the checkpoint.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let resumed = loop {
        let j = cloud.client.get(job.id).await.unwrap();
        if j.state == JobState::Running && j.preemptions == 1 {
            break j;
        }
        assert!(std::time::Instant::now() < deadline, "never resumed: {j:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let restore = restored_dir(&cloud, &resumed, "ckpt-attempt-1-rank-0");
    // The second attempt of every rank was told where to resume.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for rank in 0..2 {
        let log = out.join(format!("rank-{rank}.log"));
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("attempt 2") {
                assert!(text.contains("attempt 1 restore none"), "{text}");
                assert!(
                    text.contains(&format!("attempt 2 restore {restore}")),
                    "{text}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank} not restarted: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let kinds: Vec<String> = cloud
        .client
        .events(job.id)
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.kind)
        .collect();
    let want = [
        "queued",
        "placed",
        "started",
        "preempted",
        "requeued",
        "placed",
        "started",
    ];
    assert_eq!(kinds, want);
    // Preempting a job that is not running is refused.
    cloud.client.cancel(job.id).await.unwrap();
    wait_state(&cloud.client, job.id, JobState::Cancelled).await;
    let r = http
        .post(format!(
            "http://127.0.0.1:{}/v1/admin/jobs/{}/preempt",
            cloud.port, job.id
        ))
        .bearer_auth(token(&cloud.key, Role::Service, None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    cloud.expect_allocated(0).await;
}

/// The directory a restarted worker of `job` was handed in
/// `GANGWAY_RESTORE_FROM`: the job's newest checkpoint, committed to the
/// region's checkpoint store by the agent of its rank 0, fetched back and
/// verified into the agent's work dir under the name the job gave it.
fn restored_dir(cloud: &Cloud, job: &Job, name: &str) -> String {
    let key = job
        .restore_from
        .clone()
        .expect("a checkpoint to restore from");
    assert!(
        key.starts_with(&format!("jobs/{}/epoch-1/", job.id)),
        "{key}"
    );
    let newest = job.checkpoint.as_ref().expect("its newest checkpoint");
    assert_eq!(newest.key, key);
    assert_eq!(newest.name, name);
    assert!(cloud
        .dir
        .path()
        .join("store")
        .join(&key)
        .join("manifest.json")
        .is_file());
    let parts = gangway_checkpoint::parse_key(&key).expect("a store key");
    let dir = cloud
        .dir
        .path()
        .join("agent/restore")
        .join(job.id.to_string())
        .join(format!(
            "epoch-{}-seq-{}-attempt-{}",
            parts.epoch, parts.seq, parts.attempt
        ))
        .join(name);
    assert!(dir.join("state").exists(), "{}", dir.display());
    dir.to_string_lossy().into_owned()
}

/// Like [`TRAINER`], but a run restored from a checkpoint checks that the
/// checkpoint is whole and finishes at once.
const RESUMABLE_TRAINER: &str = r#"
    echo "attempt $GANGWAY_ATTEMPT restore ${GANGWAY_RESTORE_FROM:-none}" >> "$OUT/rank-$RANK.log"
    if [ -n "$GANGWAY_RESTORE_FROM" ]; then
        [ -f "$GANGWAY_RESTORE_FROM/state" ] || exit 7
        exit 0
    fi
    checkpoint() {
        # Rank 0 writes the job's checkpoint, as trainers do: one
        # checkpoint per job, not one per rank racing to be the newest.
        [ "$RANK" = 0 ] || return 0
        tmp="$GANGWAY_CHECKPOINT_DIR/.tmp-$RANK-$$"
        mkdir -p "$tmp" && echo "attempt $GANGWAY_ATTEMPT" > "$tmp/state"
        mv "$tmp" "$GANGWAY_CHECKPOINT_DIR/ckpt-attempt-$GANGWAY_ATTEMPT-rank-$RANK"
    }
    trap 'checkpoint; exit 0' USR1
    while true; do sleep 0.05; done
"#;

#[tokio::test]
async fn the_scheduler_preempts_a_low_priority_job_for_a_normal_one_and_the_low_one_resumes() {
    let cloud = Cloud::start("real").await;
    let out: PathBuf = cloud.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let out_env = out.to_string_lossy().into_owned();
    // A low-priority gang on every schedulable GPU, expected to run an hour.
    let mut low = spec(16, 3600, &["sh", "-c", RESUMABLE_TRAINER]);
    low.gpus_per_worker = Some(8);
    low.priority = Priority::Low;
    low.env.insert("OUT".into(), out_env.clone());
    let low = cloud.client.submit(&low, None).await.unwrap();
    wait_state(&cloud.client, low.id, JobState::Running).await;

    // A normal-priority job would preempt it: the dry run says so.
    let mut normal = spec(8, 60, &["sh", "-c", "echo ran > \"$OUT/normal-$RANK\""]);
    normal.gpus_per_worker = Some(8);
    normal.env.insert("OUT".into(), out_env);
    let d = cloud.client.dry_run(&normal).await.unwrap();
    assert_eq!(d.code, "waiting_for_preemption", "{d:?}");
    assert_eq!(d.would_preempt, vec![low.id], "{d:?}");
    assert_eq!(
        cloud.client.get(low.id).await.unwrap().state,
        JobState::Running,
        "a dry run preempts nothing"
    );

    // Submitted, the scheduler (no operator) asks the low job to
    // checkpoint; it writes one, stops and requeues; the normal job runs.
    let normal = cloud.client.submit(&normal, None).await.unwrap();
    wait_state(&cloud.client, normal.id, JobState::Succeeded).await;
    assert!(out.join("normal-0").exists());
    // Then the low job resumes from its checkpoint and finishes.
    let done = wait_state(&cloud.client, low.id, JobState::Succeeded).await;
    assert_eq!(done.preemptions, 1);
    let restore = restored_dir(&cloud, &done, "ckpt-attempt-1-rank-0");
    for rank in 0..2 {
        let text = std::fs::read_to_string(out.join(format!("rank-{rank}.log"))).unwrap();
        assert!(text.contains("attempt 1 restore none"), "{text}");
        assert!(
            text.contains(&format!("attempt 2 restore {restore}")),
            "{text}"
        );
    }

    let events = cloud.client.events(low.id).await.unwrap().events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "queued",
            "placed",
            "started",
            "preempted",
            "requeued",
            "placed",
            "started",
            "finished"
        ]
    );
    let preempted = &events[3];
    assert_eq!(preempted.detail["cause"], "priority");
    assert_eq!(preempted.detail["for_job"], normal.id.to_string());
    // The normal job was placed only after the low job was asked to let go.
    let normal_events = cloud.client.events(normal.id).await.unwrap().events;
    let placed = normal_events.iter().find(|e| e.kind == "placed").unwrap();
    assert!(placed.at > preempted.at, "{normal_events:?} {events:?}");
    cloud.expect_allocated(0).await;
}

/// Like [`RESUMABLE_TRAINER`], and each start also records the world size
/// its run was given.
const ELASTIC_TRAINER: &str = r#"
    echo "attempt $GANGWAY_ATTEMPT world $WORLD_SIZE $GANGWAY_WORLD_SIZE restore ${GANGWAY_RESTORE_FROM:-none}" >> "$OUT/rank-$RANK.log"
    if [ -n "$GANGWAY_RESTORE_FROM" ]; then
        [ -f "$GANGWAY_RESTORE_FROM/state" ] || exit 7
        exit 0
    fi
    checkpoint() {
        # Rank 0 writes the job's checkpoint, as trainers do: one
        # checkpoint per job, not one per rank racing to be the newest.
        [ "$RANK" = 0 ] || return 0
        tmp="$GANGWAY_CHECKPOINT_DIR/.tmp-$RANK-$$"
        mkdir -p "$tmp" && echo "world $WORLD_SIZE" > "$tmp/state"
        mv "$tmp" "$GANGWAY_CHECKPOINT_DIR/ckpt-attempt-$GANGWAY_ATTEMPT-rank-$RANK"
    }
    trap 'checkpoint; exit 0' USR1
    while true; do sleep 0.05; done
"#;

/// Waits until `path` holds a line containing `want`; returns the text.
async fn wait_line(path: &Path, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {want:?}: {text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_elastic_job_starts_on_what_is_free_grows_when_a_job_ends_and_resumes_larger() {
    let cloud = Cloud::start("real").await;
    let out: PathBuf = cloud.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let out_env = out.to_string_lossy().into_owned();
    // Another job holds one of the two nodes until it is released.
    let mut other = spec(
        8,
        60,
        &[
            "sh",
            "-c",
            "while [ ! -f \"$OUT/release\" ]; do sleep 0.05; done",
        ],
    );
    other.gpus_per_worker = Some(8);
    other.env.insert("OUT".into(), out_env.clone());
    let other = cloud.client.submit(&other, None).await.unwrap();
    wait_state(&cloud.client, other.id, JobState::Running).await;

    // An elastic job of 4 workers × 4 GPUs that may run with 1: 2 fit.
    let mut s = spec(16, 3600, &["sh", "-c", ELASTIC_TRAINER]);
    s.gpus_per_worker = Some(4);
    s.min_gpus = Some(4);
    s.env.insert("OUT".into(), out_env);
    let job = cloud.client.submit(&s, None).await.unwrap();
    let running = wait_state(&cloud.client, job.id, JobState::Running).await;
    assert_eq!(running.run_workers, Some(2), "{running:?}");
    assert_eq!(running.spec.min_gpus, Some(4));
    for rank in 0..2 {
        let text = wait_line(&out.join(format!("rank-{rank}.log")), "attempt 1").await;
        assert!(text.contains("attempt 1 world 2 2 restore none"), "{text}");
    }
    assert!(
        !out.join("rank-2.log").exists(),
        "rank 2 is not part of the run"
    );

    // The other job ends; the elastic job is asked to checkpoint, requeues
    // and restarts with all 4 workers from its checkpoint, and finishes.
    std::fs::write(out.join("release"), "").unwrap();
    wait_state(&cloud.client, other.id, JobState::Succeeded).await;
    let done = wait_state(&cloud.client, job.id, JobState::Succeeded).await;
    assert_eq!(done.run_workers, Some(4));
    assert_eq!(done.preemptions, 1);
    assert!(done
        .workers
        .iter()
        .all(|w| w.state == WorkerState::Succeeded));
    let restore = restored_dir(&cloud, &done, "ckpt-attempt-1-rank-0");
    for rank in 0..4 {
        let text = std::fs::read_to_string(out.join(format!("rank-{rank}.log"))).unwrap();
        // Ranks 0 and 1 start a second time, ranks 2 and 3 a first.
        let attempt = if rank < 2 { 2 } else { 1 };
        assert!(
            text.contains(&format!("attempt {attempt} world 4 4 restore {restore}")),
            "rank {rank}: {text}"
        );
    }

    let events = cloud.client.events(job.id).await.unwrap().events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "queued",
            "placed",
            "started",
            "preempted",
            "requeued",
            "placed",
            "started",
            "finished"
        ]
    );
    assert_eq!(events[1].detail["world_size"], 2);
    assert_eq!(events[3].detail["cause"], "grow");
    assert_eq!(events[3].detail["for_job"], job.id.to_string());
    assert_eq!(events[5].detail["world_size"], 4);
    cloud.expect_allocated(0).await;
}

fn reservation(
    gpus: i64,
    level: TopologyLevel,
    start: Option<chrono::DateTime<chrono::Utc>>,
    end: Option<chrono::DateTime<chrono::Utc>>,
) -> ReservationSpec {
    ReservationSpec {
        gpu_type: "h100".into(),
        gpus,
        level,
        start,
        end,
        region: None,
    }
}

#[tokio::test]
async fn reservations_are_refused_with_a_window_idempotent_and_run_their_jobs() {
    let cloud = Cloud::start("sim").await;
    let c = &cloud.client;
    let status = |e: gangway_shared::client::ClientError| {
        (
            e.status().unwrap().as_u16(),
            e.code().unwrap_or("none").to_string(),
        )
    };
    let hour = chrono::Duration::seconds(3600);
    let t = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() + 3600, 0).unwrap();

    // acme reserves the whole leaf (16 GPUs; the spare does not count) for
    // an hour from an hour from now. A retry with the key gets the same
    // reservation; the key with another body is refused.
    let whole = reservation(16, TopologyLevel::Leaf, Some(t), Some(t + hour));
    let first = c.create_reservation(&whole, Some("r1")).await.unwrap();
    assert_eq!((first.state, first.gpus), (ReservationState::Scheduled, 16));
    assert_eq!(first.domain.len(), 2);
    let again = c.create_reservation(&whole, Some("r1")).await.unwrap();
    assert_eq!(again, first);
    let other_body = reservation(8, TopologyLevel::Leaf, Some(t), Some(t + hour));
    let e = c.create_reservation(&other_body, Some("r1")).await;
    assert_eq!(
        status(e.unwrap_err()),
        (422, "idempotency_key_reused".into())
    );
    assert_eq!(
        c.list_reservations().await.unwrap().reservations,
        std::slice::from_ref(&first)
    );

    // globex wants 8 of them during acme's hour: refused, with the
    // earliest window of the same length that works (acme's end).
    let globex = cloud.tenant("globex");
    let overlap = reservation(
        8,
        TopologyLevel::Spine,
        Some(t + hour / 2),
        Some(t + hour * 3 / 2),
    );
    match globex.create_reservation(&overlap, None).await {
        Err(gangway_shared::client::ClientError::Api { status, body, .. }) => {
            assert_eq!(status.as_u16(), 409);
            assert_eq!(body.code, "reservation_unavailable");
            assert_eq!(body.earliest_start, Some(t + hour));
            assert_eq!(body.earliest_end, Some(t + hour * 2));
            assert!(body.message.contains("earliest window"), "{}", body.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(globex
        .list_reservations()
        .await
        .unwrap()
        .reservations
        .is_empty());
    // Another tenant's reservation is not there for globex.
    let e = globex.get_reservation(first.id).await.unwrap_err();
    assert_eq!(status(e), (404, "not_found".into()));
    let e = globex.delete_reservation(first.id, None).await.unwrap_err();
    assert_eq!(status(e), (404, "not_found".into()));

    // Bad requests say what to fix and create nothing.
    let valid = r#""gpu_type":"h100""#;
    let cases: Vec<(String, u16, &str)> = vec![
        ("{nope".into(), 400, "malformed_json"),
        (format!(r#"{{"gpus":0,{valid}}}"#), 422, "invalid_gpus"),
        (
            format!(r#"{{"gpus":8,"level":"rack",{valid}}}"#),
            422,
            "invalid_spec",
        ),
        (
            format!(r#"{{"gpus":8,"size":1,{valid}}}"#),
            422,
            "invalid_spec",
        ),
        (
            format!(
                r#"{{"gpus":8,"start":"2031-01-01T01:00:00Z","end":"2031-01-01T00:00:00Z",{valid}}}"#
            ),
            422,
            "invalid_reservation",
        ),
        (
            format!(r#"{{"gpus":8,"end":"2001-01-01T00:00:00Z",{valid}}}"#),
            422,
            "invalid_reservation",
        ),
        (
            r#"{"gpus":8,"gpu_type":"tpu"}"#.into(),
            422,
            "unknown_gpu_type",
        ),
        (
            format!(r#"{{"gpus":8,"region":"elsewhere",{valid}}}"#),
            422,
            "wrong_region",
        ),
        (
            format!(r#"{{"gpus":17,{valid}}}"#),
            409,
            "reservation_unavailable",
        ),
    ];
    for (body, want_status, want) in cases {
        let got = c
            .post_raw("/v1/reservations", "application/json", body.clone())
            .await
            .unwrap_err();
        assert_eq!(status(got), (want_status, want.to_string()), "body {body}");
    }
    assert_eq!(c.list_reservations().await.unwrap().reservations.len(), 1);

    // Resize with a key: done once, the retry answers the same; an empty
    // resize is refused.
    let half = ReservationResize {
        gpus: Some(8),
        end: None,
    };
    let resized = c
        .resize_reservation(first.id, &half, Some("r2"))
        .await
        .unwrap();
    assert_eq!(
        (resized.gpus, resized.domain.clone()),
        (8, first.domain.clone())
    );
    let retry = c
        .resize_reservation(first.id, &half, Some("r2"))
        .await
        .unwrap();
    assert_eq!(retry, resized);
    let empty = ReservationResize {
        gpus: None,
        end: None,
    };
    let e = c
        .resize_reservation(first.id, &empty, None)
        .await
        .unwrap_err();
    assert_eq!(status(e), (422, "invalid_reservation".into()));
    // Now globex's window fits beside it.
    let theirs = globex.create_reservation(&overlap, None).await.unwrap();
    assert_eq!(theirs.tenant, "globex");

    // Delete: 200 with the deleted reservation, the second time too.
    let deleted = c.delete_reservation(first.id, Some("r3")).await.unwrap();
    assert_eq!(deleted.state, ReservationState::Deleted);
    let twice = c.delete_reservation(first.id, None).await.unwrap();
    assert_eq!(twice.state, ReservationState::Deleted);
    let e = c
        .resize_reservation(first.id, &half, None)
        .await
        .unwrap_err();
    assert_eq!(status(e), (409, "reservation_conflict".into()));

    // A job runs in a reservation that has started; one naming another
    // tenant's, or more GPUs than it holds, is refused.
    let now = c
        .create_reservation(&reservation(8, TopologyLevel::Nvlink, None, None), None)
        .await
        .unwrap();
    assert_eq!(now.state, ReservationState::Active);
    let mut inside = spec(8, 60, &["train"]);
    inside.gpus_per_worker = Some(8);
    inside.reservation = Some(now.id);
    let mut too_big = spec(16, 60, &["train"]);
    too_big.reservation = Some(now.id);
    let e = c.submit(&too_big, None).await.unwrap_err();
    assert_eq!(status(e), (422, "invalid_reservation".into()));
    let e = globex.submit(&inside, None).await.unwrap_err();
    assert_eq!(status(e), (422, "invalid_reservation".into()));
    let job = c.submit(&inside, None).await.unwrap();
    assert_eq!(job.spec.reservation, Some(now.id));
    wait_state(c, job.id, JobState::Running).await;
    let held = c.get_reservation(now.id).await.unwrap();
    assert_eq!(held.in_use_gpus, 8);
    let placed: std::collections::BTreeSet<_> = c
        .get(job.id)
        .await
        .unwrap()
        .workers
        .iter()
        .filter_map(|w| w.node.clone())
        .collect();
    assert_eq!(
        placed.into_iter().collect::<Vec<_>>(),
        [now.domain[2].clone()]
    );
    wait_state(c, job.id, JobState::Succeeded).await;
}

/// The example trainer (deploy/examples/trainer): counts steps, checkpoints
/// every N into GANGWAY_CHECKPOINT_DIR, resumes from GANGWAY_RESTORE_FROM.
const EXAMPLE_TRAINER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/trainer");

/// The region's inventory: two machines of 8 GPUs, by name.
const MACHINES: &str = r#"
[[spine]]
  [[spine.leaf]]
  names = ["machine-a", "machine-b"]
  gpu_type = "h100"
  gpus_per_node = 8
"#;

/// A real-mode agent of region `test` for machine `name` (8 GPUs
/// declared: this host has none), with its own work dir and token and the
/// cloud's checkpoint store.
fn spawn_agent(dir: &Path, key: &SigningKey, port: u16, name: &str) -> Proc {
    Proc(
        Command::new(BIN)
            .env("GANGWAY_AGENT_TOKEN", agent_token(key, name, "test"))
            .args([
                "agent",
                "--node-name",
                name,
                "--gpus",
                "8",
                "--gpu-type",
                "h100",
            ])
            .arg("--region-url")
            .arg(format!("http://127.0.0.1:{port}"))
            .arg("--insecure-http")
            .args(["--executor", "real"])
            .arg("--work-dir")
            .arg(dir.join(name))
            .arg("--checkpoint-store")
            .arg(format!("file://{}", dir.join("store").display()))
            .arg("--sandbox-bind")
            .arg(shared_out(dir))
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir, &format!("{name}.log")))
            .spawn()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_drained_trainer_resumes_on_another_machine_from_the_checkpoint_store() {
    let db = gangway_devkit::fresh_database("e2e").await;
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate("e2e-service");
    std::fs::write(dir.path().join("service.pub.pem"), key.public_pem()).unwrap();
    std::fs::write(dir.path().join("fleet.toml"), MACHINES).unwrap();
    let port = gangway_devkit::free_port();
    let _region = spawn_region(dir.path(), &db, (port, gangway_devkit::free_port()), 200);
    let _a = spawn_agent(dir.path(), &key, port, "machine-a");
    let client = Client::new(format!("http://127.0.0.1:{port}"), "acme").with_token(token(
        &key,
        Role::Service,
        None,
    ));
    let logs = dir.path().display().to_string();
    let gpus = || async {
        client
            .region_status()
            .await
            .map(|s| s.capacity.iter().map(|c| c.schedulable).sum::<u32>())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while gpus().await < 8 {
        assert!(Instant::now() < deadline, "no GPUs; logs in {logs}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 60 steps of 0.1 s, a checkpoint every 5. The trainer runs as the
    // tenant's user, from where it can read it (a checkout may be under
    // /root), and logs where the test reads.
    let out = shared_out(dir.path());
    let trainer = out.join("trainer");
    std::fs::copy(EXAMPLE_TRAINER, &trainer).unwrap();
    let trainer_log = out.join("trainer.log");
    let mut s = spec(
        1,
        600,
        &[
            trainer.to_str().unwrap(),
            "--step-s",
            "0.1",
            "--every",
            "5",
            "--total",
            "60",
        ],
    );
    s.env.insert(
        "TRAINER_LOG".into(),
        trainer_log.to_string_lossy().into_owned(),
    );
    let job = client.submit(&s, None).await.unwrap();
    let running = wait_state(&client, job.id, JobState::Running).await;
    let node_a = running.workers[0].node.clone().unwrap();
    assert!(node_a.starts_with("machine-a"), "{node_a}");

    // Its periodic checkpoints reach the store and the region records them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let periodic = loop {
        let j = client.get(job.id).await.unwrap();
        if let Some(c) = j.checkpoint.clone().filter(|c| c.seq >= 10) {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint recorded: {j:?}; logs in {logs}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(periodic.name, format!("step-{}", periodic.seq));
    assert_eq!(
        (periodic.epoch, periodic.files, periodic.size_bytes),
        (1, 1, 3)
    );

    // A second machine, with a work dir of its own, joins; the first is
    // drained: the trainer checkpoints at once (SIGUSR1), its agent commits
    // that checkpoint before reporting it stopped, and it moves.
    let _b = spawn_agent(dir.path(), &key, port, "machine-b");
    let deadline = Instant::now() + Duration::from_secs(60);
    while gpus().await < 16 {
        assert!(
            Instant::now() < deadline,
            "machine-b never joined; logs in {logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{port}/v1/admin/nodes/{node_a}/drain"
        ))
        .bearer_auth(token(&key, Role::Service, None))
        .json(&serde_json::json!({"mode": "checkpoint", "reason": "e2e"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());

    let done = wait_state(&client, job.id, JobState::Succeeded).await;
    let node_b = done.workers[0].node.clone().unwrap();
    assert!(node_b.starts_with("machine-b"), "{node_b}");
    assert_eq!((done.preemptions, done.node_moves), (1, 1));
    let log = std::fs::read_to_string(&trainer_log).unwrap();
    let resumed: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("attempt 2 rank 0 resumed from step "))
        .unwrap_or_else(|| panic!("no second attempt: {log}"))
        .parse()
        .unwrap();
    // From the checkpoint written when asked, later than the periodic one
    // seen before the drain, and on to the end.
    assert!(resumed as i64 >= periodic.seq, "{log}");
    assert!(
        log.contains("attempt 1 rank 0 resumed from step 0"),
        "{log}"
    );
    assert!(log.contains(&format!("checkpoint step-{resumed}")), "{log}");
    assert_eq!(
        log.lines()
            .filter(|l| l.starts_with("final step"))
            .collect::<Vec<_>>(),
        ["final step 60"],
        "{log}"
    );
    // It restarted from the store: machine-b fetched the checkpoint into
    // its own work dir (one checkpoint, named as the trainer named it);
    // machine-a ran only the first attempt.
    let restored: Vec<PathBuf> = std::fs::read_dir(
        dir.path()
            .join("machine-b/restore")
            .join(job.id.to_string()),
    )
    .unwrap()
    .map(|e| e.unwrap().path())
    .collect();
    assert_eq!(restored.len(), 1, "{restored:?}");
    let fetched = restored[0].join(format!("step-{resumed}/step"));
    assert_eq!(
        std::fs::read_to_string(&fetched).unwrap().trim(),
        resumed.to_string()
    );
    assert!(
        restored[0].to_string_lossy().ends_with("-attempt-1"),
        "written by the first attempt: {restored:?}"
    );
    let jobs_a = dir.path().join("machine-a/jobs").join(job.id.to_string());
    assert!(jobs_a.join("rank-0-attempt-1").exists());
    assert!(!jobs_a.join("rank-0-attempt-2").exists());
    let stdout_b = std::fs::read_to_string(
        dir.path()
            .join("machine-b/jobs")
            .join(job.id.to_string())
            .join("rank-0-attempt-2/stdout.log"),
    )
    .unwrap();
    assert!(stdout_b.ends_with("final step 60\n"), "{stdout_b}");
    // The newest checkpoint is the one it resumed from or a later one of
    // the second run (written on machine-b, uploaded by its agent).
    let newest = done.checkpoint.unwrap();
    assert!(newest.seq >= resumed as i64, "{newest:?}");
    assert_eq!(done.restore_from, Some(newest.key));
}
