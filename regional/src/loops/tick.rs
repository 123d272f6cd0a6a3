//! The leader's tick, every `health_tick_interval` on the scheduling
//! loop: four jobs on one beat, each its own function below, in this
//! order —
//!
//! - [`node_health`]: time passes for nodes (`Store::health_tick`), so
//!   silent nodes turn suspect then lost, hold-downs and `wait` drains
//!   end, and what both axes decide (evacuate, lost) is carried out again
//!   until it is done. The policy itself is the pure `gangway-health`
//!   crate; the store applies it (`store/nodes.rs`).
//! - [`tend_clusters`]: dedicated clusters heal, shrink and finish
//!   deleting (`store/clusters/tend.rs`).
//! - [`meter_if_due`]: once an hour the usage ledger gets the hours live
//!   placements completed (`Store::meter_usage`).
//! - [`maintenance`]: the running maintenance plan, if any, advances
//!   (`store/maintenance.rs`).
//!
//! Besides, once a minute, [`goodput_if_due`] publishes each tenant's
//! goodput as a gauge, off the tick's path.

use std::time::Instant;

use crate::state::AppState;
use crate::store::{retry_races, HealthContext};

/// Runs the leader's tick if one is due (the last was `interval` ago or
/// more); wakes the scheduler when it changed what may be scheduled or
/// freed GPUs.
pub async fn tick_if_due(state: &AppState, last: &mut Option<Instant>) {
    if last.is_some_and(|t| t.elapsed() < state.config.health_tick_interval) {
        return;
    }
    *last = Some(Instant::now());
    let ctx = state.store.health_context();
    node_health(state, &ctx).await;
    tend_clusters(state).await;
    meter_if_due(state).await;
    maintenance(state, &ctx).await;
    goodput_if_due(state);
}

/// Sets `gangway_tenant_goodput_ratio{tenant}` (the share of a tenant's
/// allocated GPU time not lost to restarts) at most once a minute, in a
/// task of its own: the read adds up every job's allocations.
fn goodput_if_due(state: &AppState) {
    use std::sync::atomic::{AtomicI64, Ordering};
    static PUBLISHED_MINUTE: AtomicI64 = AtomicI64::new(0);
    let minute = chrono::Utc::now().timestamp().div_euclid(60);
    if PUBLISHED_MINUTE.swap(minute, Ordering::Relaxed) == minute {
        return;
    }
    let store = state.store.clone();
    tokio::spawn(async move {
        match store.goodput_by_tenant().await {
            Ok(list) => {
                for t in list.tenants {
                    if let Some(g) = t.goodput {
                        metrics::gauge!("gangway_tenant_goodput_ratio", "tenant" => t.tenant)
                            .set(g);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading goodput for its gauge failed"),
        }
    });
}

/// Lets time pass for nodes.
async fn node_health(state: &AppState, ctx: &HealthContext) {
    let started = Instant::now();
    let tick = retry_races(|| state.store.health_tick(ctx)).await;
    metrics::histogram!("gangway_health_tick_seconds").record(started.elapsed().as_secs_f64());
    match tick {
        Ok(o) => {
            for job in &o.evacuated {
                tracing::info!(job_id = %job, "asked to checkpoint and move off a node");
            }
            for job in &o.lost {
                tracing::warn!(job_id = %job, "workers lost with a node: requeued at the front");
            }
            // The agents of the jobs it moved hear of it now.
            let moved = o.moved();
            if !moved.is_empty() {
                if let Err(e) = state.store.wake_agents_of(&[], &moved).await {
                    tracing::warn!(error = %e, "waking the agents of moved jobs failed: they hear at their next sync");
                }
            }
            if o.fleet_changed || o.freed_gpus {
                state.wake_scheduler();
            }
        }
        Err(e) => tracing::warn!(error = %e, "health tick failed"),
    }
}

/// Heals, shrinks and finishes deleting dedicated clusters.
async fn tend_clusters(state: &AppState) {
    match retry_races(|| state.store.tend_clusters()).await {
        Ok(o) => {
            if o.changed() {
                tracing::info!(?o, "dedicated clusters tended");
                state.wake_scheduler();
            }
        }
        Err(e) => tracing::warn!(error = %e, "cluster tend failed"),
    }
}

/// Advances the running maintenance plan.
async fn maintenance(state: &AppState, ctx: &HealthContext) {
    match retry_races(|| state.store.maintenance_tick(ctx)).await {
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
