//! Fleet operations end to end across real processes: a `gangway region`
//! on a real throwaway PostgreSQL, a `gangway agent` serving a simulated
//! fleet (sim executor), and a `gangway global` on HTTPS in front. An
//! operator injects XID 79 into the node running a job with the CLI; the job
//! is checkpointed, requeued, runs elsewhere from its checkpoint and
//! succeeds; `gangway admin node get` says why the node is out, and the
//! audit log names who did it. A dedicated cluster loses a node the same
//! way and the region swaps in the leaf's spare without being asked; the
//! tenant reads it on the cluster.

mod support;

use support::{log_file, Proc, BIN};

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_shared::api::{ClusterSpec, ClusterState, Job, JobSpec, JobState};
use gangway_shared::client::Client;
use gangway_shared::tokens;
use uuid::Uuid;

/// One leaf of 3 nodes × 8 h100, no spares.
const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 3
  gpu_type = "h100"
  gpus_per_node = 8
"#;

struct Cloud {
    dir: tempfile::TempDir,
    url: String,
    ca: std::path::PathBuf,
    admin: String,
    tenant: Client,
    _procs: Vec<Proc>,
}

impl Cloud {
    async fn start() -> Cloud {
        Self::start_with(FLEET, 24).await
    }

    /// A cloud serving `fleet`, ready once `schedulable` GPUs are.
    async fn start_with(fleet_toml: &str, schedulable: u32) -> Cloud {
        let dir = tempfile::tempdir().unwrap();
        let auth = DevMaterial::load_or_create(dir.path()).unwrap();
        let db = gangway_devkit::fresh_database("e2e_fleet").await;
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, fleet_toml).unwrap();
        let (region_port, global_port) = (gangway_devkit::free_port(), gangway_devkit::free_port());
        let keys = dir.path().join("keys");
        let region = Proc(
            Command::new(BIN)
                .args(["region", "--name", "test", "--database-url", &db])
                .arg("--service-key")
                .arg(format!(
                    "{}={}",
                    auth.service_key.kid(),
                    keys.join("service-signing.pub.pem").display()
                ))
                .args(["--listen", &format!("127.0.0.1:{region_port}")])
                .args(gangway_chaos::procs::region_tls(&auth))
                .args([
                    "--schedule-interval-ms",
                    "100",
                    "--agent-sync-interval-ms",
                    "200",
                ])
                .args(["--grace-period-s", "2", "--checkpoint-deadline-s", "10"])
                .arg("--inventory")
                .arg(&fleet)
                .env("GANGWAY_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "region.log"))
                .spawn()
                .unwrap(),
        );
        let agent = gangway_chaos::procs::spawn_sim_agent(
            std::path::Path::new(BIN),
            dir.path(),
            &auth,
            "test",
            region_port,
            &fleet,
            "agent",
        );
        let global = support::spawn_global(
            dir.path(),
            &auth,
            global_port,
            &[("test", format!("https://127.0.0.1:{region_port}"))],
        );
        let sign = |role, sub: &str, tenant: Option<&str>| {
            auth.public_key_for(role)
                .sign(&claims_for(
                    role,
                    sub,
                    tenant,
                    None,
                    tokens::ISSUER,
                    tokens::PUBLIC_AUDIENCE,
                    Duration::from_secs(3600),
                ))
                .unwrap()
        };
        let url = format!("https://127.0.0.1:{global_port}");
        let ca_pem = std::fs::read(&auth.ca_cert).unwrap();
        let tenant = Client::public(
            url.clone(),
            sign(Role::Tenant, "acme-e2e", Some("acme")),
            Some(&ca_pem),
        )
        .unwrap();
        let cloud = Cloud {
            url,
            ca: auth.ca_cert.clone(),
            admin: sign(Role::Admin, "sre-on-call", None),
            tenant,
            dir,
            _procs: vec![region, agent, global],
        };
        // Ready: the global tier sees the region with all its GPUs.
        support::until_ready(&cloud.tenant, 1, schedulable, cloud.dir.path()).await;
        cloud
    }

    /// Runs `gangway admin ARGS` as an operator; returns its output.
    fn admin(&self, args: &[&str]) -> Output {
        let out = Command::new(BIN)
            .arg("admin")
            .args(args)
            .arg("--url")
            .arg(&self.url)
            .arg("--ca-cert")
            .arg(&self.ca)
            .env("GANGWAY_ADMIN_TOKEN", &self.admin)
            .env("GANGWAY_STATE_DIR", self.dir.path().join("no-state"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gangway admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn admin_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_slice(&self.admin(&a).stdout).unwrap()
    }

    async fn wait_for(&self, id: Uuid, what: &str, cond: impl Fn(&Job) -> bool) -> Job {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let job = self.tenant.get(id).await.unwrap();
            if cond(&job) {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {id}: {what} never happened: {job:?}; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_79_moves_the_job_off_its_node_and_the_operator_sees_why() {
    let cloud = Cloud::start().await;
    // 8 GPUs for 400 s estimated × 0.05 = 20 s of simulated run.
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "e2e-fleet", "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 400, "command": ["train"]
    }))
    .unwrap();
    let job = cloud.tenant.submit(&spec, Some("fleet-1")).await.unwrap();
    let running = cloud
        .wait_for(job.id, "running", |j| j.state == JobState::Running)
        .await;
    let node = running.workers[0].node.clone().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The operator injects XID 79 (GPU fallen off the bus) into its node.
    let injected = cloud.admin_json(&[
        "node",
        "inject-fault",
        &node,
        "--kind",
        "xid",
        "--code",
        "79",
        "--gpu",
        "3",
    ]);
    assert_eq!(injected["observed"], "failed");
    assert_eq!(injected["schedulable"], false);

    // The job is checkpointed, requeued, and runs elsewhere from its
    // checkpoint, then succeeds.
    let moved = cloud
        .wait_for(job.id, "running on another node", |j| {
            j.state == JobState::Running && j.workers[0].node.as_deref().is_some_and(|n| n != node)
        })
        .await;
    assert!(
        moved
            .restore_from
            .as_deref()
            .is_some_and(|r| r.starts_with("sim:")),
        "{moved:?}"
    );
    assert_eq!(moved.preemptions, 1);
    let events = cloud.tenant.events(job.id).await.unwrap().events;
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
            "started"
        ]
    );
    let preempted = &events[3];
    assert_eq!(preempted.detail["cause"], "health");
    assert_eq!(preempted.detail["node"], node.as_str());
    assert!(
        preempted.message.contains("xid_79"),
        "{}",
        preempted.message
    );
    let done = cloud
        .wait_for(job.id, "success", |j| j.state.is_terminal())
        .await;
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");

    // `gangway admin node get` says why the node is out.
    let got = cloud.admin_json(&["node", "get", &node]);
    assert_eq!(got["observed"], "failed");
    assert_eq!(got["admin_state"], "active");
    assert!(got["why"].as_str().unwrap().contains("xid_79"), "{got}");
    assert_eq!(got["usable_gpus"], serde_json::json!([]));
    let table = String::from_utf8(cloud.admin(&["node", "get", &node]).stdout).unwrap();
    assert!(table.contains("failed (xid_79)"), "{table}");
    assert!(
        table.contains("fault injected by sre-on-call: XID 79 on GPU 3"),
        "{table}"
    );
    let list = String::from_utf8(cloud.admin(&["node", "list"]).stdout).unwrap();
    assert!(
        list.lines()
            .any(|l| l.contains(&node) && l.contains("failed")),
        "{list}"
    );

    // The audit log names the operator.
    let audit = cloud.admin_json(&["audit"]);
    let entries = audit["regions"]["test"]["entries"].as_array().unwrap();
    assert_eq!(entries[0]["actor"], "sre-on-call");
    assert_eq!(entries[0]["action"], "node.fault");
    assert_eq!(entries[0]["target"], node.as_str());

    // A simulated reboot brings the node back; an uncordon-free return.
    let back = cloud.admin_json(&["node", "inject-fault", &node, "--kind", "reboot"]);
    assert_eq!(back["observed"], "healthy");
    assert_eq!(back["schedulable"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_maintenance_through_the_cli_reboots_every_node_and_the_job_carries_on() {
    let cloud = Cloud::start().await;
    // 8 GPUs for 1200 s estimated × 0.05 = 60 s of simulated run.
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "e2e-maint", "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 1200, "command": ["train"]
    }))
    .unwrap();
    let job = cloud.tenant.submit(&spec, Some("maint-1")).await.unwrap();
    cloud
        .wait_for(job.id, "running", |j| j.state == JobState::Running)
        .await;

    // One node of the three at a time (34 % of 3).
    let plan = cloud.admin_json(&[
        "maintenance",
        "start",
        "--region",
        "test",
        "--all",
        "--max-percent",
        "34",
        "--reason",
        "kernel 6.8",
    ]);
    assert_eq!(plan["total"], 3);
    let id = plan["plan_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = cloud.admin_json(&["maintenance", "status", &id]);
        let out: u64 = ["draining", "rebooting", "checking"]
            .iter()
            .map(|k| p["steps"][k].as_u64().unwrap_or(0))
            .sum();
        assert!(out <= 1, "{p}");
        if p["state"] == "done" {
            assert_eq!(p["steps"]["done"], 3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "maintenance never finished: {p}; logs in {}",
            cloud.dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let status = String::from_utf8(cloud.admin(&["maintenance", "status", &id]).stdout).unwrap();
    assert!(status.contains("3/3 done"), "{status}");
    assert!(status.contains("[####"), "{status}");
    let list = String::from_utf8(cloud.admin(&["maintenance", "list"]).stdout).unwrap();
    assert!(list.contains(&id) && list.contains("done"), "{list}");

    // The job was moved through a checkpoint (never failed) and carries on.
    let j = cloud.tenant.get(job.id).await.unwrap();
    assert!(
        matches!(
            j.state,
            JobState::Running | JobState::Starting | JobState::Succeeded
        ),
        "{j:?}"
    );
    let events = cloud.tenant.events(job.id).await.unwrap().events;
    assert!(events
        .iter()
        .any(|e| e.kind == "preempted" && e.detail["cause"] == "maintenance"));
    assert!(
        !events.iter().any(|e| e.kind == "worker_exited"),
        "{events:?}"
    );
    // Every node rebooted and is back.
    let nodes = cloud.admin_json(&["node", "list"]);
    for n in nodes["regions"]["test"]["nodes"].as_array().unwrap() {
        assert_eq!(n["admin_state"], "active", "{n}");
    }
    let audit = cloud.admin_json(&["audit", "--action", "maintenance.start"]);
    let entries = audit["regions"]["test"]["entries"].as_array().unwrap();
    assert_eq!(entries[0]["actor"], "sre-on-call");
    assert_eq!(entries[0]["reason"], "kernel 6.8");
}

/// One leaf of 3 nodes × 8 h100, one of them a spare.
const FLEET_WITH_SPARE: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 3
  gpu_type = "h100"
  gpus_per_node = 8
  spares = 1
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_takes_the_place_of_a_failed_node_under_a_running_gang() {
    let cloud = Cloud::start_with(FLEET_WITH_SPARE, 16).await;
    // A 16-GPU gang fills both schedulable nodes: 1200 s × 0.05 = 60 s.
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "e2e-spare", "gpus": 16, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 1200, "command": ["train"]
    }))
    .unwrap();
    let job = cloud.tenant.submit(&spec, Some("spare-1")).await.unwrap();
    let running = cloud
        .wait_for(job.id, "running", |j| j.state == JobState::Running)
        .await;
    let old: Vec<String> = running
        .workers
        .iter()
        .map(|w| w.node.clone().unwrap())
        .collect();
    let spare = cloud.admin_json(&["node", "list"])["regions"]["test"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["spare"] == true)
        .map(|n| n["node_id"].as_str().unwrap().to_string())
        .expect("a spare");
    tokio::time::sleep(Duration::from_secs(1)).await;

    // XID 79 on the node of rank 1.
    let failed = old[1].clone();
    cloud.admin_json(&[
        "node",
        "inject-fault",
        &failed,
        "--kind",
        "xid",
        "--code",
        "79",
        "--gpu",
        "0",
    ]);
    // The gang resumes from its checkpoint on its other node plus the spare.
    let moved = cloud
        .wait_for(job.id, "running on the spare", |j| {
            j.state == JobState::Running
                && j.workers.iter().any(|w| w.node.as_deref() == Some(&spare))
        })
        .await;
    let nodes: Vec<String> = moved
        .workers
        .iter()
        .map(|w| w.node.clone().unwrap())
        .collect();
    assert_eq!(nodes, vec![old[0].clone(), spare.clone()]);
    assert!(
        moved
            .restore_from
            .as_deref()
            .is_some_and(|r| r.starts_with("sim:")),
        "{moved:?}"
    );
    let kinds: Vec<String> = cloud
        .tenant
        .events(job.id)
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "queued",
            "placed",
            "started",
            "preempted",
            "spare_swap",
            "requeued",
            "placed",
            "started"
        ]
    );
    let out = cloud.admin_json(&["node", "get", &failed]);
    assert_eq!(out["admin_state"], "repair", "{out}");
    let in_ = cloud.admin_json(&["node", "get", &spare]);
    assert_eq!(in_["spare"], false, "{in_}");
    // Repaired (a reboot clears the fault) and returned: a spare now.
    cloud.admin_json(&["node", "inject-fault", &failed, "--kind", "reboot"]);
    let back = cloud.admin_json(&["node", "uncordon", &failed, "--reason", "GPU reseated"]);
    assert_eq!(back["spare"], true, "{back}");
    assert_eq!(back["schedulable"], false, "{back}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_cluster_that_loses_a_node_is_healed_from_its_leafs_spare() {
    let cloud = Cloud::start_with(FLEET_WITH_SPARE, 16).await;
    let spec: ClusterSpec = serde_json::from_value(serde_json::json!({
        "name": "e2e", "gpu_type": "h100", "nodes": 2, "level": "leaf"
    }))
    .unwrap();
    let cluster = cloud
        .tenant
        .create_cluster(&spec, Some("c-1"))
        .await
        .unwrap();
    assert_eq!(cluster.state, ClusterState::Ready, "{cluster:?}");
    let members: Vec<String> = cluster.members.iter().map(|m| m.node_id.clone()).collect();
    assert_eq!(members.len(), 2);
    // A job bigger than the cluster is refused at once, with what to fix.
    let job = |gpus: i64| -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": "e2e-cluster", "gpus": gpus, "gpus_per_worker": 8, "gpu_type": "h100",
            "estimated_duration_s": 1200, "command": ["train"], "cluster": cluster.id
        }))
        .unwrap()
    };
    match cloud.tenant.submit(&job(24), None).await {
        Err(gangway_shared::client::ClientError::Api { status, body, .. }) => {
            assert_eq!(
                (status.as_u16(), body.code.as_str()),
                (422, "invalid_cluster"),
                "{body:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A 16-GPU gang on it: 1200 s × 0.05 = 60 s.
    let id = cloud
        .tenant
        .submit(&job(16), Some("cl-job"))
        .await
        .unwrap()
        .id;
    let running = cloud
        .wait_for(id, "running", |j| j.state == JobState::Running)
        .await;
    let on: Vec<String> = running
        .workers
        .iter()
        .map(|w| w.node.clone().unwrap())
        .collect();
    assert_eq!(on, members);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // XID 79 on one member: the leaf's spare joins the cluster in its place
    // and the gang resumes there from its checkpoint.
    let failed = members[1].clone();
    cloud.admin_json(&[
        "node",
        "inject-fault",
        &failed,
        "--kind",
        "xid",
        "--code",
        "79",
        "--gpu",
        "0",
    ]);
    let moved = cloud
        .wait_for(id, "running again", |j| {
            j.state == JobState::Running
                && j.workers
                    .iter()
                    .all(|w| w.node.as_deref() != Some(failed.as_str()))
        })
        .await;
    assert!(moved.restore_from.is_some(), "{moved:?}");
    let healed = cloud.tenant.get_cluster(cluster.id).await.unwrap();
    assert_eq!(healed.state, ClusterState::Ready, "{healed:?}");
    let now: Vec<String> = healed.members.iter().map(|m| m.node_id.clone()).collect();
    assert!(
        now.contains(&members[0]) && !now.contains(&failed),
        "{now:?}"
    );
    let spare = now.iter().find(|n| **n != members[0]).unwrap();
    let kinds: Vec<&str> = healed.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["created", "node_failed", "spare_swapped"],
        "{healed:?}"
    );
    assert_eq!(healed.events[2].details["spare"], spare.as_str());
    assert_eq!(healed.events[2].details["domain"], "leaf");
    let mut on: Vec<String> = moved
        .workers
        .iter()
        .map(|w| w.node.clone().unwrap())
        .collect();
    on.sort();
    let mut want = now.clone();
    want.sort();
    assert_eq!(on, want);
}
