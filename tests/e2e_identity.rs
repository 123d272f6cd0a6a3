//! A node joins as itself (issue 18), end to end across real processes: a
//! `gangway region` with an inventory of named machines on a real,
//! throwaway PostgreSQL, and real-mode `gangway agent`s on this GPU-less
//! machine, each with GPUs declared and a token of its own.

mod support;

use support::{agent_token, log_file, shared_out, token, Proc, BIN};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gangway_auth::jwt::{Role, SigningKey};
use gangway_shared::api::{JobSpec, JobState};
use gangway_shared::client::Client;
use serde_json::{json, Value};
use uuid::Uuid;

struct Region {
    key: SigningKey,
    dir: tempfile::TempDir,
    port: u16,
    _proc: Proc,
    client: Client,
}

impl Region {
    /// A region `test` whose inventory lists these machines by name, in one
    /// leaf.
    async fn start(machines: &[&str]) -> Region {
        let db = gangway_devkit::fresh_database("e2e_identity").await;
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = machines.iter().map(|m| format!("{m:?}")).collect();
        let fleet = dir.path().join("inventory.toml");
        std::fs::write(
            &fleet,
            format!(
                "[[spine]]\n  [[spine.leaf]]\n  names = [{}]\n  gpu_type = \"h100\"\n  gpus_per_node = 8\n",
                names.join(", ")
            ),
        )
        .unwrap();
        let key = SigningKey::generate("e2e-service");
        std::fs::write(dir.path().join("service.pub.pem"), key.public_pem()).unwrap();
        let port = gangway_devkit::free_port();
        let proc = Proc(
            Command::new(BIN)
                .args(["region", "--name", "test", "--database-url", &db])
                .arg("--service-key")
                .arg(format!(
                    "e2e-service={}",
                    dir.path().join("service.pub.pem").display()
                ))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                // Plain HTTP on loopback: this test is about the region, not its links.
                .arg("--insecure-http")
                .args([
                    "--schedule-interval-ms",
                    "100",
                    "--agent-sync-interval-ms",
                    "200",
                ])
                .arg("--inventory")
                .arg(&fleet)
                .env("GANGWAY_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "region.log"))
                .spawn()
                .unwrap(),
        );
        let client = Client::new(format!("http://127.0.0.1:{port}"), "acme").with_token(token(
            &key,
            Role::Service,
            None,
        ));
        let region = Region {
            key,
            dir,
            port,
            _proc: proc,
            client,
        };
        region.wait("the region to answer", |_| true).await;
        region
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A real-mode agent named `--node-name name` (or by this machine's
    /// hostname), 8 h100 GPUs declared, working in `DIR/{work}`, presenting
    /// `token_for`'s token.
    fn agent(&self, name: Option<&str>, token_for: &str, work: &str) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.env(
            "GANGWAY_AGENT_TOKEN",
            agent_token(&self.key, token_for, "test"),
        )
        .arg("agent")
        .args(["--region-url", &self.url()])
        .arg("--insecure-http")
        .args(["--gpus", "8", "--gpu-type", "h100", "--executor", "real"])
        .arg("--work-dir")
        .arg(self.dir.path().join(work))
        .arg("--sandbox-bind")
        .arg(shared_out(self.dir.path()))
        .env("GANGWAY_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log_file(self.dir.path(), &format!("{work}.log")));
        if let Some(n) = name {
            cmd.args(["--node-name", n]);
        }
        Proc(cmd.spawn().unwrap())
    }

    /// The region's node list (`GET /v1/admin/nodes`).
    async fn nodes(&self) -> Value {
        self.client
            .call_json(reqwest::Method::GET, "/v1/admin/nodes", None)
            .await
            .unwrap_or(Value::Null)
    }

    /// Waits until `ok` holds of the node list.
    async fn wait(&self, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let nodes = self.nodes().await;
            if !nodes.is_null() && ok(&nodes) {
                return nodes;
            }
            assert!(
                Instant::now() < deadline,
                "waited in vain for {what}: {nodes:#}; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the agent log `work.log` says `text`.
    fn log_says(&self, work: &str, text: &str) -> bool {
        std::fs::read_to_string(self.dir.path().join(format!("{work}.log")))
            .is_ok_and(|l| l.contains(text))
    }

    async fn wait_job(&self, id: Uuid, want: JobState) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let job = self.client.get(id).await.unwrap();
            if job.state == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} in {} waiting for {want}: {job:?}; logs in {}",
                job.state,
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The node `id` of a node list, if registered.
fn node<'a>(nodes: &'a Value, id: &str) -> Option<&'a Value> {
    (nodes["nodes"].as_array()?.iter()).find(|n| n["node_id"] == id)
}

fn spec(gpus: i64, per_worker: i64, command: &str) -> JobSpec {
    serde_json::from_value(json!({
        "name": "identity", "gpus": gpus, "gpus_per_worker": per_worker, "gpu_type": "h100",
        "estimated_duration_s": 60, "command": ["sh", "-c", command],
    }))
    .unwrap()
}

/// A raw agent call with `token`: its status and error code.
async fn agent_call(url: &str, token: &str, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn machines_join_as_themselves_one_agent_each_and_only_when_admitted() {
    let region = Region::start(&["node-a", "node-b"]).await;
    let _a = region.agent(Some("node-a"), "node-a", "agent-a");
    let nodes = region
        .wait("node-a registered", |n| {
            node(n, "node-a").is_some_and(|a| a["schedulable"] == true)
        })
        .await;
    // Where it sits is the inventory's: the fleet file's leaf.
    let a = node(&nodes, "node-a").unwrap();
    assert_eq!(
        (a["agent_id"].as_str(), a["gpus"].as_u64()),
        (Some("node-a"), Some(8))
    );
    assert_eq!(a["leaf"], "test-s00-l00");

    // Two agents claiming one node: the second (another work dir: another
    // claimant) is refused with node_claimed, the first keeps the node.
    let _a2 = region.agent(Some("node-a"), "node-a", "agent-a2");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !region.log_says("agent-a2", "node_claimed") {
        assert!(
            Instant::now() < deadline,
            "the second agent was not refused with node_claimed; logs in {}",
            region.dir.path().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job = region
        .client
        .submit(&spec(8, 8, "echo on $GANGWAY_NODE_ID"), Some("claimed"))
        .await
        .unwrap();
    region.wait_job(job.id, JobState::Succeeded).await;
    let first = std::fs::read_dir(region.dir.path().join("agent-a/jobs"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(first, 1, "the first agent ran the job");
    assert!(!region.dir.path().join("agent-a2/jobs").exists());

    // Node A's token cannot register or report for node B; nothing of it is
    // recorded.
    let a_token = agent_token(&region.key, "node-a", "test");
    let b_node = json!({"node_id": "node-b", "gpu_type": "h100", "address": "127.0.0.1",
                        "gpus": [{"index": 0, "uuid": "GPU-x"}]});
    let register = format!("{}/internal/v1/agents/register", region.url());
    let as_b = json!({"agent_id": "node-b", "boot_id": Uuid::new_v4(), "executor": "real",
                      "nodes": [b_node]});
    assert_eq!(
        agent_call(&register, &a_token, as_b).await,
        (403, "wrong_agent".to_string())
    );
    let b_under_a = json!({"agent_id": "node-a", "boot_id": Uuid::new_v4(), "executor": "real",
                           "nodes": [b_node], "host_id": "elsewhere"});
    assert_eq!(
        agent_call(&register, &a_token, b_under_a).await,
        (403, "wrong_agent".to_string())
    );
    let sync_b = format!("{}/internal/v1/agents/node-b/sync", region.url());
    let report = json!({"boot_id": Uuid::new_v4(), "workers": [],
                        "nodes": [{"node_id": "node-b", "boot_id": "x"}]});
    assert_eq!(
        agent_call(&sync_b, &a_token, report).await,
        (403, "wrong_agent".to_string())
    );
    // A token of another region is refused here.
    let elsewhere = agent_token(&region.key, "node-a", "elsewhere");
    let sync_a = format!("{}/internal/v1/agents/node-a/sync", region.url());
    let report = json!({"boot_id": Uuid::new_v4(), "workers": []});
    assert_eq!(agent_call(&sync_a, &elsewhere, report).await.0, 403);
    let nodes = region.nodes().await;
    assert!(node(&nodes, "node-b").is_none(), "{nodes:#}");

    // A machine the inventory does not have is refused and listed as
    // unknown; it never receives work.
    let _c = region.agent(Some("node-c"), "node-c", "agent-c");
    let nodes = region
        .wait("node-c listed as unknown", |n| {
            (n["unknown"].as_array().into_iter().flatten()).any(|u| u["node_id"] == "node-c")
        })
        .await;
    assert!(node(&nodes, "node-c").is_none());
    assert!(region.log_says("agent-c", "unknown_node"));
    let unknown = &nodes["unknown"][0];
    assert_eq!(
        (unknown["state"].as_str(), unknown["gpus"].as_u64()),
        (Some("unknown"), Some(8))
    );

    // An operator admits it: it registers on its next try and takes work —
    // a 16-GPU gang needs both machines.
    let admitted = reqwest::Client::new()
        .post(format!("{}/v1/admin/nodes/node-c/admit", region.url()))
        .bearer_auth(token(&region.key, Role::Service, None))
        .header("x-gangway-actor", "ops-alice")
        .json(&json!({"spine": "test-s00", "leaf": "test-s00-l00"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        admitted.status().as_u16(),
        200,
        "{}",
        admitted.text().await.unwrap()
    );
    region
        .wait("node-c registered", |n| {
            node(n, "node-c").is_some_and(|c| c["schedulable"] == true)
                && n["unknown"].as_array().is_none_or(|u| u.is_empty())
        })
        .await;
    let job = region
        .client
        .submit(&spec(16, 8, "echo rank $RANK"), Some("both"))
        .await
        .unwrap();
    region.wait_job(job.id, JobState::Succeeded).await;
    let done = region.client.get(job.id).await.unwrap();
    let on: std::collections::BTreeSet<_> =
        done.workers.iter().filter_map(|w| w.node.clone()).collect();
    assert_eq!(
        on.into_iter().collect::<Vec<_>>(),
        ["node-a".to_string(), "node-c".to_string()]
    );
    let audit = region
        .client
        .call_json(
            reqwest::Method::GET,
            "/v1/admin/audit?action=node.admit",
            None,
        )
        .await
        .unwrap();
    assert_eq!(audit["entries"][0]["actor"], "ops-alice", "{audit:#}");
}

#[tokio::test]
async fn a_real_agent_registers_under_its_hostname_and_runs_a_job() {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_ascii_lowercase();
    let region = Region::start(&[host.as_str()]).await;
    let _agent = region.agent(None, &host, "agent");
    let nodes = region
        .wait("this machine registered", |n| {
            node(n, &host).is_some_and(|m| m["schedulable"] == true)
        })
        .await;
    let me = node(&nodes, &host).unwrap();
    assert_eq!(
        (me["executor"].as_str(), me["gpus"].as_u64()),
        (Some("real"), Some(8))
    );
    // Where the job (its tenant's user, in a sandbox) can write.
    let out = shared_out(region.dir.path()).join("out.txt");
    let job = region
        .client
        .submit(
            &spec(
                8,
                8,
                &format!(
                    "echo \"$GANGWAY_NODE_ID $CUDA_VISIBLE_DEVICES\" > {}",
                    out.display()
                ),
            ),
            Some("hostname"),
        )
        .await
        .unwrap();
    region.wait_job(job.id, JobState::Succeeded).await;
    let said = std::fs::read_to_string(&out).unwrap();
    assert_eq!(said.trim(), format!("{host} 0,1,2,3,4,5,6,7"));
    assert!(Path::new(&region.dir.path().join("agent/jobs")).exists());
}
