//! The store's side of regions watching each other, against a real,
//! throwaway PostgreSQL (docs/failover.md): a witness refuses to record a
//! move of a home it heard from within the adoption time; a held intent is
//! idempotent and answers claims for its home; a returning home's copies
//! of moved jobs are cancelled with where they went, only for a higher
//! epoch; a job written while the region replicates is not scheduled until
//! a buddy holds it.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_regional::scheduling::run_pass;
use gangway_regional::store::replicas::{Intent, Move};
use gangway_shared::api::JobState;
use uuid::Uuid;

mod common;
use common::{register, store, submit};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

fn intent(home: &str, epoch: i32) -> Intent {
    Intent {
        job_id: Uuid::new_v4(),
        home: home.into(),
        tenant: "acme".into(),
        idempotency_key: Some("k1".into()),
        spec: common::job("acme", "h100", 8, 8).spec,
        created_at: chrono::Utc::now(),
        epoch,
    }
}

#[tokio::test]
async fn a_witness_refuses_a_move_of_a_home_it_heard_from_recently() {
    let (store, client) = store("replicas_witness").await;
    let m = Move {
        job_id: Uuid::new_v4(),
        from_home: "r1".into(),
        to_region: "r2".into(),
        epoch: 2,
        planned: false,
        at: None,
    };
    // Never heard from r1: recorded.
    assert!(store.witness_move(&m, 16.0).await.unwrap());
    let recorded = store.moves_from("r1").await.unwrap();
    assert!(recorded[0].at.is_some(), "a witness says when");
    let recorded: Vec<Move> = (recorded.into_iter())
        .map(|r| Move { at: None, ..r })
        .collect();
    assert_eq!(recorded, vec![m.clone()]);
    // r1 heartbeats us: from now on its jobs' moves are refused.
    store.peer_heard("r1", &BTreeMap::new()).await.unwrap();
    let later = Move {
        job_id: Uuid::new_v4(),
        ..m.clone()
    };
    assert!(!store.witness_move(&later, 16.0).await.unwrap());
    assert_eq!(store.moves_from("r1").await.unwrap().len(), 1);
    // Heard from long enough ago: recorded again.
    client
        .execute(
            "UPDATE peer_leases SET last_heard_at = now() - interval '20 seconds' WHERE peer = 'r1'",
            &[],
        )
        .await
        .unwrap();
    assert!(store.witness_move(&later, 16.0).await.unwrap());
    assert_eq!(store.moves_from("r1").await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_held_intent_is_idempotent_and_claims_its_job_for_its_home() {
    let (store, client) = store("replicas_intent").await;
    let i = intent("r1", 1);
    store.hold_intent(&i).await.unwrap();
    store.hold_intent(&i).await.unwrap();
    let n: i64 = client
        .query_one("SELECT count(*) FROM replica_jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // A keyed create of it here is the home's.
    assert_eq!(
        store.held_for_another(i.job_id).await.unwrap().as_deref(),
        Some("r1")
    );
    assert_eq!(
        store.claim(i.job_id, "acme", "test-region").await.unwrap(),
        "r1"
    );
    // The home says it ended: it is never adopted.
    let done = gangway_regional::store::replicas::Update {
        job_id: i.job_id,
        home: "r1".into(),
        epoch: 1,
        finished: true,
        checkpoint: Some("ckpt-7".into()),
        checkpointed_at: None,
    };
    store.apply_updates(&[done]).await.unwrap();
    let state: String = client
        .query_one(
            "SELECT state FROM replica_jobs WHERE job_id = $1",
            &[&i.job_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "finished");
    assert!(store.held_for_another(i.job_id).await.unwrap().is_none());
}

#[tokio::test]
async fn a_returning_home_cancels_its_copies_of_jobs_that_moved_at_a_higher_epoch() {
    let (store, _client) = store("replicas_return").await;
    register(&store, vec![common::node("n0", "s0", "l0", "h100")]).await;
    let a = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let b = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let moves = vec![
        Move {
            job_id: a,
            from_home: "test-region".into(),
            to_region: "r2".into(),
            epoch: 2,
            planned: false,
            at: None,
        },
        // Not a higher epoch than ours: ignored.
        Move {
            job_id: b,
            from_home: "test-region".into(),
            to_region: "r3".into(),
            epoch: 1,
            planned: false,
            at: None,
        },
    ];
    assert_eq!(store.release_moved(&moves).await.unwrap(), 1);
    assert_eq!(store.release_moved(&moves).await.unwrap(), 0, "once");
    let ja = store.get_job("acme", a).await.unwrap();
    assert_eq!(ja.state, JobState::Cancelled);
    assert_eq!(ja.moved_to.as_deref(), Some("r2"));
    let jb = store.get_job("acme", b).await.unwrap();
    assert_eq!((jb.state, jb.moved_to), (JobState::Queued, None));
}

#[tokio::test]
async fn a_job_is_not_scheduled_until_a_buddy_holds_its_intent() {
    let (store, _client) = store("replicas_ack").await;
    let store = store.with_replication(true);
    register(&store, vec![common::node("n0", "s0", "l0", "h100")]).await;
    let id = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    assert!(store.awaits_buddy(id).await.unwrap());
    let o = run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 0, "not acknowledged yet: {o:?}");
    store.replicated(id, "r2").await.unwrap();
    let o = run_pass(&store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1, "{o:?}");
    assert_eq!(store.intent_of(id).await.unwrap().epoch, 1);
}

#[tokio::test]
async fn a_job_cancelled_before_a_buddy_held_it_is_told_to_that_buddy() {
    let (store, client) = store("replicas_cancel_awaiting").await;
    let store = store.with_replication(true);
    register(&store, vec![common::node("n0", "s0", "l0", "h100")]).await;
    let id = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    assert!(store.awaits_buddy(id).await.unwrap());
    // Cancelled while its intent (a queued job) is on its way to r2.
    store.cancel_job("acme", id).await.unwrap();
    store.replicated(id, "r2").await.unwrap();
    assert!(!store.awaits_buddy(id).await.unwrap());
    // r2 holds it queued: the cancellation is owed to it, or r2 would run
    // it should this region die.
    let owed: bool = client
        .query_one(
            "SELECT buddy = 'r2' AND buddy_dirty_since IS NOT NULL FROM jobs WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(owed, "the buddy is never told of the cancellation");
}

#[tokio::test]
async fn a_batch_marks_each_job_held_and_owes_its_buddy_only_the_cancelled_one() {
    let (store, client) = store("replicas_mark_batch").await;
    let store = store.with_replication(true);
    register(&store, vec![common::node("n0", "s0", "l0", "h100")]).await;
    let kept = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let gone = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    let other = submit(&store, &common::job("acme", "h100", 8, 8)).await;
    store.cancel_job("acme", gone).await.unwrap();
    // Two held by r2 in one mark (the form for a batch), one by r3 alone.
    (store.replicated_many(&[(kept, "r2"), (gone, "r2")]).await).unwrap();
    store.replicated(other, "r3").await.unwrap();
    let row = |id: Uuid| {
        let client = &client;
        async move {
            let r = client
                .query_one(
                    "SELECT buddy, buddy_told_state, buddy_dirty_since IS NOT NULL
                     FROM jobs WHERE job_id = $1",
                    &[&id],
                )
                .await
                .unwrap();
            (
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, bool>(2),
            )
        }
    };
    for id in [kept, gone, other] {
        assert!(
            !store.awaits_buddy(id).await.unwrap(),
            "{id} still awaits a buddy"
        );
    }
    assert_eq!(row(kept).await, ("r2".into(), "queued".into(), false));
    assert_eq!(
        row(gone).await,
        ("r2".into(), "queued".into(), true),
        "r2 holds it queued: the cancellation is owed to it"
    );
    assert_eq!(row(other).await, ("r3".into(), "queued".into(), false));
}

/// A region's state for tests: `name`, its store, its checkpoint store at
/// `ckpt`, and its peers (name, URL).
fn region_state(
    name: &str,
    store: gangway_regional::Store,
    ckpt: &std::path::Path,
    peers: &[(&str, String)],
) -> gangway_regional::AppState {
    let mut config = common::region_config(name, peers);
    config.checkpoint_store = Some(
        gangway_checkpoint::CheckpointStore::open(&format!("file://{}", ckpt.display())).unwrap(),
    );
    gangway_regional::AppState::new(store, config)
}

#[tokio::test]
async fn a_checkpoint_reaches_the_buddys_store_whole_and_an_older_epoch_is_refused() {
    let (home_store, _c1) = store("replicas_ckpt_home").await;
    let (buddy_store, _c2) = store("replicas_ckpt_buddy").await;
    let dirs = tempfile::tempdir().unwrap();
    // The buddy serves its API; the home only calls it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let buddy_url = format!("http://{}", listener.local_addr().unwrap());
    let buddy = region_state(
        "rb",
        buddy_store.clone(),
        &dirs.path().join("rb"),
        &[("ra", "http://127.0.0.1:9".into())],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(listener, buddy, stop.clone()));
    let home = region_state(
        "ra",
        home_store,
        &dirs.path().join("ra"),
        &[("rb", buddy_url)],
    );
    let home_ckpt = home.config.checkpoint_store.clone().unwrap();
    let buddy_ckpt = gangway_checkpoint::CheckpointStore::open(&format!(
        "file://{}",
        dirs.path().join("rb").display()
    ))
    .unwrap();

    // A job of ra's, held by rb at epoch 1, with a checkpoint in ra's store
    // (one file larger than a copy chunk, so it goes in several).
    let job = Uuid::new_v4();
    let mut i = intent("ra", 1);
    i.job_id = job;
    buddy_store.hold_intent(&i).await.unwrap();
    let src = dirs.path().join("src").join("step-3");
    std::fs::create_dir_all(src.join("shards")).unwrap();
    std::fs::write(src.join("step"), b"3").unwrap();
    std::fs::write(src.join("shards/model.bin"), vec![7u8; 9 * 1024 * 1024]).unwrap();
    let up = |seq| gangway_checkpoint::Upload {
        job_id: job,
        epoch: 1,
        seq,
        attempt: 1,
        agent_id: "ra-agent".into(),
        node_id: "ra-n0".into(),
        rank: 0,
        owner: None,
    };
    let m = home_ckpt.upload(&src, &up(3)).await.unwrap();
    gangway_regional::replication::copy_checkpoint(home.link(), "rb", &m.key)
        .await
        .unwrap();
    // Whole in the buddy's store: the same manifest, every file verified.
    assert_eq!(buddy_ckpt.manifest(&m.key).await.unwrap(), m);
    let got = dirs.path().join("got").join("step-3");
    buddy_ckpt.fetch(&m.key, &got).await.unwrap();
    assert_eq!(std::fs::read(got.join("step")).unwrap(), b"3");

    // The job moved on at rb (epoch 2): a late epoch-1 checkpoint of the
    // old owner is refused, never committed.
    let mut adopted = i.clone();
    adopted.epoch = 2;
    buddy_store.hold_intent(&adopted).await.unwrap();
    let late = home_ckpt.upload(&src, &up(4)).await.unwrap();
    gangway_regional::replication::copy_checkpoint(home.link(), "rb", &late.key)
        .await
        .unwrap();
    assert!(buddy_ckpt.manifest(&late.key).await.is_err());
    stop.cancel();
    let _ = server.await;
}

/// Serves `state` on a free loopback port until the returned token is
/// cancelled; its URL.
async fn serve(state: gangway_regional::AppState) -> (String, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(gangway_regional::serve_on(listener, state, stop.clone()));
    (url, stop)
}

/// `n` jobs submitted at `store` while it replicates, and their intents.
async fn new_jobs(store: &gangway_regional::Store, home: &str, n: usize) -> Vec<Intent> {
    let mut intents = Vec::new();
    for _ in 0..n {
        let j = common::job("acme", "h100", 8, 8);
        let id = submit(store, &j).await;
        let i = store.intent_of(id).await.unwrap();
        assert_eq!(i.home, home);
        intents.push(i);
    }
    intents
}

/// Every intent handed over by `home` at once, as concurrent creates do.
async fn hold_all(
    home: &gangway_regional::AppState,
    intents: &[Intent],
) -> Vec<gangway_regional::replication::intents::Taken> {
    let holds = intents.iter().map(|i| {
        let (home, i) = (home.clone(), i.clone());
        tokio::spawn(async move { home.intents.hold(&home.store, &home.peers, i).await })
    });
    (futures_util::future::join_all(holds).await.into_iter())
        .map(|t| t.unwrap())
        .collect()
}

/// A count over the jobs `ids` (`$1`) on a raw client.
async fn count(db: &tokio_postgres::Client, sql: &str, ids: &[Uuid]) -> i64 {
    db.query_one(sql, &[&ids]).await.unwrap().get(0)
}

#[tokio::test]
async fn concurrent_creates_share_one_hand_over_and_each_is_held_before_it_is_acknowledged() {
    use gangway_regional::replication::intents::Taken;
    let (home_store, home_db) = common::region_store("replicas_group_home", "ra").await;
    let home_store = home_store.with_replication(true);
    let (buddy_store, buddy_db) = store("replicas_group_buddy").await;
    let (buddy_url, stop) = serve(common::region_state(
        "rb",
        buddy_store,
        &[("ra", "http://127.0.0.1:9".into())],
    ))
    .await;
    let home = common::region_state("ra", home_store.clone(), &[("rb", buddy_url)]);
    let intents = new_jobs(&home_store, "ra", 60).await;

    // Sixty creates waiting for their buddy at once, as a busy region's are.
    for taken in hold_all(&home, &intents).await {
        assert_eq!(taken, Taken::Marked("rb".into()));
    }
    // Every one held at the buddy, and schedulable at home, by the time its
    // create is answered...
    let ids: Vec<Uuid> = intents.iter().map(|i| i.job_id).collect();
    let held = count(&buddy_db, "SELECT count(*) FROM replica_jobs WHERE job_id = ANY($1) AND home = 'ra' AND state = 'live'", &ids).await;
    assert_eq!(held, 60);
    for id in &ids {
        assert!(!home_store.awaits_buddy(*id).await.unwrap());
    }
    let buddies = count(
        &home_db,
        "SELECT count(*) FROM jobs WHERE job_id = ANY($1) AND buddy = 'rb'",
        &ids,
    )
    .await;
    assert_eq!(buddies, 60);
    // ...in fewer commits than creates: rows written by one statement share
    // its transaction's `now()`.
    let commits = count(
        &buddy_db,
        "SELECT count(DISTINCT updated_at) FROM replica_jobs WHERE job_id = ANY($1)",
        &ids,
    )
    .await;
    assert!(commits < 60, "60 intents in {commits} commits: not batched");
    stop.cancel();
}

#[tokio::test]
async fn intents_whose_first_buddy_is_down_go_together_to_the_next() {
    use gangway_regional::replication::intents::Taken;
    let (home_store, _home_db) = common::region_store("replicas_group_next_home", "ra").await;
    let home_store = home_store.with_replication(true);
    let (buddy_store, buddy_db) = store("replicas_group_next_rc").await;
    let (rc_url, stop) = serve(common::region_state(
        "rc",
        buddy_store,
        &[
            ("ra", "http://127.0.0.1:9".into()),
            ("rb", "http://127.0.0.1:9".into()),
        ],
    ))
    .await;
    // rb never answers (nothing listens there); rc does.
    let home = common::region_state(
        "ra",
        home_store.clone(),
        &[("rb", "http://127.0.0.1:9".into()), ("rc", rc_url)],
    );
    let intents = new_jobs(&home_store, "ra", 20).await;
    let first_rb = (intents.iter())
        .filter(|i| home.peers.buddies_of(i.job_id)[0] == "rb")
        .count();
    assert!(first_rb > 0, "some jobs must have rb first for this test");
    for taken in hold_all(&home, &intents).await {
        assert_eq!(taken, Taken::Marked("rc".into()));
    }
    let ids: Vec<Uuid> = intents.iter().map(|i| i.job_id).collect();
    let held = count(
        &buddy_db,
        "SELECT count(*) FROM replica_jobs WHERE job_id = ANY($1)",
        &ids,
    )
    .await;
    assert_eq!(held, 20);
    // With no buddy at all, nothing is acknowledged.
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = new_jobs(&home_store, "ra", 1).await.remove(0);
    let id = late.job_id;
    assert_eq!(
        home.intents.hold(&home.store, &home.peers, late).await,
        Taken::Nobody
    );
    assert!(
        home_store.awaits_buddy(id).await.unwrap(),
        "not schedulable"
    );
}

#[tokio::test]
async fn a_batch_holds_each_job_once_at_its_highest_epoch() {
    let (store, client) = store("replicas_batch_epochs").await;
    let a1 = intent("ra", 1);
    let a3 = Intent {
        epoch: 3,
        ..a1.clone()
    };
    let a2 = Intent {
        epoch: 2,
        ..a1.clone()
    };
    let b = intent("ra", 1);
    store
        .hold_intents(&[a1.clone(), a3, a2, b.clone()])
        .await
        .unwrap();
    assert_eq!(epoch_of(&store, a1.job_id).await, Some(3));
    assert_eq!(epoch_of(&store, b.job_id).await, Some(1));
    // An older epoch later changes nothing; the claims answer for the home.
    store.hold_intents(std::slice::from_ref(&a1)).await.unwrap();
    assert_eq!(epoch_of(&store, a1.job_id).await, Some(3));
    let claims: i64 = (client.query_one(
        "SELECT count(*) FROM idempotency_claims WHERE job_id = ANY($1) AND region = 'ra'",
        &[&vec![a1.job_id, b.job_id]],
    ))
    .await
    .unwrap()
    .get(0);
    assert_eq!(claims, 2);
}

async fn epoch_of(store: &gangway_regional::Store, job: Uuid) -> Option<i32> {
    store
        .replica_epoch(job)
        .await
        .unwrap()
        .map(|(epoch, _)| epoch)
}

#[tokio::test]
async fn the_homes_with_live_replicas_are_each_named_once() {
    let (store, client) = store("replicas_homes").await;
    assert!(store.replica_homes().await.unwrap().is_empty());
    let mut held = Vec::new();
    for home in ["rc", "ra", "rc", "rb", "ra", "rc"] {
        held.push(intent(home, 1));
    }
    store.hold_intents(&held).await.unwrap();
    assert_eq!(store.replica_homes().await.unwrap(), ["ra", "rb", "rc"]);
    // A home whose replicas all finished is no longer one.
    client
        .execute(
            "UPDATE replica_jobs SET state = 'finished' WHERE home = 'rb'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(store.replica_homes().await.unwrap(), ["ra", "rc"]);
}
