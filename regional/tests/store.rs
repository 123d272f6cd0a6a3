//! The regional store against a real, throwaway PostgreSQL: migrations,
//! generation-checked plans, racing schedulers, and the constraint that
//! makes a double-allocated GPU impossible.

use std::time::Duration;

use gangway_regional::scheduler::run_pass;
use gangway_regional::store::{NewJob, StoreError, SubmitOutcome};
use gangway_regional::Store;
use gangway_sched::{plan, Policy};
use gangway_shared::agent::{AgentGpu, AgentNode, RegisterRequest};
use gangway_shared::api::{JobMode, JobState, TopologyLevel};
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

async fn store(prefix: &str) -> Store {
    let url = gangway_devkit::fresh_database(prefix).await;
    let store = Store::connect(&url, "test-region", 8).unwrap();
    store.migrate().await.unwrap();
    store
}

/// `leaves` leaves × `nodes` nodes × 8 h100 GPUs, one spine, one agent.
async fn register_fleet(store: &Store, leaves: usize, nodes: usize) {
    let mut list = Vec::new();
    for l in 0..leaves {
        for n in 0..nodes {
            let node_id = format!("s0-l{l}-n{n}");
            list.push(AgentNode {
                node_id: node_id.clone(),
                spine: "s0".into(),
                leaf: format!("s0-l{l}"),
                nvlink_domain: node_id.clone(),
                gpu_type: "h100".into(),
                spare: false,
                address: "127.0.0.1".into(),
                gpus: (0..8)
                    .map(|i| AgentGpu {
                        index: i,
                        uuid: format!("GPU-{node_id}-{i}"),
                    })
                    .collect(),
            });
        }
    }
    store
        .register_agent(&RegisterRequest {
            agent_id: "agent-0".into(),
            boot_id: Uuid::new_v4(),
            executor: "sim".into(),
            nodes: list,
        })
        .await
        .unwrap();
}

fn job(tenant: &str, gpus: i32, per: i32) -> NewJob {
    let spec = serde_json::from_value(serde_json::json!({"name": "t", "gpus": gpus,
        "gpu_type": "h100", "estimated_duration_s": 60, "command": ["true"],
        "gpus_per_worker": per}))
    .unwrap();
    NewJob {
        id: Uuid::new_v4(),
        tenant: tenant.into(),
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

async fn raw(store_url_prefix: &str) -> (Store, tokio_postgres::Client) {
    let url = gangway_devkit::fresh_database(store_url_prefix).await;
    let store = Store::connect(&url, "test-region", 8).unwrap();
    store.migrate().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (store, client)
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_again() {
    let (store, client) = raw("migrate").await;
    // Twice more, concurrently: the advisory lock serialises them.
    let (a, b) = tokio::join!(store.migrate(), store.migrate());
    a.unwrap();
    b.unwrap();
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables
             WHERE table_schema = 'public' AND table_name IN
               ('jobs', 'workers', 'allocations', 'nodes', 'gpus', 'agents', 'job_events', 'quotas', 'sched_state')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 9);
    assert_eq!(store.generation().await.unwrap(), 0);
}

#[tokio::test]
async fn the_database_refuses_a_gpu_held_twice() {
    let (store, client) = raw("doublealloc").await;
    register_fleet(&store, 1, 1).await;
    let a = submit(&store, &job("acme", 1, 1)).await;
    let b = submit(&store, &job("acme", 1, 1)).await;
    let insert = "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant, gpu_type, generation)
                  VALUES ($1, 0, 1, 's0-l0-n0', 3, 'acme', 'h100', 1)";
    client.execute(insert, &[&a]).await.unwrap();
    let err = client.execute(insert, &[&b]).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
        "{err}"
    );
    // Once released, the GPU may be allocated again.
    client
        .execute("UPDATE allocations SET released_at = now()", &[])
        .await
        .unwrap();
    client.execute(insert, &[&b]).await.unwrap();
}

#[tokio::test]
async fn a_stale_plan_is_rejected_whole() {
    let store = store("stale").await;
    register_fleet(&store, 1, 2).await;
    let first = submit(&store, &job("acme", 8, 1)).await;
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap();
    let stale = plan(&snap.snapshot, &Policy::default());
    assert_eq!(stale.placements.len(), 1);

    // Another scheduler commits first.
    let o = run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1);
    assert!(!o.stale);
    let generation = store.generation().await.unwrap();

    match store.apply_plan(&stale).await {
        Err(StoreError::StalePlan(_)) => {}
        other => panic!("stale plan applied: {other:?}"),
    }
    // Nothing of it was written.
    assert_eq!(store.generation().await.unwrap(), generation);
    let job = store.get_job("acme", first).await.unwrap();
    assert_eq!(job.state, JobState::Starting);
    assert_eq!(job.workers.iter().filter(|w| w.node.is_some()).count(), 8);
}

#[tokio::test]
async fn a_plan_for_a_job_cancelled_meanwhile_is_rejected() {
    let store = store("cancelled").await;
    register_fleet(&store, 1, 1).await;
    let id = submit(&store, &job("acme", 4, 1)).await;
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap();
    let p = plan(&snap.snapshot, &Policy::default());
    store.cancel_job("acme", id).await.unwrap();
    assert!(matches!(
        store.apply_plan(&p).await,
        Err(StoreError::StalePlan(_))
    ));
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    let (caps, _, _) = store.capacity(AGENT_TIMEOUT).await.unwrap();
    assert_eq!(caps[0].allocated, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_schedulers_never_double_allocate_or_split_a_gang() {
    let (store, client) = raw("race").await;
    register_fleet(&store, 2, 4).await; // 64 GPUs
                                        // 100 jobs asking for 4..32 GPUs: far more than fits.
    let mut ids = Vec::new();
    for i in 0..100 {
        let gpus = [4, 8, 16, 32, 1, 2][i % 6];
        ids.push(
            submit(
                &store,
                &job(if i % 2 == 0 { "acme" } else { "globex" }, gpus, 1),
            )
            .await,
        );
    }
    // Four schedulers race, each running passes as fast as it can.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut stale = 0;
            for _ in 0..10 {
                if run_pass(&s, AGENT_TIMEOUT).await.unwrap().stale {
                    stale += 1;
                }
            }
            stale
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // No GPU held twice (the index forbids it; check the data anyway).
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
    // Every job is whole: all workers placed with their GPUs, or none.
    let mut placed_gpus = 0;
    for (i, id) in ids.iter().enumerate() {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        let job = store.get_job(tenant, *id).await.unwrap();
        let placed = job.workers.iter().filter(|w| w.node.is_some()).count();
        assert!(
            placed == 0 || placed == job.workers.len(),
            "job {id} half placed: {placed} of {}",
            job.workers.len()
        );
        let live: i64 = client
            .query_one(
                "SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL",
                &[id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(live as usize, placed, "allocations match workers for {id}");
        placed_gpus += placed;
    }
    assert!(placed_gpus <= 64);
    // The fleet ends up nearly full: the race did not lose placements.
    assert!(placed_gpus >= 60, "only {placed_gpus} of 64 GPUs placed");
}

#[tokio::test]
async fn idempotent_submit_returns_the_same_job_and_refuses_a_different_spec() {
    let store = store("idem").await;
    register_fleet(&store, 1, 1).await;
    let mut j = job("acme", 2, 1);
    j.idempotency_key = Some("k-1".into());
    j.id = gangway_shared::ids::job_id_for_key("acme", "k-1");
    let a = submit(&store, &j).await;
    match store.submit(&j).await.unwrap() {
        SubmitOutcome::Replayed(job) => assert_eq!(job.id, a),
        SubmitOutcome::Created(_) => panic!("second job created"),
    }
    let mut other = j.clone();
    other.spec.gpus = 4;
    assert!(matches!(
        store.submit(&other).await,
        Err(StoreError::KeyReused)
    ));
    let (jobs, _) = store
        .list_jobs(
            "acme",
            &gangway_regional::store::ListFilter {
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
}

#[tokio::test]
async fn tenants_do_not_see_each_others_jobs() {
    let store = store("isolation").await;
    register_fleet(&store, 1, 1).await;
    let id = submit(&store, &job("acme", 1, 1)).await;
    assert!(matches!(
        store.get_job("globex", id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.cancel_job("globex", id).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.job_events("globex", id).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Queued
    );
}

#[tokio::test]
async fn usage_cuts_allocation_intervals_at_period_boundaries() {
    use chrono::{TimeZone, Utc};
    use gangway_shared::api::{Granularity, UsageGroup};
    let (store, client) = raw("usage").await;
    register_fleet(&store, 1, 1).await;
    let a = submit(&store, &job("acme", 2, 1)).await;
    let b = submit(&store, &job("globex", 1, 1)).await;
    // acme: 2 GPUs from 10:30 to 12:15; globex: 1 GPU from 11:00, still held.
    for (job, rank, gpu, start, end) in [
        (
            a,
            0,
            0,
            "2026-11-02 10:30:00+00",
            Some("2026-11-02 12:15:00+00"),
        ),
        (
            a,
            1,
            1,
            "2026-11-02 10:30:00+00",
            Some("2026-11-02 12:15:00+00"),
        ),
        (b, 0, 2, "2026-11-02 11:00:00+00", None),
    ] {
        client
            .execute(
                "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant,
                                          gpu_type, generation, allocated_at, released_at)
                 SELECT $1, $2, 1, 's0-l0-n0', $3, tenant, 'h100', 1, $4::text::timestamptz,
                        $5::text::timestamptz
                 FROM jobs WHERE job_id = $1",
                &[&job, &rank, &gpu, &start, &end],
            )
            .await
            .unwrap();
    }
    let from = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let to = Utc.with_ymd_and_hms(2026, 11, 3, 0, 0, 0).unwrap();
    let hours = store
        .usage("acme", from, to, Granularity::Hour, UsageGroup::GpuType)
        .await
        .unwrap();
    let got: Vec<(u32, f64)> = hours
        .iter()
        .map(|r| (chrono::Timelike::hour(&r.period_start), r.gpu_seconds))
        .collect();
    assert_eq!(got, vec![(10, 3600.0), (11, 7200.0), (12, 1800.0)]);
    // By day and by job: one row, the whole 2 × 1 h 45 min.
    let by_job = store
        .usage("acme", from, to, Granularity::Day, UsageGroup::Job)
        .await
        .unwrap();
    assert_eq!(by_job.len(), 1);
    assert_eq!(by_job[0].key, a.to_string());
    assert_eq!(by_job[0].gpu_seconds, 2.0 * 6300.0);
    // A window that clips the interval counts only what lies inside.
    let clipped = store
        .usage(
            "acme",
            Utc.with_ymd_and_hms(2026, 11, 2, 11, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(2026, 11, 2, 11, 30, 0).unwrap(),
            Granularity::Hour,
            UsageGroup::Region,
        )
        .await
        .unwrap();
    assert_eq!(clipped.len(), 1);
    assert_eq!(clipped[0].key, "test-region");
    assert_eq!(clipped[0].gpu_seconds, 2.0 * 1800.0);
    // globex's live allocation counts up to now; acme never sees it.
    let g = store
        .usage("globex", from, to, Granularity::Day, UsageGroup::GpuType)
        .await
        .unwrap();
    assert_eq!(g[0].gpu_seconds, 13.0 * 3600.0);
}
