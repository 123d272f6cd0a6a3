//! Scheduling partitions against a real, throwaway PostgreSQL: two GPU
//! types planned and committed independently (a plan for one never goes
//! stale because the other committed), while plans for the same type, a
//! change to the fleet, or a racing second scheduler still make a plan
//! stale, and no GPU is ever allocated twice.

use std::time::Duration;

use gangway_regional::config::Planning;
use gangway_regional::scheduling::{run_partition_pass, run_pass};
use gangway_regional::store::{AdminChange, NewJob, StoreError};
use gangway_regional::Store;
use gangway_sched::{plan, Policy};
mod common;
use common::{register, store, submit};

const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// One spine; leaf 0 holds `nodes` h100 nodes, leaf 1 `nodes` a100 nodes,
/// 8 GPUs each.
async fn register_two_types(store: &Store, nodes: usize) {
    let mut list = Vec::new();
    for (l, ty) in ["h100", "a100"].iter().enumerate() {
        for n in 0..nodes {
            list.push(common::node(
                &format!("s0-l{l}-n{n}"),
                "s0",
                &format!("s0-l{l}"),
                ty,
            ));
        }
    }
    register(store, list).await;
}

fn job(tenant: &str, ty: &str, gpus: i32, per: i32) -> NewJob {
    common::job(tenant, ty, gpus, per)
}

fn planning() -> Planning {
    Planning::with_agent_timeout(AGENT_TIMEOUT)
}

async fn plan_for(store: &Store, ty: &str) -> gangway_sched::Plan {
    let data = store
        .snapshot_partition(ty, AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    assert!(data.snapshot.nodes.iter().all(|n| n.gpu_type == ty));
    assert!(data.snapshot.queue.iter().all(|r| r.gpu_type == ty));
    plan(&data.snapshot, &Policy::default())
}

fn is_stale<T: std::fmt::Debug>(r: Result<T, StoreError>) -> bool {
    match r {
        Err(StoreError::StalePlan(_)) => true,
        Ok(_) => false,
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

#[tokio::test]
async fn one_types_commit_leaves_the_other_types_plan_valid_but_not_its_own() {
    let (store, _client) = store("part_indep").await;
    register_two_types(&store, 3).await;
    let h = submit(&store, &job("acme", "h100", 8, 8)).await;
    let a = submit(&store, &job("acme", "a100", 8, 8)).await;

    // Both pools planned at once; h100 commits first: the a100 plan still
    // applies (one pool never makes the other's plans stale).
    let (ph, pa) = (
        plan_for(&store, "h100").await,
        plan_for(&store, "a100").await,
    );
    assert_eq!(ph.placements.len(), 1);
    assert_eq!(ph.placements[0].job, h.to_string());
    assert_eq!(pa.placements[0].job, a.to_string());
    let gen = store.generation().await.unwrap();
    store.apply_plan(&ph).await.unwrap();
    store.apply_plan(&pa).await.unwrap();
    // The region generation only moves when what may be scheduled does.
    assert_eq!(store.generation().await.unwrap(), gen);

    // Two plans for the same pool: the second is stale, and writes nothing.
    let h2 = submit(&store, &job("acme", "h100", 8, 8)).await;
    let first = plan_for(&store, "h100").await;
    let second = plan_for(&store, "h100").await;
    assert_eq!(first, second);
    store.apply_plan(&first).await.unwrap();
    assert!(is_stale(store.apply_plan(&second).await));
    let placed = store.get_job("acme", h2).await.unwrap();
    assert_eq!(
        placed.workers.iter().filter(|w| w.node.is_some()).count(),
        1
    );

    // A change to the fleet (a cordon) makes plans of every pool stale.
    submit(&store, &job("acme", "a100", 1, 1)).await;
    submit(&store, &job("acme", "h100", 1, 1)).await;
    let (ph, pa) = (
        plan_for(&store, "h100").await,
        plan_for(&store, "a100").await,
    );
    assert_eq!((ph.placements.len(), pa.placements.len()), (1, 1));
    let ctx = store.health_context();
    store
        .set_node_admin(&ctx, "ops", "s0-l1-n1", AdminChange::Cordon, Some("fan"))
        .await
        .unwrap()
        .unwrap();
    assert!(is_stale(store.apply_plan(&ph).await));
    assert!(is_stale(store.apply_plan(&pa).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_scheduled_at_once_with_a_racing_second_scheduler_never_double_allocate() {
    let (store, client) = store("part_race").await;
    register_two_types(&store, 4).await; // 32 h100 + 32 a100 GPUs
    let mut ids = Vec::new();
    for i in 0..120 {
        let ty = if i % 2 == 0 { "h100" } else { "a100" };
        let tenant = if i % 3 == 0 { "acme" } else { "globex" };
        let gpus = [4, 8, 16, 1, 2, 8][i % 6];
        let per = if gpus >= 8 { 8 } else { 1 };
        ids.push((tenant, submit(&store, &job(tenant, ty, gpus, per)).await));
    }
    // The leader's partition loops (one per type) race a second scheduler
    // that plans whole passes, and a third that runs partition passes too.
    let mut tasks = Vec::new();
    for (who, ty) in [(0, "h100"), (0, "a100"), (1, ""), (2, "h100"), (2, "a100")] {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut stale = 0;
            for _ in 0..12 {
                let o = if who == 1 {
                    run_pass(&s, AGENT_TIMEOUT).await.unwrap()
                } else {
                    run_partition_pass(&s, &planning(), ty).await.unwrap()
                };
                stale += usize::from(o.stale);
            }
            stale
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let dup: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT node_id, gpu_index FROM allocations
              WHERE released_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) d",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dup, 0);
    // Every gang whole, on its own type's nodes.
    let mut placed = std::collections::BTreeMap::new();
    for (tenant, id) in &ids {
        let job = store.get_job(tenant, *id).await.unwrap();
        let n = job.workers.iter().filter(|w| w.node.is_some()).count();
        assert!(n == 0 || n == job.workers.len(), "job {id} half placed");
        let wrong: i64 = client
            .query_one(
                "SELECT count(*) FROM allocations a JOIN nodes n USING (node_id)
                 WHERE a.job_id = $1 AND a.released_at IS NULL AND n.gpu_type <> $2",
                &[id, &job.spec.gpu_type],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(wrong, 0, "job {id} placed on another type's nodes");
        if n > 0 {
            *placed.entry(job.spec.gpu_type.clone()).or_insert(0) += job.spec.gpus;
        }
    }
    // Both pools end up nearly full: neither waited on the other.
    for ty in ["h100", "a100"] {
        let gpus = placed.get(ty).copied().unwrap_or(0);
        assert!((28..=32).contains(&gpus), "{ty}: {gpus} of 32 GPUs placed");
    }
}
