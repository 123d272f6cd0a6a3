//! Node health in the region's loop: the leader lets time pass for nodes
//! (`Store::health_tick`) every `health_tick_interval`, so silent nodes turn
//! suspect then lost, hold-downs and `wait` drains end, and what both axes
//! decide (evacuate, lost) is carried out again until it is done; then
//! dedicated clusters are tended (`Store::tend_clusters`). The
//! policy itself is the pure `gangway-health` crate; the store applies it
//! (`store/nodes.rs`). The running maintenance plan, if any, advances on
//! the same beat (`Store::maintenance_tick`), and once an hour the usage
//! ledger gets the hours live placements completed (`Store::meter_usage`).

use std::time::Instant;

use crate::api::AppState;

/// Runs a health tick if one is due (the last was `interval` ago or more);
/// wakes the scheduler when it changed what may be scheduled or freed GPUs.
pub async fn tick_if_due(state: &AppState, last: &mut Option<Instant>) {
    if last.is_some_and(|t| t.elapsed() < state.config.health_tick_interval) {
        return;
    }
    *last = Some(Instant::now());
    let ctx = state.store.health_context();
    let started = Instant::now();
    let tick = crate::store::retry_races(|| state.store.health_tick(&ctx)).await;
    metrics::histogram!("gangway_health_tick_seconds").record(started.elapsed().as_secs_f64());
    match tick {
        Ok(o) => {
            for job in &o.evacuated {
                tracing::info!(job_id = %job, "asked to checkpoint and move off a node");
            }
            for job in &o.lost {
                tracing::warn!(job_id = %job, "workers lost with a node: requeued at the front");
            }
            if o.fleet_changed || o.freed_gpus {
                state.wake_scheduler();
            }
        }
        Err(e) => tracing::warn!(error = %e, "health tick failed"),
    }
    // Dedicated clusters heal, shrink and finish deleting on the same beat
    // (store/clusters.rs).
    match crate::store::retry_races(|| state.store.tend_clusters()).await {
        Ok(o) => {
            if o.changed() {
                tracing::info!(?o, "dedicated clusters tended");
                state.wake_scheduler();
            }
        }
        Err(e) => tracing::warn!(error = %e, "cluster tend failed"),
    }
    meter_if_due(state).await;
    // Rolling maintenance advances on the same beat (store/maintenance.rs).
    match crate::store::retry_races(|| state.store.maintenance_tick(&ctx)).await {
        Ok(o) => {
            if o.fleet_changed || o.freed_gpus {
                state.wake_scheduler();
            }
        }
        Err(e) => tracing::warn!(error = %e, "maintenance tick failed"),
    }
}

/// Once per clock hour: the hour live placements just completed goes into
/// the usage ledger (after a start, the last two days' are made sure of).
async fn meter_if_due(state: &AppState) {
    use std::sync::atomic::Ordering;
    let hour = chrono::Utc::now().timestamp().div_euclid(3600);
    let done = state.metered_hour.load(Ordering::Relaxed);
    if done >= hour {
        return;
    }
    let since = match done {
        0 => chrono::Utc::now() - chrono::Duration::days(2),
        h => chrono::DateTime::from_timestamp((h - 1) * 3600, 0).unwrap_or_default(),
    };
    match state.store.meter_usage(since).await {
        Ok(n) => {
            state.metered_hour.store(hour, Ordering::Relaxed);
            if n > 0 {
                tracing::info!(rows = n, "live placements' completed hours metered");
            }
        }
        Err(e) => tracing::warn!(error = %e, "metering live placements failed"),
    }
}
