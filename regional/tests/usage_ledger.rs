//! The usage ledger (docs/billing.md) against a real PostgreSQL: every
//! placement's GPU time becomes rows of at most a clock hour each, written
//! by the database when the GPUs are released and by the meter for the
//! hours a live placement completes; every GPU-second once, whatever is
//! replayed.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{node, Fleet};
use gangway_regional::scheduling::run_pass;
use gangway_shared::agent::{Desired, WorkerReport, WorkerStatus};
use uuid::Uuid;

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Runs every wanted worker of node `n`, or ends it with `exit`.
async fn report(store: &gangway_regional::Store, fleet: &Fleet, n: usize, exit: Option<i32>) {
    let wanted = fleet.sync(store, n, "boot-1", vec![], vec![]).await;
    let reports = wanted
        .iter()
        .map(|a| WorkerReport {
            job_id: a.job_id,
            rank: a.rank,
            attempt: a.attempt,
            status: match (a.desired, exit) {
                (Desired::Run, None) => WorkerStatus::Running,
                (_, code) => WorkerStatus::Exited {
                    exit_code: code.or(Some(0)),
                    signal: None,
                    message: None,
                },
            },
            checkpoint: None,
            fenced: false,
            unasked: false,
        })
        .collect();
    fleet.sync(store, n, "boot-1", vec![], reports).await;
}

/// One node, n0, and an 8-GPU job of acme placed and running on it.
async fn one_running_job(store: &gangway_regional::Store) -> (Fleet, Uuid) {
    let fleet = Fleet::register_nodes(store, vec![node("n0", "s0", "l0", "h100")]).await;
    let job = common::submit(store, &common::job("acme", "h100", 8, 8)).await;
    run_pass(store, AGENT_TIMEOUT).await.unwrap();
    report(store, &fleet, 0, None).await;
    (fleet, job)
}

/// GPU-seconds: (allocations held, released ones only) and (ledger rows).
async fn totals(db: &tokio_postgres::Client, job: Uuid) -> (f64, f64) {
    let held: f64 = db
        .query_one(
            "SELECT coalesce(sum(extract(epoch FROM released_at - allocated_at)), 0)::float8
             FROM allocations WHERE job_id = $1 AND released_at IS NOT NULL",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    let billed: f64 = db
        .query_one(
            "SELECT coalesce(sum(gpu_seconds), 0)::float8 FROM usage_ledger WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    (held, billed)
}

async fn rows(db: &tokio_postgres::Client) -> i64 {
    db.query_one("SELECT count(*) FROM usage_ledger", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn every_gpu_second_of_a_placement_is_one_row_per_hour_once_whatever_is_replayed() {
    let (store, db) = common::store("usage_ledger").await;
    let fleet = Fleet::register_nodes(
        &store,
        vec![
            node("n0", "s0", "l0", "h100"),
            node("n1", "s0", "l0", "h100"),
        ],
    )
    .await;
    let job = common::submit(&store, &common::job("acme", "h100", 16, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    for n in 0..2 {
        report(&store, &fleet, n, None).await;
    }
    // It has been running for two and a half hours.
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '150 minutes'",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(rows(&db).await, 0, "nothing ended yet");

    // The meter writes the hours both placements completed, once.
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::days(2);
    let new = store.meter_usage(since).await.unwrap();
    assert!(
        new >= 4,
        "two placements, two or three complete hours each: {new}"
    );
    assert_eq!(store.meter_usage(since).await.unwrap(), 0, "metered again");
    let metered: f64 = db
        .query_one(
            "SELECT sum(gpu_seconds)::float8 FROM usage_ledger WHERE ended_by = 'running'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let expect: f64 = db
        .query_one(
            "SELECT sum(extract(epoch FROM date_trunc('hour', now(), 'UTC') - allocated_at))::float8
             FROM allocations",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!((metered - expect).abs() < 1e-3, "{metered} vs {expect}");

    // It ends: the release writes the rest, and the ledger holds exactly
    // the GPU time the allocations held.
    for n in 0..2 {
        report(&store, &fleet, n, Some(0)).await;
    }
    let (held, billed) = totals(&db, job).await;
    assert!(held > 16.0 * 2.4 * 3600.0, "{held}");
    assert!((held - billed).abs() < 1e-3, "held {held}, billed {billed}");
    // Every row lies within one clock hour; the last of each placement
    // says how it ended.
    let stray: i64 = db
        .query_one(
            "SELECT count(*) FROM usage_ledger
             WHERE date_trunc('hour', started_at, 'UTC')
                 < date_trunc('hour', ended_at - interval '1 microsecond', 'UTC')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stray, 0);
    let ended: Vec<(i32, String, i32)> = db
        .query(
            "SELECT rank, ended_by, gpus FROM usage_ledger WHERE ended_by <> 'running'
             ORDER BY rank",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        ended,
        [(0, "succeeded".into(), 8), (1, "succeeded".into(), 8)]
    );

    // Replays change nothing: the meter again, an allocation update that
    // releases nothing, a buddy given the same rows.
    let before = rows(&db).await;
    assert_eq!(store.meter_usage(since).await.unwrap(), 0);
    db.execute(
        "UPDATE allocations SET release_reason = release_reason",
        &[],
    )
    .await
    .unwrap();
    let all = store
        .usage_records(since, Utc::now(), None, None, 1000)
        .await
        .unwrap();
    assert_eq!(all.records.len() as i64, before);
    assert_eq!(store.hold_usage(&all.records).await.unwrap(), 0);
    assert_eq!(rows(&db).await, before);
    assert_eq!(totals(&db, job).await.1, billed);

    // Pages in id order; a tenant sees only its own.
    let page = store
        .usage_records(since, Utc::now(), Some("acme"), None, 2)
        .await
        .unwrap();
    assert_eq!(page.records.len(), 2);
    let rest = store
        .usage_records(since, Utc::now(), Some("acme"), page.next, 1000)
        .await
        .unwrap();
    assert_eq!(page.records.len() + rest.records.len(), before as usize);
    assert!(rest.records[0].usage_id > page.records[1].usage_id);
    let other = store
        .usage_records(since, Utc::now(), Some("globex"), None, 1000)
        .await
        .unwrap();
    assert!(other.records.is_empty());
}

#[tokio::test]
async fn a_preempted_placement_says_who_preempted_it() {
    let (store, db) = common::store("usage_ledger_preempt").await;
    let (fleet, job) = one_running_job(&store).await;
    assert!(store.preempt_job(job, "an operator asked").await.unwrap());
    // The agent checkpoints and stops it.
    fleet.act(&store, 0, Some("ckpt-1")).await;
    let row = db
        .query_one(
            "SELECT ended_by, cause, gpus FROM usage_ledger WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap();
    let (ended_by, cause, gpus): (String, Option<String>, i32) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (ended_by.as_str(), cause.as_deref(), gpus),
        ("preempted", Some("operator"), 8)
    );
    let (held, billed) = totals(&db, job).await;
    assert!((held - billed).abs() < 1e-6, "held {held}, billed {billed}");
    // It runs again: a second placement (attempt), a second row once it
    // ends, of its own.
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    report(&store, &fleet, 0, None).await;
    report(&store, &fleet, 0, Some(0)).await;
    let attempts: Vec<i32> = db
        .query(
            "SELECT attempt FROM usage_ledger WHERE job_id = $1 ORDER BY attempt",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(attempts[0] < attempts[1]);
    let (held, billed) = totals(&db, job).await;
    assert!((held - billed).abs() < 1e-6, "held {held}, billed {billed}");
}

/// Credits of `job`: (count, GPU-seconds, causes).
async fn credits(db: &tokio_postgres::Client, job: Uuid) -> (i64, f64, Vec<String>) {
    let row = db
        .query_one(
            "SELECT count(*), coalesce(sum(gpu_seconds), 0)::float8,
                    coalesce(array_agg(DISTINCT cause) FILTER (WHERE cause IS NOT NULL), '{}')
             FROM usage_credits WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// The last usage row of `job` (how its placement ended): (ended_by, cause).
async fn how_it_ended(db: &tokio_postgres::Client, job: Uuid) -> (String, Option<String>) {
    let row = db
        .query_one(
            "SELECT ended_by, cause FROM usage_ledger WHERE job_id = $1 AND ended_by <> 'running'",
            &[&job],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_lost_nodes_placement_is_credited_from_the_jobs_checkpoint_once() {
    let (store, db) = common::store("usage_credit_lost").await;
    let (_fleet, job) = one_running_job(&store).await;
    // It has run for two and a half hours; its newest checkpoint is 100
    // minutes old; its buddy is another region.
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '150 minutes'",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE jobs SET checkpointed_at = now() - interval '100 minutes', buddy = 'r2'
         WHERE job_id = $1",
        &[&job],
    )
    .await
    .unwrap();
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::days(2);
    assert!(store.meter_usage(since).await.unwrap() >= 2);
    let metered = store.metered_until().await.unwrap().unwrap();
    assert_eq!(metered.timestamp() % 3600, 0, "{metered}");
    assert!(Utc::now() - metered < chrono::Duration::hours(1));
    assert_eq!(credits(&db, job).await.0, 0, "nothing lost yet");

    // The node dies.
    let ctx = store.health_context();
    store
        .inject_fault(&ctx, "ops", "n0", &gangway_shared::api::Fault::NodeDown)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        how_it_ended(&db, job).await,
        ("node_lost".into(), Some("node_lost".into()))
    );
    // Credited: from the checkpoint to the end, × 8, over the two or three
    // hourly rows it spans — never more than a row charges.
    let expect: f64 = db
        .query_one(
            "SELECT (8 * extract(epoch FROM max(a.released_at) - j.checkpointed_at))::float8
             FROM allocations a JOIN jobs j USING (job_id) WHERE job_id = $1 GROUP BY j.checkpointed_at",
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    let (n, credited, causes) = credits(&db, job).await;
    assert!((credited - expect).abs() < 1e-3, "{credited} vs {expect}");
    assert!((2..=3).contains(&n), "{n} credits");
    assert_eq!(causes, ["node_lost"]);
    let beyond: i64 = db
        .query_one(
            "SELECT count(*) FROM usage_credits c JOIN usage_ledger u USING (usage_id)
             WHERE c.gpu_seconds > u.gpu_seconds + 1e-9 OR c.started_at < u.started_at
                OR c.ended_at > u.ended_at OR c.usage_started_at <> u.started_at
                OR c.credit_id <> md5('credit/' || u.usage_id::text)::uuid",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(beyond, 0);
    let (held, billed) = totals(&db, job).await;
    assert!((held - billed).abs() < 1e-3, "held {held}, billed {billed}");
    // Queued for the buddy, like the usage rows.
    let queued: i64 = db
        .query_one("SELECT count(*) FROM usage_credit_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, n);

    // Replays change nothing: the fault again, an update that releases
    // nothing, the meter, the buddy given the same credits.
    store
        .inject_fault(&ctx, "ops", "n0", &gangway_shared::api::Fault::NodeDown)
        .await
        .unwrap()
        .unwrap();
    db.execute(
        "UPDATE allocations SET release_reason = release_reason",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(store.meter_usage(since).await.unwrap(), 0);
    let page = store
        .usage_credits(since, Utc::now(), Some("acme"), None, 1000)
        .await
        .unwrap();
    assert_eq!(page.credits.len() as i64, n);
    assert_eq!(store.hold_credits(&page.credits).await.unwrap(), 0);
    assert_eq!(credits(&db, job).await, (n, credited, causes));
    // Pages, and a tenant's own only.
    let first = store
        .usage_credits(since, Utc::now(), None, None, 1)
        .await
        .unwrap();
    assert_eq!(first.credits.len(), 1);
    let rest = store
        .usage_credits(since, Utc::now(), None, first.next, 1000)
        .await
        .unwrap();
    assert_eq!(1 + rest.credits.len() as i64, n);
    assert!(store
        .usage_credits(since, Utc::now(), Some("globex"), None, 1000)
        .await
        .unwrap()
        .credits
        .is_empty());
}

#[tokio::test]
async fn a_drained_job_with_a_fresh_checkpoint_is_credited_next_to_nothing() {
    use gangway_regional::store::AdminChange;
    let (store, db) = common::store("usage_credit_drain").await;
    let (fleet, job) = one_running_job(&store).await;
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '90 minutes'",
        &[],
    )
    .await
    .unwrap();
    let ctx = store.health_context();
    store
        .set_node_admin(
            &ctx,
            "ops",
            "n0",
            AdminChange::Drain {
                mode: gangway_shared::api::DrainMode::Checkpoint,
                deadline_s: 30,
            },
            Some("firmware"),
        )
        .await
        .unwrap()
        .unwrap();
    // The worker checkpoints as asked and stops.
    fleet.act(&store, 0, Some("ckpt-drain")).await;
    assert_eq!(
        how_it_ended(&db, job).await,
        ("preempted".into(), Some("drain".into()))
    );
    let (_, credited, _) = credits(&db, job).await;
    assert!(credited < 8.0, "at most a second of 8 GPUs: {credited}");
    let (held, billed) = totals(&db, job).await;
    assert!(held > 8.0 * 89.0 * 60.0, "{held}");
    assert!((held - billed).abs() < 1e-3, "held {held}, billed {billed}");
}

#[tokio::test]
async fn a_priority_preemption_is_attributed_to_its_cause_and_not_credited() {
    use gangway_sched::{Plan, PreemptCause, Preemption};
    let (store, db) = common::store("usage_credit_priority").await;
    let fleet = Fleet::register_nodes(&store, vec![node("n0", "s0", "l0", "h100")]).await;
    let mut low = common::job("globex", "h100", 8, 8);
    low.spec.priority = gangway_shared::api::Priority::Low;
    low.priority = 0;
    let low = common::submit(&store, &low).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    report(&store, &fleet, 0, None).await;
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '30 minutes'",
        &[],
    )
    .await
    .unwrap();
    let high = common::submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let read = store.snapshot(AGENT_TIMEOUT).await.unwrap().snapshot;
    let applied = store
        .apply_plan(&Plan {
            generation: read.generation,
            partitions: read.partitions.clone(),
            preemptions: vec![Preemption {
                job: low.to_string(),
                for_job: high.to_string(),
                cause: PreemptCause::Priority,
                at_risk_gpu_s: 8 * 1800,
                gpus: 8,
            }],
            ..Plan::default()
        })
        .await
        .unwrap();
    assert_eq!(applied.preempted, vec![(low, PreemptCause::Priority)]);
    // Stopped without a checkpoint: half an hour of 8 GPUs lost, charged
    // (the low class is priced for being preemptible), and the row says
    // who caused it.
    fleet.act(&store, 0, None).await;
    assert_eq!(
        how_it_ended(&db, low).await,
        ("preempted".into(), Some("priority".into()))
    );
    assert_eq!(credits(&db, low).await.0, 0);
    let (held, billed) = totals(&db, low).await;
    assert!(held > 8.0 * 29.0 * 60.0, "{held}");
    assert!((held - billed).abs() < 1e-3, "held {held}, billed {billed}");
    // The row tells globex's bill the cause, not whose job it was.
    let rec = store
        .usage_records(
            Utc::now() - chrono::Duration::hours(2),
            Utc::now(),
            Some("globex"),
            None,
            100,
        )
        .await
        .unwrap();
    let last = rec
        .records
        .iter()
        .find(|r| r.ended_by == "preempted")
        .unwrap();
    assert_eq!(last.cause.as_deref(), Some("priority"));
}

#[tokio::test]
async fn allocations_read_for_reconciliation_match_the_ledger_to_the_meters_hour() {
    let (store, db) = common::store("usage_reconcile").await;
    let fleet = Fleet::register_nodes(
        &store,
        vec![
            node("n0", "s0", "l0", "h100"),
            node("n1", "s0", "l0", "h100"),
        ],
    )
    .await;
    let (from, to) = (
        Utc::now() - chrono::Duration::days(1),
        Utc::now() + chrono::Duration::hours(1),
    );
    let ledger = || async {
        let s: f64 = db
            .query_one(
                "SELECT coalesce(sum(gpu_seconds), 0)::float8 FROM usage_ledger",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        s
    };
    let job = common::submit(&store, &common::job("acme", "h100", 16, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    for n in 0..2 {
        report(&store, &fleet, n, None).await;
    }
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '150 minutes'",
        &[],
    )
    .await
    .unwrap();
    // Never metered: live placements count nothing, and have no rows.
    let a = store.allocated_usage(from, to).await.unwrap();
    assert_eq!(a.metered_until, None);
    assert!(a.tenants.is_empty(), "{a:?}");
    assert_eq!(a.live.len(), 2);
    assert!(a.live.iter().all(|p| p.job_id == job));

    // Metered: both sides count the live placements to the meter's hour.
    store
        .meter_usage(Utc::now() - chrono::Duration::days(2))
        .await
        .unwrap();
    let a = store.allocated_usage(from, to).await.unwrap();
    let w = a.metered_until.unwrap();
    assert!(a.as_of > w);
    assert_eq!(a.tenants.len(), 1);
    let acme = &a.tenants[0];
    assert_eq!(acme.tenant, "acme");
    assert_eq!(acme.gpu_seconds, acme.live_gpu_seconds);
    assert!(acme.gpu_seconds > 16.0 * 3600.0, "{acme:?}");
    assert!((acme.gpu_seconds - ledger().await).abs() < 1e-3);

    // One worker ends: all of its placement on both sides.
    report(&store, &fleet, 1, Some(0)).await;
    let a = store.allocated_usage(from, to).await.unwrap();
    assert_eq!(a.live.len(), 1);
    let live_from = a.live[0].started_at.max(w);
    let uncounted: f64 = db
        .query_one(
            "SELECT coalesce(sum(gpu_seconds), 0)::float8 FROM usage_ledger
             WHERE rank = $1 AND started_at >= $2",
            &[&a.live[0].rank, &live_from],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(uncounted, 0.0, "the meter writes only complete hours");
    assert!((a.tenants[0].gpu_seconds - ledger().await).abs() < 1e-3);
    assert!(a.tenants[0].live_gpu_seconds < a.tenants[0].gpu_seconds);
    // Clipped to the period asked for.
    let half = store
        .allocated_usage(w - chrono::Duration::minutes(30), w)
        .await
        .unwrap();
    assert!((half.tenants[0].gpu_seconds - 16.0 * 1800.0).abs() < 1e-3);
}

/// GPU-seconds of `job`'s credits and of its corrections (V20).
async fn credits_and_corrections(db: &tokio_postgres::Client, job: Uuid) -> (f64, f64) {
    let row = db
        .query_one(
            "SELECT coalesce(sum(gpu_seconds) FILTER (WHERE cause <> 'correction'), 0)::float8,
                    coalesce(sum(gpu_seconds) FILTER (WHERE cause = 'correction'), 0)::float8
             FROM usage_credits WHERE job_id = $1",
            &[&job],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_release_dated_back_into_hours_the_meter_wrote_is_corrected_to_what_was_held() {
    use gangway_shared::agent::RegisterRequest;
    use gangway_shared::billing::reconcile::tally;
    let (store, db) = common::store("usage_backdated").await;
    let (_fleet, job) = one_running_job(&store).await;
    // It has run for two and a half hours, and has a buddy.
    db.execute(
        "UPDATE allocations SET allocated_at = now() - interval '150 minutes'",
        &[],
    )
    .await
    .unwrap();
    db.execute("UPDATE jobs SET buddy = 'r2' WHERE job_id = $1", &[&job])
        .await
        .unwrap();
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::days(2);
    assert!(store.meter_usage(since).await.unwrap() >= 2);
    let metered = totals(&db, job).await.1;
    assert!(metered > 8.0 * 90.0 * 60.0, "{metered}");

    // Its agent was last heard 100 minutes ago — inside an hour the meter
    // wrote whole — and comes back with a new boot: the workers died with
    // the old one, and are billed to when it was last heard.
    store.flush_liveness().await.unwrap();
    db.execute(
        "UPDATE agents SET last_sync_at = now() - interval '100 minutes'",
        &[],
    )
    .await
    .unwrap();
    let reboot = RegisterRequest {
        agent_id: "agent-n0".into(),
        boot_id: Uuid::new_v4(),
        executor: "sim".into(),
        nodes: vec![node("n0", "s0", "l0", "h100")],
        host_id: None,
    };
    store.register_agent(&reboot).await.unwrap();
    // The hour it ended in is the meter's row (same id), shortened by a
    // correction that says how the placement ended.
    let ended: Vec<(String, String)> = db
        .query(
            "SELECT DISTINCT ended_by, cause FROM usage_credits WHERE job_id = $1 ORDER BY 1, 2",
            &[&job],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        ended,
        [
            ("node_lost".into(), "correction".into()),
            ("node_lost".into(), "node_lost".into())
        ]
    );
    let (held, billed) = totals(&db, job).await;
    assert!((held - 8.0 * 50.0 * 60.0).abs() < 5.0 * 8.0, "{held}");
    assert!(
        billed > held + 8.0 * 60.0,
        "the meter's rows reach past the end"
    );
    // The ledger (rows less corrections) bills exactly what was held; the
    // loss (no checkpoint: the whole placement) is credited, never past
    // the end.
    let (credited, corrected) = credits_and_corrections(&db, job).await;
    assert!(
        (billed - corrected - held).abs() < 1e-3,
        "billed {billed}, corrected {corrected}, held {held}"
    );
    assert!(
        (credited - held).abs() < 1e-3,
        "credited {credited}, held {held}"
    );
    // Each correction is of one row, from the end (or the row's start) to
    // the row's end, with an id derived from it; each credit ends by then.
    let odd: i64 = db
        .query_one(
            "SELECT count(*) FROM usage_credits c JOIN usage_ledger u USING (usage_id)
             JOIN (SELECT job_id, max(released_at) AS e FROM allocations GROUP BY 1) a
               ON a.job_id = c.job_id
             WHERE (c.cause = 'correction'
                    AND (c.credit_id <> md5('correction/' || u.usage_id::text)::uuid
                         OR c.started_at <> greatest(u.started_at, a.e)
                         OR c.ended_at <> u.ended_at))
                OR (c.cause <> 'correction' AND c.ended_at > a.e)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(odd, 0);
    // Corrections go to the buddy like credits.
    let queued: i64 = db
        .query_one(
            "SELECT count(*) FROM usage_credit_outbox o JOIN usage_credits c USING (credit_id)
             WHERE c.cause = 'correction'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(queued >= 1);

    // Replays change nothing: the same boot again, an update that
    // releases nothing, the meter, a buddy given the same corrections.
    let before = (rows(&db).await, credits_and_corrections(&db, job).await);
    store.register_agent(&reboot).await.unwrap();
    db.execute(
        "UPDATE allocations SET release_reason = release_reason",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(store.meter_usage(since).await.unwrap(), 0);
    let all = store
        .usage_credits(since, Utc::now(), None, None, 1000)
        .await
        .unwrap();
    assert_eq!(store.hold_credits(&all.credits).await.unwrap(), 0);
    assert_eq!(
        (rows(&db).await, credits_and_corrections(&db, job).await),
        before
    );

    // Reconciliation, on the region's own reads: zero difference, the
    // correction off the billed side, the credit on the credited one.
    let (from, to) = (since, Utc::now() + chrono::Duration::minutes(1));
    let allocated = store.allocated_usage(from, to).await.unwrap();
    let records = store
        .usage_records(from, to, None, None, 1000)
        .await
        .unwrap();
    let report = tally(
        &[(allocated.region.clone(), allocated)].into(),
        &records
            .records
            .into_iter()
            .map(|r| (r.usage_id, r))
            .collect(),
        &all.credits.into_iter().map(|c| (c.credit_id, c)).collect(),
        (from, to),
        0.5,
    );
    assert!(report.reconciled, "{report:?}");
    assert_eq!(report.rows.len(), 1);
    let line = &report.rows[0];
    assert!((line.allocated_gpu_seconds - held).abs() < 1e-3, "{line:?}");
    assert!(line.billed_gpu_seconds.abs() < 1e-3, "{line:?}");
    assert!((line.credited_gpu_seconds - held).abs() < 1e-3, "{line:?}");
    // The tenant sees the time held, all of it credited.
    let usage = store
        .usage(
            "acme",
            from,
            to,
            gangway_shared::api::Granularity::Day,
            gangway_shared::api::UsageGroup::Job,
            None,
        )
        .await
        .unwrap();
    let sum = |f: fn(&gangway_shared::api::UsageRow) -> f64| usage.own.iter().map(f).sum::<f64>();
    assert!((sum(|r| r.gpu_seconds) - held).abs() < 1e-3, "{usage:?}");
    assert!((sum(|r| r.credited_gpu_seconds) - held).abs() < 1e-3);
    assert!(sum(|r| r.billed_gpu_seconds).abs() < 1e-3);
}
