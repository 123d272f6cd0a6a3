//! Helpers shared by the regional integration tests that were written
//! with them (each test binary compiles this module and uses part of it).

#![allow(dead_code)]

use gangway_regional::store::{NewJob, SubmitOutcome};
use gangway_regional::Store;
use gangway_shared::agent::{AgentGpu, AgentNode, RegisterRequest};
use gangway_shared::api::{JobMode, TopologyLevel};
use uuid::Uuid;

/// A migrated store on a fresh throwaway database, and a raw client to it.
pub async fn store(prefix: &str) -> (Store, tokio_postgres::Client) {
    let url = gangway_devkit::fresh_database(prefix).await;
    let store = Store::connect(&url, "test-region", 16).unwrap();
    store.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (store, client)
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
            })
            .collect(),
        gpu_power_w: None,
        rack_power_budget_w: None,
    }
}

/// Registers all `nodes` under one simulated agent; returns its boot id.
pub async fn register(store: &Store, nodes: Vec<AgentNode>) -> Uuid {
    let boot_id = Uuid::new_v4();
    store
        .register_agent(&RegisterRequest {
            agent_id: "agent-0".into(),
            boot_id,
            executor: "sim".into(),
            nodes,
        })
        .await
        .unwrap();
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
