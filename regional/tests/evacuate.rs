//! Planned evacuation and fail back, the store's side and the handover
//! driven in-process, against real, throwaway PostgreSQL databases
//! (docs/failover.md, "Planned evacuation and fail back"):
//!
//! - a running job is asked to checkpoint and stop, and is not moved before
//!   it stopped; once marked it is never placed at its home again, and it
//!   becomes schedulable at the target only when the target takes it;
//! - every step of a handover can be repeated and changes nothing again;
//! - a witness refuses a second move of a job at the same epoch (or an
//!   older one) to another region;
//! - failing back revives the home's released copy: queued again, its
//!   workers pending, `moved_to` cleared, at the next epoch, resuming from
//!   the checkpoint it was handed over with;
//! - the leader's beat carries a job from a running home to its buddy over
//!   HTTP, a replayed beat changing nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_regional::scheduling::run_pass;
use gangway_regional::store::handovers::{Take, EVACUATING, FAILING_BACK};
use gangway_regional::store::replicas::{Move, Update};
use gangway_regional::Store;
use gangway_shared::api::{EvacuationState, JobState};
use uuid::Uuid;

mod common;
use common::{node, region_state, region_store, Fleet};

const AGENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// A keyed 8-GPU gang of tenant acme at `store`, acknowledged with `buddy`
/// holding its intent (as replication would leave it).
async fn job_with_buddy(store: &Store, buddy: &Store, key: &str) -> Uuid {
    let mut j = common::job("acme", "h100", 8, 8);
    j.id = gangway_shared::ids::job_id_for_key("acme", key);
    j.idempotency_key = Some(key.into());
    let id = common::submit(store, &j).await;
    store.replicated(id, buddy.region()).await.unwrap();
    buddy
        .hold_intent(&store.intent_of(id).await.unwrap())
        .await
        .unwrap();
    id
}

/// Places and starts `id` on node n0 of `store`.
async fn run(store: &Store, fleet: &Fleet, id: Uuid) {
    let o = run_pass(store, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 1, "{o:?}");
    fleet.act(store, 0, None).await;
    fleet.act(store, 0, None).await;
    let j = store.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Running, "{j:?}");
}

async fn events(store: &Store, id: Uuid, kind: &str) -> Vec<String> {
    (store.job_events("acme", id).await.unwrap())
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.message)
        .collect()
}

/// Moves as recorded, less when (a witness's clock).
fn untimed(moves: Vec<Move>) -> Vec<Move> {
    moves.into_iter().map(|m| Move { at: None, ..m }).collect()
}

fn planned(job: Uuid, from: &str, to: &str, epoch: i32) -> Move {
    Move {
        job_id: job,
        from_home: from.into(),
        to_region: to.into(),
        epoch,
        planned: true,
        at: None,
    }
}

#[tokio::test]
async fn a_running_job_moves_only_once_stopped_and_never_runs_in_two_regions() {
    let (h, _hc) = region_store("evac_step_home", "rh").await;
    let (t, _tc) = region_store("evac_step_target", "rt").await;
    let hf = Fleet::register_nodes(&h, vec![node("n0", "s0", "l0", "h100")]).await;
    Fleet::register_nodes(&t, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = job_with_buddy(&h, &t, "evac-1").await;
    run(&h, &hf, id).await;

    // The operator evacuates rh: the job is marked for its buddy.
    assert!(h.start_evacuation("ops", Some("power work")).await.unwrap());
    assert!(!h.start_evacuation("ops", None).await.unwrap(), "once");
    assert_eq!(
        h.evacuation_state().await.unwrap(),
        EvacuationState::Evacuating
    );
    let marked = h
        .mark_evacuation(&|_, buddy: Option<&str>| buddy.map(String::from))
        .await
        .unwrap();
    assert_eq!(marked, vec![(id, "rt".to_string())]);
    assert!(h
        .mark_evacuation(&|_, b| b.map(String::from))
        .await
        .unwrap()
        .is_empty());

    // Running: not moved.
    let m = planned(id, "rh", "rt", 2);
    assert!(
        !h.commit_planned_move(&m).await.unwrap(),
        "running: not moved"
    );
    // Asked to checkpoint and stop (an evacuation's region preemption).
    assert!(h.preempt_for_handover(id).await.unwrap());
    assert!(!h.preempt_for_handover(id).await.unwrap(), "once");
    let j = h.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Preempting);
    let preempted = events(&h, id, "preempted").await;
    assert!(preempted[0].contains("evacuating"), "{preempted:?}");
    assert!(!h.commit_planned_move(&m).await.unwrap(), "still stopping");

    // The workers checkpoint and stop: queued, with the checkpoint just
    // written, and never placed here again.
    hf.act(&h, 0, Some("sim:0.400000")).await;
    let j = h.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Queued);
    assert_eq!(j.restore_from.as_deref(), Some("sim:0.400000"));
    assert_eq!(j.preemptions, 1);
    assert!(j.lost_gpu_s < 1.0, "work lost: {}", j.lost_gpu_s);
    let o = run_pass(&h, AGENT_TIMEOUT).await.unwrap();
    assert_eq!(o.placements, 0, "a marked job is never placed: {o:?}");

    // The target is told of the checkpoint, then the move is committed at
    // home (the point of no return); a cancel here must go to the new
    // owner now.
    t.apply_updates(&[Update {
        job_id: id,
        home: "rh".into(),
        epoch: 1,
        finished: false,
        checkpoint: j.restore_from.clone(),
        checkpointed_at: None,
    }])
    .await
    .unwrap();
    assert!(h.commit_planned_move(&m).await.unwrap());
    assert!(
        h.commit_planned_move(&m).await.unwrap(),
        "the same move again"
    );
    let refused = h.cancel_job("acme", id).await.unwrap_err();
    assert!(
        matches!(&refused, gangway_regional::store::StoreError::Conflict { code, .. }
                 if *code == gangway_shared::error::codes::REGION_UNAVAILABLE),
        "{refused:?}"
    );
    // Witnessed at the target, then taken there at epoch 2, from that
    // checkpoint.
    assert!(t.witness_move(&m, 16.0).await.unwrap());
    let take = Take {
        job_id: id,
        from_home: "rh".into(),
        epoch: 2,
        checkpoint: j.restore_from.clone(),
        cause: EVACUATING.into(),
    };
    assert!(t
        .take_handover(&take, take.checkpoint.as_deref())
        .await
        .unwrap());
    let moved = t.get_job("acme", id).await.unwrap();
    assert_eq!(
        (moved.state, moved.epoch, moved.adopted_from.as_deref()),
        (JobState::Queued, 2, Some("rh"))
    );
    assert_eq!(moved.restore_from.as_deref(), Some("sim:0.400000"));
    let requeued = events(&t, id, "requeued").await;
    assert!(requeued[0].contains("evacuation"), "{requeued:?}");
    // Both copies exist for a moment: only the target's may be placed.
    assert_eq!(run_pass(&h, AGENT_TIMEOUT).await.unwrap().placements, 0);
    assert_eq!(run_pass(&t, AGENT_TIMEOUT).await.unwrap().placements, 1);

    // The home releases its copy, once.
    assert!(h.release_handed_over(id, "rt", 2).await.unwrap());
    assert!(!h.release_handed_over(id, "rt", 2).await.unwrap(), "once");
    let home = h.get_job("acme", id).await.unwrap();
    assert_eq!(home.state, JobState::Cancelled);
    assert_eq!(home.moved_to.as_deref(), Some("rt"));
    let handed = events(&h, id, "handed_over").await;
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert!(handed[0].contains("evacuation"), "{handed:?}");

    // A replayed take changes nothing.
    assert!(!t
        .take_handover(&take, take.checkpoint.as_deref())
        .await
        .unwrap());
    assert_eq!(events(&t, id, "requeued").await.len(), 1);
    assert_eq!(t.get_job("acme", id).await.unwrap().epoch, 2);

    // Nothing is left: the evacuation says so.
    assert_eq!(h.evacuation_left().await.unwrap(), 0);
    let e = h.evacuation().await.unwrap();
    assert_eq!((e.jobs_left, e.moved, e.held), (0, 1, 0), "{e:?}");
    assert_eq!(e.jobs[0].step, "moved");
    assert_eq!(e.jobs[0].to.as_deref(), Some("rt"));
    assert_eq!(e.actor.as_deref(), Some("ops"));
}

#[tokio::test]
async fn a_witness_refuses_a_second_move_at_the_same_epoch_to_another_region() {
    let (store, _c) = region_store("evac_witness", "rw").await;
    let job = Uuid::new_v4();
    let to_r2 = planned(job, "r1", "r2", 2);
    assert!(store.witness_move(&to_r2, 16.0).await.unwrap());
    assert!(
        store.witness_move(&to_r2, 16.0).await.unwrap(),
        "the same move"
    );
    // The same epoch elsewhere, or an older one: refused, nothing changes.
    let to_r3 = planned(job, "r1", "r3", 2);
    assert!(!store.witness_move(&to_r3, 16.0).await.unwrap());
    let mut adoption = planned(job, "r1", "r3", 2);
    adoption.planned = false;
    assert!(!store.witness_move(&adoption, 16.0).await.unwrap());
    assert!(!store
        .witness_move(&planned(job, "r1", "r3", 1), 16.0)
        .await
        .unwrap());
    assert_eq!(
        untimed(store.moves_from("r1").await.unwrap()),
        vec![to_r2.clone()]
    );
    // A later epoch (the job moving on, here back from r2) replaces it.
    let back = planned(job, "r2", "r1", 3);
    assert!(store.witness_move(&back, 16.0).await.unwrap());
    assert!(store.moves_from("r1").await.unwrap().is_empty());
    assert_eq!(untimed(store.moves_from("r2").await.unwrap()), vec![back]);

    // A planned move is recorded while the home is heard; an adoption is
    // not.
    store.peer_heard("r1", &BTreeMap::new()).await.unwrap();
    let other = Uuid::new_v4();
    let mut adopt = planned(other, "r1", "r2", 2);
    adopt.planned = false;
    assert!(!store.witness_move(&adopt, 16.0).await.unwrap());
    assert!(store
        .witness_move(&planned(other, "r1", "r2", 2), 16.0)
        .await
        .unwrap());
}

#[tokio::test]
async fn failing_back_revives_the_released_copy_at_the_next_epoch() {
    let (h, _hc) = region_store("evac_back_home", "rh").await;
    let (t, _tc) = region_store("evac_back_target", "rt").await;
    let hf = Fleet::register_nodes(&h, vec![node("n0", "s0", "l0", "h100")]).await;
    let tf = Fleet::register_nodes(&t, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = job_with_buddy(&h, &t, "back-1").await;
    run(&h, &hf, id).await;
    // Evacuated to rt (queued there, placed, running).
    h.start_evacuation("ops", None).await.unwrap();
    h.mark_evacuation(&|_, b| b.map(String::from))
        .await
        .unwrap();
    h.preempt_for_handover(id).await.unwrap();
    hf.act(&h, 0, Some("sim:0.250000")).await;
    assert!(h
        .commit_planned_move(&planned(id, "rh", "rt", 2))
        .await
        .unwrap());
    t.witness_move(&planned(id, "rh", "rt", 2), 16.0)
        .await
        .unwrap();
    let take = Take {
        job_id: id,
        from_home: "rh".into(),
        epoch: 2,
        checkpoint: Some("sim:0.250000".into()),
        cause: EVACUATING.into(),
    };
    t.take_handover(&take, take.checkpoint.as_deref())
        .await
        .unwrap();
    h.release_handed_over(id, "rt", 2).await.unwrap();
    run(&t, &tf, id).await;

    // rh fails back: rt marks the job it took from rh, and still runs it.
    let (changed, called_off) = h.start_failback("ops", None).await.unwrap();
    assert!(changed);
    assert_eq!(called_off, 0);
    assert_eq!(t.mark_handback("rh").await.unwrap(), 1);
    assert_eq!(t.mark_handback("rh").await.unwrap(), 1, "marked once");
    assert!(t.preempt_for_handover(id).await.unwrap());
    let preempted = events(&t, id, "preempted").await;
    assert!(preempted[0].contains("failing_back"), "{preempted:?}");
    tf.act(&t, 0, Some("sim:0.600000")).await;
    assert_eq!(run_pass(&t, AGENT_TIMEOUT).await.unwrap().placements, 0);

    // rh is not rt's buddy for it: rt gives rh the intent first; then the
    // move, and rh takes it back at epoch 3.
    let intent = t.intent_of(id).await.unwrap();
    assert_eq!((intent.home.as_str(), intent.epoch), ("rt", 2));
    h.hold_intent(&intent).await.unwrap();
    let back = planned(id, "rt", "rh", 3);
    assert!(t.commit_planned_move(&back).await.unwrap());
    assert!(h.witness_move(&back, 16.0).await.unwrap());
    let take_back = Take {
        job_id: id,
        from_home: "rt".into(),
        epoch: 3,
        checkpoint: Some("sim:0.600000".into()),
        cause: FAILING_BACK.into(),
    };
    assert!(h
        .take_handover(&take_back, take_back.checkpoint.as_deref())
        .await
        .unwrap());
    // The released copy lives again: queued, workers pending, moved_to
    // cleared, epoch 3, from the checkpoint rt wrote.
    let revived = h.get_job("acme", id).await.unwrap();
    assert_eq!(revived.state, JobState::Queued, "{revived:?}");
    assert_eq!(revived.moved_to, None);
    assert_eq!(revived.epoch, 3);
    assert_eq!(revived.adopted_from.as_deref(), Some("rt"));
    assert_eq!(revived.restore_from.as_deref(), Some("sim:0.600000"));
    assert_eq!(revived.reason, None);
    assert!(revived
        .workers
        .iter()
        .all(|w| w.state == gangway_shared::api::WorkerState::Pending && w.node.is_none()));
    // A replayed take changes nothing; rt releases its copy.
    assert!(!h.take_handover(&take_back, None).await.unwrap());
    assert!(t.release_handed_over(id, "rh", 3).await.unwrap());
    assert_eq!(
        t.mark_handback("rh").await.unwrap(),
        0,
        "none away any more"
    );
    // rh places it again (it is not evacuating); it runs, and succeeds.
    run(&h, &hf, id).await;
    let e = h.evacuation().await.unwrap();
    assert_eq!(e.state, EvacuationState::FailingBack);
    assert_eq!(e.moved, 1, "{e:?}");
    assert_eq!(e.jobs[0].to.as_deref(), Some("rt"), "came back from rt");
    assert!(h
        .advance_evacuation(EvacuationState::FailingBack, EvacuationState::None, 0)
        .await
        .unwrap());
    assert_eq!(h.evacuation_state().await.unwrap(), EvacuationState::None);
}

#[tokio::test]
async fn a_job_that_cannot_leave_is_stopped_and_held() {
    let (h, _hc) = region_store("evac_held", "rh").await;
    let (t, _tc) = region_store("evac_held_target", "rt").await;
    let hf = Fleet::register_nodes(&h, vec![node("n0", "s0", "l0", "h100")]).await;
    let mut j = common::job("acme", "h100", 8, 8);
    j.spec.region = Some("rh".into());
    let id = common::submit(&h, &j).await;
    h.replicated(id, "rt").await.unwrap();
    t.hold_intent(&h.intent_of(id).await.unwrap())
        .await
        .unwrap();
    run(&h, &hf, id).await;
    h.start_evacuation("ops", None).await.unwrap();
    assert!(h
        .mark_evacuation(&|_, b| b.map(String::from))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(h.stop_held().await.unwrap(), 1);
    assert_eq!(h.evacuation_left().await.unwrap(), 1, "still stopping");
    hf.act(&h, 0, Some("sim:0.100000")).await;
    assert_eq!(h.evacuation_left().await.unwrap(), 0);
    let e = h.evacuation().await.unwrap();
    assert_eq!((e.jobs_left, e.held), (0, 1), "{e:?}");
    assert_eq!(e.jobs[0].step, "held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_beat_hands_a_running_job_to_its_buddy_and_a_replay_changes_nothing() {
    let (h_store, _hc) = region_store("evac_beat_home", "rh").await;
    let (t_store, _tc) = region_store("evac_beat_target", "rt").await;
    // rt serves its API (its own loops stay fenced: rh does not serve);
    // rh's beat is called by hand.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t_url = format!("http://{}", listener.local_addr().unwrap());
    let t = region_state(
        "rt",
        t_store.clone(),
        &[("rh", "http://127.0.0.1:9".into())],
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gangway_regional::serve_on(listener, t, stop.clone()));
    let h = region_state("rh", h_store.clone(), &[("rt", t_url)]);

    let hf = Fleet::register_nodes(&h_store, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = job_with_buddy(&h_store, &t_store, "beat-1").await;
    run(&h_store, &hf, id).await;
    h_store.start_evacuation("ops", None).await.unwrap();

    // First beat: marked and asked to checkpoint and stop; rt has nothing.
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    assert!(h.is_evacuating());
    assert_eq!(
        h_store.get_job("acme", id).await.unwrap().state,
        JobState::Preempting
    );
    assert!(t_store.get_job("acme", id).await.is_err());
    // Its workers checkpoint and stop.
    hf.act(&h_store, 0, Some("sim:0.500000")).await;
    // Next beat: moved to rt at epoch 2 with that checkpoint, rh's copy
    // released, and nothing is left.
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    let there = t_store.get_job("acme", id).await.unwrap();
    assert_eq!((there.epoch, there.state), (2, JobState::Queued));
    assert_eq!(there.restore_from.as_deref(), Some("sim:0.500000"));
    let home = h_store.get_job("acme", id).await.unwrap();
    assert_eq!(home.moved_to.as_deref(), Some("rt"));
    assert_eq!(home.state, JobState::Cancelled);
    assert_eq!(
        h_store.evacuation_state().await.unwrap(),
        EvacuationState::Evacuated
    );
    // The move is at both regions.
    let at_rt = untimed(t_store.moves_from("rh").await.unwrap());
    assert_eq!(at_rt, vec![planned(id, "rh", "rt", 2)]);
    // A replayed beat changes nothing.
    let before = t_store.job_events("acme", id).await.unwrap().len();
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    assert_eq!(t_store.job_events("acme", id).await.unwrap().len(), before);
    assert_eq!(events(&h_store, id, "handed_over").await.len(), 1);
    let e = h_store.evacuation().await.unwrap();
    assert_eq!(
        (e.state, e.jobs_left, e.moved),
        (EvacuationState::Evacuated, 0, 1)
    );
    stop.cancel();
    let _ = server.await;
}

/// Balancing: a job that waits at rh while its buddy rt has room goes to
/// rt on rh's beat (a handover like an evacuation's, cause `balancing`)
/// and is placed there; while rt has no room it stays, and a job pinned to
/// rh never leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_job_goes_to_its_buddy_once_the_buddy_has_room() {
    let (h_store, _hc) = region_store("balance_home", "rh").await;
    let (t_store, _tc) = region_store("balance_target", "rt").await;
    // Both serve their API; rt runs its heartbeats (a region with peers
    // takes nothing while it has not heard a majority); rh's beat and
    // rt's scheduling passes are called by hand.
    let h_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let h_url = format!("http://{}", h_listener.local_addr().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t_url = format!("http://{}", listener.local_addr().unwrap());
    let t = region_state("rt", t_store.clone(), &[("rh", h_url)]);
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn({
        let t = t.clone();
        async move { axum::serve(listener, gangway_regional::api::app(t)).await }
    });
    let beats = tokio::spawn(gangway_regional::loops::beat::run_loop(
        t.clone(),
        stop.clone(),
    ));
    let mut config = common::region_config("rh", &[("rt", t_url)]);
    config.peers.balance_after = Some(Duration::ZERO);
    let h = gangway_regional::AppState::new(h_store.clone(), config);
    let h_server = tokio::spawn({
        let h = h.clone();
        async move { axum::serve(h_listener, gangway_regional::api::app(h)).await }
    });

    let hf = Fleet::register_nodes(&h_store, vec![node("n0", "s0", "l0", "h100")]).await;
    let tf = Fleet::register_nodes(&t_store, vec![node("n0", "s0", "l0", "h100")]).await;
    // rh's one node runs a job; a second job waits behind it, and a third
    // that is pinned to rh.
    let first = job_with_buddy(&h_store, &t_store, "balance-1").await;
    run(&h_store, &hf, first).await;
    let waiting = job_with_buddy(&h_store, &t_store, "balance-2").await;
    let mut j = common::job("acme", "h100", 8, 8);
    j.spec.region = Some("rh".into());
    let pinned = common::submit(&h_store, &j).await;
    h_store.replicated(pinned, "rt").await.unwrap();
    t_store
        .hold_intent(&h_store.intent_of(pinned).await.unwrap())
        .await
        .unwrap();
    // rt's one node is busy with its own job: no room, nothing moves
    // (once rt has heard rh: a fenced region has no room to give).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while t.peers.is_fenced() {
        assert!(std::time::Instant::now() < deadline, "rt never heard rh");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let theirs = common::submit(&t_store, &common::job("globex", "h100", 8, 8)).await;
    t_store.replicated(theirs, "rh").await.unwrap();
    assert_eq!(
        run_pass(&t_store, AGENT_TIMEOUT).await.unwrap().placements,
        1
    );
    tf.act(&t_store, 0, None).await;
    let wanted = tf.act(&t_store, 0, None).await;
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    for id in [waiting, pinned] {
        let here = h_store.get_job("acme", id).await.unwrap();
        assert_eq!((here.state, here.moved_to), (JobState::Queued, None));
        assert!(events(&h_store, id, "handover").await.is_empty());
    }
    assert!(t_store.get_job("acme", waiting).await.is_err());

    // rt's job ends: rt has room for one 8-GPU job. Within a few beats (rt
    // reads its capacity at most once a second) the waiting job moves there.
    let done: Vec<_> = wanted
        .iter()
        .filter(|a| a.job_id == theirs)
        .map(common::succeeded)
        .collect();
    tf.sync(&t_store, 0, "boot-1", vec![], done).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        gangway_regional::loops::evacuation::advance(&h)
            .await
            .unwrap();
        if h_store
            .get_job("acme", waiting)
            .await
            .unwrap()
            .moved_to
            .is_some()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never moved");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let home = h_store.get_job("acme", waiting).await.unwrap();
    assert_eq!(
        (home.state, home.moved_to.as_deref()),
        (JobState::Cancelled, Some("rt"))
    );
    let marked = events(&h_store, waiting, "handover").await;
    assert!(marked[0].contains("room"), "{marked:?}");
    let there = t_store.get_job("acme", waiting).await.unwrap();
    assert_eq!((there.epoch, there.state), (2, JobState::Queued));
    assert_eq!(
        untimed(t_store.moves_from("rh").await.unwrap()),
        vec![planned(waiting, "rh", "rt", 2)]
    );
    // rt places it; the pinned job and the running one stay at rh.
    assert_eq!(
        run_pass(&t_store, AGENT_TIMEOUT).await.unwrap().placements,
        1
    );
    assert_eq!(
        t_store.get_job("acme", waiting).await.unwrap().state,
        JobState::Starting
    );
    let p = h_store.get_job("acme", pinned).await.unwrap();
    assert_eq!((p.state, p.moved_to), (JobState::Queued, None));
    assert_eq!(
        h_store.get_job("acme", first).await.unwrap().state,
        JobState::Running
    );
    // A replayed beat changes nothing.
    let before = t_store.job_events("acme", waiting).await.unwrap().len();
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    assert_eq!(
        t_store.job_events("acme", waiting).await.unwrap().len(),
        before
    );
    assert_eq!(events(&h_store, waiting, "handed_over").await.len(), 1);
    stop.cancel();
    let _ = beats.await;
    server.abort();
    h_server.abort();
}

/// A balancing move that cannot go through (its buddy does not answer
/// after it was marked) is called off: the job stays and is placed here.
#[tokio::test]
async fn a_balancing_move_that_fails_is_called_off_and_the_job_stays() {
    let (h_store, _hc) = region_store("balance_off_home", "rh").await;
    let (t_store, _tc) = region_store("balance_off_target", "rt").await;
    // rt is unreachable (nothing listens there).
    let mut config = common::region_config("rh", &[("rt", "http://127.0.0.1:9".into())]);
    config.peers.balance_after = Some(Duration::ZERO);
    let h = gangway_regional::AppState::new(h_store.clone(), config);
    let hf = Fleet::register_nodes(&h_store, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = job_with_buddy(&h_store, &t_store, "balance-off").await;
    // As if a beat had read rt's room and marked it.
    let w = h_store
        .balance_candidates(Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].job_id, w[0].buddy.as_str()), (id, "rt"));
    assert!(h_store.mark_balancing(&w[0]).await.unwrap());
    assert!(!h_store.mark_balancing(&w[0]).await.unwrap(), "once");
    // Marked: not placed here.
    assert_eq!(
        run_pass(&h_store, AGENT_TIMEOUT).await.unwrap().placements,
        0
    );
    // The beat cannot reach rt: the move is called off, nothing recorded.
    gangway_regional::loops::evacuation::advance(&h)
        .await
        .unwrap();
    let j = h_store.get_job("acme", id).await.unwrap();
    assert_eq!((j.state, j.moved_to, j.epoch), (JobState::Queued, None, 1));
    let said = events(&h_store, id, "handover").await;
    assert!(said.last().unwrap().contains("stays"), "{said:?}");
    assert!(h_store.moves_from("rh").await.unwrap().is_empty());
    run(&h_store, &hf, id).await;
}

/// A pass that read a job before it was marked for a handover does not
/// place it: once the move is recorded the job may run in the other region
/// at any moment, so the plan is stale and places nothing.
#[tokio::test]
async fn a_plan_read_before_a_job_was_marked_for_a_handover_places_nothing() {
    let (h_store, _hc) = region_store("balance_race_home", "rh").await;
    let (t_store, _tc) = region_store("balance_race_target", "rt").await;
    Fleet::register_nodes(&h_store, vec![node("n0", "s0", "l0", "h100")]).await;
    let id = job_with_buddy(&h_store, &t_store, "balance-race").await;
    let data = h_store
        .snapshot_partition(
            "h100",
            AGENT_TIMEOUT,
            gangway_regional::config::Planning::with_agent_timeout(AGENT_TIMEOUT).history,
        )
        .await
        .unwrap();
    let plan = gangway_sched::plan(&data.snapshot, &gangway_sched::Policy::default());
    assert_eq!(plan.placements.len(), 1);
    let w = h_store
        .balance_candidates(Duration::ZERO, 10)
        .await
        .unwrap();
    assert!(h_store.mark_balancing(&w[0]).await.unwrap());
    // The move is recorded here before the plan commits.
    assert!(h_store
        .commit_planned_move(&planned(id, "rh", "rt", 2))
        .await
        .unwrap());
    let applied = h_store.apply_plan(&plan).await;
    assert!(
        matches!(
            applied,
            Err(gangway_regional::store::StoreError::StalePlan(_))
        ),
        "{applied:?}"
    );
    let j = h_store.get_job("acme", id).await.unwrap();
    assert_eq!(j.state, JobState::Queued);
    assert!(j.workers.iter().all(|w| w.node.is_none()));
}
