//! The scheduling loops: a replica competes for leadership
//! ([`super::leader`]) and, while it leads, runs one pass loop per pool
//! (a GPU type's shared pool, or a dedicated cluster), each placing with
//! [`crate::scheduling::pass`] again while it places work, else on a
//! wake-up (new job, freed GPUs) or every `schedule_interval`, never
//! sooner than [`MIN_PASS_GAP`] after the previous pass began (for new
//! jobs alone after a pass that did nothing, [`FUTILE_PASS_GAP`]). The
//! leader's tick (`tick.rs`) runs on the same loop.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::leader::Leadership;
use crate::config::Planning;
use crate::scheduling::run_partition_pass;
use crate::state::AppState;

/// Competes for leadership and, while leader, runs one pass loop per GPU
/// type ([`partition_loop`]) until `shutdown` or until leadership is lost.
pub async fn run_loop(state: AppState, shutdown: CancellationToken) {
    let span = tracing::info_span!("scheduler", region = %state.store.region());
    async move {
        let cfg = state.config.clone();
        let planning = cfg.planning();
        let mut leadership: Option<Leadership> = None;
        let mut last_health_tick = None;
        let mut partitions = Partitions::default();
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            // (Re)connect the leadership connection when needed.
            if leadership.as_ref().is_none_or(|l| l.is_closed()) {
                set_leader(&state, false);
                partitions.stop_all().await;
                match Leadership::connect(&cfg.database_url).await {
                    Ok(l) => leadership = Some(l),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot open the leader connection");
                        sleep_or_cancel(cfg.leader_retry_interval, &shutdown).await;
                        continue;
                    }
                }
            }
            let l = leadership.as_mut().expect("connected above");
            let leading = match l.try_acquire().await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "leadership check failed");
                    false
                }
            };
            set_leader(&state, leading);
            if !leading {
                partitions.stop_all().await;
                sleep_or_cancel(cfg.leader_retry_interval, &shutdown).await;
                continue;
            }
            // Whatever leads runs under the lock's token: the moment the
            // lock's connection ends (its server failed over), the pass
            // loops stop and the flag drops, before any next check.
            let lost = l.lost().clone();
            tokio::select! {
                _ = lost.cancelled() => {}
                _ = super::tick::tick_if_due(&state, &mut last_health_tick) => {}
            }
            if !lost.is_cancelled() {
                // One pass loop per GPU type of the fleet (re-read only
                // when the fleet changed).
                match state.fleet_shape().await {
                    Ok(shape) => partitions.reconcile(&state, &planning, &lost, shape.keys()),
                    Err(e) => tracing::warn!(error = %e, "cannot read the fleet's GPU types"),
                }
                tokio::select! {
                    _ = lost.cancelled() => {}
                    _ = sleep_or_cancel(cfg.schedule_interval, &shutdown) => {}
                }
            }
            if lost.is_cancelled() {
                set_leader(&state, false);
                tracing::warn!("the leader lock's connection ended: no longer leading");
                partitions.stop_all().await;
            }
        }
        partitions.stop_all().await;
        if let Some(mut l) = leadership {
            l.release().await;
        }
        set_leader(&state, false);
    }
    .instrument(span)
    .await
}

/// The running pass loops, by partition (GPU type, or cluster key).
#[derive(Default)]
struct Partitions {
    loops: BTreeMap<String, (CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Partitions {
    /// Starts a loop for every partition that has none, stops those gone
    /// from the fleet (a type no node has any more, a deleted cluster).
    /// Each loop stops by itself when `lock` (the leader lock's
    /// [`Leadership::lost`]) is cancelled.
    fn reconcile<'t>(
        &mut self,
        state: &AppState,
        planning: &Planning,
        lock: &CancellationToken,
        types: impl Iterator<Item = &'t String>,
    ) {
        let types: std::collections::BTreeSet<&String> = types.collect();
        self.loops.retain(|t, (stop, task)| {
            let keep = types.contains(t) && !task.is_finished();
            if !keep {
                stop.cancel();
            }
            keep
        });
        for t in types {
            if !self.loops.contains_key(t) {
                // Stopped by the leader, or by the lock's loss itself.
                let stop = lock.child_token();
                let task = tokio::spawn(partition_loop(
                    state.clone(),
                    planning.clone(),
                    t.clone(),
                    stop.clone(),
                ));
                tracing::info!(gpu_type = %t, "scheduling partition started");
                self.loops.insert(t.clone(), (stop, task));
            }
        }
    }

    /// Stops every loop and waits until none is in a pass.
    async fn stop_all(&mut self) {
        for (t, (stop, task)) in std::mem::take(&mut self.loops) {
            stop.cancel();
            let _ = task.await;
            tracing::info!(gpu_type = %t, "scheduling partition stopped");
        }
    }
}

/// How often a partition with nothing to place or grow is planned anyway.
const IDLE_PASS_EVERY: Duration = Duration::from_secs(10);

/// The least time from one pass's start to the next's: wake-ups that come
/// meanwhile (each new job, each freed GPU) are served by one pass, which
/// places them together and commits once, instead of one pass each (under
/// a steady stream of creates, passes ran back to back and most placed one
/// or two jobs). A job waits at most this much longer to be placed.
const MIN_PASS_GAP: Duration = Duration::from_millis(20);

/// The least time from the start of a pass that placed and preempted
/// nothing to the next pass woken by new jobs alone. Such a pass means the
/// pool is full for what waits (or everything waits on a reservation): a
/// new job changes that only if it fits where nothing waiting did, or
/// outranks a running one, and either can wait this long. Freed GPUs, a
/// node back or any other wake-up plans at once (after [`MIN_PASS_GAP`]).
/// Under a stream of creates into a full pool, passes ran 50 times a second
/// to place nothing; now at most 5.
const FUTILE_PASS_GAP: Duration = Duration::from_millis(200);

/// How long after a pass that placed and preempted nothing the pool is
/// planned again only when some of the work that waits could fit in its
/// free GPUs ([`gangway_regional::store::Outlook`]; a count, not a read of
/// the fleet). Its GPUs freed one node at a time while gangs larger than
/// the free ones wait — the shape of a busy pool — woke a pass each, and
/// each read the whole fleet to place nothing: two passes in three during
/// a burst on three 10,240-GPU regions. What no freed GPU brings about
/// waits at most this long: a preemption that became allowed, or one that
/// a new job of a higher priority than running work asks for (the pass
/// that makes it is followed by the victims' checkpoints, tens of seconds).
const NOTHING_FITS_RECHECK: Duration = Duration::from_secs(2);

/// One GPU type's passes: again while they place work or lose a race,
/// else on a wake-up (new job, freed GPUs) or every `schedule_interval`,
/// at most one per [`MIN_PASS_GAP`] (per [`FUTILE_PASS_GAP`] for new jobs
/// after a pass that did nothing; after one, none while nothing that waits
/// fits in the free GPUs, for up to [`NOTHING_FITS_RECHECK`]), until `stop`.
async fn partition_loop(
    state: AppState,
    planning: Planning,
    gpu_type: String,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("partition", gpu_type = %gpu_type);
    async move {
        let mut wake = state.sched_wakeup.subscribe();
        // When the partition was last planned, and whether this round was
        // woken (a job came, GPUs were freed) rather than timed: a timed
        // round over an idle partition is skipped, but it is planned at
        // least every `IDLE_PASS_EVERY` (its fleet gauges stay fresh).
        let mut planned_at: Option<Instant> = None;
        let mut woken = true;
        // Whether the last pass placed and preempted nothing, and the
        // count of other-than-new-job wake-ups when it began.
        let mut futile = false;
        let mut others_seen = 0;
        while !stop.is_cancelled() {
            // New jobs alone after a pass that could do nothing: wait
            // until `FUTILE_PASS_GAP` after it, or until anything else
            // wakes the loop.
            if let Some(rest) = planned_at
                .filter(|_| futile && woken && wake.borrow().other == others_seen)
                .and_then(|t| FUTILE_PASS_GAP.checked_sub(t.elapsed()))
            {
                let other_wakeup = async {
                    while wake.changed().await.is_ok() {
                        if wake.borrow().other != others_seen {
                            return;
                        }
                    }
                    std::future::pending().await // the state is gone: the timer decides
                };
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(rest) => {}
                    _ = other_wakeup => {}
                }
            }
            // Coalesce: what woke the loop since the last pass began is
            // served together, at most one pass per `MIN_PASS_GAP`.
            if let Some(rest) = planned_at.and_then(|t| MIN_PASS_GAP.checked_sub(t.elapsed())) {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(rest) => {}
                }
            }
            // Wake-ups from now on count for the next wait.
            others_seen = wake.borrow_and_update().other;
            // A fenced region places nothing (`beat.rs`), nor does one
            // being evacuated (`evacuation.rs`).
            if state.peers.is_fenced() || state.is_evacuating() {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(state.config.schedule_interval) => {}
                }
                continue;
            }
            // A partition with nothing to place and nothing to grow is
            // not planned on a timed round, nor, after a pass that could
            // do nothing, while fewer of its GPUs are free than any waiting
            // work needs: its snapshot reads the whole fleet (at 10,000
            // GPUs, the region's largest read) for an empty plan.
            let since = planned_at.map(|t| t.elapsed());
            let skip = if since.is_some_and(|t| t < IDLE_PASS_EVERY) && (!woken || futile) {
                match state.store.partition_outlook(&gpu_type).await {
                    Ok(o) if !o.has_work() => (!woken).then_some("skipped"),
                    Ok(o) => (futile
                        && !o.could_place()
                        && since.is_some_and(|t| t < NOTHING_FITS_RECHECK))
                    .then_some("nothing_fits"),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot tell whether work waits: planning");
                        None
                    }
                }
            } else {
                None
            };
            if let Some(outcome) = skip {
                metrics::counter!("gangway_schedule_passes_total", "outcome" => outcome, "partition" => gpu_type.clone()).increment(1);
            } else {
                planned_at = Some(Instant::now());
                // A pass under way finishes (its commit is checked anyway).
                let outcome = run_partition_pass(&state.store, &planning, &gpu_type).await;
                futile = outcome
                    .as_ref()
                    .is_ok_and(|o| !o.stale && o.placements == 0 && o.preempted == 0);
                match outcome {
                    Ok(o) if o.stale => continue, // replan at once on fresh state
                    Ok(o) if o.placements > 0 => {
                        tracing::debug!(
                            placements = o.placements,
                            waiting = o.waiting,
                            "pass committed"
                        );
                        continue; // more may fit now that these are out of the queue
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "scheduling pass failed"),
                }
            }
            woken = tokio::select! {
                _ = stop.cancelled() => break,
                _ = wake.changed() => true,
                _ = tokio::time::sleep(state.config.schedule_interval) => false,
            };
        }
    }
    .instrument(span)
    .await
}

/// Records whether this replica leads: the flag `GET /v1/region` reports
/// and the `gangway_scheduler_leader` gauge, always together.
fn set_leader(state: &AppState, leading: bool) {
    let was = state.leader.swap(leading, Ordering::Relaxed);
    if leading != was {
        tracing::info!(leader = leading, "scheduling leadership changed");
    }
    metrics::gauge!("gangway_scheduler_leader").set(if leading { 1.0 } else { 0.0 });
}

async fn sleep_or_cancel(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
