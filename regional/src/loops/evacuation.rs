//! Planned evacuation of a region, and fail back (docs/failover.md,
//! "Planned evacuation and fail back"); and balancing, the same handover
//! for one queued job that waited here while its buddy has room
//! (`balance`; docs/failover.md, "Balancing queued work").
//!
//! An operator evacuates region H: H persists it (`region_evacuation`),
//! refuses new jobs (503 `region_unavailable`; the global tier routes
//! creates around it), places nothing, and hands every live job it owns to
//! the job's buddy T, which already holds its intent. Each handover is
//! driven from a durable marker on H's job (`jobs.handover_to`), advanced
//! by H's leader on this loop's beat, one idempotent step at a time:
//!
//! 1. a starting or running job is asked to checkpoint and stop (a region
//!    preemption, cause `evacuating`); it is never placed here again;
//! 2. once stopped: its intent, its final checkpoint (into T's store) and
//!    an update naming that checkpoint go to T;
//! 3. the move (job, H → T, epoch + 1, planned) is recorded here under the
//!    job's lock — the point of no return — then at a majority of regions
//!    (witnesses accept a planned move from a home they hear);
//! 4. T takes the job (`POST /internal/v1/replicas/take`): ours there at
//!    epoch + 1, resuming from that checkpoint, its intent handed to a
//!    buddy of T's;
//! 5. H releases its copy (`moved_to` = T, cancelled, an event saying it
//!    was handed over).
//!
//! A crash anywhere either finishes on a later beat (every step can be
//! repeated) or, if H stays dead, falls back to adoption by the buddy: the
//! same move (T, epoch + 1) a majority may have recorded already. The job
//! is never runnable in two regions: at H it is not placed from step 1 on,
//! and at T only from step 4, after the move is at a majority.
//!
//! Fail back: H takes work again and asks every peer, each beat, to hand
//! back the live jobs it adopted from H (`POST
//! /internal/v1/replicas/handback`); each peer marks them (cause
//! `failing_back`) and hands them over the same way, first giving H their
//! intent. H's released copy of such a job comes back to life at the next
//! epoch. Every region's leader advances the markers it holds on this
//! loop, whatever its own state.

use gangway_shared::api::EvacuationState;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::replication::copy_checkpoint;
use crate::state::AppState;
use crate::store::handovers::{
    Handback, HandbackAnswer, Handover, Take, Taken, BALANCING, FAILING_BACK,
};
use crate::store::replicas::{Move, MoveAnswer, Update};
use crate::store::{Result, StoreError};

/// Jobs advanced per beat (the rest wait for the next one).
const PER_BEAT: i64 = 100;

/// A peer's evacuation state, as `POST /internal/v1/evacuation/state`
/// answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerEvacuation {
    pub region: String,
    pub state: EvacuationState,
}

/// Every replica follows the evacuation state on every beat; the leader
/// (not fenced) advances it. Runs beside the heartbeats rather than inside
/// them, so a slow or dead target never delays a heartbeat.
pub async fn run_loop(state: AppState, shutdown: CancellationToken) {
    if state.peers.config.peers.is_empty() {
        return;
    }
    let every = state.peers.config.heartbeat_interval;
    loop {
        match state.store.evacuation_state().await {
            Ok(e) => {
                state.set_evacuating(e.is_evacuating());
                if state.is_leader() && !state.peers.is_fenced() {
                    if let Err(err) = advance(&state).await {
                        tracing::warn!(error = %err, "evacuation beat failed");
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the evacuation state"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One beat: marks what the evacuation or fail back asks for, advances
/// every handover this region holds by as many steps as it can, and moves
/// the evacuation's state on (evacuating ⇄ evacuated, failing back →
/// none once nothing is left away).
pub async fn advance(state: &AppState) -> Result<()> {
    let now = state.store.evacuation_state().await?;
    state.set_evacuating(now.is_evacuating());
    let mut away = None;
    match now {
        EvacuationState::Evacuating | EvacuationState::Evacuated => {
            let target = |job: Uuid, buddy: Option<&str>| target_for(state, job, buddy);
            for (job, to) in state.store.mark_evacuation(&target).await? {
                tracing::info!(job_id = %job, to, "job to be handed over for the evacuation");
            }
            let n = state.store.stop_held().await?;
            if n > 0 {
                tracing::info!(jobs = n, "jobs that cannot leave the region stopped");
            }
        }
        EvacuationState::FailingBack => away = ask_handback(state).await,
        EvacuationState::None => {
            if let Err(e) = balance(state).await {
                tracing::warn!(error = %e, "balancing beat failed");
            }
        }
    }
    for h in state.store.handing_over(PER_BEAT).await? {
        if let Err(e) = step(state, &h).await {
            tracing::warn!(job_id = %h.job_id, to = %h.to, error = %e, "handover waits for the next beat");
        }
    }
    match now {
        EvacuationState::Evacuating | EvacuationState::Evacuated => {
            let left = state.store.evacuation_left().await?;
            let next = if left == 0 {
                EvacuationState::Evacuated
            } else {
                EvacuationState::Evacuating
            };
            if state.store.advance_evacuation(now, next, 0).await? && left == 0 {
                tracing::info!("evacuated: no job left to hand over");
            }
        }
        EvacuationState::FailingBack => {
            if let Some(away) = away {
                let here = state.store.handing_over(1).await?.len() as u64;
                let next = if away == 0 && here == 0 {
                    EvacuationState::None
                } else {
                    EvacuationState::FailingBack
                };
                let away = i32::try_from(away).unwrap_or(i32::MAX);
                if state.store.advance_evacuation(now, next, away).await?
                    && next == EvacuationState::None
                {
                    tracing::info!("failed back: every job moved away is back");
                }
            }
        }
        EvacuationState::None => {}
    }
    Ok(())
}

/// Where an evacuated job goes: its buddy (it holds the job's intent
/// already), else the first peer of its rendezvous order.
fn target_for(state: &AppState, job: Uuid, buddy: Option<&str>) -> Option<String> {
    match buddy {
        Some(b) if state.peers.peer(b).is_some() => Some(b.to_string()),
        _ => state.peers.buddies_of(job).first().map(|b| b.to_string()),
    }
}

/// Asks every peer to hand back our jobs; the number they still run, or
/// `None` when a peer did not answer (it may run some).
async fn ask_handback(state: &AppState) -> Option<u64> {
    let q = Handback {
        home: state.store.region().to_string(),
    };
    let calls = state.peers.config.peers.iter().map(|p| {
        let q = &q;
        async move {
            let a: std::result::Result<HandbackAnswer, _> = state
                .peers
                .post(&p.name, "/internal/v1/replicas/handback", q)
                .await;
            (p.name.as_str(), a)
        }
    });
    let mut away = Some(0u64);
    for (peer, a) in futures_util::future::join_all(calls).await {
        match a {
            Ok(a) => away = away.map(|n| n + a.away),
            Err(e) => {
                tracing::debug!(error = %e, peer, "a peer was not asked to hand jobs back");
                away = None;
            }
        }
    }
    away
}

fn peer_err(e: crate::replication::peers::PeerError) -> StoreError {
    StoreError::Conflict {
        code: gangway_shared::error::codes::REGION_UNAVAILABLE,
        message: e.to_string(),
    }
}

fn waits(message: String) -> StoreError {
    StoreError::Conflict {
        code: gangway_shared::error::codes::REGION_UNAVAILABLE,
        message,
    }
}

/// Advances one handover as far as it goes now.
async fn step(state: &AppState, h: &Handover) -> Result<()> {
    let me = state.store.region().to_string();
    if let Some(moved) = &h.moved_to {
        // Released already (here, or by learning the move after a crash).
        if *moved == h.to {
            take(state, h, h.epoch + 1).await?;
            (state.store)
                .release_handed_over(h.job_id, &h.to, h.epoch + 1)
                .await?;
        } else {
            state.store.drop_handover(h.job_id).await?;
        }
        return Ok(());
    }
    match h.state.as_str() {
        // A balancing move is for a job that waits: one placed here after
        // all (a pass that read it before it was marked) stays.
        "starting" | "running" | "preempting" if h.cause == BALANCING => {
            if (state.store)
                .unmark_balancing(h.job_id, "it was placed here meanwhile")
                .await?
            {
                tracing::info!(job_id = %h.job_id, to = %h.to, "balancing called off: the job started here");
            }
            Ok(())
        }
        "starting" | "running" => {
            if state.store.preempt_for_handover(h.job_id).await? {
                tracing::info!(job_id = %h.job_id, to = %h.to, cause = %h.cause, "asked to checkpoint and stop for its handover");
            }
            Ok(())
        }
        // Its workers are going down (or it is being cancelled).
        "preempting" | "cancelling" => Ok(()),
        "succeeded" | "failed" | "cancelled" => {
            // It ended here before it moved: the target, which may hold
            // its intent now, must never adopt it.
            let u = Update {
                job_id: h.job_id,
                home: me,
                epoch: h.epoch,
                finished: true,
                checkpoint: h.restore_from.clone(),
                checkpointed_at: None,
            };
            let _: serde_json::Value = (state.peers)
                .post(&h.to, "/internal/v1/replicas/updates", &[u])
                .await
                .map_err(peer_err)?;
            state.store.drop_handover(h.job_id).await
        }
        "queued" if h.cause == BALANCING => {
            let moved = move_stopped(state, h).await;
            if let Err(e) = &moved {
                // Called off unless its move is recorded here (then it goes
                // on, on later beats, like any handover).
                let why = format!("its move to region {} did not go through ({e})", h.to);
                if state.store.unmark_balancing(h.job_id, &why).await? {
                    metrics::counter!("gangway_balancing_called_off_total").increment(1);
                    tracing::info!(job_id = %h.job_id, to = %h.to, error = %e, "balancing called off");
                    return Ok(());
                }
            }
            moved
        }
        "queued" => move_stopped(state, h).await,
        other => Err(waits(format!("job in state {other}"))),
    }
}

/// Balancing: a queued job that has waited here for the peers'
/// `balance_after` goes to its buddy — the region that holds its intent
/// already — when the buddy has room for it now: more free GPUs of its
/// type than the buddy's own waiting jobs ask, by at least the job's size.
/// Oldest first; the room a beat hands out is counted down as it goes.
/// The move is a handover like an evacuation's (cause `balancing`),
/// called off while it is not yet recorded if anything fails. A job that
/// arrived by a move stays at least `balance_after` before it may move
/// again.
async fn balance(state: &AppState) -> Result<()> {
    let Some(after) = state.peers.config.balance_after else {
        return Ok(());
    };
    let waiting = state.store.balance_candidates(after, PER_BEAT).await?;
    if waiting.is_empty() {
        return Ok(());
    }
    let mut buddies: Vec<&str> = waiting.iter().map(|w| w.buddy.as_str()).collect();
    buddies.sort_unstable();
    buddies.dedup();
    let mut room = room_at(state, &buddies).await;
    for w in &waiting {
        let Some(left) = (room.get_mut(&w.buddy)).and_then(|r| r.get_mut(&w.gpu_type)) else {
            continue;
        };
        if *left < i64::from(w.gpus) {
            continue;
        }
        if state.store.mark_balancing(w).await? {
            *left -= i64::from(w.gpus);
            metrics::counter!("gangway_balancing_marked_total").increment(1);
            tracing::info!(job_id = %w.job_id, to = %w.buddy, gpus = w.gpus, waited_s = w.waited_s,
                           "job to be handed over to a region with room for it");
        }
    }
    Ok(())
}

/// Each of `peers`' room per GPU type (free GPUs less what its own waiting
/// jobs ask), from their status; a peer that does not answer, is fenced
/// or is evacuated has none.
async fn room_at(
    state: &AppState,
    peers: &[&str],
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>> {
    let calls = peers.iter().map(|&p| async move {
        let a: std::result::Result<gangway_shared::api::RegionStatus, _> = state
            .peers
            .post(p, "/internal/v1/regions/status", &serde_json::json!({}))
            .await;
        (p, a)
    });
    let mut room = std::collections::BTreeMap::new();
    for (peer, a) in futures_util::future::join_all(calls).await {
        match a {
            Ok(s) if !s.fenced && !s.evacuating => {
                let by_type = (s.capacity.iter())
                    .map(|c| {
                        let left = i64::from(c.free) - i64::from(c.queued);
                        (c.gpu_type.clone(), left)
                    })
                    .collect();
                room.insert(peer.to_string(), by_type);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, peer, "no room read from a peer"),
        }
    }
    room
}

/// Steps 2–5 of a stopped job's handover.
async fn move_stopped(state: &AppState, h: &Handover) -> Result<()> {
    let me = state.store.region().to_string();
    let peers = &state.peers;
    // 2. The target holds the job's intent (its buddy does already), its
    // final checkpoint, and knows it is the newest.
    let intent = state.store.intent_of(h.job_id).await?;
    let _: serde_json::Value = peers
        .post(&h.to, "/internal/v1/replicas/intents", &intent)
        .await
        .map_err(peer_err)?;
    if let Some(key) = h
        .restore_from
        .as_deref()
        .filter(|k| gangway_checkpoint::is_store_key(k))
    {
        copy_checkpoint(state.link(), &h.to, key)
            .await
            .map_err(|e| waits(format!("checkpoint {key} not copied yet: {e}")))?;
    }
    let told = Update {
        job_id: h.job_id,
        home: me.clone(),
        epoch: h.epoch,
        finished: false,
        checkpoint: h.restore_from.clone(),
        checkpointed_at: None,
    };
    let _: serde_json::Value = peers
        .post(&h.to, "/internal/v1/replicas/updates", &[told])
        .await
        .map_err(peer_err)?;
    // 3. The move, here first (the point of no return), then at a majority.
    let m = Move {
        job_id: h.job_id,
        from_home: me.clone(),
        to_region: h.to.clone(),
        epoch: h.epoch + 1,
        planned: true,
        at: None,
    };
    if !state.store.commit_planned_move(&m).await? {
        return Err(waits(
            "the job changed, or a conflicting move is recorded: not moved".into(),
        ));
    }
    let calls = peers.config.peers.iter().map(|p| {
        let m = &m;
        async move {
            let a: std::result::Result<MoveAnswer, _> =
                peers.post(&p.name, "/internal/v1/replicas/moves", m).await;
            a.is_ok_and(|a| a.recorded)
        }
    });
    let recorded = 1 + futures_util::future::join_all(calls)
        .await
        .into_iter()
        .filter(|r| *r)
        .count();
    if recorded < peers.config.majority() {
        return Err(waits(format!(
            "its move was recorded at {recorded} region(s), a majority is {}",
            peers.config.majority()
        )));
    }
    // 4. The target takes it; 5. our copy is released.
    take(state, h, h.epoch + 1).await?;
    if state
        .store
        .release_handed_over(h.job_id, &h.to, h.epoch + 1)
        .await?
    {
        metrics::counter!("gangway_jobs_handed_over_total", "way" => "out", "cause" => cause_label(&h.cause))
            .increment(1);
        tracing::info!(job_id = %h.job_id, to = %h.to, epoch = h.epoch + 1, cause = %h.cause, "job handed over");
    }
    Ok(())
}

fn cause_label(cause: &str) -> &'static str {
    match cause {
        FAILING_BACK => "failing_back",
        BALANCING => "balancing",
        _ => "evacuating",
    }
}

/// Asks `h.to` to take the job at `epoch` (idempotent there).
async fn take(state: &AppState, h: &Handover, epoch: i32) -> Result<()> {
    let t = Take {
        job_id: h.job_id,
        from_home: state.store.region().to_string(),
        epoch,
        checkpoint: h.restore_from.clone(),
        cause: cause_label(&h.cause).to_string(),
    };
    let _: Taken = state
        .peers
        .post(&h.to, "/internal/v1/replicas/take", &t)
        .await
        .map_err(peer_err)?;
    Ok(())
}

/// The evacuation states of every peer that answers (within their client
/// timeout), for refusing a second evacuation at once.
pub async fn peer_states(state: &AppState) -> Vec<PeerEvacuation> {
    let calls = state.peers.config.peers.iter().map(|p| async move {
        let a: std::result::Result<PeerEvacuation, _> = state
            .peers
            .post(
                &p.name,
                "/internal/v1/evacuation/state",
                &serde_json::json!({}),
            )
            .await;
        a.ok()
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}
