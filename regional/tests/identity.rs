//! A node joins as itself (issue 18), against a real PostgreSQL: the
//! inventory owns where a machine sits, a machine not in it is refused and
//! listed as unknown until admitted, a node is held by one claimant at a
//! time, and an agent reports for its own nodes only.

mod common;

use std::time::Duration;

use common::node;
use gangway_regional::store::{InventoryNode, StopTiming, StoreError};
use gangway_regional::Store;
use gangway_shared::agent::{AgentNode, NodeReport, RegisterRequest, SyncRequest};
use gangway_shared::api::InventoryEntry;
use gangway_shared::error::codes;
use uuid::Uuid;

const TIMING: StopTiming = StopTiming {
    grace_period_s: 5,
    checkpoint_deadline_s: 10,
};

/// A real machine's registration: its agent is named as the node.
fn machine(name: &str, host: &str) -> RegisterRequest {
    let mut n: AgentNode = node(name, "", "", "h100");
    n.nvlink_domain = String::new();
    RegisterRequest {
        agent_id: name.into(),
        boot_id: Uuid::new_v4(),
        executor: "real".into(),
        nodes: vec![n],
        host_id: Some(host.into()),
    }
}

fn code(e: StoreError) -> &'static str {
    match e {
        StoreError::Refused { code, .. }
        | StoreError::Conflict { code, .. }
        | StoreError::Invalid { code, .. } => code,
        other => panic!("not a refusal: {other:?}"),
    }
}

fn place(spine: &str, leaf: &str) -> InventoryEntry {
    InventoryEntry {
        spine: spine.into(),
        leaf: leaf.into(),
        ..InventoryEntry::default()
    }
}

async fn store(prefix: &str) -> (Store, tokio_postgres::Client) {
    let (store, db) = common::store(prefix).await;
    (store.with_claim_lease(Duration::from_secs(30)), db)
}

#[tokio::test]
async fn an_unknown_machine_is_refused_listed_and_admitted_where_the_operator_says() {
    let (store, db) = store("identity").await;
    let req = machine("gpu-a1-001", "host-1");
    let e = store.register_agent(&req).await.unwrap_err();
    assert_eq!(code(e), codes::UNKNOWN_NODE);
    // Nothing registered; the machine is listed as unknown.
    let nodes: i64 = db
        .query_one("SELECT count(*) FROM nodes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(nodes, 0);
    let unknown = store.unknown_nodes().await.unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        (unknown[0].node_id.as_str(), unknown[0].state.as_str()),
        ("gpu-a1-001", "unknown")
    );
    assert_eq!(
        (unknown[0].gpus, unknown[0].agent_id.as_str()),
        (8, "gpu-a1-001")
    );

    // Admitting needs a machine seen as unknown; adding does not.
    let e = store
        .admit_node("ops", "gpu-a1-002", &place("s1", "s1-l1"), true)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::NotFound), "{e:?}");
    store
        .admit_node("ops", "gpu-a1-001", &place("s1", "s1-l1"), true)
        .await
        .unwrap();
    assert!(store.unknown_nodes().await.unwrap().is_empty());
    store.register_agent(&req).await.unwrap();
    // Where it sits is the inventory's, not the agent's.
    let row = db
        .query_one(
            "SELECT spine, leaf, nvlink_domain, agent_id FROM nodes WHERE node_id = 'gpu-a1-001'",
            &[],
        )
        .await
        .unwrap();
    let got: (String, String, String, String) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        got,
        (
            "s1".into(),
            "s1-l1".into(),
            "gpu-a1-001".into(),
            "gpu-a1-001".into()
        )
    );
    // Audited, with the operator.
    let audited: i64 = db
        .query_one(
            "SELECT count(*) FROM audit_log WHERE action = 'node.admit' AND actor = 'ops'
               AND target = 'gpu-a1-001'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1);
}

#[tokio::test]
async fn a_node_is_served_by_the_agent_the_inventory_names_and_reports_only_for_its_own() {
    let (store, db) = store("identity").await;
    for name in ["node-a", "node-b"] {
        store
            .admit_node("ops", name, &place("s0", "s0-l0"), false)
            .await
            .unwrap();
    }
    // Agent node-a registering node-b: refused, nothing recorded.
    let mut stolen = machine("node-b", "host-a");
    stolen.agent_id = "node-a".into();
    assert_eq!(
        code(store.register_agent(&stolen).await.unwrap_err()),
        codes::WRONG_AGENT
    );
    let a = machine("node-a", "host-a");
    let b = machine("node-b", "host-b");
    store.register_agent(&a).await.unwrap();
    store.register_agent(&b).await.unwrap();
    // node-a's agent reporting node-b's health: refused, nothing recorded.
    store.flush_liveness().await.unwrap();
    let before: Option<chrono::DateTime<chrono::Utc>> = db
        .query_one(
            "SELECT last_sync_at FROM agents WHERE agent_id = 'node-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let report = SyncRequest {
        logs: Vec::new(),
        boot_id: a.boot_id,
        workers: vec![],
        checkpoints: None,
        nodes: vec![NodeReport {
            node_id: "node-b".into(),
            boot_id: "other-machine".into(),
            signals: vec![],
        }],
    };
    let e = store
        .sync_agent("node-a", &report, TIMING)
        .await
        .unwrap_err();
    assert_eq!(code(e), codes::WRONG_AGENT);
    let after: Option<chrono::DateTime<chrono::Utc>> = db
        .query_one(
            "SELECT last_sync_at FROM agents WHERE agent_id = 'node-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "a refused sync records nothing");
    // The sync's looks are sent together, but what it is told follows
    // their order: an unknown agent, or one from a stale boot, is told
    // that (it registers again), whatever its node reports would say.
    assert!(matches!(
        store
            .sync_agent("node-z", &report, TIMING)
            .await
            .unwrap_err(),
        StoreError::UnknownAgent
    ));
    let stale = SyncRequest {
        boot_id: Uuid::new_v4(),
        ..report.clone()
    };
    assert!(matches!(
        store
            .sync_agent("node-a", &stale, TIMING)
            .await
            .unwrap_err(),
        StoreError::StaleBoot
    ));
    let boot_b: Option<String> = db
        .query_one("SELECT boot_id FROM nodes WHERE node_id = 'node-b'", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(boot_b.as_deref(), Some("other-machine"));

    // A fleet file's simulated nodes are bound to its simulated agent.
    let fleet = gangway_shared::fleet::FleetFile::parse(
        "[[spine]]\n[[spine.leaf]]\nnodes = 2\ngpu_type = \"h100\"\ngpus_per_node = 8\n",
    )
    .unwrap();
    let inventory: Vec<InventoryNode> = (fleet.expand("r1").iter())
        .map(|n| InventoryNode::from_fleet(n, "r1-agent"))
        .collect();
    store.load_inventory(&inventory, "fleet").await.unwrap();
    let sim = |agent: &str| RegisterRequest {
        agent_id: agent.into(),
        boot_id: Uuid::new_v4(),
        executor: "sim".into(),
        nodes: gangway_agent::nodes_from_fleet(&fleet, "r1", "127.0.0.1"),
        host_id: None,
    };
    assert_eq!(
        code(store.register_agent(&sim("r2-agent")).await.unwrap_err()),
        codes::WRONG_AGENT
    );
    store.register_agent(&sim("r1-agent")).await.unwrap();
}

#[tokio::test]
async fn a_second_claimant_is_refused_while_the_first_is_alive_and_takes_over_after() {
    let (store, db) = store("identity").await;
    store
        .admit_node("ops", "gpu-7", &place("s0", "s0-l0"), false)
        .await
        .unwrap();
    let first = machine("gpu-7", "host-1");
    store.register_agent(&first).await.unwrap();
    // The same agent restarting on the same machine: its own node.
    let restart = RegisterRequest {
        boot_id: Uuid::new_v4(),
        ..first.clone()
    };
    store.register_agent(&restart).await.unwrap();
    // Another machine claiming the name while the first is alive: refused,
    // and the first keeps the node.
    let second = machine("gpu-7", "host-2");
    assert_eq!(
        code(store.register_agent(&second).await.unwrap_err()),
        codes::NODE_CLAIMED
    );
    let sync = SyncRequest {
        logs: Vec::new(),
        boot_id: restart.boot_id,
        workers: vec![],
        checkpoints: None,
        nodes: vec![],
    };
    store.sync_agent("gpu-7", &sync, TIMING).await.unwrap();

    // An operator releases it: the second takes it over (audited), and the
    // first one's next sync is from a stale boot.
    store
        .release_node("ops", "gpu-7", Some("machine replaced"))
        .await
        .unwrap();
    store.register_agent(&second).await.unwrap();
    assert!(matches!(
        store.sync_agent("gpu-7", &sync, TIMING).await.unwrap_err(),
        StoreError::StaleBoot
    ));
    // The first comes back while the second is alive: refused.
    let back = RegisterRequest {
        boot_id: Uuid::new_v4(),
        ..first.clone()
    };
    assert_eq!(
        code(store.register_agent(&back).await.unwrap_err()),
        codes::NODE_CLAIMED
    );
    // Once the second's lease has run out, the first may take it back.
    store.flush_liveness().await.unwrap();
    db.execute(
        "UPDATE agents SET last_sync_at = now() - interval '31 seconds'",
        &[],
    )
    .await
    .unwrap();
    store.register_agent(&back).await.unwrap();
    let takeovers: Vec<(String, Option<String>)> = db
        .query(
            "SELECT actor, reason FROM audit_log WHERE action = 'node.takeover' ORDER BY audit_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        takeovers,
        [
            (
                "agent:gpu-7".to_string(),
                Some("an operator released the node".to_string())
            ),
            (
                "agent:gpu-7".to_string(),
                Some("its previous agent's lease ran out".to_string())
            ),
        ]
    );
    assert_eq!(
        db.query_one(
            "SELECT count(*) FROM audit_log WHERE action = 'node.release'",
            &[]
        )
        .await
        .unwrap()
        .get::<_, i64>(0),
        1
    );
}
