//! The queue a pool's passes keep between them (`store/queue.rs`), against
//! a real, throwaway PostgreSQL: after every kind of change — creates,
//! placements (a gang whole, an array job's workers some at a time),
//! cancellations, preemptions that requeue, a deletion, a change made by a
//! transaction still open when the previous snapshot was taken, and
//! creates racing the passes — the held queue is exactly what a whole read
//! of the queue finds, while reading only what changed; and a pool has
//! work exactly while its held queue holds a
//! job, and could place something exactly while the least that waiting
//! work needs fits in its free GPUs (`Store::partition_outlook`).

use std::time::Duration;

use gangway_regional::config::Planning;
use gangway_regional::scheduling::run_partition_pass;
use gangway_regional::store::{NewJob, QueueRead};
use gangway_regional::Store;
use gangway_sched::Request;
use gangway_shared::api::JobMode;
use uuid::Uuid;
mod common;
use common::{node, submit, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(600);

fn planning() -> Planning {
    Planning::with_agent_timeout(AGENT_TIMEOUT)
}

async fn fresh() -> (Store, tokio_postgres::Client, String) {
    common::region_store_at("queue", "test-region").await
}

/// The h100 pool's queue as `store` reads it now, in a fixed order.
async fn queue(store: &Store) -> (Vec<Request>, QueueRead) {
    let data = store
        .snapshot_partition("h100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let mut q = data.snapshot.queue;
    q.sort_by(|a, b| (&a.job, &a.ranks).cmp(&(&b.job, &b.ranks)));
    (q, data.queue_read)
}

/// `held`'s queue, checked against a whole read by a store that holds
/// nothing; how `held` read it.
async fn agrees(held: &Store, url: &str) -> (Vec<Request>, QueueRead) {
    let (mine, how) = queue(held).await;
    let (theirs, whole) = queue(&Store::connect(url, "test-region", 2).unwrap()).await;
    assert_eq!(whole, QueueRead::Whole);
    assert_eq!(mine, theirs, "the held queue differs from a whole read");
    (mine, how)
}

fn changes(how: QueueRead) -> usize {
    match how {
        QueueRead::Changes { changed } => changed,
        QueueRead::Whole => panic!("read the whole queue, not what changed"),
    }
}

fn array(tenant: &str, workers: i32) -> NewJob {
    let mut j = common::job(tenant, "h100", workers, 1);
    j.mode = JobMode::Array;
    j.spec.mode = JobMode::Array;
    j
}

fn jobs_of(q: &[Request]) -> Vec<&str> {
    let mut j: Vec<&str> = q.iter().map(|r| r.job.as_str()).collect();
    j.dedup();
    j
}

#[tokio::test]
async fn the_held_queue_sees_every_change_a_whole_read_sees() {
    let (held, client, url) = fresh().await;
    // Two 8-GPU nodes, one agent each.
    let fleet = Fleet::register_nodes(
        &held,
        vec![
            node("n0", "s0", "s0-l0", "h100"),
            node("n1", "s0", "s0-l0", "h100"),
        ],
    )
    .await;
    let gang = submit(&held, &common::job("acme", "h100", 8, 8)).await;
    let big = submit(&held, &common::job("acme", "h100", 16, 8)).await;
    let workers = submit(&held, &array("zeta", 12)).await;

    let (q, how) = agrees(&held, &url).await;
    assert_eq!(how, QueueRead::Whole, "the first read is whole");
    assert_eq!(q.len(), 1 + 1 + 12);
    // Then only what changed is read (nothing, or what transactions of
    // other databases on the server kept below the horizon).
    let (_, how) = agrees(&held, &url).await;
    assert!(changes(how) <= 3);

    // A pass places what fits: the gang and some of the array job's
    // workers (its row may stay 'starting' while its workers are placed
    // one by one).
    let o = run_partition_pass(&held, &planning(), "h100")
        .await
        .unwrap();
    assert!(o.placements > 0);
    let (q, how) = agrees(&held, &url).await;
    assert!(changes(how) >= 1);
    assert!(q.len() < 14, "placed units left the queue: {q:?}");

    // A cancelled job leaves the queue.
    held.cancel_job("acme", big).await.unwrap();
    let (q, how) = agrees(&held, &url).await;
    assert!(changes(how) >= 1);
    assert!(!jobs_of(&q).contains(&big.to_string().as_str()));

    // Every running unit preempted and checkpointed: back in the queue.
    let running: Vec<Uuid> = client
        .query(
            "SELECT DISTINCT job_id FROM allocations WHERE released_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(running.contains(&gang));
    for &j in &running {
        held.preempt_job(j, "test").await.unwrap();
    }
    for n in 0..2 {
        fleet.act(&held, n, Some("ckpt-1")).await;
    }
    let (q, _) = agrees(&held, &url).await;
    assert!(
        jobs_of(&q).contains(&gang.to_string().as_str()),
        "the gang waits again"
    );
    assert_eq!(
        q.iter().filter(|r| r.job == workers.to_string()).count(),
        12,
        "all the array job's workers wait again"
    );

    // A change by a transaction that was open while the previous snapshot
    // was taken (its xid below that snapshot's horizon) is not missed.
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute("UPDATE jobs SET priority = 3 WHERE job_id = $1", &[&gang])
        .await
        .unwrap();
    // A later transaction commits first: the snapshot's horizon of
    // finished transactions passes the open one's.
    let later = submit(&held, &common::job("acme", "h100", 8, 8)).await;
    let (q, _) = agrees(&held, &url).await;
    assert!(q
        .iter()
        .any(|r| r.job == gang.to_string() && r.priority != 3));
    assert!(jobs_of(&q).contains(&later.to_string().as_str()));
    client.batch_execute("COMMIT").await.unwrap();
    let (q, how) = agrees(&held, &url).await;
    assert!(changes(how) >= 1);
    assert!(q
        .iter()
        .any(|r| r.job == gang.to_string() && r.priority == 3));

    // A job held apart as awaiting a buddy, then held by one and changed
    // in the same interval, is named by both of the read's lookups: it is
    // read once (its ranks not twice).
    client
        .execute(
            "INSERT INTO jobs_awaiting_buddy (job_id, created_at) VALUES ($1, now())",
            &[&workers],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE jobs SET priority = 2 WHERE job_id = $1",
            &[&workers],
        )
        .await
        .unwrap();
    agrees(&held, &url).await;
    client
        .batch_execute(&format!(
            "DELETE FROM jobs_awaiting_buddy WHERE job_id = '{workers}';
             UPDATE jobs SET priority = 3 WHERE job_id = '{workers}';"
        ))
        .await
        .unwrap();
    let (q, _) = agrees(&held, &url).await;
    assert_eq!(
        q.iter().filter(|r| r.job == workers.to_string()).count(),
        12
    );

    // A deleted job (no row left to find) leaves too: the whole queue is
    // read again once.
    let doomed = submit(&held, &common::job("acme", "h100", 16, 8)).await;
    let (q, _) = agrees(&held, &url).await;
    assert!(jobs_of(&q).contains(&doomed.to_string().as_str()));
    client
        .batch_execute(&format!(
            "DELETE FROM workers WHERE job_id = '{doomed}';
             DELETE FROM job_events WHERE job_id = '{doomed}';
             DELETE FROM jobs WHERE job_id = '{doomed}';"
        ))
        .await
        .unwrap();
    let (q, how) = agrees(&held, &url).await;
    assert_eq!(how, QueueRead::Whole);
    assert!(!jobs_of(&q).contains(&doomed.to_string().as_str()));
    let (_, how) = agrees(&held, &url).await;
    changes(how);
}

#[tokio::test]
async fn creates_racing_the_passes_are_all_in_the_held_queue() {
    let (held, _client, url) = fresh().await;
    // One 8-GPU node, full: what is created waits.
    Fleet::register_nodes(&held, vec![node("n0", "s0", "s0-l0", "h100")]).await;
    submit(&held, &common::job("acme", "h100", 8, 8)).await;
    run_partition_pass(&held, &planning(), "h100")
        .await
        .unwrap();

    let mut creates = Vec::new();
    for c in 0..8 {
        let store = held.clone();
        creates.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..40 {
                ids.push(submit(&store, &common::job(&format!("t{c}"), "h100", 1, 1)).await);
            }
            ids
        }));
    }
    // Passes (snapshots with the held queue) while the creates commit.
    let mut passes = 0;
    while !creates.iter().all(|t| t.is_finished()) {
        run_partition_pass(&held, &planning(), "h100")
            .await
            .unwrap();
        passes += 1;
    }
    let mut created = Vec::new();
    for t in creates {
        created.extend(t.await.unwrap());
    }
    assert!(passes > 1, "the passes raced the creates");
    let (q, how) = agrees(&held, &url).await;
    assert!(matches!(how, QueueRead::Changes { .. }));
    let waiting = jobs_of(&q);
    for id in created {
        assert!(waiting.contains(&id.to_string().as_str()), "{id} missing");
    }
}

#[tokio::test]
async fn a_pool_has_work_exactly_while_its_held_queue_holds_a_job_and_could_place_what_fits() {
    let (held, _client, url) = fresh().await;
    // One 8-GPU node of each type, and an h100 spare (which takes no work:
    // its GPUs are not free for the pool).
    let mut spare = node("n2", "s0", "s0-l0", "h100");
    spare.spare = true;
    let fleet = Fleet::register_nodes(
        &held,
        vec![
            node("n0", "s0", "s0-l0", "h100"),
            node("n1", "s0", "s0-l1", "a100"),
            spare,
        ],
    )
    .await;
    let outlook = |ty: &'static str| {
        let store = held.clone();
        async move {
            let o = store.partition_outlook(ty).await.unwrap();
            (o.least_needed, o.free_at_most, o.could_place())
        }
    };
    assert_eq!(outlook("h100").await, (None, 8, false));
    assert_eq!(outlook("a100").await, (None, 8, false));

    // Two gangs of the node's size: the first is placed, the second waits.
    let first = submit(&held, &common::job("acme", "h100", 8, 8)).await;
    let second = submit(&held, &common::job("acme", "h100", 8, 8)).await;
    assert_eq!(outlook("h100").await, (Some(8), 8, true));
    assert_eq!(
        outlook("a100").await,
        (None, 8, false),
        "h100's queue is not a100's work"
    );
    run_partition_pass(&held, &planning(), "h100")
        .await
        .unwrap();
    // The second gang still waits, and cannot fit: no pass is needed
    // until GPUs are freed.
    assert_eq!(outlook("h100").await, (Some(8), 0, false));
    // The check brought the pass's held queue up to date: it still agrees
    // with a whole read, and holds only the second gang.
    let (q, how) = agrees(&held, &url).await;
    assert!(matches!(how, QueueRead::Changes { .. }));
    assert_eq!(jobs_of(&q), vec![second.to_string().as_str()]);

    // A smaller job counts with the least needed; two 4-GPU workers of an
    // array job, each its own unit, need 4.
    let mut array = common::job("acme", "h100", 8, 4);
    array.mode = JobMode::Array;
    let third = submit(&held, &array).await;
    assert_eq!(outlook("h100").await, (Some(4), 0, false));

    // Cancelled, nothing waits; the first runs and has nothing to grow.
    held.cancel_job("acme", second).await.unwrap();
    held.cancel_job("acme", third).await.unwrap();
    assert_eq!(outlook("h100").await, (None, 0, false));
    assert_eq!(outlook("a100").await, (None, 8, false));
    let (q, _) = agrees(&held, &url).await;
    assert!(q.is_empty(), "{first} runs, {second} is cancelled: {q:?}");

    // The first ends: its GPUs count as free again.
    let wanted = fleet.sync(&held, 0, "boot-1", vec![], vec![]).await;
    let ended = wanted.iter().map(common::succeeded).collect();
    fleet.sync(&held, 0, "boot-1", vec![], ended).await;
    let again = submit(&held, &common::job("acme", "h100", 8, 8)).await;
    assert_eq!(outlook("h100").await, (Some(8), 8, true), "{again} fits");
}

#[tokio::test]
async fn a_pass_knows_when_each_waiting_job_was_submitted() {
    // (What `gangway_queue_wait_seconds` records for each placement: the
    // submission times stay in the held queue, asked for by job.)
    let (store, client, _url) = fresh().await;
    Fleet::register_nodes(&store, vec![node("n0", "s0", "s0-l0", "h100")]).await;
    let first = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let second = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let created = |id: Uuid| {
        let client = &client;
        async move {
            let row = client
                .query_one("SELECT created_at FROM jobs WHERE job_id = $1", &[&id])
                .await
                .unwrap();
            row.get::<_, chrono::DateTime<chrono::Utc>>(0)
        }
    };
    let data = store
        .snapshot_partition("h100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let (a, b, stranger) = (
        first.to_string(),
        second.to_string(),
        Uuid::new_v4().to_string(),
    );
    let asked = [a.as_str(), b.as_str(), stranger.as_str(), "not-an-id"];
    let at = store
        .submitted_at(&data.queue_key, asked.iter().copied())
        .await;
    assert_eq!(
        at,
        vec![
            Some(created(first).await),
            Some(created(second).await),
            None,
            None
        ]
    );
    // Placed, the first is no longer held after the next read; another
    // pool's key holds neither.
    run_partition_pass(&store, &planning(), "h100")
        .await
        .unwrap();
    let data = store
        .snapshot_partition("h100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let at = store
        .submitted_at(&data.queue_key, [a.as_str(), b.as_str()].into_iter())
        .await;
    assert_eq!(at, vec![None, Some(created(second).await)]);
    let elsewhere = store.submitted_at("a100", [b.as_str()].into_iter()).await;
    assert_eq!(elsewhere, vec![None]);
}

/// A store whose passes are shown the first `cap` units and each
/// tenant's first `per_tenant`, with one 8-GPU node.
async fn windowed(cap: usize, per_tenant: usize) -> (Store, tokio_postgres::Client) {
    let (store, client, _url) = fresh().await;
    store.set_queue_window(gangway_sched::QueueWindow { cap, per_tenant });
    Fleet::register_nodes(&store, vec![node("n0", "s0", "s0-l0", "h100")]).await;
    (store, client)
}

/// Why `job` of `tenant` waits, as `GET /v1/jobs/{id}/explain` says.
async fn why(store: &Store, tenant: &str, job: Uuid) -> gangway_shared::api::Explanation {
    gangway_regional::scheduling::explain(store, tenant, job, &planning())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pass_sees_the_queues_window_and_later_jobs_move_in_as_earlier_ones_leave() {
    // A window of the first 3 units and each tenant's first 1: acme's
    // backlog of five fills the first part, and zeta's first job is shown
    // all the same (a backlog hides no tenant from fair sharing).
    let (store, _client) = windowed(3, 1).await;
    let mut acme = Vec::new();
    for _ in 0..5 {
        acme.push(submit(&store, &common::job("acme", "h100", 8, 8)).await);
    }
    let zeta = [
        submit(&store, &common::job("zeta", "h100", 8, 8)).await,
        submit(&store, &common::job("zeta", "h100", 8, 8)).await,
    ];
    let data = store
        .snapshot_partition("h100", AGENT_TIMEOUT, planning().history)
        .await
        .unwrap();
    let mut shown: Vec<String> = data.snapshot.queue.iter().map(|r| r.job.clone()).collect();
    shown.sort();
    let mut expected: Vec<String> = [acme[0], acme[1], acme[2], zeta[0]]
        .iter()
        .map(Uuid::to_string)
        .collect();
    expected.sort();
    assert_eq!(
        shown, expected,
        "the window: acme's first three and zeta's first"
    );
    // The queue's depth still counts every unit.
    assert_eq!(data.queued_units.get("h100"), Some(&7));

    // A job beyond the window says so, and how many are ahead of it.
    let said = why(&store, "acme", acme[4]).await;
    assert_eq!(said.code, "beyond_window", "{said:?}");
    assert!(
        said.message
            .contains("4 queued unit(s) are ahead of it, 4 of them its tenant's"),
        "{}",
        said.message
    );
    let said = why(&store, "zeta", zeta[1]).await;
    assert_eq!(said.code, "beyond_window");
    assert!(
        said.message
            .contains("6 queued unit(s) are ahead of it, 1 of them"),
        "{}",
        said.message
    );
    // One shown waits as the planner decides.
    let said = why(&store, "acme", acme[1]).await;
    assert_ne!(said.code, "beyond_window");
    // A dry run: another of acme's would be beyond it; a new tenant's
    // first job is in it.
    let spec = common::job("acme", "h100", 8, 8).spec;
    let dry = gangway_regional::scheduling::dry_run(&store, "acme", &spec, &planning())
        .await
        .unwrap();
    assert_eq!(dry.code, "beyond_window", "{dry:?}");
    let dry = gangway_regional::scheduling::dry_run(&store, "newco", &spec, &planning())
        .await
        .unwrap();
    assert_ne!(dry.code, "beyond_window", "{dry:?}");

    // A pass places from the window only: acme's first or zeta's first.
    let o = run_partition_pass(&store, &planning(), "h100")
        .await
        .unwrap();
    assert_eq!(o.placements, 1);
    let (q, _) = queue(&store).await;
    let left: Vec<&str> = jobs_of(&q);
    let placed: Vec<Uuid> = [acme[0], zeta[0]]
        .into_iter()
        .filter(|j| !left.contains(&j.to_string().as_str()))
        .collect();
    assert_eq!(
        placed.len(),
        1,
        "the pass placed acme's or zeta's first job"
    );

    // As jobs ahead leave, later ones move in: with acme's next two
    // cancelled, its fifth is shown, and zeta's second once its first is
    // placed.
    store.cancel_job("acme", acme[1]).await.unwrap();
    store.cancel_job("acme", acme[2]).await.unwrap();
    let (q, _) = queue(&store).await;
    let shown = jobs_of(&q);
    assert!(shown.contains(&acme[4].to_string().as_str()), "{shown:?}");
    let said = why(&store, "acme", acme[4]).await;
    assert_ne!(said.code, "beyond_window", "{said:?}");
    assert_eq!(
        shown.contains(&zeta[1].to_string().as_str()),
        placed == [zeta[0]],
        "zeta's second is shown once its first left the queue: {shown:?}"
    );
}

#[tokio::test]
async fn a_job_owed_what_its_victims_free_is_shown_whatever_the_window() {
    // A window of one unit: the second job waits beyond it, until it holds
    // a claim on what its victims freed (recorded as a pass that preempted
    // for it records it), which must not go to another for want of it.
    let (store, client) = windowed(1, 0).await;
    let first = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let owed = submit(&store, &common::job("zeta", "h100", 8, 8)).await;
    let (q, _) = queue(&store).await;
    assert_eq!(jobs_of(&q), vec![first.to_string().as_str()]);
    client
        .execute(
            "UPDATE jobs SET claim_until = now() + interval '5 minutes' WHERE job_id = $1",
            &[&owed],
        )
        .await
        .unwrap();
    let (q, _) = queue(&store).await;
    let mut expected = vec![first.to_string(), owed.to_string()];
    expected.sort();
    assert_eq!(jobs_of(&q), expected);
    // And the pass places it first: it comes before every class.
    let o = run_partition_pass(&store, &planning(), "h100")
        .await
        .unwrap();
    assert_eq!(o.placements, 1);
    let (q, _) = queue(&store).await;
    assert_eq!(jobs_of(&q), vec![first.to_string().as_str()]);
}
