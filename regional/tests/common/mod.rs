//! Helpers shared by the regional integration tests that were written
//! with them (each test binary compiles this module and uses part of it).

#![allow(dead_code)]

use gangway_health::Signal;
use gangway_regional::store::{NewJob, StopTiming, SubmitOutcome};
use gangway_regional::Store;
use gangway_shared::agent::{
    AgentGpu, AgentNode, Assignment, Desired, NodeReport, RegisterRequest, SyncRequest,
    WorkerReport, WorkerStatus,
};
use gangway_shared::api::{JobMode, TopologyLevel};
use uuid::Uuid;

/// A migrated store on a fresh throwaway database, and a raw client to it.
pub async fn store(prefix: &str) -> (Store, tokio_postgres::Client) {
    region_store(prefix, "test-region").await
}

/// A migrated store named `region` on a fresh database, and a raw client.
pub async fn region_store(prefix: &str, region: &str) -> (Store, tokio_postgres::Client) {
    let (store, client, _) = region_store_at(prefix, region).await;
    (store, client)
}

/// [`region_store`], and the database's URL (for another store on it).
pub async fn region_store_at(
    prefix: &str,
    region: &str,
) -> (Store, tokio_postgres::Client, String) {
    let url = gangway_devkit::fresh_database(prefix).await;
    let store = Store::connect(&url, region, 16).unwrap();
    store.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (store, client, url)
}

/// A migrated store on a fresh database that decides nodes with `policy`
/// (a checkpoint deadline of 30 s), a raw client to it, and its URL.
pub async fn policy_store(
    prefix: &str,
    policy: gangway_health::HealthPolicy,
) -> (Store, tokio_postgres::Client, String) {
    let url = gangway_devkit::fresh_database(prefix).await;
    let store = Store::connect(&url, "test-region", 8)
        .unwrap()
        .with_health(policy, std::time::Duration::from_secs(30));
    store.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (store, client, url)
}

/// A region's configuration for tests: `name` and its peers (name, URL).
pub fn region_config(name: &str, peers: &[(&str, String)]) -> gangway_regional::RegionConfig {
    let mut config = gangway_regional::RegionConfig::new(name, "127.0.0.1:0".parse().unwrap(), "");
    config.peers.peers = peers
        .iter()
        .map(|(n, u)| gangway_regional::config::Peer {
            name: n.to_string(),
            url: u.clone(),
        })
        .collect();
    config
}

/// A region's state for tests: `name`, its store and its peers (name, URL).
pub fn region_state(
    name: &str,
    store: Store,
    peers: &[(&str, String)],
) -> gangway_regional::AppState {
    gangway_regional::AppState::new(store, region_config(name, peers))
}

/// An 8-GPU node of `ty` (its own NVLink domain), no power figures.
pub fn node(node_id: &str, spine: &str, leaf: &str, ty: &str) -> AgentNode {
    AgentNode {
        node_id: node_id.into(),
        spine: spine.into(),
        leaf: leaf.into(),
        nvlink_domain: node_id.into(),
        gpu_type: ty.into(),
        spare: false,
        address: "127.0.0.1".into(),
        gpus: (0..8)
            .map(|i| AgentGpu {
                index: i,
                uuid: format!("GPU-{node_id}-{i}"),
                ..AgentGpu::default()
            })
            .collect(),
        gpu_power_w: None,
        rack_power_budget_w: None,
    }
}

/// Registers all `nodes` under one simulated agent; returns its boot id.
pub async fn register(store: &Store, nodes: Vec<AgentNode>) -> Uuid {
    let boot_id = Uuid::new_v4();
    let req = RegisterRequest {
        agent_id: "agent-0".into(),
        boot_id,
        executor: "sim".into(),
        nodes,
        host_id: None,
    };
    store.admit_as_registered(&req).await.unwrap();
    store.register_agent(&req).await.unwrap();
    boot_id
}

/// A normal-priority gang of `gpus` GPUs of `ty`, `per` per worker, an
/// hour long by its estimate.
pub fn job(tenant: &str, ty: &str, gpus: i32, per: i32) -> NewJob {
    let spec = serde_json::from_value(serde_json::json!({"name": "t", "gpus": gpus,
        "gpu_type": ty, "estimated_duration_s": 3600, "command": ["train"],
        "gpus_per_worker": per}))
    .unwrap();
    NewJob {
        id: Uuid::new_v4(),
        tenant: tenant.into(),
        idempotency_key: None,
        spec,
        name: "t".into(),
        mode: JobMode::Gang,
        gpu_type: ty.into(),
        gpus,
        gpus_per_worker: per,
        workers: gpus / per,
        priority: 1,
        required: TopologyLevel::Region,
        preferred: TopologyLevel::Nvlink,
    }
}

/// Submits a fresh job; returns its id.
pub async fn submit(store: &Store, j: &NewJob) -> Uuid {
    match store.submit(j).await.unwrap() {
        SubmitOutcome::Created(job) => job.id,
        SubmitOutcome::Replayed(_) => panic!("fresh job replayed"),
    }
}

/// How long agents give workers to stop and to checkpoint, in tests.
pub const TIMING: StopTiming = StopTiming {
    grace_period_s: 5,
    checkpoint_deadline_s: 30,
};

/// One agent per node, as on real machines: `n0` by `agent-n0`, …
pub struct Fleet {
    pub boots: Vec<Uuid>,
}

impl Fleet {
    /// Registers these nodes, which must be named `n0`, `n1`, … in order.
    pub async fn register_nodes(store: &Store, nodes: Vec<AgentNode>) -> Fleet {
        let mut boots = Vec::new();
        for (n, node) in nodes.into_iter().enumerate() {
            assert_eq!(node.node_id, format!("n{n}"));
            let boot = Uuid::new_v4();
            let req = RegisterRequest {
                agent_id: format!("agent-n{n}"),
                boot_id: boot,
                executor: "sim".into(),
                nodes: vec![node],
                host_id: None,
            };
            store.admit_as_registered(&req).await.unwrap();
            store.register_agent(&req).await.unwrap();
            boots.push(boot);
        }
        Fleet { boots }
    }

    /// Syncs node `n`'s agent with these signals and reports; returns the
    /// assignments.
    pub async fn sync(
        &self,
        store: &Store,
        n: usize,
        machine_boot: &str,
        signals: Vec<Signal>,
        workers: Vec<WorkerReport>,
    ) -> Vec<Assignment> {
        (self
            .sync_outcome(store, n, machine_boot, signals, workers)
            .await)
            .assignments
    }

    /// [`Fleet::sync`], answering all the sync did.
    pub async fn sync_outcome(
        &self,
        store: &Store,
        n: usize,
        machine_boot: &str,
        signals: Vec<Signal>,
        workers: Vec<WorkerReport>,
    ) -> gangway_regional::store::SyncOutcome {
        store
            .sync_agent(
                &format!("agent-n{n}"),
                &SyncRequest {
                    logs: Vec::new(),
                    boot_id: self.boots[n],
                    workers,
                    nodes: vec![NodeReport {
                        node_id: format!("n{n}"),
                        boot_id: machine_boot.into(),
                        signals,
                    }],
                    checkpoints: None,
                },
                TIMING,
            )
            .await
            .unwrap()
    }

    /// Syncs as the agent would: wanted workers run; workers asked to
    /// checkpoint exit with `checkpoint`; workers asked to stop exit.
    pub async fn act(&self, store: &Store, n: usize, checkpoint: Option<&str>) -> Vec<Assignment> {
        let wanted = self.sync(store, n, "boot-1", vec![], vec![]).await;
        let reports = wanted
            .iter()
            .map(|a| WorkerReport {
                job_id: a.job_id,
                rank: a.rank,
                attempt: a.attempt,
                status: match a.desired {
                    Desired::Run => WorkerStatus::Running,
                    _ => WorkerStatus::Exited {
                        exit_code: None,
                        signal: Some(15),
                        message: Some("checkpointed and stopped".into()),
                    },
                },
                checkpoint: match a.desired {
                    Desired::Checkpoint => checkpoint.map(String::from),
                    _ => None,
                },
                fenced: false,
                unasked: false,
            })
            .collect();
        self.sync(store, n, "boot-1", vec![], reports).await;
        wanted
    }
}

/// The report of `a`'s worker having exited 0.
pub fn succeeded(a: &Assignment) -> WorkerReport {
    WorkerReport {
        job_id: a.job_id,
        rank: a.rank,
        attempt: a.attempt,
        status: WorkerStatus::Exited {
            exit_code: Some(0),
            signal: None,
            message: None,
        },
        checkpoint: None,
        fenced: false,
        unasked: false,
    }
}

/// GPUs allocated to `job` now.
pub async fn live_gpus(client: &tokio_postgres::Client, job: Uuid) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL",
            &[&job],
        )
        .await
        .unwrap()
        .get(0)
}
