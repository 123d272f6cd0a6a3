//! The regional store against a real, throwaway PostgreSQL: migrations,
//! generation-checked plans, racing schedulers, the constraint that makes a
//! double-allocated GPU impossible, quotas as fair-share terms,
//! preemption carried out from a plan, and per-tenant admission limits.

mod common;

use std::time::Duration;

use axum::http::Method;
use gangway_regional::config::{HistoryOptions, Planning};
use gangway_regional::scheduling::{dry_run, explain, run_pass, run_pass_with};
use gangway_regional::store::{NewJob, StopTiming, StoreError, SubmitOutcome};
use gangway_regional::{RegionConfig, Store};
use gangway_sched::{plan, Plan, Policy, PreemptCause, Preemption};
use gangway_shared::agent::{
    AgentGpu, AgentNode, Assignment, Desired, RegisterRequest, SyncRequest, WorkerReport,
    WorkerStatus,
};
use gangway_shared::api::{
    JobMode, JobSpec, JobState, LimitTerms, Priority, Quota, QuotaTerms, QuotaUpdate,
    TopologyLevel, WorkerState,
};
use gangway_shared::client::Client;
use serde_json::json;
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

async fn store(prefix: &str) -> Store {
    let url = gangway_devkit::fresh_database(prefix).await;
    let store = Store::connect(&url, "test-region", 8).unwrap();
    store.migrate().await.unwrap();
    store
}

/// `leaves` leaves × `nodes` nodes × 8 h100 GPUs, one spine, one agent;
/// returns the agent's boot id.
async fn register_fleet(store: &Store, leaves: usize, nodes: usize) -> Uuid {
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
                        ..AgentGpu::default()
                    })
                    .collect(),
                gpu_power_w: None,
                rack_power_budget_w: None,
            });
        }
    }
    let boot_id = Uuid::new_v4();
    let req = RegisterRequest {
        agent_id: "agent-0".into(),
        boot_id,
        executor: "sim".into(),
        nodes: list,
        host_id: None,
    };
    store.admit_as_registered(&req).await.unwrap();
    store.register_agent(&req).await.unwrap();
    boot_id
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
    let insert = "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant, gpu_type, placement_seq)
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

/// A keyed create that claims its key in its own commit
/// (`Store::submit_claiming`, the global tier's merged claim) makes the job
/// only where the claim is this region's: a claim for another region,
/// made before or committed by a concurrent claimer while the create
/// waited on it, leaves nothing behind; the global tier then goes where
/// the claim says.
#[tokio::test]
async fn a_create_that_claims_its_key_makes_nothing_where_another_region_holds_the_claim() {
    let url = gangway_devkit::fresh_database("claimhere").await;
    let store = Store::connect(&url, "test-region", 8).unwrap();
    store.migrate().await.unwrap();
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    };
    let client = connect().await;
    register_fleet(&store, 1, 1).await;
    let keyed = |key: &str| {
        let mut j = job("acme", 2, 1);
        j.idempotency_key = Some(key.into());
        j.id = gangway_shared::ids::job_id_for_key("acme", key);
        j
    };
    let jobs_with = |id: Uuid| {
        let client = &client;
        async move {
            let row = client
                .query_one("SELECT count(*) FROM jobs WHERE job_id = $1", &[&id])
                .await
                .unwrap();
            row.get::<_, i64>(0)
        }
    };

    // Made here, and the claim says so to anyone claiming later.
    let a = keyed("k-a");
    let (made, held) = store.submit_claiming(&a).await.unwrap();
    assert!(matches!(made, SubmitOutcome::Created(_)) && held);
    assert_eq!(
        store.claim(a.id, "acme", "us-west").await.unwrap(),
        "test-region"
    );
    // A retry claims and replays.
    let (again, held) = store.submit_claiming(&a).await.unwrap();
    assert!(matches!(again, SubmitOutcome::Replayed(_)) && held);

    // Claimed here before (a claim call, then this create): made.
    let b = keyed("k-b");
    store.claim(b.id, "acme", "test-region").await.unwrap();
    let (made, _) = store.submit_claiming(&b).await.unwrap();
    assert!(matches!(made, SubmitOutcome::Created(_)));

    // Claimed for another region before: nothing made.
    let c = keyed("k-c");
    store.claim(c.id, "acme", "us-west").await.unwrap();
    assert!(matches!(
        store.submit_claiming(&c).await,
        Err(StoreError::ClaimedElsewhere)
    ));
    assert_eq!(jobs_with(c.id).await, 0);

    // A concurrent claimer's claim for another region, not yet committed
    // when the create starts: the create waits for it, then makes nothing.
    let d = keyed("k-d");
    let mut other = connect().await;
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO idempotency_claims (job_id, tenant, region) VALUES ($1, 'acme', 'us-west')",
        &[&d.id],
    )
    .await
    .unwrap();
    let racing = {
        let (store, d) = (store.clone(), d.clone());
        tokio::spawn(async move { store.submit_claiming(&d).await })
    };
    // The create is waiting on the claim's row.
    let waits = "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%idempotency_claims%'";
    for _ in 0..200 {
        if client.query_one(waits, &[]).await.unwrap().get::<_, i64>(0) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !racing.is_finished(),
        "the create did not wait for the claim"
    );
    tx.commit().await.unwrap();
    assert!(matches!(
        racing.await.unwrap(),
        Err(StoreError::ClaimedElsewhere)
    ));
    assert_eq!(jobs_with(d.id).await, 0);
    assert_eq!(
        store.claim(d.id, "acme", "test-region").await.unwrap(),
        "us-west"
    );
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
    for (job, rank, gpu, start) in [
        (a, 0, 0, "2026-11-02 10:30:00+00"),
        (a, 1, 1, "2026-11-02 10:30:00+00"),
        (b, 0, 2, "2026-11-02 11:00:00+00"),
    ] {
        client
            .execute(
                "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant,
                                          gpu_type, placement_seq, allocated_at)
                 SELECT $1, $2, 1, 's0-l0-n0', $3, tenant, 'h100', 1, $4::text::timestamptz
                 FROM jobs WHERE job_id = $1",
                &[&job, &rank, &gpu, &start],
            )
            .await
            .unwrap();
    }
    // acme's placements end: the database writes their ledger rows.
    client
        .execute(
            "UPDATE allocations SET released_at = '2026-11-02 12:15:00+00',
                                    release_reason = 'succeeded'
             WHERE job_id = $1",
            &[&a],
        )
        .await
        .unwrap();
    let from = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let to = Utc.with_ymd_and_hms(2026, 11, 3, 0, 0, 0).unwrap();
    let usage = |tenant: &'static str, from, to, g, group| {
        let store = store.clone();
        async move {
            let u = store.usage(tenant, from, to, g, group, None).await.unwrap();
            assert!(u.held_for.is_empty());
            u.own
        }
    };
    let hours = usage("acme", from, to, Granularity::Hour, UsageGroup::GpuType).await;
    let got: Vec<(u32, f64)> = hours
        .iter()
        .map(|r| (chrono::Timelike::hour(&r.period_start), r.gpu_seconds))
        .collect();
    assert_eq!(got, vec![(10, 3600.0), (11, 7200.0), (12, 1800.0)]);
    // Ended: all billed, none pending.
    assert!(hours
        .iter()
        .all(|r| r.billed_gpu_seconds == r.gpu_seconds && r.pending_gpu_seconds == 0.0));
    // By day and by job: one row, the whole 2 × 1 h 45 min.
    let by_job = usage("acme", from, to, Granularity::Day, UsageGroup::Job).await;
    assert_eq!(by_job.len(), 1);
    assert_eq!(by_job[0].key, a.to_string());
    assert_eq!(by_job[0].gpu_seconds, 2.0 * 6300.0);
    // A window that clips the interval counts only what lies inside.
    let clipped = usage(
        "acme",
        Utc.with_ymd_and_hms(2026, 11, 2, 11, 0, 0).unwrap(),
        Utc.with_ymd_and_hms(2026, 11, 2, 11, 30, 0).unwrap(),
        Granularity::Hour,
        UsageGroup::Region,
    )
    .await;
    assert_eq!(clipped.len(), 1);
    assert_eq!(clipped[0].key, "test-region");
    assert_eq!(clipped[0].gpu_seconds, 2.0 * 1800.0);
    // globex's live allocation counts up to now, not metered yet; acme
    // never sees it.
    let g = usage("globex", from, to, Granularity::Day, UsageGroup::GpuType).await;
    assert_eq!(g[0].gpu_seconds, 13.0 * 3600.0);
    assert_eq!(g[0].pending_gpu_seconds, 13.0 * 3600.0);
    assert_eq!(g[0].billed_gpu_seconds, 0.0);
    // Once metered, the same time is billed: nothing counted twice.
    store
        .meter_usage(Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap())
        .await
        .unwrap();
    let g = usage("globex", from, to, Granularity::Day, UsageGroup::GpuType).await;
    assert_eq!(g[0].gpu_seconds, 13.0 * 3600.0);
    assert_eq!(g[0].billed_gpu_seconds, 13.0 * 3600.0);
    assert_eq!(g[0].pending_gpu_seconds, 0.0);
}

// ---------------------------------------------------------------------------
// Fair sharing and preemption: quotas as terms, the snapshot's shares and
// running units, and the plan's preemptions carried out.

const TIMING: StopTiming = StopTiming {
    grace_period_s: 2,
    checkpoint_deadline_s: 10,
};

/// A job of this priority that expects to run an hour (so nothing waiting
/// for it starts soon anyway).
fn job_at(tenant: &str, gpus: i32, per: i32, priority: Priority) -> NewJob {
    let mut j = job(tenant, gpus, per);
    j.spec.estimated_duration_s = 3600;
    j.spec.priority = priority;
    j.priority = priority.rank() as i16;
    j
}

/// Syncs as the agent would: every worker the region wants running is
/// reported running; every worker asked to checkpoint exits with
/// `checkpoint`. Returns the assignments the region gave.
async fn agent_sync(store: &Store, boot: Uuid, checkpoint: Option<&str>) -> Vec<Assignment> {
    let wanted = store
        .sync_agent(
            "agent-0",
            &SyncRequest {
                logs: Vec::new(),
                boot_id: boot,
                workers: Vec::new(),
                nodes: Vec::new(),
                checkpoints: None,
            },
            TIMING,
        )
        .await
        .unwrap()
        .assignments;
    let reports = wanted
        .iter()
        .map(|a| WorkerReport {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
            status: match a.desired {
                Desired::Run => WorkerStatus::Running,
                _ => WorkerStatus::Exited {
                    exit_code: Some(0),
                    signal: None,
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
    let after = store
        .sync_agent(
            "agent-0",
            &SyncRequest {
                logs: Vec::new(),
                boot_id: boot,
                workers: reports,
                nodes: Vec::new(),
                checkpoints: None,
            },
            TIMING,
        )
        .await
        .unwrap()
        .assignments;
    // A worker heard running is listed started: the agent need not report
    // it again while it runs on.
    for a in &after {
        let ran = (wanted.iter()).any(|w| {
            (w.job_id, w.rank, w.attempt) == (a.job_id, a.rank, a.attempt)
                && w.desired == Desired::Run
        });
        assert_eq!(a.started, ran, "{a:?}");
    }
    wanted
}

/// The region's defaults, with no minimum run time so that a job placed a
/// moment ago may be preempted.
fn planning() -> Planning {
    let mut p = Planning::with_agent_timeout(AGENT_TIMEOUT);
    p.policy.preemption.min_run_s = 0;
    p
}

async fn preempted_for(client: &tokio_postgres::Client, id: Uuid) -> Option<String> {
    client
        .query_one("SELECT preempted_for FROM jobs WHERE job_id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

fn terms(guaranteed: i64, max: Option<i64>, weight: Option<f64>) -> QuotaTerms {
    QuotaUpdate {
        guaranteed_gpus: guaranteed,
        max_gpus: max,
        weight,
    }
    .check()
    .unwrap()
}

#[tokio::test]
async fn quotas_feed_the_snapshot_as_caps_guarantees_weights_and_decayed_history() {
    let (store, client) = raw("shares").await;
    register_fleet(&store, 1, 1).await;
    store
        .set_quota("acme", "h100", &terms(4, Some(8), Some(2.0)))
        .await
        .unwrap();
    store
        .set_quota("globex", "h100", &terms(2, None, None))
        .await
        .unwrap();
    let listed = store.list_quotas().await.unwrap();
    assert_eq!(
        listed,
        vec![
            Quota {
                tenant: "acme".into(),
                gpu_type: "h100".into(),
                guaranteed_gpus: 4,
                max_gpus: Some(8),
                weight: 2.0,
            },
            Quota {
                tenant: "globex".into(),
                gpu_type: "h100".into(),
                guaranteed_gpus: 2,
                max_gpus: None,
                weight: 1.0,
            },
        ]
    );

    // acme has held one GPU for a day (one half-life): half of the decayed
    // average. globex held one from two days ago to one day ago: a quarter.
    // initech held one long ago, beyond the look-back: nothing.
    let a = submit(&store, &job("acme", 1, 1)).await;
    let b = submit(&store, &job("globex", 1, 1)).await;
    let c = submit(&store, &job("initech", 1, 1)).await;
    for (job, gpu, start, end) in [
        (a, 0, "1 day", None),
        (b, 1, "2 days", Some("1 day")),
        (c, 2, "30 days", Some("29 days")),
    ] {
        client
            .execute(
                "INSERT INTO allocations (job_id, rank, attempt, node_id, gpu_index, tenant,
                                          gpu_type, placement_seq, allocated_at, released_at)
                 SELECT $1, 0, 1, 's0-l0-n0', $2, tenant, 'h100', 1,
                        now() - $3::text::interval, now() - $4::text::interval
                 FROM jobs WHERE job_id = $1",
                &[&job, &gpu, &start, &end],
            )
            .await
            .unwrap();
    }
    let history = HistoryOptions {
        half_life: Duration::from_secs(24 * 3600),
        refresh: Duration::ZERO,
    };
    let snap = store
        .snapshot_with(AGENT_TIMEOUT, history)
        .await
        .unwrap()
        .snapshot;
    let key = |t: &str| (t.to_string(), "h100".to_string());
    // Only a cap is a hard limit.
    assert_eq!(snap.quotas, [(key("acme"), 8)].into_iter().collect());
    let acme = snap.shares[&key("acme")];
    assert_eq!((acme.guaranteed, acme.weight), (4, 2000));
    assert!((499..=501).contains(&acme.history), "{acme:?}");
    let globex = snap.shares[&key("globex")];
    assert_eq!((globex.guaranteed, globex.weight), (2, 1000));
    assert!((249..=251).contains(&globex.history), "{globex:?}");
    assert!(!snap.shares.contains_key(&key("initech")));
    // The running unit: started when its allocation was made.
    let running = snap
        .running
        .iter()
        .find(|r| r.job == a.to_string())
        .unwrap();
    assert!(
        snap.now.abs_diff(running.started + 24 * 3600) <= 2,
        "{running:?} at {}",
        snap.now
    );
    assert_eq!(
        (
            running.checkpointed,
            running.preemptions,
            &running.preempted_for
        ),
        (None, 0, &None)
    );
    // A shorter half-life makes the same day weigh less.
    let snap = store
        .snapshot_with(
            AGENT_TIMEOUT,
            HistoryOptions {
                half_life: Duration::from_secs(12 * 3600),
                ..history
            },
        )
        .await
        .unwrap()
        .snapshot;
    let acme = snap.shares[&key("acme")];
    assert!((749..=751).contains(&acme.history), "{acme:?}");

    // Removing acme's terms removes its cap and guarantee.
    assert!(store.delete_quota("acme", "h100").await.unwrap());
    let snap = store
        .snapshot_with(AGENT_TIMEOUT, history)
        .await
        .unwrap()
        .snapshot;
    assert!(snap.quotas.is_empty());
    assert_eq!(snap.shares[&key("acme")].guaranteed, 0);
    assert_eq!(snap.shares[&key("acme")].weight, 1000);
}

#[tokio::test]
async fn a_planned_preemption_checkpoints_the_victim_and_skips_jobs_no_longer_running() {
    let (store, client) = raw("applypreempt").await;
    let boot = register_fleet(&store, 1, 2).await; // 16 GPUs
    let low = submit(&store, &job_at("acme", 16, 8, Priority::Low)).await;
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    agent_sync(&store, boot, None).await;
    assert_eq!(
        store.get_job("acme", low).await.unwrap().state,
        JobState::Running
    );
    let normal = submit(&store, &job_at("globex", 8, 8, Priority::Normal)).await;
    let gone = Uuid::new_v4();

    // Made by hand, against the state as a scheduler reads it.
    let read = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let preemption = |victim: Uuid| Preemption {
        job: victim.to_string(),
        for_job: normal.to_string(),
        cause: PreemptCause::Priority,
        at_risk_gpu_s: 1234,
        gpus: 16,
    };
    let planned = Plan {
        generation: read.generation,
        partitions: read.partitions.clone(),
        // A queued job and a job that does not exist are not running: both
        // are skipped, and the victim that is running is preempted.
        preemptions: vec![preemption(normal), preemption(gone), preemption(low)],
        ..Plan::default()
    };
    let applied = store.apply_plan(&planned).await.unwrap();
    assert_eq!(applied.preempted, vec![(low, PreemptCause::Priority)]);
    assert_eq!(applied.placed_workers, 0);
    let job = store.get_job("acme", low).await.unwrap();
    assert_eq!(job.state, JobState::Preempting);
    assert_eq!(job.preemptions, 1);
    assert!(job
        .workers
        .iter()
        .all(|w| w.state == WorkerState::Checkpointing));
    assert_eq!(
        store.get_job("globex", normal).await.unwrap().state,
        JobState::Queued
    );
    let events = store.job_events("acme", low).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.kind, "preempted");
    assert_eq!(last.detail["cause"], "priority");
    assert_eq!(last.detail["for_job"], normal.to_string());
    assert_eq!(last.detail["at_risk_gpu_s"], 1234);
    assert!(
        last.message.contains(&normal.to_string()),
        "{}",
        last.message
    );
    assert_eq!(preempted_for(&client, low).await, Some(normal.to_string()));
    // The snapshot shows the preemption in flight, so a pass does not choose
    // the victim again.
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let r = snap
        .running
        .iter()
        .find(|r| r.job == low.to_string())
        .unwrap();
    assert_eq!(
        r.preempted_for.as_deref(),
        Some(normal.to_string().as_str())
    );
    assert_eq!(r.preemptions, 1);
    // The same plan again is stale: nothing more happens.
    assert!(matches!(
        store.apply_plan(&planned).await,
        Err(StoreError::StalePlan(_))
    ));
    assert_eq!(store.get_job("acme", low).await.unwrap().preemptions, 1);

    // The agent asks the workers to checkpoint; they write one and stop.
    let asked = agent_sync(&store, boot, Some("/ckpt/step-7")).await;
    assert!(asked
        .iter()
        .filter(|a| a.job_id == low)
        .all(|a| a.desired == Desired::Checkpoint && a.checkpoint_deadline_s == 10));
    let job = store.get_job("acme", low).await.unwrap();
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/step-7"));
    assert_eq!(preempted_for(&client, low).await, None);
    let kinds: Vec<String> = store
        .job_events("acme", low)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["queued", "placed", "started", "preempted", "requeued"]
    );
    let checkpointed: bool = client
        .query_one(
            "SELECT checkpointed_at > now() - interval '1 minute' FROM jobs WHERE job_id = $1",
            &[&low],
        )
        .await
        .unwrap()
        .get(0);
    assert!(checkpointed);
    // Its GPUs are free: the normal job is placed by the next pass.
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    assert_eq!(
        store.get_job("globex", normal).await.unwrap().state,
        JobState::Starting
    );
}

#[tokio::test]
async fn an_operator_preemption_is_recorded_as_one() {
    let (store, client) = raw("operatorpreempt").await;
    let boot = register_fleet(&store, 1, 1).await;
    let id = submit(&store, &job("acme", 8, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    agent_sync(&store, boot, None).await;
    assert!(store
        .preempt_job(id, "requested by an operator")
        .await
        .unwrap());
    assert_eq!(preempted_for(&client, id).await.as_deref(), Some(""));
    let last = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert_eq!(last.detail["cause"], "operator");
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert_eq!(snap.running[0].preempted_for.as_deref(), Some(""));
    // Not running any more: refused, nothing changes.
    assert!(!store.preempt_job(id, "again").await.unwrap());
    assert_eq!(store.get_job("acme", id).await.unwrap().preemptions, 1);
}

/// Reports `job`'s workers as exited, each `(rank, exit code, unasked)`:
/// `unasked`, the agent had passed on no request to stop it.
async fn report_ends(
    store: &Store,
    boot: Uuid,
    wanted: &[Assignment],
    job: Uuid,
    ends: &[(u32, i32, bool)],
) {
    let workers = ends
        .iter()
        .map(|&(rank, code, unasked)| {
            let a = wanted
                .iter()
                .find(|a| a.job_id == job && a.rank == rank)
                .expect("an assignment for the worker");
            json!({"job_id": job, "rank": rank, "attempt": a.attempt, "status": "exited",
                   "exit_code": code, "unasked": unasked})
        })
        .collect::<Vec<_>>();
    let req: SyncRequest =
        serde_json::from_value(json!({"boot_id": boot, "workers": workers})).unwrap();
    store.sync_agent("agent-0", &req, TIMING).await.unwrap();
}

/// Workers of `job` in each state, by name.
async fn worker_states(client: &tokio_postgres::Client, job: Uuid) -> Vec<String> {
    client
        .query(
            "SELECT state::text FROM workers WHERE job_id = $1 ORDER BY rank",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn a_job_that_ended_before_a_fence_reached_it_finishes_instead_of_running_again() {
    let (store, client) = raw("endedunasked").await;
    let boot = register_fleet(&store, 1, 2).await;
    let id = submit(&store, &job("acme", 16, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let wanted = agent_sync(&store, boot, None).await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    // Both workers exit 0 by themselves; before their agent reports it,
    // the region fences and asks the job to checkpoint and stop.
    assert_eq!(store.fence_jobs().await.unwrap(), 1);
    report_ends(&store, boot, &wanted, id, &[(0, 0, true), (1, 0, true)]).await;
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    assert_eq!(worker_states(&client, id).await, ["succeeded", "succeeded"]);
    assert_eq!(common::live_gpus(&client, id).await, 0);
    let last = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert_eq!(last.kind, "finished", "{last:?}");
    // Nothing of it is placed again.
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 0);
}

#[tokio::test]
async fn a_gang_stopped_while_one_rank_ended_by_itself_runs_again_whole() {
    let (store, client) = raw("partlyended").await;
    let boot = register_fleet(&store, 1, 2).await;
    let id = submit(&store, &job("acme", 16, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let wanted = agent_sync(&store, boot, None).await;
    assert!(store.preempt_job(id, "an operator asked").await.unwrap());
    // Rank 1 had ended by itself; rank 0 checkpointed and stopped as
    // asked (exit 0 too, as a script that catches SIGTERM does). And an
    // agent from before `unasked` says nothing of why its worker ended:
    // that exit is a stop, as it always was.
    report_ends(&store, boot, &wanted, id, &[(0, 0, false), (1, 0, true)]).await;
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Queued, "{j:?}");
    assert_eq!(worker_states(&client, id).await, ["pending", "pending"]);
    assert_eq!(common::live_gpus(&client, id).await, 0);
    // Placed again with both ranks, as a gang.
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    assert_eq!(worker_states(&client, id).await, ["assigned", "assigned"]);
}

#[tokio::test]
async fn the_quota_api_refuses_bad_terms_and_changes_nothing() {
    let url = gangway_devkit::fresh_database("quotaapi").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = gangway_regional::prepare(
        RegionConfig::new("test", addr, &url),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(
        listener,
        state,
        shutdown.clone(),
    ));
    let c = Client::new(format!("http://{addr}"), "acme");
    let put = |body: serde_json::Value| {
        let c = c.clone();
        async move {
            c.call_json(Method::PUT, "/v1/admin/quotas/acme/h100", Some(&body))
                .await
        }
    };
    let ok = put(json!({"guaranteed_gpus": 8, "max_gpus": 16, "weight": 1.5}))
        .await
        .unwrap();
    assert_eq!(
        ok,
        json!({"tenant": "acme", "gpu_type": "h100", "guaranteed_gpus": 8,
               "max_gpus": 16, "weight": 1.5})
    );
    let cases = [
        (json!({"guaranteed_gpus": -1}), 422, "invalid_gpus"),
        (json!({"guaranteed_gpus": 20_000_000}), 422, "invalid_gpus"),
        (
            json!({"guaranteed_gpus": 1, "max_gpus": -5}),
            422,
            "invalid_gpus",
        ),
        (
            json!({"guaranteed_gpus": 8, "max_gpus": 4}),
            422,
            "invalid_quota",
        ),
        (
            json!({"guaranteed_gpus": 8, "weight": 0}),
            422,
            "invalid_quota",
        ),
        (
            json!({"guaranteed_gpus": 8, "weight": -1.0}),
            422,
            "invalid_quota",
        ),
        (
            json!({"guaranteed_gpus": 8, "weight": 0.0001}),
            422,
            "invalid_quota",
        ),
        (
            json!({"guaranteed_gpus": 8, "weight": 1e9}),
            422,
            "invalid_quota",
        ),
        (json!({"max_gpus": 8}), 422, "invalid_spec"),
        (json!({"guaranteed_gpus": "8"}), 422, "invalid_spec"),
        (
            json!({"guaranteed_gpus": 8, "surprise": 1}),
            422,
            "invalid_spec",
        ),
        (json!([8]), 422, "invalid_spec"),
    ];
    for (body, status, code) in cases {
        let e = match put(body.clone()).await {
            Ok(v) => panic!("{body} accepted: {v}"),
            Err(e) => e,
        };
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(status), Some(code)),
            "{body}"
        );
    }
    let e = c
        .call_json(
            Method::PUT,
            "/v1/admin/quotas/Not%20A%20Tenant/h100",
            Some(&json!({"guaranteed_gpus": 1})),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("invalid_spec"));
    // Nothing of it was stored.
    let listed = c.list_quotas().await.unwrap().quotas;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].guaranteed_gpus,
            listed[0].max_gpus,
            listed[0].weight
        ),
        (8, Some(16), 1.5)
    );
    // A PUT replaces the terms: what it leaves out takes its default.
    let replaced = c
        .set_quota(
            "acme",
            "h100",
            &QuotaUpdate {
                guaranteed_gpus: 4,
                max_gpus: None,
                weight: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (replaced.guaranteed_gpus, replaced.max_gpus, replaced.weight),
        (4, None, 1.0)
    );
    assert_eq!(c.list_quotas().await.unwrap().quotas, vec![replaced]);
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_waiting_normal_job_preempts_a_low_priority_one_and_no_more_while_it_stops() {
    let (store, client) = raw("prioritypreempt").await;
    let boot = register_fleet(&store, 1, 3).await; // 24 GPUs
    let planning = planning();
    let big = submit(&store, &job_at("acme", 16, 8, Priority::Low)).await;
    let small = submit(&store, &job_at("acme", 8, 8, Priority::Low)).await;
    assert_eq!(
        run_pass_with(&store, &planning).await.unwrap().placements,
        2
    );
    agent_sync(&store, boot, None).await;

    // A dry run of a normal job says which job it would preempt.
    let spec: JobSpec = serde_json::from_value(json!({"name": "n", "gpus": 8,
        "gpus_per_worker": 8, "gpu_type": "h100", "estimated_duration_s": 60,
        "command": ["true"]}))
    .unwrap();
    let d = dry_run(&store, "globex", &spec, &planning).await.unwrap();
    assert_eq!(d.code, "waiting_for_preemption", "{d:?}");
    assert_eq!(d.would_preempt.len(), 1, "{d:?}");
    assert!([big, small].contains(&d.would_preempt[0]));
    assert!(d.estimated_start.is_some());
    // Nothing was written.
    for id in [big, small] {
        assert_eq!(
            store.get_job("acme", id).await.unwrap().state,
            JobState::Running
        );
    }

    let normal = submit(&store, &job_at("globex", 8, 8, Priority::Normal)).await;
    let first = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((first.placements, first.preempted), (0, 1), "{first:?}");
    let mut victims = Vec::new();
    for id in [big, small] {
        if store.get_job("acme", id).await.unwrap().state == JobState::Preempting {
            victims.push(id);
        }
    }
    assert_eq!(victims.len(), 1, "exactly one victim");
    let victim = victims[0];
    let last = store
        .job_events("acme", victim)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(last.kind, "preempted");
    assert_eq!(last.detail["cause"], "priority");
    assert_eq!(last.detail["for_job"], normal.to_string());
    assert_eq!(
        preempted_for(&client, victim).await,
        Some(normal.to_string())
    );

    // While the victim stops, later passes choose no more victims for the
    // same job, and explain says what it waits for.
    for _ in 0..2 {
        let again = run_pass_with(&store, &planning).await.unwrap();
        assert_eq!((again.placements, again.preempted), (0, 0), "{again:?}");
    }
    let running = [big, small].iter().filter(|&&id| id != victim).count();
    assert_eq!(running, 1);
    let e = explain(&store, "globex", normal, &planning).await.unwrap();
    assert_eq!(e.code, "waiting_for_preemption", "{e:?}");
    assert!(e.message.contains(&victim.to_string()), "{}", e.message);
    assert!(e.estimated_start.is_some());
    let e = explain(&store, "acme", victim, &planning).await.unwrap();
    assert_eq!(e.code, "preempting", "{e:?}");

    // The victim checkpoints and stops; the normal job takes its GPUs.
    agent_sync(&store, boot, Some("/ckpt/1")).await;
    assert_eq!(
        store.get_job("acme", victim).await.unwrap().state,
        JobState::Queued
    );
    assert_eq!(preempted_for(&client, victim).await, None);
    let placed = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((placed.placements, placed.preempted), (1, 0), "{placed:?}");
    assert_eq!(
        store.get_job("globex", normal).await.unwrap().state,
        JobState::Starting
    );
}

/// `nodes` 8-GPU nodes, acme guaranteed 8 GPUs of them, and globex
/// (guaranteed nothing) borrowing all of them with one normal gang, placed
/// and running: the store, a client of its database, the agent's boot id,
/// globex's job and the planning used.
async fn lent_to_globex(
    name: &str,
    nodes: usize,
) -> (Store, tokio_postgres::Client, Uuid, Uuid, Planning) {
    let (store, client) = raw(name).await;
    let boot = register_fleet(&store, 1, nodes).await;
    store
        .set_quota("acme", "h100", &terms(8, None, None))
        .await
        .unwrap();
    let planning = planning();
    let gpus = 8 * nodes as i32;
    let borrowed = submit(&store, &job_at("globex", gpus, 8, Priority::Normal)).await;
    assert_eq!(
        run_pass_with(&store, &planning).await.unwrap().placements,
        1
    );
    agent_sync(&store, boot, None).await;
    (store, client, boot, borrowed, planning)
}

#[tokio::test]
async fn a_tenant_under_its_guarantee_takes_back_gpus_lent_to_another() {
    // globex is guaranteed nothing but borrows the whole idle fleet.
    let (store, _client, boot, borrowed, planning) = lent_to_globex("reclaim", 2).await;
    // acme, holding nothing of its 8, takes them back.
    let mine = submit(&store, &job_at("acme", 8, 8, Priority::Normal)).await;
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.preempted, 1, "{pass:?}");
    let job = store.get_job("globex", borrowed).await.unwrap();
    assert_eq!(job.state, JobState::Preempting);
    let last = store
        .job_events("globex", borrowed)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(last.detail["cause"], "reclaim");
    assert_eq!(last.detail["for_job"], mine.to_string());
    agent_sync(&store, boot, Some("/ckpt/g")).await;
    run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(
        store.get_job("acme", mine).await.unwrap().state,
        JobState::Starting
    );
    // A tenant with no guarantee cannot do the same: globex's job waits.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.preempted, 0, "{pass:?}");
    assert_eq!(
        store.get_job("acme", mine).await.unwrap().state,
        JobState::Starting
    );
}

#[tokio::test]
async fn what_a_reclaim_frees_goes_to_the_job_that_reclaimed_it_not_to_a_higher_class() {
    let (store, client, boot, borrowed, planning) = lent_to_globex("reclaimclaim", 1).await;
    // acme's low job takes its guarantee back, and with it the first claim
    // on what the victim frees (twice the checkpoint deadline).
    let mine = submit(&store, &job_at("acme", 8, 8, Priority::Low)).await;
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.preempted, 1, "{pass:?}");
    let claim_s: f64 = client
        .query_one(
            "SELECT extract(epoch FROM claim_until - now())::float8 FROM jobs WHERE job_id = $1",
            &[&mine],
        )
        .await
        .unwrap()
        .get(0);
    // (The snapshot's clock is whole seconds, rounded: up to half a second
    // ahead of the database's.)
    let deadline = planning.policy.preemption.checkpoint_deadline_s as f64;
    assert!(
        (2.0 * deadline - 30.0..=2.0 * deadline + 1.0).contains(&claim_s),
        "{claim_s}"
    );
    // The victim checkpoints, stops and queues again: a normal job, a class
    // above acme's low one, and first in line but for the claim.
    agent_sync(&store, boot, Some("/ckpt/g")).await;
    assert_eq!(
        store.get_job("globex", borrowed).await.unwrap().state,
        JobState::Queued
    );
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert!(
        snap.claims.contains_key(&mine.to_string()),
        "{:?}",
        snap.claims
    );
    run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(
        store.get_job("acme", mine).await.unwrap().state,
        JobState::Starting
    );
    assert_eq!(
        store.get_job("globex", borrowed).await.unwrap().state,
        JobState::Queued
    );
}

#[tokio::test]
async fn a_unit_whose_planned_victims_all_stopped_before_the_commit_claims_nothing() {
    let (store, client, _boot, borrowed, _planning) = lent_to_globex("claimskip", 1).await;
    let first = submit(&store, &job_at("acme", 8, 8, Priority::Normal)).await;
    let second = submit(&store, &job_at("acme", 8, 8, Priority::Normal)).await;
    let queued = submit(&store, &job_at("globex", 8, 8, Priority::Normal)).await;
    // Made by hand: `first` reclaims the running job, `second` a job that
    // is no longer running by the commit (queued, as after its own
    // preemption); both were given claims.
    let read = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let reclaim = |victim: Uuid, for_job: Uuid| Preemption {
        job: victim.to_string(),
        for_job: for_job.to_string(),
        cause: PreemptCause::Reclaim,
        at_risk_gpu_s: 0,
        gpus: 8,
    };
    let until = read.now + 240;
    let planned = Plan {
        generation: read.generation,
        partitions: read.partitions.clone(),
        preemptions: vec![reclaim(borrowed, first), reclaim(queued, second)],
        claims: [(first.to_string(), until), (second.to_string(), until)].into(),
        ..Plan::default()
    };
    let applied = store.apply_plan(&planned).await.unwrap();
    assert_eq!(applied.preempted, vec![(borrowed, PreemptCause::Reclaim)]);
    let claimed = |id: Uuid| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT claim_until IS NOT NULL FROM jobs WHERE job_id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(claimed(first).await, "the unit whose victim stops claims");
    assert!(
        !claimed(second).await,
        "no victim of its own stops: no claim"
    );
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert_eq!(
        snap.claims.keys().collect::<Vec<_>>(),
        vec![&first.to_string()]
    );
}

#[tokio::test]
async fn a_checkpoint_reported_by_a_running_worker_is_where_the_work_at_risk_starts() {
    let store = store("runningckpt").await;
    let boot = register_fleet(&store, 1, 1).await;
    let id = submit(&store, &job("acme", 8, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    let wanted = agent_sync(&store, boot, None).await;
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert_eq!(snap.running[0].checkpointed, None);
    let report = |checkpoint: &str| SyncRequest {
        logs: Vec::new(),
        boot_id: boot,
        workers: vec![WorkerReport {
            job_id: id,
            rank: 0,
            attempt: wanted[0].attempt,
            status: WorkerStatus::Running,
            checkpoint: Some(checkpoint.into()),
            fenced: false,
            unasked: false,
        }],
        nodes: Vec::new(),
        checkpoints: None,
    };
    store
        .sync_agent("agent-0", &report("/ckpt/a"), TIMING)
        .await
        .unwrap();
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let at = snap.running[0].checkpointed.expect("checkpoint time");
    assert!(snap.now.abs_diff(at) <= 2, "{at} vs {}", snap.now);
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.restore_from.as_deref(), Some("/ckpt/a"));
}

// ---------------------------------------------------------------------------
// Elastic gangs: start with the workers that fit, grow by a checkpointed
// restart when capacity frees, restart smaller after a preemption.

/// An elastic gang of `gpus` GPUs in workers of `per`, which may run with
/// as few as `min_gpus`.
fn elastic(tenant: &str, gpus: i32, per: i32, min_gpus: i64, priority: Priority) -> NewJob {
    let mut j = job_at(tenant, gpus, per, priority);
    j.spec.min_gpus = Some(min_gpus);
    j
}

/// Reports, as the agent would, how workers ended: (job, rank, exit code)
/// for the attempt the region last assigned.
async fn report_exits(
    store: &Store,
    boot: Uuid,
    wanted: &[Assignment],
    exits: &[(Uuid, u32, i32)],
) {
    let workers: Vec<serde_json::Value> = exits
        .iter()
        .map(|&(job, rank, code)| {
            let a = wanted
                .iter()
                .find(|a| a.job_id == job && a.rank == rank)
                .expect("an assignment for the worker");
            json!({"job_id": job, "rank": rank, "attempt": a.attempt,
                   "status": "exited", "exit_code": code})
        })
        .collect();
    // Built from JSON, so that fields the protocol gains later default.
    let req: SyncRequest =
        serde_json::from_value(json!({"boot_id": boot, "workers": workers})).unwrap();
    store.sync_agent("agent-0", &req, TIMING).await.unwrap();
}

fn of_job(wanted: &[Assignment], job: Uuid) -> Vec<&Assignment> {
    wanted.iter().filter(|a| a.job_id == job).collect()
}

#[tokio::test]
async fn an_elastic_gang_starts_with_the_workers_that_fit_and_only_they_make_its_run() {
    let (store, _client) = raw("elasticstart").await;
    let boot = register_fleet(&store, 1, 4).await; // 32 GPUs
    let planning = planning();
    let blocker = submit(&store, &job_at("globex", 8, 8, Priority::Normal)).await;
    assert_eq!(
        run_pass_with(&store, &planning).await.unwrap().placements,
        1
    );
    agent_sync(&store, boot, None).await;

    // 4 workers of 8 GPUs, at least 2: 3 fit now. A dry run says so.
    let e = elastic("acme", 32, 8, 16, Priority::Normal);
    let d = dry_run(&store, "acme", &e.spec, &planning).await.unwrap();
    assert_eq!(d.code, "would_start", "{d:?}");
    assert!(d.message.contains("with 3 of its 4 workers"), "{d:?}");
    assert_eq!(d.nodes.len(), 3);
    let id = submit(&store, &e).await;
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.placed_workers), (1, 3), "{pass:?}");

    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Starting);
    assert_eq!(job.run_workers, Some(3));
    assert_eq!(job.spec.min_gpus, Some(16));
    let states: Vec<WorkerState> = job.workers.iter().map(|w| w.state).collect();
    use WorkerState::{Assigned, Pending};
    assert_eq!(states, [Assigned, Assigned, Assigned, Pending]);
    assert!(job.workers[3].node.is_none());
    let placed = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert_eq!(placed.kind, "placed");
    assert!(
        placed.message.contains("3 of 4 workers"),
        "{}",
        placed.message
    );
    assert_eq!(placed.detail["world_size"], 3);
    assert_eq!(placed.detail["ranks"], json!([0, 1, 2]));

    // The snapshot: its last rank is not queued, and it runs as an elastic
    // unit of 3 of at most 4 workers.
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    assert!(
        snap.queue.iter().all(|r| r.job != id.to_string()),
        "{:?}",
        snap.queue
    );
    let run = snap
        .running
        .iter()
        .find(|r| r.job == id.to_string())
        .unwrap();
    assert_eq!(
        run.elastic,
        Some(gangway_sched::Elastic {
            workers: 3,
            max_workers: 4,
            gpus_per_worker: 8,
            required: gangway_sched::Level::Region,
        })
    );
    let plain = snap
        .running
        .iter()
        .find(|r| r.job == blocker.to_string())
        .unwrap();
    assert_eq!(plain.elastic, None);

    // Its workers are told the run's world size; the run has started once
    // those 3 run.
    let wanted = agent_sync(&store, boot, None).await;
    let mine = of_job(&wanted, id);
    assert_eq!(mine.len(), 3);
    assert!(mine.iter().all(|a| a.world_size == 3), "{mine:?}");
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Running);
    let e = explain(&store, "acme", id, &planning).await.unwrap();
    assert_eq!(e.code, "running", "{e:?}");
    assert!(e.message.contains("3 of its 4 workers"), "{}", e.message);
    // Nothing more is placed for it, and nothing is idle to grow on.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 0), "{pass:?}");

    // The run's 3 workers succeed: the job has succeeded.
    let exits: Vec<(Uuid, u32, i32)> = (0..3).map(|r| (id, r, 0)).collect();
    report_exits(&store, boot, &wanted, &exits).await;
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.run_workers, Some(3));
    assert_eq!(
        job.workers[3].state,
        WorkerState::Pending,
        "not part of the run"
    );
    let finished = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert!(
        finished.message.contains("3 of 3 worker(s) succeeded"),
        "{}",
        finished.message
    );
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(
        pass.placements, 0,
        "a finished job's other ranks are not queued"
    );

    // Another: one worker of its run fails; the run stops and the job
    // fails, its rank outside the run untouched.
    let failing = submit(&store, &elastic("acme", 32, 8, 8, Priority::Normal)).await;
    assert_eq!(
        run_pass_with(&store, &planning)
            .await
            .unwrap()
            .placed_workers,
        3
    );
    let wanted = agent_sync(&store, boot, None).await;
    assert_eq!(
        store.get_job("acme", failing).await.unwrap().state,
        JobState::Running
    );
    report_exits(&store, boot, &wanted, &[(failing, 1, 3)]).await;
    let job = store.get_job("acme", failing).await.unwrap();
    assert_eq!(job.reason.as_deref(), Some("worker_failed"));
    assert_eq!(job.workers[0].state, WorkerState::Stopping);
    assert_eq!(job.workers[3].state, WorkerState::Pending);
    agent_sync(&store, boot, None).await; // the others stop
    let job = store.get_job("acme", failing).await.unwrap();
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    let finished = store
        .job_events("acme", failing)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(
        finished
            .message
            .contains("0 of 3 worker(s) succeeded, 1 failed"),
        "{}",
        finished.message
    );
    let (caps, _, _) = store.capacity(AGENT_TIMEOUT).await.unwrap();
    assert_eq!(caps[0].allocated, 8, "only the first job's GPUs are held");
}

#[tokio::test]
async fn an_elastic_gang_grows_by_a_checkpointed_restart_when_capacity_frees() {
    let (store, client) = raw("elasticgrow").await;
    let boot = register_fleet(&store, 1, 4).await; // 32 GPUs
    let planning = planning();
    let blocker = submit(&store, &job_at("globex", 16, 8, Priority::Normal)).await;
    run_pass_with(&store, &planning).await.unwrap();
    let id = submit(&store, &elastic("acme", 32, 8, 8, Priority::Normal)).await;
    assert_eq!(
        run_pass_with(&store, &planning)
            .await
            .unwrap()
            .placed_workers,
        2
    );
    let wanted = agent_sync(&store, boot, None).await;
    assert!(of_job(&wanted, id).iter().all(|a| a.world_size == 2));
    assert_eq!(
        store.get_job("acme", id).await.unwrap().run_workers,
        Some(2)
    );
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.preempted, 0, "nothing idle yet: {pass:?}");

    // The other job ends: 16 GPUs idle, which nobody waits for.
    report_exits(&store, boot, &wanted, &[(blocker, 0, 0), (blocker, 1, 0)]).await;
    assert_eq!(
        store.get_job("globex", blocker).await.unwrap().state,
        JobState::Succeeded
    );
    // A dry run meanwhile never lists a restart to grow as a victim.
    let spec: JobSpec = serde_json::from_value(json!({"name": "n", "gpus": 8,
        "gpus_per_worker": 8, "gpu_type": "h100", "estimated_duration_s": 60,
        "command": ["true"]}))
    .unwrap();
    let d = dry_run(&store, "globex", &spec, &planning).await.unwrap();
    assert_eq!(d.code, "would_start", "{d:?}");
    assert!(d.would_preempt.is_empty(), "{d:?}");

    // The scheduler asks the elastic gang to checkpoint and restart larger.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 1), "{pass:?}");
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Preempting);
    let preempted = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert_eq!(preempted.kind, "preempted");
    assert_eq!(preempted.detail["cause"], "grow");
    assert_eq!(preempted.detail["for_job"], id.to_string());
    assert!(
        preempted.message.contains("restart larger"),
        "{}",
        preempted.message
    );
    assert_eq!(preempted_for(&client, id).await, Some(id.to_string()));
    let e = explain(&store, "acme", id, &planning).await.unwrap();
    assert!(e.message.contains("of 2 worker(s) not down yet"), "{e:?}");
    // While it stops, no pass asks again or places its other ranks.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 0), "{pass:?}");

    // It checkpoints and stops; it requeues whole and restarts with all 4
    // workers from its checkpoint.
    let asked = agent_sync(&store, boot, Some("/ckpt/e-1")).await;
    assert!(of_job(&asked, id)
        .iter()
        .all(|a| a.desired == Desired::Checkpoint));
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.run_workers, None);
    assert!(job.workers.iter().all(|w| w.state == WorkerState::Pending));
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.placed_workers), (1, 4), "{pass:?}");
    let wanted = agent_sync(&store, boot, None).await;
    let mine = of_job(&wanted, id);
    assert_eq!(mine.len(), 4);
    for a in &mine {
        assert_eq!(a.world_size, 4);
        assert_eq!(a.restore_from.as_deref(), Some("/ckpt/e-1"));
    }
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!((job.state, job.run_workers), (JobState::Running, Some(4)));
    assert_eq!(job.preemptions, 1);
    let kinds: Vec<String> = (store.job_events("acme", id).await.unwrap().into_iter())
        .map(|e| e.kind)
        .collect();
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
    // The restart to grow does not count against the cap on priority
    // preemptions; at its maximum, it grows no more.
    let snap = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let run = snap
        .running
        .iter()
        .find(|r| r.job == id.to_string())
        .unwrap();
    assert_eq!(run.preemptions, 0);
    assert_eq!(
        run.elastic.map(|e| (e.workers, e.max_workers)),
        Some((4, 4))
    );
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.preempted), (0, 0), "{pass:?}");
}

#[tokio::test]
async fn a_preempted_elastic_gang_restarts_smaller() {
    let (store, _client) = raw("elasticshrink").await;
    let boot = register_fleet(&store, 1, 4).await; // 32 GPUs
    let planning = planning();
    let id = submit(&store, &elastic("acme", 32, 8, 8, Priority::Low)).await;
    assert_eq!(
        run_pass_with(&store, &planning)
            .await
            .unwrap()
            .placed_workers,
        4
    );
    agent_sync(&store, boot, None).await;

    // A normal gang needs 2 nodes: the low elastic gang is preempted.
    let normal = submit(&store, &job_at("globex", 16, 8, Priority::Normal)).await;
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!(pass.preempted, 1, "{pass:?}");
    let preempted = store.job_events("acme", id).await.unwrap().pop().unwrap();
    assert_eq!(preempted.detail["cause"], "priority");
    assert_eq!(preempted.detail["for_job"], normal.to_string());
    agent_sync(&store, boot, Some("/ckpt/e-7")).await;
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Queued
    );

    // One pass starts the normal gang and the elastic one again, on the 2
    // nodes left.
    let pass = run_pass_with(&store, &planning).await.unwrap();
    assert_eq!((pass.placements, pass.placed_workers), (2, 4), "{pass:?}");
    let job = store.get_job("acme", id).await.unwrap();
    assert_eq!(job.run_workers, Some(2));
    let wanted = agent_sync(&store, boot, None).await;
    let mine = of_job(&wanted, id);
    assert_eq!(mine.len(), 2);
    for a in &mine {
        assert_eq!(a.world_size, 2);
        assert_eq!(a.restore_from.as_deref(), Some("/ckpt/e-7"));
    }
    assert_eq!(
        store.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    assert_eq!(
        store.get_job("globex", normal).await.unwrap().state,
        JobState::Running
    );
}

fn limits(max_queued_jobs: Option<u32>, max_gpus: Option<u32>) -> LimitTerms {
    LimitTerms {
        max_queued_jobs,
        max_gpus,
    }
}

/// The tenant's jobs and job events stored, counted in the database.
async fn stored(client: &tokio_postgres::Client, tenant: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM jobs WHERE tenant = $1),
                    (SELECT count(*) FROM job_events e JOIN jobs j USING (job_id)
                     WHERE j.tenant = $1)",
            &[&tenant],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn admission_limits_refuse_a_queued_job_past_the_limit_until_one_starts() {
    let (store, client) = raw("limitsqueued").await;
    register_fleet(&store, 1, 1).await; // 8 GPUs
    store
        .set_limits_as("sre", "acme", &limits(Some(2), None))
        .await
        .unwrap();
    let first = submit(&store, &job_at("acme", 8, 8, Priority::Normal)).await;
    // A keyed create accepted at the limit…
    let mut keyed = job("acme", 8, 8);
    keyed.idempotency_key = Some("k-limit".into());
    keyed.id = gangway_shared::ids::job_id_for_key("acme", "k-limit");
    let second = submit(&store, &keyed).await;
    let refused = job("acme", 1, 1);
    match store.submit(&refused).await {
        Err(StoreError::QueuedJobsLimit {
            region,
            limit: 2,
            queued: 2,
        }) => assert_eq!(region, "test-region"),
        other => panic!("a third queued job was not refused: {other:?}"),
    }
    // Nothing of it was stored: no job, no event.
    assert_eq!(stored(&client, "acme").await, (2, 2));
    assert!(matches!(
        store.get_job("acme", refused.id).await,
        Err(StoreError::NotFound)
    ));
    // … is still its own answer when retried at the limit, and the key
    // still refuses another spec.
    match store.submit(&keyed).await.unwrap() {
        SubmitOutcome::Replayed(job) => assert_eq!(job.id, second),
        SubmitOutcome::Created(_) => panic!("a retry created a job"),
    }
    let mut other_spec = keyed.clone();
    other_spec.spec.gpus = 4;
    assert!(matches!(
        store.submit(&other_spec).await,
        Err(StoreError::KeyReused)
    ));
    // A dry run says the same, and writes nothing.
    assert!(matches!(
        store.check_admission("acme", 1).await,
        Err(StoreError::QueuedJobsLimit { limit: 2, .. })
    ));

    // One of them starts (8 GPUs, the whole fleet): a slot is free.
    assert_eq!(run_pass(&store, AGENT_TIMEOUT).await.unwrap().placements, 1);
    let mut states = Vec::new();
    for id in [first, second] {
        states.push(store.get_job("acme", id).await.unwrap().state);
    }
    states.sort_by_key(|s| s.as_str());
    assert_eq!(states, [JobState::Queued, JobState::Starting]);
    store.check_admission("acme", 1).await.unwrap();
    let third = submit(&store, &refused).await;
    assert_eq!(third, refused.id);
    assert!(matches!(
        store.submit(&job("acme", 1, 1)).await,
        Err(StoreError::QueuedJobsLimit { queued: 2, .. })
    ));
    // Other tenants are not limited by acme's limits.
    for _ in 0..3 {
        submit(&store, &job("globex", 1, 1)).await;
    }
    // Limits replaced, then removed: the new ones apply at once.
    let set = store
        .set_limits_as("sre", "acme", &limits(Some(3), None))
        .await
        .unwrap();
    assert_eq!((set.max_queued_jobs, set.max_gpus), (Some(3), None));
    submit(&store, &job("acme", 1, 1)).await;
    assert!(store.submit(&job("acme", 1, 1)).await.is_err());
    assert!(store.delete_limits_as("sre", "acme").await.unwrap());
    assert!(!store.delete_limits_as("sre", "acme").await.unwrap());
    submit(&store, &job("acme", 1, 1)).await;
    assert!(store.list_limits().await.unwrap().limits.is_empty());
    // Each change is in the audit log.
    let log = store
        .audit_log(&gangway_shared::api::AuditQuery {
            target: Some("acme".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = log.entries.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["limits.delete", "limits.set", "limits.set"]);
    assert_eq!(log.entries[1].detail["max_queued_jobs"], 3);
    assert_eq!(log.entries[1].actor, "sre");
}

#[tokio::test]
async fn admission_limits_count_the_gpus_of_every_unfinished_job() {
    let (store, client) = raw("limitsgpus").await;
    register_fleet(&store, 1, 1).await; // 8 GPUs
    store
        .set_limits_as("sre", "acme", &limits(None, Some(16)))
        .await
        .unwrap();
    let running = submit(&store, &job_at("acme", 8, 8, Priority::Normal)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(
        store.get_job("acme", running).await.unwrap().state,
        JobState::Starting
    );
    let queued = submit(&store, &job("acme", 4, 4)).await;
    let before = stored(&client, "acme").await;
    // 8 starting + 4 queued + 5 asked = 17 > 16: refused, however it waits.
    match store.submit(&job("acme", 5, 5)).await {
        Err(StoreError::RequestedGpusLimit {
            limit: 16,
            unfinished_gpus: 12,
            job_gpus: 5,
            ..
        }) => {}
        other => panic!("17 GPUs admitted under a limit of 16: {other:?}"),
    }
    assert_eq!(stored(&client, "acme").await, before, "nothing stored");
    // Exactly up to the limit is admitted.
    let fits = submit(&store, &job("acme", 4, 4)).await;
    assert!(matches!(
        store.submit(&job("acme", 1, 1)).await,
        Err(StoreError::RequestedGpusLimit {
            unfinished_gpus: 16,
            ..
        })
    ));
    // A job larger than the limit by itself is refused even with room.
    store.cancel_job("acme", queued).await.unwrap();
    store.cancel_job("acme", fits).await.unwrap();
    assert!(matches!(
        store.submit(&job("acme", 16, 8)).await,
        Err(StoreError::RequestedGpusLimit {
            unfinished_gpus: 8,
            job_gpus: 16,
            ..
        })
    ));
    // Cancelled jobs no longer count.
    submit(&store, &job("acme", 8, 8)).await;
    assert_eq!(
        store.list_limits().await.unwrap().limits[0].max_gpus,
        Some(16)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_submits_never_pass_a_limit_together() {
    let (store, client) = raw("limitsrace").await;
    store
        .set_limits_as("sre", "acme", &limits(Some(5), None))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.submit(&job("acme", 1, 1)).await })
        })
        .collect();
    let (mut created, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(SubmitOutcome::Created(_)) => created += 1,
            Err(StoreError::QueuedJobsLimit { limit: 5, .. }) => refused += 1,
            other => panic!("unexpected answer: {other:?}"),
        }
    }
    assert_eq!((created, refused), (5, 11));
    assert_eq!(stored(&client, "acme").await, (5, 5));
}
