//! Fleet operations against a real, throwaway PostgreSQL: each health
//! signal class leads to its action through the store (application XIDs
//! ignored, a GPU fault quarantines the GPU and moves its jobs, a node fault
//! drains the node, a stale heartbeat makes it suspect then lost and its
//! jobs requeue at the front); cordon, uncordon and drains (checkpoint and
//! wait) with jobs on the node; every admin action in the audit log, which
//! only the global tier's service token may read.

use std::time::Duration;

use axum::http::Method;
use gangway_health::{HealthPolicy, Signal};
use gangway_regional::scheduling::run_pass;
use gangway_regional::store::{AdminChange, NewJob, SubmitOutcome};
use gangway_regional::{RegionConfig, Store};
use gangway_shared::agent::{AgentGpu, AgentNode, Desired, RegisterRequest, WorkerReport};
use gangway_shared::api::{DrainMode, JobMode, JobState, NodeView, TopologyLevel};
use serde_json::json;
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// A fast policy for tests: suspect after 2 s of silence, lost after 5 s.
fn policy() -> HealthPolicy {
    HealthPolicy {
        suspect_after_s: 2,
        lost_after_s: 5,
        ..HealthPolicy::default()
    }
}

async fn store(prefix: &str) -> (Store, tokio_postgres::Client) {
    store_with(prefix, HealthPolicy::default()).await
}

async fn store_with(prefix: &str, policy: HealthPolicy) -> (Store, tokio_postgres::Client) {
    let (store, client, _) = common::policy_store(prefix, policy).await;
    (store, client)
}

fn node(id: &str) -> AgentNode {
    AgentNode {
        node_id: id.into(),
        spine: "s0".into(),
        leaf: "s0-l0".into(),
        nvlink_domain: id.into(),
        gpu_type: "h100".into(),
        spare: false,
        address: "127.0.0.1".into(),
        gpus: (0..8)
            .map(|i| AgentGpu {
                index: i,
                uuid: format!("GPU-{id}-{i}"),
                ..AgentGpu::default()
            })
            .collect(),
        gpu_power_w: None,
        rack_power_budget_w: None,
    }
}

mod common;
use common::Fleet;

impl Fleet {
    async fn register(store: &Store, nodes: usize) -> Fleet {
        Self::register_nodes(store, (0..nodes).map(|n| node(&format!("n{n}"))).collect()).await
    }
}

fn job(gpus: i32, per: i32) -> NewJob {
    let spec = serde_json::from_value(json!({"name": "t", "gpus": gpus, "gpu_type": "h100",
        "estimated_duration_s": 3600, "command": ["train"], "gpus_per_worker": per}))
    .unwrap();
    NewJob {
        id: Uuid::new_v4(),
        tenant: "acme".into(),
        idempotency_key: None,
        spec,
        name: "t".into(),
        mode: JobMode::Gang,
        gpu_type: "h100".into(),
        gpus,
        gpus_per_worker: per,
        workers: gpus / per,
        priority: 1,
        required: TopologyLevel::Region,
        preferred: TopologyLevel::Nvlink,
    }
}

async fn submit(store: &Store, j: &NewJob) -> Uuid {
    match store.submit(j).await.unwrap() {
        SubmitOutcome::Created(job) => job.id,
        SubmitOutcome::Replayed(_) => panic!("fresh job replayed"),
    }
}

/// Places `gpus` GPUs of work and starts it; returns the job and the index
/// of the node it runs on.
async fn running_job(store: &Store, fleet: &Fleet, gpus: i32, per: i32) -> (Uuid, usize) {
    let id = submit(store, &job(gpus, per)).await;
    let o = run_pass(store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1, "{o:?}");
    let j = store.get_job("acme", id).await.unwrap();
    let node = j.workers[0].node.clone().unwrap();
    let n: usize = node.trim_start_matches('n').parse().unwrap();
    fleet.act(store, n, None).await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    (id, n)
}

async fn node_view(store: &Store, id: &str) -> NodeView {
    store
        .get_node(store.health_policy(), id)
        .await
        .unwrap()
        .expect("the node")
}

async fn events(store: &Store, id: Uuid) -> Vec<(String, serde_json::Value)> {
    store
        .job_events("acme", id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.detail))
        .collect()
}

fn snapshot_node(snap: &gangway_sched::Snapshot, id: &str) -> gangway_sched::Node {
    snap.nodes.iter().find(|n| n.id == id).unwrap().clone()
}

fn xid(gpu: u32, code: u32) -> Signal {
    Signal::Xid { gpu, code }
}

#[tokio::test]
async fn application_xids_are_ignored_and_a_gpu_fault_quarantines_the_gpu_and_moves_its_job() {
    let (store, client) = store("fleet_gpu").await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let (id, n) = running_job(&store, &fleet, 8, 8).await;
    let name = format!("n{n}");

    // Application XIDs: recorded, never held against the GPU or the node.
    for code in [13, 31, 43, 45, 68] {
        fleet
            .sync(&store, n, "boot-1", vec![xid(2, code)], vec![])
            .await;
    }
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "healthy");
    assert!(v.schedulable);
    assert_eq!(v.usable_gpus.len(), 8);
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    let ignored = v
        .events
        .iter()
        .filter(|e| e.kind == "health" && e.detail["action"] == "ignore")
        .count();
    assert_eq!(ignored, 5, "{:?}", v.events);

    // XID 48 (double-bit ECC): GPU 2 is quarantined and its job moves.
    fleet
        .sync(&store, n, "boot-1", vec![xid(2, 48)], vec![])
        .await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "degraded");
    assert!(v.schedulable, "the other GPUs still work");
    assert_eq!(v.usable_gpus, vec![0, 1, 3, 4, 5, 6, 7]);
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Preempting);
    let (_, detail) = events(&store, id)
        .await
        .into_iter()
        .find(|(k, _)| k == "preempted")
        .unwrap();
    assert_eq!(detail["cause"], "health");
    assert_eq!(detail["node"], name);
    // The snapshot no longer offers GPU 2.
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let sn = snapshot_node(&snap, &name);
    assert!(sn.schedulable && !sn.free.contains(&2));

    // Checkpointed and stopped: it requeues at the front and restarts on
    // the other node (8 usable GPUs are no longer on this one).
    fleet.act(&store, n, Some("/ckpt/step-9")).await;
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Queued);
    let front: bool = client
        .query_one("SELECT requeue_front FROM jobs WHERE job_id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(front);
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(
        job.workers[0].node.as_deref(),
        Some(format!("n{}", 1 - n).as_str())
    );
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/step-9"));

    // A reboot (new machine boot id) returns the GPU.
    fleet.sync(&store, n, "boot-2", vec![], vec![]).await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "healthy");
    assert_eq!(v.usable_gpus.len(), 8);
}

#[tokio::test]
async fn a_node_fault_drains_the_node_until_it_reboots() {
    let (store, _client) = store("fleet_node").await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let (id, n) = running_job(&store, &fleet, 4, 4).await;
    let name = format!("n{n}");
    // XID 79: the GPU fell off the bus — the whole node drains.
    fleet
        .sync(&store, n, "boot-1", vec![xid(5, 79)], vec![])
        .await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "failed");
    assert!(!v.schedulable && v.usable_gpus.is_empty());
    assert!(v.why.as_deref().unwrap().contains("xid_79"), "{:?}", v.why);
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert!(!snapshot_node(&snap, &name).schedulable);
    fleet.act(&store, n, Some("/ckpt/a")).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(
        job.workers[0].node.as_deref(),
        Some(format!("n{}", 1 - n).as_str())
    );
    // The same boot: still out. A new boot: back.
    fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    assert_eq!(node_view(&store, &name).await.observed, "failed");
    fleet.sync(&store, n, "boot-2", vec![], vec![]).await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "healthy");
    assert!(v.schedulable);
    let kinds: Vec<&str> = v.events.iter().map(|e| e.kind.as_str()).collect();
    assert!(kinds.contains(&"evacuate"), "{kinds:?}");
}

#[tokio::test]
async fn a_stale_heartbeat_makes_a_node_suspect_then_lost_and_its_jobs_requeue_at_the_front() {
    let (store, client) = store_with("fleet_lost", policy()).await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    // An older job that can never fit waits in the queue.
    let old = submit(&store, &job(64, 8)).await;
    let (id, n) = running_job(&store, &fleet, 8, 8).await;
    let other = 1 - n;
    let name = format!("n{n}");
    let ctx = store.health_context();

    // The job's node goes silent; the other keeps syncing.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    fleet.sync(&store, other, "boot-1", vec![], vec![]).await;
    store.health_tick(&ctx).await.unwrap();
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "suspect");
    assert!(!v.schedulable);
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running,
        "suspect: no new work, but its jobs stay"
    );

    tokio::time::sleep(Duration::from_millis(3000)).await;
    fleet.sync(&store, other, "boot-1", vec![], vec![]).await;
    let out = store.health_tick(&ctx).await.unwrap();
    assert_eq!(out.lost, vec![id]);
    assert_eq!(node_view(&store, &name).await.observed, "lost");
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Queued, "{job:?}");
    let kinds: Vec<String> = events(&store, id).await.into_iter().map(|e| e.0).collect();
    assert_eq!(
        kinds,
        ["queued", "placed", "started", "preempted", "requeued"]
    );
    let (_, detail) = events(&store, id)
        .await
        .into_iter()
        .find(|(k, _)| k == "preempted")
        .unwrap();
    assert_eq!(detail["cause"], "node_lost");
    // Goodput: the ~5.5 s its 8 GPUs ran since it started (no checkpoint)
    // are lost.
    assert!(job.lost_gpu_s > 8.0 * 5.0, "{job:?}");
    assert!(job.lost_gpu_s <= job.allocated_gpu_s + 1e-6, "{job:?}");
    assert!(job.goodput.is_some_and(|g| g < 0.2), "{job:?}");
    let tenants = store.goodput_by_tenant().await.unwrap().tenants;
    let acme = tenants.iter().find(|t| t.tenant == "acme").unwrap();
    assert!((acme.lost_gpu_s - job.lost_gpu_s).abs() < 1e-6, "{acme:?}");
    assert!(acme.goodput.is_some_and(|g| g < 1.0), "{acme:?}");
    // Its GPUs are released; it is first in line, before the older job.
    let live = common::live_gpus(&client, id).await;
    assert_eq!(live, 0);
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let seq = |j: Uuid| {
        snap.queue
            .iter()
            .find(|r| r.job == j.to_string())
            .unwrap()
            .seq
    };
    assert!(seq(id) < seq(old), "{} vs {}", seq(id), seq(old));
    // A second tick changes nothing more.
    let again = store.health_tick(&ctx).await.unwrap();
    assert!(again.lost.is_empty() && again.evacuated.is_empty());
    // It runs again on the live node.
    fleet.sync(&store, other, "boot-1", vec![], vec![]).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(
        job.workers[0].node.as_deref(),
        Some(format!("n{other}").as_str())
    );
    // The silent node comes back (same boot): healthy again.
    fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    assert_eq!(node_view(&store, &name).await.observed, "healthy");
}

#[tokio::test]
async fn cordon_keeps_running_jobs_and_uncordon_returns_the_node() {
    let (store, client) = store("fleet_cordon").await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let (id, n) = running_job(&store, &fleet, 4, 4).await;
    let name = format!("n{n}");
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops@example",
            &name,
            AdminChange::Cordon,
            Some("bad fan"),
        )
        .await
        .unwrap()
        .unwrap();
    let v = node_view(&store, &name).await;
    assert_eq!((v.admin_state.as_str(), v.schedulable), ("cordoned", false));
    assert_eq!(v.jobs, vec![id]);
    assert!(v.why.unwrap().contains("bad fan"));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert!(!snapshot_node(&snap, &name).schedulable);
    store.health_tick(&ctx).await.unwrap();
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    store
        .set_node_admin(&ctx, "ops@example", &name, AdminChange::Uncordon, None)
        .await
        .unwrap()
        .unwrap();
    let v = node_view(&store, &name).await;
    assert_eq!((v.admin_state.as_str(), v.schedulable), ("active", true));
    let audit: Vec<(String, String, String)> = client
        .query(
            "SELECT actor, action, target FROM audit_log ORDER BY audit_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        audit,
        [
            ("ops@example".into(), "node.cordon".into(), name.clone()),
            ("ops@example".into(), "node.uncordon".into(), name.clone()),
        ]
    );
    // Append-only, whatever the code does.
    assert!(client.execute("DELETE FROM audit_log", &[]).await.is_err());
    assert!(client
        .execute("UPDATE audit_log SET actor = 'x'", &[])
        .await
        .is_err());
    // No such node.
    assert_eq!(
        store
            .set_node_admin(&ctx, "ops", "nope", AdminChange::Cordon, None)
            .await
            .unwrap()
            .unwrap_err(),
        gangway_regional::store::NodeRefusal::NotFound
    );
}

#[tokio::test]
async fn a_checkpoint_drain_moves_the_jobs_through_a_checkpoint() {
    let (store, _client) = store("fleet_drain").await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let (id, n) = running_job(&store, &fleet, 8, 8).await;
    let name = format!("n{n}");
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops",
            &name,
            AdminChange::Drain {
                mode: DrainMode::Checkpoint,
                deadline_s: 5,
            },
            Some("firmware"),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    // The workers are asked to checkpoint within the drain's deadline.
    let asked = fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    assert_eq!(asked[0].desired, Desired::Checkpoint);
    assert!(asked[0].checkpoint_deadline_s <= 5, "{asked:?}");
    let v = node_view(&store, &name).await;
    assert_eq!(v.admin_state, "draining");
    assert_eq!(v.drain_mode, Some(DrainMode::Checkpoint));
    assert!(!v.drained, "a job is still on it");
    fleet.act(&store, n, Some("/ckpt/drain")).await;
    let (_, detail) = events(&store, id)
        .await
        .into_iter()
        .find(|(k, _)| k == "preempted")
        .unwrap();
    assert_eq!(detail["cause"], "drain");
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(
        job.workers[0].node.as_deref(),
        Some(format!("n{}", 1 - n).as_str())
    );
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/drain"));
    // The move counts as a preemption of the job, but a node's, not one
    // against its allowance of priority preemptions.
    assert_eq!((job.preemptions, job.node_moves), (1, 1));
    // Checkpointed as it stopped: nothing lost to the restart.
    assert!(job.lost_gpu_s < 1.0, "{job:?}");
    assert!(job.goodput.is_some_and(|g| g > 0.9), "{job:?}");
    fleet.act(&store, 1 - n, None).await;
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let running = snap
        .running
        .iter()
        .find(|r| r.job == id.to_string())
        .expect("running again");
    assert_eq!(running.preemptions, 0);
    assert!(node_view(&store, &name).await.drained);
    // Uncordon returns it.
    store
        .set_node_admin(&ctx, "ops", &name, AdminChange::Uncordon, None)
        .await
        .unwrap()
        .unwrap();
    assert!(node_view(&store, &name).await.schedulable);
}

#[tokio::test]
async fn a_wait_drain_lets_jobs_finish_and_moves_the_rest_at_the_deadline() {
    let (store, _client) = store("fleet_wait").await;
    let fleet = Fleet::register(&store, 1).await;
    fleet.sync(&store, 0, "boot-1", vec![], vec![]).await;
    let (short, _) = running_job(&store, &fleet, 4, 4).await;
    let (long, _) = running_job(&store, &fleet, 4, 4).await;
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops",
            "n0",
            AdminChange::Drain {
                mode: DrainMode::Wait,
                deadline_s: 2,
            },
            None,
        )
        .await
        .unwrap()
        .unwrap();
    store.health_tick(&ctx).await.unwrap();
    for id in [short, long] {
        assert_eq!(
            store.get_job("acme", id).await.unwrap().state,
            JobState::Running
        );
    }
    // The short job finishes within the deadline.
    let wanted = fleet.sync(&store, 0, "boot-1", vec![], vec![]).await;
    let done: Vec<WorkerReport> = wanted
        .iter()
        .filter(|a| a.job_id == short)
        .map(common::succeeded)
        .collect();
    fleet.sync(&store, 0, "boot-1", vec![], done).await;
    assert_eq!(
        store.get_job("acme", short).await.unwrap().state,
        JobState::Succeeded
    );
    // At the deadline the other is checkpointed and moved.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.health_tick(&ctx).await.unwrap();
    assert_eq!(
        store.get_job("acme", long).await.unwrap().state,
        JobState::Preempting
    );
    let v = node_view(&store, "n0").await;
    assert_eq!(v.drain_mode, Some(DrainMode::Checkpoint));
    assert!(v
        .events
        .iter()
        .any(|e| e.message.contains("drain deadline passed")));
    fleet.act(&store, 0, Some("/ckpt/late")).await;
    assert_eq!(
        store.get_job("acme", long).await.unwrap().state,
        JobState::Queued
    );
    assert!(node_view(&store, "n0").await.drained);
}

#[tokio::test]
async fn every_admin_action_is_audited_and_only_the_global_tier_reads_the_log() {
    let url = gangway_devkit::fresh_database("fleet_audit").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let key = gangway_auth::jwt::SigningKey::generate("svc");
    let mut cfg = RegionConfig::new("test", addr, &url);
    cfg.auth = Some(
        gangway_auth::jwt::Verifier::new(
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            &[key.verifier_entry()],
        )
        .unwrap(),
    );
    let state = gangway_regional::prepare(cfg, Duration::from_secs(10))
        .await
        .unwrap();
    let store = state.store.clone();
    let fleet = Fleet::register(&store, 3).await;
    for n in 0..3 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(
        listener,
        state,
        shutdown.clone(),
    ));
    let token = |role| {
        key.sign(&gangway_auth::jwt::claims_for(
            role,
            "someone",
            Some("acme"),
            None,
            gangway_shared::tokens::ISSUER,
            gangway_shared::tokens::REGION_AUDIENCE,
            Duration::from_secs(600),
        ))
        .unwrap()
    };
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let service = token(gangway_auth::jwt::Role::Service);
    let call = |method: Method, path: &str, body: Option<serde_json::Value>| {
        let mut r = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&service)
            .header(gangway_shared::api::ACTOR_HEADER, "alice@ops");
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send()
    };
    let ok = |r: reqwest::Response| async move {
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        assert!(status.is_success(), "{status}: {body}");
        body
    };
    ok(call(
        Method::POST,
        "/v1/admin/nodes/n0/cordon",
        Some(json!({"reason": "fan"})),
    )
    .await
    .unwrap())
    .await;
    ok(call(Method::POST, "/v1/admin/nodes/n0/uncordon", None)
        .await
        .unwrap())
    .await;
    let drained = ok(call(
        Method::POST,
        "/v1/admin/nodes/n1/drain",
        Some(json!({"mode": "wait", "deadline_s": 600, "reason": "kernel"})),
    )
    .await
    .unwrap())
    .await;
    assert_eq!(drained["admin_state"], "draining");
    assert_eq!(drained["drain_mode"], "wait");
    let faulted = ok(call(
        Method::POST,
        "/v1/admin/nodes/n0/faults",
        Some(json!({"kind": "xid", "gpu": 1, "code": 79})),
    )
    .await
    .unwrap())
    .await;
    assert_eq!(faulted["observed"], "failed");
    ok(call(
        Method::PUT,
        "/v1/admin/quotas/acme/h100",
        Some(json!({"guaranteed_gpus": 8})),
    )
    .await
    .unwrap())
    .await;
    let r = call(Method::DELETE, "/v1/admin/quotas/acme/h100", None)
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // An operator preemption of a running job.
    let id = submit(&store, &job(4, 4)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let on = store.get_job("acme", id).await.unwrap().workers[0]
        .node
        .clone()
        .unwrap();
    fleet
        .act(&store, on.trim_start_matches('n').parse().unwrap(), None)
        .await;
    ok(
        call(Method::POST, &format!("/v1/admin/jobs/{id}/preempt"), None)
            .await
            .unwrap(),
    )
    .await;

    let log = ok(call(Method::GET, "/v1/admin/audit", None).await.unwrap()).await;
    let got: Vec<(String, String, String)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = [
        ("node.cordon", "n0"),
        ("node.uncordon", "n0"),
        ("node.drain", "n1"),
        ("node.fault", "n0"),
        ("quota.set", "acme/h100"),
        ("quota.delete", "acme/h100"),
        ("job.preempt", id.to_string().as_str()),
    ]
    .iter()
    .map(|(a, t)| ("alice@ops".to_string(), a.to_string(), t.to_string()))
    .collect();
    assert_eq!(got, want);
    let first = &log["entries"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(first["reason"], "fan");
    // Filters and paging.
    let only = ok(call(Method::GET, "/v1/admin/audit?action=node.fault", None)
        .await
        .unwrap())
    .await;
    assert_eq!(only["entries"].as_array().unwrap().len(), 1);
    let page = ok(call(Method::GET, "/v1/admin/audit?limit=2", None)
        .await
        .unwrap())
    .await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    assert!(page["next_before"].is_i64());

    // Bad input: stable codes, and nothing changes.
    let cases = [
        (
            "/v1/admin/nodes/n0/drain",
            json!({"deadline_s": 0}),
            422,
            "invalid_drain",
        ),
        (
            "/v1/admin/nodes/n0/drain",
            json!({"mode": "soon"}),
            422,
            "invalid_spec",
        ),
        (
            "/v1/admin/nodes/n0/drain",
            json!({"surprise": 1}),
            422,
            "invalid_spec",
        ),
        (
            "/v1/admin/nodes/n0/faults",
            json!({"kind": "xid", "gpu": 8, "code": 79}),
            422,
            "invalid_fault",
        ),
        (
            "/v1/admin/nodes/n0/faults",
            json!({"kind": "meteor"}),
            422,
            "invalid_spec",
        ),
        ("/v1/admin/nodes/nope/cordon", json!({}), 404, "not_found"),
        (
            "/v1/admin/nodes/n0/cordon",
            json!({"reason": "x".repeat(600)}),
            422,
            "invalid_spec",
        ),
    ];
    for (path, body, status, code) in cases {
        let r = call(Method::POST, path, Some(body.clone())).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{path} {body}");
        let b: serde_json::Value = r.json().await.unwrap();
        assert_eq!(b["code"], code, "{path} {body}");
    }
    let after = ok(call(Method::GET, "/v1/admin/audit", None).await.unwrap()).await;
    assert_eq!(after["entries"], log["entries"], "refusals are not audited");

    // A tenant's (or an agent's) token does not get in (the global tier
    // answers tenants 403 before that: global/tests).
    for role in [
        gangway_auth::jwt::Role::Tenant,
        gangway_auth::jwt::Role::Agent,
    ] {
        let r = http
            .get(format!("{base}/v1/admin/audit"))
            .bearer_auth(token(role))
            .send()
            .await
            .unwrap();
        // Refused: a tenant or agent token is no service token.
        assert!(
            matches!(r.status().as_u16(), 401 | 403),
            "{role:?}: {}",
            r.status()
        );
    }
    let r = http
        .get(format!("{base}/v1/admin/audit"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn thermal_ecc_nvlink_remap_and_injected_faults_each_lead_to_their_action() {
    let (store, _client) = store("fleet_classes").await;
    let fleet = Fleet::register(&store, 2).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let (id, n) = running_job(&store, &fleet, 2, 2).await;
    let name = format!("n{n}");
    let gpus = store.get_job("acme", id).await.unwrap().workers[0]
        .gpus
        .clone();
    let hot = gpus[0];
    // Thermal: the hot GPU takes no new work, but its job stays.
    fleet
        .sync(
            &store,
            n,
            "boot-1",
            vec![Signal::Thermal {
                gpu: hot,
                celsius: 95,
                throttled: true,
            }],
            vec![],
        )
        .await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed, "degraded");
    assert!(!v.usable_gpus.contains(&hot) && v.usable_gpus.len() == 7);
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    // It cools: back.
    fleet
        .sync(
            &store,
            n,
            "boot-1",
            vec![Signal::Thermal {
                gpu: hot,
                celsius: 60,
                throttled: false,
            }],
            vec![],
        )
        .await;
    assert_eq!(node_view(&store, &name).await.observed, "healthy");
    // ECC: single-bit errors below the limit are fine; a double-bit error
    // on a GPU without work quarantines it, and the job stays.
    let idle = (0..8).find(|g| !gpus.contains(g)).unwrap();
    fleet
        .sync(
            &store,
            n,
            "boot-1",
            vec![
                Signal::Ecc {
                    gpu: idle,
                    single_bit: 10,
                    double_bit: 0,
                },
                Signal::Ecc {
                    gpu: idle,
                    single_bit: 10,
                    double_bit: 1,
                },
            ],
            vec![],
        )
        .await;
    let v = node_view(&store, &name).await;
    assert_eq!(v.observed_detail["quarantined"], json!([idle]));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running,
        "a quarantine moves only the work on that GPU"
    );
    // NVLink errors past the limit: the node drains.
    fleet
        .sync(
            &store,
            n,
            "boot-1",
            vec![Signal::Nvlink {
                gpu: 0,
                errors: 5_000,
            }],
            vec![],
        )
        .await;
    assert_eq!(node_view(&store, &name).await.observed, "failed");
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    fleet.act(&store, n, Some("/ckpt/1")).await;
    // A failed row remap: repair, which a reboot does not clear; an
    // operator's uncordon returns the node.
    fleet
        .sync(
            &store,
            n,
            "boot-2",
            vec![Signal::Remap {
                gpu: 1,
                pending: false,
                failed: true,
            }],
            vec![],
        )
        .await;
    assert_eq!(node_view(&store, &name).await.observed, "needs_repair");
    fleet.sync(&store, n, "boot-3", vec![], vec![]).await;
    assert_eq!(node_view(&store, &name).await.observed, "needs_repair");
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops",
            &name,
            AdminChange::Uncordon,
            Some("board swapped"),
        )
        .await
        .unwrap()
        .unwrap();
    let v = node_view(&store, &name).await;
    assert_eq!((v.observed.as_str(), v.schedulable), ("healthy", true));

    // Injected into the simulated fleet: a dead node is lost (its jobs
    // requeue) and stays lost while its agent keeps syncing, until it
    // reboots.
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let other = format!("n{}", 1 - n);
    let job = store.get_job("acme", id).await.unwrap();
    let on = job.workers[0].node.clone().unwrap();
    fleet
        .act(&store, on.trim_start_matches('n').parse().unwrap(), None)
        .await;
    store
        .inject_fault(&ctx, "ops", &on, &gangway_shared::api::Fault::NodeDown)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node_view(&store, &on).await.observed, "lost");
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Queued
    );
    fleet
        .sync(
            &store,
            on.trim_start_matches('n').parse().unwrap(),
            "boot-3",
            vec![],
            vec![],
        )
        .await;
    assert_eq!(node_view(&store, &on).await.observed, "lost");
    store
        .inject_fault(&ctx, "ops", &on, &gangway_shared::api::Fault::Reboot)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node_view(&store, &on).await.observed, "healthy");
    // A GPU the node does not have is refused.
    assert!(matches!(
        store
            .inject_fault(
                &ctx,
                "ops",
                &other,
                &gangway_shared::api::Fault::Xid { gpu: 8, code: 79 }
            )
            .await
            .unwrap(),
        Err(gangway_regional::store::NodeRefusal::InvalidFault(_))
    ));
}

#[tokio::test]
async fn a_spare_from_the_same_leaf_takes_a_failed_nodes_place_under_a_64_gpu_gang() {
    let (store, client) = store("fleet_spare").await;
    // n0…n7 and a spare n8 in leaf s0-l0; another spare n9 in leaf s0-l1.
    let mut nodes: Vec<AgentNode> = (0..10).map(|n| node(&format!("n{n}"))).collect();
    nodes[8].spare = true;
    nodes[9].spare = true;
    nodes[9].leaf = "s0-l1".into();
    let fleet = Fleet::register_nodes(&store, nodes.clone()).await;
    for n in 0..10 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let id = submit(&store, &job(64, 8)).await;
    let o = run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1, "{o:?}");
    for n in 0..8 {
        fleet.act(&store, n, None).await;
    }
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Running);
    let before: Vec<(u32, String, Vec<u32>)> = j
        .workers
        .iter()
        .map(|w| (w.rank, w.node.clone().unwrap(), w.gpus.clone()))
        .collect();
    assert!(before.iter().all(|(_, n, _)| n != "n8" && n != "n9"));

    // n3 falls off the bus (XID 79): a node fault.
    fleet
        .sync(&store, 3, "boot-1", vec![xid(0, 79)], vec![])
        .await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    let failed = node_view(&store, "n3").await;
    assert_eq!(failed.admin_state, "repair", "{failed:?}");
    assert!(!failed.schedulable);
    let spare = node_view(&store, "n8").await;
    assert!(!spare.spare, "the same leaf's spare left the pool");
    assert!(
        node_view(&store, "n9").await.spare,
        "the other leaf's stays"
    );
    // While the gang checkpoints, the planner sees none of its GPUs free:
    // neither its old ones as they are released nor the spare's.
    let other = submit(&store, &job(8, 8)).await;
    for n in 0..8 {
        fleet.act(&store, n, Some("/ckpt/step-42")).await;
        if n < 7 {
            run_pass(&store, AGENT_TIMEOUT).await.unwrap();
            assert_eq!(
                store.get_job("acme", other).await.unwrap().state,
                JobState::Queued,
                "nothing else lands on the gang's held GPUs"
            );
        }
    }
    // The last worker down: the gang is placed at once on its old nodes
    // minus n3 plus n8, the same GPUs, and resumes from its checkpoint.
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Starting, "{job:?}");
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/step-42"));
    assert_eq!((job.preemptions, job.node_moves), (1, 1));
    let after: Vec<(u32, String, Vec<u32>)> = job
        .workers
        .iter()
        .map(|w| (w.rank, w.node.clone().unwrap(), w.gpus.clone()))
        .collect();
    let want: Vec<(u32, String, Vec<u32>)> = before
        .iter()
        .map(|(r, n, g)| {
            let n = if n == "n3" {
                "n8".to_string()
            } else {
                n.clone()
            };
            (*r, n, g.clone())
        })
        .collect();
    assert_eq!(after, want);
    let kinds: Vec<String> = events(&store, id).await.into_iter().map(|e| e.0).collect();
    assert_eq!(
        kinds,
        [
            "queued",
            "placed",
            "started",
            "preempted",
            "spare_swap",
            "requeued",
            "placed"
        ]
    );
    let live = common::live_gpus(&client, id).await;
    assert_eq!(live, 64);
    // It runs on its nodes again.
    for n in [0, 1, 2, 4, 5, 6, 7, 8] {
        fleet.act(&store, n, None).await;
    }
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    // The agents registering again do not undo the swap.
    let req = RegisterRequest {
        agent_id: "agent-n8".into(),
        boot_id: fleet.boots[8],
        executor: "sim".into(),
        nodes: vec![nodes[8].clone()],
        host_id: None,
    };
    store.admit_as_registered(&req).await.unwrap();
    store.register_agent(&req).await.unwrap();
    assert!(!node_view(&store, "n8").await.spare);
    // n3 repaired: the operator returns it from repair, into the pool.
    fleet.sync(&store, 3, "boot-2", vec![], vec![]).await;
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops",
            "n3",
            AdminChange::Uncordon,
            Some("GPU replaced"),
        )
        .await
        .unwrap()
        .unwrap();
    let repaired = node_view(&store, "n3").await;
    assert!(repaired.spare && !repaired.schedulable, "{repaired:?}");
}

async fn open_store(url: &str) -> Store {
    let store = Store::connect(url, "test-region", 8)
        .unwrap()
        .with_health(HealthPolicy::default(), Duration::from_secs(30));
    store.migrate().await.unwrap();
    store
}

#[tokio::test]
async fn rolling_maintenance_reboots_every_node_in_waves_and_resumes_after_a_restart() {
    let url = gangway_devkit::fresh_database("fleet_maint").await;
    let mut store = open_store(&url).await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // 64 nodes × 8 GPUs: 8 leaves of 8.
    let nodes: Vec<AgentNode> = (0..64)
        .map(|n| {
            let mut node = node(&format!("n{n}"));
            node.leaf = format!("s0-l{}", n / 8);
            node
        })
        .collect();
    let fleet = Fleet::register_nodes(&store, nodes).await;
    for n in 0..64 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    // Running work: four 16-GPU gangs (two nodes each) and eight 8-GPU jobs.
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(submit(&store, &job(16, 8)).await);
    }
    for _ in 0..8 {
        jobs.push(submit(&store, &job(8, 8)).await);
    }
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    for n in 0..64 {
        fleet.act(&store, n, None).await;
    }
    for &j in &jobs {
        assert_eq!(
            store.get_job("acme", j).await.unwrap().state,
            JobState::Running
        );
    }

    // Refused: no targets; a second plan while one runs.
    use gangway_shared::api::MaintenanceStart;
    assert!(store
        .start_maintenance("ops", &MaintenanceStart::default())
        .await
        .unwrap()
        .is_err());
    let req = MaintenanceStart {
        all: true,
        per_leaf: Some(2),
        region_percent: Some(25),
        reason: Some("kernel upgrade".into()),
        ..MaintenanceStart::default()
    };
    let plan = store.start_maintenance("ops", &req).await.unwrap().unwrap();
    assert_eq!(plan.total, 64);
    assert!(store.start_maintenance("ops", &req).await.unwrap().is_err());
    let cap = 16; // 25 % of 64

    let ctx = store.health_context();
    let mut max_out = 0;
    let mut restarted = false;
    for round in 0..80 {
        store.maintenance_tick(&ctx).await.unwrap();
        for n in 0..64 {
            fleet.act(&store, n, Some("/ckpt/maint")).await;
        }
        run_pass(&store, AGENT_TIMEOUT).await.unwrap();
        for n in 0..64 {
            fleet.act(&store, n, Some("/ckpt/maint")).await;
        }
        // Capacity never below the floor: at most the cap out at once.
        let out: i64 = client
            .query_one(
                "SELECT count(*) FROM nodes WHERE operator_state <> 'active'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(out <= cap, "{out} nodes out in round {round}");
        max_out = max_out.max(out);
        let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
        // The control plane restarts mid-way: a new store on the same
        // database carries on from the persisted steps.
        if !restarted && p.steps.get("done").copied().unwrap_or(0) >= 16 {
            drop(store);
            store = open_store(&url).await;
            restarted = true;
        }
        if p.state == "done" {
            break;
        }
    }
    assert!(restarted, "never got half-way");
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    assert_eq!(p.state, "done", "{p:?}");
    assert_eq!(p.steps.get("done"), Some(&64));
    assert!(max_out >= 8, "waves ran in parallel: at most {max_out} out");
    // Every node rebooted once and is back in service.
    let rebooted: i64 = client
        .query_one(
            "SELECT count(*) FROM nodes WHERE sim_reboots = 1 AND operator_state = 'active'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rebooted, 64);
    // No job stopped without a checkpoint: every move was a maintenance
    // preemption, and every requeue resumed from a checkpoint.
    for &j in &jobs {
        let job = store.get_job("acme", j).await.unwrap();
        assert_eq!(job.state, JobState::Running, "{job:?}");
        assert!(job.preemptions >= 1, "{job:?}");
        assert_eq!(job.preemptions, job.node_moves);
        for (kind, detail) in events(&store, j).await {
            match kind.as_str() {
                "preempted" => assert_eq!(detail["cause"], "maintenance"),
                "requeued" => assert_eq!(detail["restore_from"], "/ckpt/maint"),
                "worker_exited" | "finished" => panic!("job {j} stopped: {detail}"),
                _ => {}
            }
        }
    }
    // Audited.
    let audited: i64 = client
        .query_one(
            "SELECT count(*) FROM audit_log WHERE action = 'maintenance.start' AND actor = 'ops'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1);
}

/// The plan's view of one node: its step and why (skipped).
fn plan_node(
    p: &gangway_shared::api::MaintenancePlan,
    id: &str,
) -> gangway_shared::api::MaintenanceNode {
    p.nodes.iter().find(|n| n.node_id == id).unwrap().clone()
}

/// Node events of `id` that a maintenance plan recorded, as (step, message).
async fn plan_events(store: &Store, id: &str) -> Vec<(String, String)> {
    node_view(store, id)
        .await
        .events
        .into_iter()
        .filter(|e| e.kind == "admin" && e.detail.get("plan").is_some())
        .map(|e| {
            (
                e.detail["step"].as_str().unwrap_or("").to_string(),
                e.message,
            )
        })
        .collect()
}

#[tokio::test]
async fn rolling_maintenance_skips_a_node_lost_or_cordoned_before_its_turn_and_finishes() {
    use gangway_shared::api::{Fault, MaintenanceStart};
    let (store, client) = store("fleet_maint_skip").await;
    // 8 nodes × 8 GPUs: two leaves of 4.
    let nodes: Vec<AgentNode> = (0..8)
        .map(|n| {
            let mut node = node(&format!("n{n}"));
            node.leaf = format!("s0-l{}", n / 4);
            node
        })
        .collect();
    let fleet = Fleet::register_nodes(&store, nodes).await;
    for n in 0..8 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let ctx = store.health_context();
    // One node per leaf at a time, half the region out at most.
    let req = MaintenanceStart {
        all: true,
        per_leaf: Some(1),
        region_percent: Some(50),
        reason: Some("kernel 6.8".into()),
        ..MaintenanceStart::default()
    };
    let plan = store.start_maintenance("ops", &req).await.unwrap().unwrap();
    assert_eq!(plan.total, 8);
    store.maintenance_tick(&ctx).await.unwrap();
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    assert_eq!(plan_node(&p, "n0").step, "draining");
    assert_eq!(plan_node(&p, "n4").step, "draining");

    // Before their turn: n2 dies (lost), an operator cordons n6.
    store
        .inject_fault(&ctx, "ops", "n2", &Fault::NodeDown)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(node_view(&store, "n2").await.observed, "lost");
    store
        .set_node_admin(&ctx, "ops", "n6", AdminChange::Cordon, Some("fan"))
        .await
        .unwrap()
        .unwrap();
    // Their leaves are busy with the plan: not their turn yet, so they
    // stay pending.
    store.maintenance_tick(&ctx).await.unwrap();
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    assert_eq!(plan_node(&p, "n2").step, "pending", "{p:?}");
    assert_eq!(plan_node(&p, "n6").step, "pending", "{p:?}");
    assert!(p.skipped.is_empty(), "{p:?}");

    let mut finished = false;
    for _ in 0..80 {
        store.health_tick(&ctx).await.unwrap();
        store.maintenance_tick(&ctx).await.unwrap();
        for n in 0..8 {
            fleet.act(&store, n, Some("/ckpt/maint")).await;
        }
        run_pass(&store, AGENT_TIMEOUT).await.unwrap();
        // Never more than the cap out, the two outages counted.
        let out: i64 = client
            .query_one(
                "SELECT count(*) FROM nodes
                 WHERE operator_state <> 'active' OR observed NOT IN ('healthy', 'degraded')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(out <= 4, "{out} nodes out");
        let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
        if p.state == "done" {
            finished = true;
            break;
        }
    }
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    assert!(finished, "the plan never finished: {p:?}");
    assert_eq!(p.steps.get("done"), Some(&6), "{p:?}");
    assert_eq!(p.steps.get("skipped"), Some(&2), "{p:?}");
    assert!(p.finished_at.is_some() && p.held.is_none(), "{p:?}");
    // Skipped, each with why.
    let skipped: Vec<(&str, &str)> = p
        .skipped
        .iter()
        .map(|s| (s.node_id.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        skipped,
        vec![
            ("n2", "node lost: its agent is gone or the node is down"),
            ("n6", "cordoned by an operator: fan"),
        ]
    );
    assert!(p.skipped.iter().all(|s| s.at.is_some()));
    let n6 = plan_node(&p, "n6");
    assert_eq!(
        (n6.step.as_str(), n6.reason.as_deref()),
        ("skipped", Some("cordoned by an operator: fan"))
    );
    assert_eq!(plan_node(&p, "n0").reason, None);
    // The list view carries the skips too.
    let list = store.list_maintenance().await.unwrap();
    assert_eq!(list.plans[0].skipped.len(), 2);
    // Every other node rebooted once and is back; the skipped ones were
    // left as they were (n6 still cordoned by its operator, n2 lost).
    let rebooted: Vec<String> = client
        .query(
            "SELECT node_id FROM nodes WHERE sim_reboots = 1 AND operator_state = 'active'
             ORDER BY node_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rebooted, ["n0", "n1", "n3", "n4", "n5", "n7"]);
    let v6 = node_view(&store, "n6").await;
    assert_eq!(v6.admin_state, "cordoned");
    assert_eq!(node_view(&store, "n2").await.observed, "lost");
    // Recorded as the plan's other steps are: a node event each.
    for (node, why) in [("n2", "node lost"), ("n6", "cordoned by an operator: fan")] {
        let events = plan_events(&store, node).await;
        let skips: Vec<&(String, String)> = events.iter().filter(|e| e.0 == "skipped").collect();
        assert_eq!(skips.len(), 1, "{node}: {events:?}");
        assert!(skips[0].1.contains(why), "{node}: {events:?}");
        assert!(!events.iter().any(|e| e.0 == "draining"), "{events:?}");
    }
    assert!(plan_events(&store, "n1")
        .await
        .iter()
        .any(|e| e.0 == "rebooting"));
}

#[tokio::test]
async fn rolling_maintenance_waits_for_a_node_merely_suspect_at_its_turn() {
    use gangway_shared::api::MaintenanceStart;
    // Suspect after 2 s of silence, lost after 5 s.
    let (store, _client) = store_with("fleet_maint_wait", policy()).await;
    let fleet = Fleet::register(&store, 4).await;
    for n in 0..4 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    let ctx = store.health_context();
    // n2 and n3 go quiet: suspect.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for n in 0..2 {
        fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
    }
    store.health_tick(&ctx).await.unwrap();
    assert_eq!(node_view(&store, "n3").await.observed, "suspect");
    let req = MaintenanceStart {
        all: true,
        per_leaf: Some(4),
        region_percent: Some(100),
        ..MaintenanceStart::default()
    };
    let plan = store.start_maintenance("ops", &req).await.unwrap().unwrap();
    store.maintenance_tick(&ctx).await.unwrap();
    // Their turn came with n0's and n1's: waited for, not skipped.
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    for n in ["n2", "n3"] {
        let node = plan_node(&p, n);
        assert_eq!(node.step, "pending", "{p:?}");
        assert!(node.waiting_since.is_some(), "{p:?}");
    }
    assert!(p.skipped.is_empty(), "{p:?}");
    assert_eq!(p.held.as_ref().unwrap()["code"], "node_out", "{p:?}");
    // n3's agent is back; n2's stays silent until it is lost.
    let start = std::time::Instant::now();
    let mut finished = false;
    while start.elapsed() < Duration::from_secs(30) {
        for n in [0, 1, 3] {
            fleet.act(&store, n, None).await;
        }
        store.health_tick(&ctx).await.unwrap();
        store.maintenance_tick(&ctx).await.unwrap();
        let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
        if let Some(s) = p.skipped.first() {
            // Skipped only once lost, not while merely suspect.
            assert_eq!(node_view(&store, "n2").await.observed, "lost");
            assert_eq!(s.node_id, "n2");
        }
        if p.state == "done" {
            finished = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = store.get_maintenance(plan.plan_id).await.unwrap().unwrap();
    assert!(finished, "the plan never finished: {p:?}");
    assert_eq!(p.steps.get("done"), Some(&3), "{p:?}");
    assert_eq!(plan_node(&p, "n3").step, "done");
    let n2 = plan_node(&p, "n2");
    assert_eq!(n2.step, "skipped");
    assert!(
        n2.reason.as_deref().unwrap().starts_with("node lost"),
        "{n2:?}"
    );
}

#[tokio::test]
async fn a_spare_in_another_rack_is_taken_only_where_its_power_budget_feeds_the_move() {
    // Rack s0-l0: n0, n1 run a 16-GPU gang. Rack s0-l1: n2 runs an 8-GPU
    // job, n3 is a spare; its budget feeds 8 GPUs at 700 W, all drawn by
    // n2. When n1 fails, n3 may not take its 8 GPUs: no swap, and the gang
    // waits. With room for 16 in s0-l1, the same failure swaps n3 in.
    for (budget, swapped) in [(8 * 700, false), (16 * 700, true)] {
        let (store, _client) = store(&format!("fleet_spare_power_{swapped}")).await;
        let mut nodes: Vec<AgentNode> = (0..4).map(|n| node(&format!("n{n}"))).collect();
        for n in &mut nodes {
            n.gpu_power_w = Some(700);
        }
        for n in &mut nodes[2..] {
            n.leaf = "s0-l1".into();
            n.rack_power_budget_w = Some(budget);
        }
        nodes[3].spare = true;
        let fleet = Fleet::register_nodes(&store, nodes).await;
        for n in 0..4 {
            fleet.sync(&store, n, "boot-1", vec![], vec![]).await;
        }
        // The gang needs one rack: only s0-l0 has two nodes.
        let mut gang = job(16, 8);
        gang.required = TopologyLevel::Leaf;
        let gang = submit(&store, &gang).await;
        run_pass(&store, AGENT_TIMEOUT).await.unwrap();
        let small = submit(&store, &job(8, 8)).await;
        run_pass(&store, AGENT_TIMEOUT).await.unwrap();
        for n in 0..3 {
            fleet.act(&store, n, None).await;
        }
        let on = |j: &gangway_shared::api::Job| -> Vec<String> {
            j.workers.iter().filter_map(|w| w.node.clone()).collect()
        };
        let g = store.get_job("acme", gang).await.unwrap();
        let s = store.get_job("acme", small).await.unwrap();
        assert_eq!(
            (on(&g), on(&s)),
            (vec!["n0".into(), "n1".into()], vec!["n2".into()])
        );

        fleet
            .sync(&store, 1, "boot-1", vec![xid(0, 79)], vec![])
            .await;
        assert_eq!(
            node_view(&store, "n3").await.spare,
            !swapped,
            "budget {budget}"
        );
        let said: Vec<String> = (node_view(&store, "n1").await.events.into_iter())
            .map(|e| e.message)
            .collect();
        assert_eq!(
            said.iter().any(|m| m.contains("no spare to swap in")),
            !swapped,
            "{said:?}"
        );
    }
}
