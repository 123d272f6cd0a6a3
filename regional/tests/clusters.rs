//! Dedicated clusters against a real, throwaway PostgreSQL: a create binds
//! whole free nodes in the tightest domain or nothing at all (racing
//! creates included, and never against a capacity reservation's promise);
//! only the cluster's jobs run on its nodes and they run nowhere else,
//! outside the tenant's quota; a member that fails is replaced by a spare
//! of the same leaf without being asked, with events the tenant reads, and
//! with no spare the cluster is degraded until one is free; resizes keep
//! it tight; a delete checkpoints and stops its jobs before its nodes go
//! back.

use std::collections::BTreeSet;
use std::time::Duration;

use gangway_health::Signal;
use gangway_regional::scheduling::run_pass;
use gangway_regional::store::{
    ClusterOutcome, NewCluster, NewJob, NewReservation, StoreError, Who,
};
use gangway_regional::Store;
use gangway_shared::agent::{AgentNode, RegisterRequest};
use gangway_shared::api::{
    Cluster, ClusterResize, ClusterSpec, ClusterState, JobState, QuotaTerms, ReservationSpec,
    TopologyLevel,
};
use gangway_shared::error::codes;
use gangway_shared::ids::cluster_id_for_key;
use uuid::Uuid;

mod common;
use common::{store, submit, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Nodes `n0`… of 8 h100 GPUs: `layout` gives, per leaf of spine `s0`, how
/// many ordinary nodes and how many spares it has.
async fn fleet(store: &Store, layout: &[(usize, usize)]) -> (Fleet, Vec<AgentNode>) {
    let mut nodes = Vec::new();
    for (l, &(plain, spares)) in layout.iter().enumerate() {
        for k in 0..plain + spares {
            let mut n = common::node(&format!("n{}", nodes.len()), "s0", &format!("l{l}"), "h100");
            n.spare = k >= plain;
            nodes.push(n);
        }
    }
    let fleet = Fleet::register_nodes(store, nodes.clone()).await;
    for n in 0..nodes.len() {
        fleet.sync(store, n, "boot-1", vec![], vec![]).await;
    }
    (fleet, nodes)
}

fn spec(nodes: i64, level: TopologyLevel) -> ClusterSpec {
    ClusterSpec {
        name: Some("train".into()),
        gpu_type: "h100".into(),
        nodes,
        level,
        region: None,
    }
}

async fn create(
    store: &Store,
    tenant: &str,
    key: Option<&str>,
    s: ClusterSpec,
) -> Result<Cluster, StoreError> {
    let new = NewCluster {
        id: key.map_or_else(Uuid::new_v4, |k| cluster_id_for_key(tenant, k)),
        tenant: tenant.into(),
        idempotency_key: key.map(String::from),
        spec: s,
        agent_timeout: AGENT_TIMEOUT,
    };
    store
        .create_cluster(&new)
        .await
        .map(|o| o.cluster().clone())
}

fn members(c: &Cluster) -> Vec<String> {
    c.members.iter().map(|m| m.node_id.clone()).collect()
}

/// A gang of `gpus` GPUs (8 per worker) of tenant acme, on `cluster`.
fn job_on(gpus: i32, cluster: Option<Uuid>) -> NewJob {
    let mut j = common::job("acme", "h100", gpus, 8);
    j.spec.cluster = cluster;
    j
}

/// The nodes a job's workers are placed on.
async fn nodes_of(store: &Store, id: Uuid) -> BTreeSet<String> {
    (store.get_job("acme", id).await.unwrap().workers.iter())
        .filter_map(|w| w.node.clone())
        .collect()
}

/// Nodes bound to any cluster, from the table itself.
async fn bound(client: &tokio_postgres::Client) -> Vec<(String, Uuid)> {
    (client
        .query(
            "SELECT node_id, cluster_id FROM nodes WHERE cluster_id IS NOT NULL ORDER BY node_id",
            &[],
        )
        .await
        .unwrap())
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

fn kinds(c: &Cluster) -> Vec<&str> {
    c.events.iter().map(|e| e.kind.as_str()).collect()
}

/// Starts every worker the agents are told to run on nodes `nodes`.
async fn act(
    store: &Store,
    fleet: &Fleet,
    nodes: impl IntoIterator<Item = usize>,
    ckpt: Option<&str>,
) {
    for n in nodes {
        fleet.act(store, n, ckpt).await;
    }
}

#[tokio::test]
async fn a_cluster_binds_the_tightest_free_nodes_and_only_its_jobs_run_there() {
    let (store, _client) = store("clusters_place").await;
    // l0: 4 nodes (n0–n3), l1: 3 nodes (n4–n6).
    let (fleet, _) = fleet(&store, &[(4, 0), (3, 0)]).await;
    // acme may hold 8 GPUs of the shared pool.
    store
        .set_quota(
            "acme",
            "h100",
            &QuotaTerms {
                guaranteed_gpus: 0,
                max_gpus: Some(8),
                weight_milli: 1000,
            },
        )
        .await
        .unwrap();
    // 3 nodes: l1 fits them exactly (l0 stays whole for bigger asks).
    let c = create(&store, "acme", None, spec(3, TopologyLevel::Spine))
        .await
        .unwrap();
    assert_eq!(c.state, ClusterState::Ready);
    assert_eq!(members(&c), ["n4", "n5", "n6"]);
    assert_eq!((c.gpus, c.placement_level), (24, TopologyLevel::Leaf));
    assert_eq!(c.domain, ["s0"]);
    assert_eq!(
        kinds(&store.get_cluster(Some("acme"), c.id).await.unwrap()),
        ["created"]
    );
    // Another tenant cannot see it.
    assert!(matches!(
        store.get_cluster(Some("other"), c.id).await,
        Err(StoreError::NotFound)
    ));

    // A 24-GPU gang on the cluster runs there, past acme's quota of 8; a
    // shared-pool job of acme's goes to l0; another tenant's 32-GPU job
    // waits (l0 is what the shared pool has) instead of taking the
    // cluster's idle GPUs.
    let on = submit(&store, &job_on(24, Some(c.id))).await;
    let off = submit(&store, &job_on(8, None)).await;
    let mut big = common::job("other", "h100", 32, 8);
    big.required = TopologyLevel::Region;
    let big = submit(&store, &big).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(
        nodes_of(&store, on).await,
        BTreeSet::from(["n4".into(), "n5".into(), "n6".into()])
    );
    let shared = nodes_of(&store, off).await;
    assert!(
        shared
            .iter()
            .all(|n| ["n0", "n1", "n2", "n3"].contains(&n.as_str())),
        "{shared:?}"
    );
    assert_eq!(
        store.get_job("other", big).await.unwrap().state,
        JobState::Queued
    );
    act(&store, &fleet, 0..7, None).await;
    assert_eq!(
        store.get_job("acme", on).await.unwrap().state,
        JobState::Running
    );
    let c = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!(c.in_use_gpus, 24);

    // Another tenant's job naming the cluster is refused at submission,
    // and one of another GPU type.
    let mut foreign = common::job("other", "h100", 8, 8);
    foreign.spec.cluster = Some(c.id);
    match store.submit(&foreign).await {
        Err(StoreError::Invalid { code, .. }) => assert_eq!(code, codes::INVALID_CLUSTER),
        other => panic!("{other:?}"),
    }
    let mut a100 = job_on(8, Some(c.id));
    a100.spec.gpu_type = "a100".into();
    a100.gpu_type = "a100".into();
    match store.submit(&a100).await {
        Err(StoreError::Invalid { code, .. }) => assert_eq!(code, codes::INVALID_CLUSTER),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_create_that_cannot_be_made_whole_binds_nothing() {
    let (store, client) = store("clusters_refuse").await;
    // l0: 3 nodes, l1: 2 nodes.
    let (fleet, _) = fleet(&store, &[(3, 0), (2, 0)]).await;
    // No leaf has 4 free nodes: refused at leaf level, nothing written.
    match create(&store, "acme", Some("k1"), spec(4, TopologyLevel::Leaf)).await {
        Err(StoreError::Conflict { code, message }) => {
            assert_eq!(code, codes::CLUSTER_UNAVAILABLE);
            assert!(message.contains("at most 3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(bound(&client).await.is_empty());
    let rows: i64 = client
        .query_one("SELECT count(*) FROM clusters", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    // Nodes running work are not free: a job on l0 leaves it 2 free nodes.
    let busy = submit(&store, &job_on(8, None)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    act(&store, &fleet, 0..5, None).await;
    let busy_node = nodes_of(&store, busy).await.into_iter().next().unwrap();
    // A reservation of 16 GPUs in spine s0 leaves room for a 2-node
    // cluster only: 40 GPUs, 8 running, 16 promised.
    let r = store
        .create_reservation(
            &NewReservation {
                id: Uuid::new_v4(),
                tenant: "lab".into(),
                idempotency_key: None,
                spec: ReservationSpec {
                    gpu_type: "h100".into(),
                    gpus: 16,
                    level: TopologyLevel::Spine,
                    start: None,
                    end: None,
                    region: None,
                },
            },
            Who::Tenant("lab"),
        )
        .await
        .unwrap();
    assert_eq!(r.reservation().gpus, 16);
    match create(&store, "acme", None, spec(3, TopologyLevel::Spine)).await {
        Err(StoreError::Conflict { code, message }) => {
            assert_eq!(code, codes::CLUSTER_UNAVAILABLE);
            assert!(message.contains("reservation"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(bound(&client).await.is_empty());

    // Two creates racing for the same 2 free nodes: one gets both, the
    // other is refused, and no node is in two clusters.
    let (a, b) = tokio::join!(
        create(&store, "acme", None, spec(2, TopologyLevel::Spine)),
        create(&store, "beta", None, spec(2, TopologyLevel::Spine)),
    );
    let won: Vec<&Cluster> = [&a, &b]
        .into_iter()
        .filter_map(|r| r.as_ref().ok())
        .collect();
    assert_eq!(won.len(), 1, "{a:?} {b:?}");
    let loser = if a.is_ok() { &b } else { &a };
    assert!(
        matches!(loser, Err(StoreError::Conflict { code, .. }) if *code == codes::CLUSTER_UNAVAILABLE),
        "{loser:?}"
    );
    let taken = bound(&client).await;
    assert_eq!(taken.len(), 2);
    assert!(taken
        .iter()
        .all(|(n, c)| *c == won[0].id && *n != busy_node));
}

#[tokio::test]
async fn creates_resizes_and_deletes_are_idempotent_under_a_key() {
    let (store, _client) = store("clusters_keys").await;
    let (_fleet, _) = fleet(&store, &[(4, 0)]).await;
    let a = create(&store, "acme", Some("c1"), spec(2, TopologyLevel::Leaf))
        .await
        .unwrap();
    let again = NewCluster {
        id: cluster_id_for_key("acme", "c1"),
        tenant: "acme".into(),
        idempotency_key: Some("c1".into()),
        spec: spec(2, TopologyLevel::Leaf),
        agent_timeout: AGENT_TIMEOUT,
    };
    match store.create_cluster(&again).await.unwrap() {
        ClusterOutcome::Replayed(c) => assert_eq!(members(&c), members(&a)),
        other => panic!("{other:?}"),
    }
    let other_body = NewCluster {
        spec: spec(3, TopologyLevel::Leaf),
        ..again.clone()
    };
    assert!(matches!(
        store.create_cluster(&other_body).await,
        Err(StoreError::KeyReused)
    ));
    // Only 2 of the 4 nodes were bound, once.
    assert_eq!(store.list_clusters(Some("acme")).await.unwrap().len(), 1);

    let grow = ClusterResize { nodes: 3 };
    let r1 = store
        .resize_cluster(Who::Tenant("acme"), a.id, Some("r1"), &grow, AGENT_TIMEOUT)
        .await
        .unwrap();
    assert!(matches!(r1, ClusterOutcome::Done(_)));
    let r2 = store
        .resize_cluster(Who::Tenant("acme"), a.id, Some("r1"), &grow, AGENT_TIMEOUT)
        .await
        .unwrap();
    assert!(matches!(r2, ClusterOutcome::Replayed(ref c) if c.members.len() == 3));
    assert!(matches!(
        store
            .resize_cluster(
                Who::Tenant("acme"),
                a.id,
                Some("r1"),
                &ClusterResize { nodes: 4 },
                AGENT_TIMEOUT
            )
            .await,
        Err(StoreError::KeyReused)
    ));
    // Growing past what is free: refused, nothing changed.
    match store
        .resize_cluster(
            Who::Tenant("acme"),
            a.id,
            None,
            &ClusterResize { nodes: 5 },
            AGENT_TIMEOUT,
        )
        .await
    {
        Err(StoreError::Conflict { code, .. }) => assert_eq!(code, codes::CLUSTER_UNAVAILABLE),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.get_cluster(None, a.id).await.unwrap().members.len(),
        3
    );

    let d1 = store
        .delete_cluster(Who::Tenant("acme"), a.id, Some("d1"))
        .await
        .unwrap();
    assert_eq!(
        d1.cluster().state,
        ClusterState::Deleted,
        "nothing ran: gone at once"
    );
    assert!(d1.cluster().members.is_empty());
    let d2 = store
        .delete_cluster(Who::Tenant("acme"), a.id, Some("d1"))
        .await
        .unwrap();
    assert!(matches!(d2, ClusterOutcome::Replayed(_)));
    // A deleted cluster is not resized again.
    match store
        .resize_cluster(Who::Tenant("acme"), a.id, None, &grow, AGENT_TIMEOUT)
        .await
    {
        Err(StoreError::Conflict { code, .. }) => assert_eq!(code, codes::CLUSTER_CONFLICT),
        other => panic!("{other:?}"),
    }
    // An operator's delete is audited.
    let b = create(&store, "acme", None, spec(1, TopologyLevel::Leaf))
        .await
        .unwrap();
    store
        .delete_cluster(Who::Operator("ops"), b.id, None)
        .await
        .unwrap();
    let audit = store
        .audit_log(&serde_json::from_value(serde_json::json!({})).unwrap())
        .await
        .unwrap();
    assert!(
        audit.entries.iter().any(|e| e.action == "cluster.delete"
            && e.actor == "ops"
            && e.target == b.id.to_string()),
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_failed_node_is_replaced_by_a_spare_of_its_leaf_and_the_tenant_sees_it() {
    let (store, client) = store("clusters_heal").await;
    // l0: n0–n2 and spare n3; l1: n4 and spare n5.
    let (fleet, nodes) = fleet(&store, &[(3, 1), (1, 1)]).await;
    let c = create(&store, "acme", None, spec(2, TopologyLevel::Leaf))
        .await
        .unwrap();
    assert_eq!(c.domain, ["s0", "l0"]);
    let m = members(&c);
    // A 16-GPU gang runs on both members.
    let id = submit(&store, &job_on(16, Some(c.id))).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    act(&store, &fleet, 0..6, None).await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );

    // One member falls off the bus (XID 79): without anyone asking, the
    // leaf's spare n3 takes its place and the gang moves there from its
    // checkpoint.
    let failed: usize = m[1].trim_start_matches('n').parse().unwrap();
    fleet
        .sync(
            &store,
            failed,
            "boot-1",
            vec![Signal::Xid { gpu: 0, code: 79 }],
            vec![],
        )
        .await;
    let c2 = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!(c2.state, ClusterState::Ready, "{c2:?}");
    let now: BTreeSet<String> = members(&c2).into_iter().collect();
    assert_eq!(now, BTreeSet::from([m[0].clone(), "n3".to_string()]));
    assert_eq!(&kinds(&c2)[1..], ["node_failed", "spare_swapped"]);
    let swap = &c2.events[2];
    assert_eq!(swap.details["spare"], "n3");
    assert_eq!(swap.details["domain"], "leaf");
    assert!(swap.message.contains(&m[1]), "{}", swap.message);
    // The gang checkpoints, then restarts on the member that stayed and n3.
    act(&store, &fleet, [0, 1, 2], Some("/ckpt/7")).await;
    let job = store.get_job("acme", id).await.unwrap();
    assert!(
        matches!(job.state, JobState::Starting | JobState::Running),
        "{job:?}"
    );
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/7"));
    assert_eq!(nodes_of(&store, id).await, now);
    // The spare l1 still has is no one's.
    assert_eq!(bound(&client).await.len(), 2);

    // The other original member fails too: l0 has no spare left (n5 is in
    // another leaf, outside the cluster's domain), so the cluster is
    // degraded, says so, and its gang waits on what is left.
    act(&store, &fleet, [0, 1, 2, 3], None).await;
    let second: usize = m[0].trim_start_matches('n').parse().unwrap();
    fleet
        .sync(
            &store,
            second,
            "boot-1",
            vec![Signal::Xid { gpu: 0, code: 79 }],
            vec![],
        )
        .await;
    let c3 = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!(c3.state, ClusterState::Degraded, "{c3:?}");
    assert_eq!(members(&c3), ["n3"]);
    assert_eq!(kinds(&c3).last(), Some(&"no_spare"));
    assert!(
        store.tend_clusters().await.unwrap().healed == 0,
        "still none"
    );

    // An operator adds a spare to the leaf (n2's agent registers it as
    // one): the region's tend binds it to the cluster without being asked.
    let mut n2 = nodes[2].clone();
    n2.spare = true;
    let req = RegisterRequest {
        agent_id: "agent-n2".into(),
        boot_id: fleet.boots[2],
        executor: "sim".into(),
        nodes: vec![n2],
        host_id: None,
    };
    store.admit_as_registered(&req).await.unwrap();
    store.register_agent(&req).await.unwrap();
    let t = store.tend_clusters().await.unwrap();
    assert_eq!(t.healed, 1, "{t:?}");
    let c4 = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!(c4.state, ClusterState::Ready, "{c4:?}");
    assert_eq!(members(&c4).len(), 2);
    assert_eq!(kinds(&c4).last(), Some(&"spare_swapped"));
}

#[tokio::test]
async fn a_resize_keeps_the_cluster_tight_and_a_delete_stops_its_jobs_first() {
    let (store, client) = store("clusters_resize").await;
    // l0: n0–n2, l1: n3–n5.
    let (fleet, _) = fleet(&store, &[(3, 0), (3, 0)]).await;
    // Both leaves fit 2 nodes as well: the first by name, its first nodes.
    let c = create(&store, "acme", None, spec(2, TopologyLevel::Spine))
        .await
        .unwrap();
    assert_eq!(members(&c), ["n0", "n1"]);
    // Growing by one takes l0's last node, not l1's free ones.
    let g = store
        .resize_cluster(
            Who::Tenant("acme"),
            c.id,
            None,
            &ClusterResize { nodes: 3 },
            AGENT_TIMEOUT,
        )
        .await
        .unwrap();
    assert_eq!(members(g.cluster()), ["n0", "n1", "n2"]);
    assert_eq!(g.cluster().placement_level, TopologyLevel::Leaf);
    // Shared work lands outside the cluster, on l1.
    let shared = submit(&store, &job_on(8, None)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    act(&store, &fleet, 0..6, None).await;
    assert!(nodes_of(&store, shared)
        .await
        .iter()
        .all(|n| ["n3", "n4", "n5"].contains(&n.as_str())));

    // A 16-GPU job runs on two members; shrinking to one gives back the
    // idle member at once, and a busy one only after its job moved.
    let id = submit(&store, &job_on(16, Some(c.id))).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    act(&store, &fleet, 0..6, None).await;
    let busy = nodes_of(&store, id).await;
    let s = store
        .resize_cluster(
            Who::Tenant("acme"),
            c.id,
            None,
            &ClusterResize { nodes: 1 },
            AGENT_TIMEOUT,
        )
        .await
        .unwrap();
    let s = s.cluster();
    assert_eq!(s.state, ClusterState::Resizing, "{s:?}");
    assert_eq!(s.members.len(), 2, "the idle member left at once: {s:?}");
    assert!(s.members.iter().all(|m| busy.contains(&m.node_id)));
    assert_eq!(s.members.iter().filter(|m| m.releasing).count(), 1);
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    // Its job checkpoints and stops; the given-back node leaves; the job
    // waits for a cluster big enough (it asked for two nodes).
    act(&store, &fleet, 0..6, Some("/ckpt/1")).await;
    let t = store.tend_clusters().await.unwrap();
    assert_eq!(t.released, 1, "{t:?}");
    let after = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!((after.state, after.members.len()), (ClusterState::Ready, 1));

    // Back to two; the job runs again; then delete: its job is asked to
    // checkpoint and stop first, its nodes stay bound until it has.
    store
        .resize_cluster(
            Who::Tenant("acme"),
            c.id,
            None,
            &ClusterResize { nodes: 2 },
            AGENT_TIMEOUT,
        )
        .await
        .unwrap();
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    act(&store, &fleet, 0..6, None).await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    let queued = submit(&store, &job_on(16, Some(c.id))).await;
    let d = store
        .delete_cluster(Who::Tenant("acme"), c.id, None)
        .await
        .unwrap();
    assert_eq!(d.cluster().state, ClusterState::Deleting);
    assert_eq!(d.cluster().members.len(), 2, "bound until its jobs are off");
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    assert_eq!(
        store.get_job("acme", queued).await.unwrap().state,
        JobState::Cancelled
    );
    // No new work on a deleting cluster, and no new jobs for it.
    assert!(matches!(
        store.submit(&job_on(8, Some(c.id))).await,
        Err(StoreError::Invalid { code, .. }) if code == codes::INVALID_CLUSTER
    ));
    store.tend_clusters().await.unwrap();
    assert_eq!(bound(&client).await.len(), 2);
    act(&store, &fleet, 0..6, Some("/ckpt/2")).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let t = store.tend_clusters().await.unwrap();
    assert_eq!((t.cancelled, t.deleted, t.released), (1, 1, 2), "{t:?}");
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(
        job.restore_from.as_deref(),
        Some("/ckpt/2"),
        "its checkpoint is kept: {job:?}"
    );
    let gone = store.get_cluster(Some("acme"), c.id).await.unwrap();
    assert_eq!(gone.state, ClusterState::Deleted);
    assert!(bound(&client).await.is_empty());
    assert_eq!(kinds(&gone).last(), Some(&"deleted"));
    // The freed nodes take shared work again.
    let next = submit(&store, &job_on(16, None)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(nodes_of(&store, next).await.len(), 2);
}
