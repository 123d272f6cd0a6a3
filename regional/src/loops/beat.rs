//! Regions watching each other, on the peers' beat (docs/failover.md).
//!
//! Every region heartbeats every peer over HTTPS each
//! `PeerConfig::heartbeat_interval`; a heartbeat carries what the sender
//! last heard from every region, and the answer what the receiver did.
//! Both ends record it in `peer_leases`, on the database's clock:
//!
//! - **Fencing.** A region without a successful round trip to a majority of
//!   the regions (itself included) for `PeerConfig::lease` fences itself:
//!   it places nothing, refuses new jobs, and asks its running jobs to
//!   checkpoint and stop within the fenced checkpoint time. It unfences
//!   once it reaches a majority again, after it has learned which of its
//!   jobs were adopted elsewhere meanwhile and released them.
//! - **Adoption** (`replication/mod.rs`, `store/replicas.rs`). A region holding another's job
//!   intent (its buddy) adopts that region's live jobs only when it is not
//!   fenced itself and a majority of the regions — it and peers it reaches
//!   — have heard nothing from the dead one for `PeerConfig::adopt_after`,
//!   which is longer than the dead region's lease plus the time its
//!   workers have to stop (fenced by their region, or by their agents'
//!   own lease when the region process is gone). A region heard from by a
//!   majority is never adopted, so a job never runs in two regions.
//! - **Replication** of job intent happens on each create (synchronous,
//!   `api/jobs.rs`); what comes after (a job ended, a new checkpoint) is
//!   sent by a loop of its own ([`run_loop`]), so that a large checkpoint
//!   copy never holds up a heartbeat.

use tokio_util::sync::CancellationToken;

use crate::replication::peers::{majority_left, Heartbeat};
use crate::state::AppState;

/// The peers' loops, each a task of its own so that nothing slow delays a
/// heartbeat or a fence:
///
/// - the heartbeats: every beat, heartbeat every peer, record the answers,
///   unfence (after learning which jobs moved), and (the leader) adopt
///   dead regions' jobs;
/// - the [`watchdog`], which fences the region the moment the majority the
///   last beat saw runs out — also when no beat runs (its database is
///   down, or a beat is stuck), since the peers stop hearing a region
///   whose beats stall and adopt its jobs on that count;
/// - replication: the leader sends buddies what they have not been told,
///   checkpoint copies included (a large one takes a while).
pub async fn run_loop(state: AppState, shutdown: CancellationToken) {
    if state.peers.config.peers.is_empty() {
        return;
    }
    let every = state.peers.config.heartbeat_interval;
    let each = |f: fn(AppState) -> futures_util::future::BoxFuture<'static, ()>| {
        let (state, shutdown) = (state.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                f(state.clone()).await;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        })
    };
    let loops = [
        each(|s| Box::pin(async move { beat(&s).await })),
        each(|s| Box::pin(async move { watchdog(&s).await })),
        each(|s| {
            Box::pin(async move {
                if s.is_leader() && !s.peers.is_fenced() {
                    crate::replication::replicate_pending_intents(s.link()).await;
                    crate::replication::outbox::flush_all(s.link()).await;
                }
                if let Ok(lag) = s.store.replication_lag().await {
                    s.peers.saw_replication_lag(lag);
                    metrics::gauge!("gangway_replication_lag_seconds").set(lag);
                }
                if let Ok(lag) = s.store.usage_replication_lag().await {
                    metrics::gauge!("gangway_usage_replication_lag_seconds").set(lag);
                }
            })
        }),
    ];
    for l in loops {
        let _ = l.await;
    }
}

/// Fences the region once the majority the last beat saw has run out:
/// places nothing, refuses creates, and (the leader) asks every starting or
/// running job to checkpoint and stop, every beat while it lasts.
async fn watchdog(state: &AppState) {
    let peers = &state.peers;
    if !peers.majority_lost() {
        return;
    }
    if !peers.set_fenced(true) {
        tracing::warn!(
            lease_s = peers.config.lease.as_secs_f64(),
            "no round trip to a majority of regions within the lease (or none could be \
             recorded): fenced (placing nothing, asking running jobs to checkpoint and stop)"
        );
    }
    metrics::gauge!("gangway_region_fenced").set(1.0);
    // The beat may have heard a majority again since (it unfences on its
    // own task): jobs are asked to stop only while the region still is
    // fenced, or a moment's silence under load stops work for nothing.
    if state.is_leader() && peers.is_fenced() && peers.majority_lost() {
        match state.store.fence_jobs().await {
            Ok(n) if n > 0 => tracing::warn!(jobs = n, "fenced: jobs asked to checkpoint and stop"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot stop jobs while fenced"),
        }
    }
}

async fn beat(state: &AppState) {
    let peers = &state.peers;
    let me = state.store.region().to_string();
    let view = match state.store.leases(&peers.names(), peers.uptime_s()).await {
        Ok(l) => l.silent_s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peers' leases");
            return;
        }
    };
    let hb = Heartbeat {
        from: me.clone(),
        silent_s: view,
    };
    // Each answer is recorded as it comes, and the beat waits for the
    // slowest at most a quarter of the lease: a peer whose packets vanish
    // (a cut link answers nothing, not even a refusal) must not hold up
    // the round trips to the others, or a region that still reaches a
    // majority would fence for want of recording it.
    let mut calls: futures_util::stream::FuturesUnordered<_> = (peers.config.peers.iter())
        .map(|p| {
            let hb = &hb;
            async move {
                let answer: Result<Heartbeat, _> = peers
                    .post(&p.name, "/internal/v1/peers/heartbeat", hb)
                    .await;
                (p.name.as_str(), answer)
            }
        })
        .collect();
    let patience = tokio::time::sleep(peer_patience(&peers.config));
    tokio::pin!(patience);
    loop {
        let (peer, answer) = tokio::select! {
            next = futures_util::StreamExt::next(&mut calls) => match next {
                Some(next) => next,
                None => break,
            },
            () = &mut patience => {
                tracing::debug!(unanswered = calls.len(), "heartbeats unanswered in time");
                break;
            }
        };
        match answer {
            Ok(theirs) if theirs.from == peer => {
                if let Err(e) = state.store.peer_answered(peer, &theirs.silent_s).await {
                    tracing::warn!(error = %e, peer, "cannot record a heartbeat's answer");
                }
            }
            Ok(theirs) => {
                tracing::warn!(peer, answered_as = %theirs.from, "a peer answered under another name")
            }
            Err(e) => tracing::debug!(error = %e, peer, "heartbeat failed"),
        }
    }
    // What the heartbeats just recorded decides fencing and adoption.
    let leases = match state.store.leases(&peers.names(), peers.uptime_s()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peers' leases");
            return;
        }
    };
    peers.saw_round_trips(&leases.round_trip_s);
    let left = majority_left(
        &leases.round_trip_s,
        peers.config.lease,
        peers.config.majority(),
    );
    peers.set_majority_left(left);
    if left.is_none() {
        watchdog(state).await;
        return;
    }
    metrics::gauge!("gangway_region_fenced").set(0.0);
    if peers.is_fenced() {
        // Before placing anything again: which of our jobs moved while we
        // were cut off.
        match crate::replication::learn_moves(state.link()).await {
            // The majority the heartbeats found may have run out while
            // the peers were asked (a slow one): unfenced now, the
            // watchdog would fence again at once and stop every job.
            Ok(_) if peers.majority_lost() => {
                tracing::debug!("the majority ran out while learning moves: staying fenced");
                return;
            }
            Ok(moved) => {
                if moved > 0 {
                    tracing::warn!(
                        jobs = moved,
                        "jobs adopted elsewhere while fenced: released"
                    );
                }
                peers.set_fenced(false);
                tracing::info!("a majority of regions answers again: unfenced");
                state.wake_scheduler();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot learn which jobs moved: staying fenced");
                return;
            }
        }
    }
    if state.is_leader() {
        match crate::replication::adopt_dead(state.link(), &leases).await {
            Ok(n) if n > 0 => {
                tracing::warn!(jobs = n, "adopted the jobs of a dead region");
                state.wake_scheduler();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "adoption check failed"),
        }
    }
}

/// How long one beat waits for a peer's answer (a heartbeat, the moves
/// list): a quarter of the lease, so that a beat that asks twice (fenced:
/// heartbeats, then moves) still ends well within the lease although a
/// peer answers nothing at all.
pub(crate) fn peer_patience(config: &crate::config::PeerConfig) -> std::time::Duration {
    config.lease / 4
}
