//! What a region's peers hold so that it can be billed if it never comes
//! back, against real, throwaway PostgreSQL databases and a peer served
//! over HTTP (docs/billing.md, "A region that does not come back"):
//!
//! - a home tells its buddy of each placement as it opens and as it ends
//!   (and the meter's hours and a checkpoint with its time, as before);
//! - the buddy, adopting, closes the placement still open from the end of
//!   the newest row it holds to the last time it heard from the home: the
//!   held rows and the closings together are the time the placement held
//!   its GPUs, and the work after the checkpoint is credited (cause
//!   `moved`); a placement that ended at home is not closed;
//! - closing again changes nothing; the closings count in what the buddy
//!   holds for the home (the tenant API's copies), never in its own usage;
//! - every peer holds the home's committed capacity and reads the same
//!   hourly records from it as the home, changes included.

use std::time::Duration;

use chrono::{DateTime, Utc};
use gangway_regional::scheduling::run_pass;
use gangway_regional::Store;
use gangway_shared::api::{Granularity, JobState, QuotaTerms, UsageGroup};
use uuid::Uuid;

mod common;
use common::{node, region_state, region_store, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// An 8-GPU gang of acme at `home`, its intent held by `buddy`, placed
/// and running on node `n`.
async fn running_job(home: &Store, buddy: &Store, fleet: &Fleet, n: usize) -> Uuid {
    let id = common::submit(home, &common::job("acme", "h100", 8, 8)).await;
    home.replicated(id, buddy.region()).await.unwrap();
    buddy
        .hold_intent(&home.intent_of(id).await.unwrap())
        .await
        .unwrap();
    let o = run_pass(home, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1, "{o:?}");
    fleet.act(home, n, None).await;
    fleet.act(home, n, None).await;
    assert_eq!(
        home.get_job("acme", id).await.unwrap().state,
        JobState::Running
    );
    id
}

/// Sum of `gpu_seconds` of a table's rows of `job` (at `region` when given).
async fn seconds(c: &tokio_postgres::Client, table: &str, job: Uuid) -> f64 {
    c.query_one(
        &format!("SELECT coalesce(sum(gpu_seconds), 0)::float8 FROM {table} WHERE job_id = $1"),
        &[&job],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopter_closes_the_dead_homes_open_placement_to_when_it_last_heard_from_it() {
    let (h_store, hc) = region_store("closings_home", "rh").await;
    let (b_store, bc) = region_store("closings_buddy", "rb").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b_url = format!("http://{}", listener.local_addr().unwrap());
    let b = region_state(
        "rb",
        b_store.clone(),
        &[("rh", "http://127.0.0.1:9".into())],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(listener, b, stop.clone()));
    let h = region_state("rh", h_store.clone(), &[("rb", b_url)]);

    let fleet = Fleet::register_nodes(
        &h_store,
        vec![
            node("n0", "s0", "l0", "h100"),
            node("n1", "s0", "l0", "h100"),
        ],
    )
    .await;
    let live = running_job(&h_store, &b_store, &fleet, 0).await;
    let ended = running_job(&h_store, &b_store, &fleet, 1).await;
    // The live one started 150 minutes ago and checkpointed 100 minutes
    // in (outbox and all, as if it had been so).
    for sql in [
        "UPDATE allocations SET allocated_at = allocated_at - interval '150 minutes'
         WHERE job_id = $1",
        "UPDATE placement_outbox SET allocated_at = allocated_at - interval '150 minutes'
         WHERE job_id = $1",
        "UPDATE jobs SET restore_from = 'sim:0.600000',
                         checkpointed_at = (SELECT min(allocated_at) + interval '100 minutes'
                                            FROM allocations WHERE job_id = $1)
         WHERE job_id = $1",
    ] {
        hc.execute(sql, &[&live]).await.unwrap();
    }
    let started: DateTime<Utc> = hc
        .query_one(
            "SELECT min(allocated_at) FROM allocations WHERE job_id = $1",
            &[&live],
        )
        .await
        .unwrap()
        .get(0);
    let checkpointed = started + chrono::Duration::minutes(100);
    // The other ends at home (cancelled, its workers stopped).
    h_store.cancel_job("acme", ended).await.unwrap();
    fleet.act(&h_store, 1, None).await;
    fleet.act(&h_store, 1, None).await;
    assert_eq!(
        h_store.get_job("acme", ended).await.unwrap().state,
        JobState::Cancelled
    );
    // The home meters the live one's completed hours and tells its buddy
    // everything: rows, placements, the checkpoint with its time.
    h_store
        .meter_usage(Utc::now() - chrono::Duration::hours(6))
        .await
        .unwrap();
    use gangway_regional::replication::outbox::{flush, Credits, Placements, Updates, UsageRows};
    flush::<UsageRows>(h.link()).await;
    flush::<Credits>(h.link()).await;
    flush::<Placements>(h.link()).await;
    gangway_regional::replication::replicate_pending_intents(h.link()).await;
    flush::<Updates>(h.link()).await;
    let outbox: i64 = hc
        .query_one("SELECT count(*) FROM placement_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(outbox, 0, "every placement was told");
    // The buddy holds the open one; the ended one it let go.
    let held: Vec<(Uuid, Option<DateTime<Utc>>, i32)> = bc
        .query(
            "SELECT job_id, ended_at, gpus FROM replica_placements ORDER BY started_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(held, vec![(live, None, 8)]);
    let held_rows = seconds(&bc, "usage_ledger", live).await;
    assert!(held_rows >= 8.0 * 3600.0, "the meter's hours: {held_rows}");

    // The home goes silent; the buddy last heard from it a while after
    // the last hour the meter wrote (halfway from there to now: a fixed
    // "a minute ago" falls before that hour's end when the test runs in
    // an hour's first minute, leaving nothing to close).
    let metered_to = started + chrono::Duration::microseconds((held_rows / 8.0 * 1e6) as i64);
    let heard = metered_to + (Utc::now() - metered_to) / 2;
    bc.execute(
        "INSERT INTO peer_leases (peer, last_heard_at) VALUES ('rh', $1)
         ON CONFLICT (peer) DO UPDATE SET last_heard_at = EXCLUDED.last_heard_at",
        &[&heard],
    )
    .await
    .unwrap();
    bc.execute(
        "UPDATE replica_placements SET told_at = $1::timestamptz - interval '10 seconds'",
        &[&heard],
    )
    .await
    .unwrap();
    let (ckpt_at, ckpt): (Option<DateTime<Utc>>, Option<String>) = bc
        .query_one(
            "SELECT checkpointed_at, checkpoint FROM replica_jobs WHERE job_id = $1",
            &[&live],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(ckpt.as_deref(), Some("sim:0.600000"));
    let ckpt_at = ckpt_at.expect("the checkpoint's time is replicated");
    assert!((ckpt_at - checkpointed).num_milliseconds().abs() < 1);

    // Adopting: closed from the newest held row to when it was last heard.
    let hours = b_store
        .close_placements(live, "rh", 1, Some(ckpt_at))
        .await
        .unwrap();
    assert!(hours >= 1, "{hours}");
    let closed = seconds(&bc, "usage_closings", live).await;
    let held_for = (heard - started).num_microseconds().unwrap() as f64 / 1e6 * 8.0;
    assert!(
        (held_rows + closed - held_for).abs() < 0.01,
        "held rows {held_rows} + closings {closed} = the time held, {held_for}"
    );
    let last: (String, Option<String>, DateTime<Utc>) = bc
        .query_one(
            "SELECT ended_by, cause, ended_at FROM usage_closings WHERE job_id = $1
             ORDER BY ended_at DESC LIMIT 1",
            &[&live],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(
        (last.0.as_str(), last.1.as_deref()),
        ("moved", Some("moved"))
    );
    assert!((last.2 - heard).num_milliseconds().abs() < 1);
    // The work after the checkpoint, 50 minutes before the last heard, is
    // credited, on the held rows and the closings alike.
    let credited = seconds(&bc, "usage_closing_credits", live).await;
    let lost = (heard - ckpt_at).num_microseconds().unwrap() as f64 / 1e6 * 8.0;
    assert!((credited - lost).abs() < 0.01, "{credited} vs {lost}");
    // The ended one is not closed; closing again changes nothing.
    assert_eq!(
        b_store
            .close_placements(ended, "rh", 1, None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        b_store
            .close_placements(live, "rh", 1, Some(ckpt_at))
            .await
            .unwrap(),
        0
    );
    assert_eq!(seconds(&bc, "usage_closings", live).await, closed);
    assert_eq!(seconds(&bc, "usage_closing_credits", live).await, credited);

    // They count in what the buddy holds for rh, never in its own usage.
    let usage = b_store
        .usage(
            "acme",
            started - chrono::Duration::hours(1),
            Utc::now(),
            Granularity::Day,
            UsageGroup::Job,
            Some(live),
        )
        .await
        .unwrap();
    assert!(usage.own.is_empty(), "{:?}", usage.own);
    let rows = &usage.held_for["rh"];
    let sum = |f: fn(&gangway_shared::api::UsageRow) -> f64| rows.iter().map(f).sum::<f64>();
    assert!((sum(|r| r.gpu_seconds) - held_for).abs() < 0.01, "{rows:?}");
    assert!((sum(|r| r.credited_gpu_seconds) - lost).abs() < 0.01);
    assert!((sum(|r| r.billed_gpu_seconds) - (held_for - lost)).abs() < 0.01);
    // And the admin read gives them as ledger rows and credits of rh.
    let c = b_store
        .closings(started, Utc::now(), Some("rh"))
        .await
        .unwrap();
    assert!(c
        .records
        .iter()
        .all(|r| r.region == "rh" && r.job_id == live));
    assert_eq!(c.records.len() as i32, hours);
    let offsets: std::collections::BTreeSet<Uuid> = c.credits.iter().map(|c| c.usage_id).collect();
    assert!(
        c.records.iter().all(|r| offsets.contains(&r.usage_id)),
        "every closing is after the checkpoint: credited"
    );
    assert!(b_store
        .closings(started, Utc::now(), Some("elsewhere"))
        .await
        .unwrap()
        .records
        .is_empty());
    stop.cancel();
    let _ = server.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_peer_holds_the_homes_commitments_and_reads_them_as_the_home_does() {
    let (h_store, _hc) = region_store("copies_commit_home", "rh").await;
    let (p_store, pc) = region_store("copies_commit_peer", "rp").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let p_url = format!("http://{}", listener.local_addr().unwrap());
    let p = region_state(
        "rp",
        p_store.clone(),
        &[("rh", "http://127.0.0.1:9".into())],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(listener, p, stop.clone()));
    let h = region_state("rh", h_store.clone(), &[("rp", p_url)]);
    let terms = |g: u32| QuotaTerms {
        guaranteed_gpus: g,
        max_gpus: None,
        weight_milli: 1000,
    };
    // Flushes until the peer holds `n` versions of rh's: a change is sent
    // once no transaction older than it runs (in the whole cluster: the
    // other tests' too), so it can take a beat or two.
    let held = |n: i64| {
        let (h, pc) = (&h, &pc);
        async move {
            let mut held = -1;
            for _ in 0..100 {
                gangway_regional::replication::outbox::flush::<
                    gangway_regional::replication::outbox::Commitments,
                >(h.link())
                .await;
                held = pc
                    .query_one(
                        "SELECT count(*) FROM held_commitments WHERE home = 'rh'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if held >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            held
        }
    };
    let from = Utc::now() - chrono::Duration::hours(1);
    h_store.set_quota("acme", "h100", &terms(8)).await.unwrap();
    h_store
        .set_quota("globex", "h100", &terms(2))
        .await
        .unwrap();
    assert_eq!(held(2).await, 2);
    // A change: the old version closed, a new one opened; both are sent,
    // and nothing again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    h_store.set_quota("acme", "h100", &terms(4)).await.unwrap();
    assert_eq!(held(3).await, 3);
    let sent_again = pc
        .query_one(
            "SELECT count(*) FROM held_commitments WHERE valid_until IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(sent_again, 1, "the closed version took its change");
    for _ in 0..3 {
        gangway_regional::replication::outbox::flush::<
            gangway_regional::replication::outbox::Commitments,
        >(h.link())
        .await;
    }
    assert_eq!(held(3).await, 3, "nothing new");
    // The peer heard from rh just now: what it reads for a period that
    // ended before is what rh reads, record for record.
    p_store
        .peer_heard("rh", &std::collections::BTreeMap::new())
        .await
        .unwrap();
    let to = Utc::now() - chrono::Duration::milliseconds(10);
    let own = h_store
        .usage_commitments(from, to, None, None, 5000)
        .await
        .unwrap();
    let copy = p_store
        .held_usage_commitments("rh", from, to, None, None, 5000)
        .await
        .unwrap();
    // Per guarantee and hour (acme's two versions share theirs, or not).
    assert!(own.commitments.len() >= 2, "{:?}", own.commitments);
    assert_eq!(copy.commitments, own.commitments);
    assert!(copy.commitments.iter().all(|c| c.region == "rh"));
    // rh goes silent: its guarantees in force end where the peer last
    // heard from it, however late the read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heard = Utc::now();
    pc.execute(
        "UPDATE peer_leases SET last_heard_at = $1 WHERE peer = 'rh'",
        &[&heard],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let later = p_store
        .held_usage_commitments(
            "rh",
            from,
            Utc::now() + chrono::Duration::hours(2),
            None,
            None,
            5000,
        )
        .await
        .unwrap();
    let globex: Vec<_> = (later.commitments.iter())
        .filter(|c| c.tenant == "globex")
        .collect();
    let last = globex.iter().map(|c| c.ended_at).max().unwrap();
    assert!((last - heard).num_milliseconds().abs() < 1, "{globex:?}");
    assert!(later.commitments.iter().all(|c| c.ended_at <= last));
    // Its own region reads nothing of it as its own.
    assert!(p_store
        .usage_commitments(from, Utc::now(), None, None, 5000)
        .await
        .unwrap()
        .commitments
        .is_empty());
    stop.cancel();
    let _ = server.await;
}
