//! The usage ledger (docs/billing.md) against a real PostgreSQL: every
//! placement's GPU time becomes rows of at most a clock hour each, written
//! by the database when the GPUs are released and by the meter for the
//! hours a live placement completes; every GPU-second once, whatever is
//! replayed.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{node, Fleet};
use gangway_regional::scheduler::run_pass;
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
        })
        .collect();
    fleet.sync(store, n, "boot-1", vec![], reports).await;
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
    let fleet = Fleet::register_nodes(&store, vec![node("n0", "s0", "l0", "h100")]).await;
    let job = common::submit(&store, &common::job("acme", "h100", 8, 8)).await;
    run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    report(&store, &fleet, 0, None).await;
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
