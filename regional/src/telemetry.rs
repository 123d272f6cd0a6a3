//! Prometheus metrics, served on their own listener so rate limits and
//! API load never get in their way.
//!
//! Names carry the `gangway_` prefix; labels come from small fixed sets
//! (GPU type, topology level, outcome), never from ids, with one bounded
//! exception: `rack` (a leaf id, a few hundred per region) on the rack
//! power gauges, which are only useful per rack.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Installs the global recorder and serves `/metrics` on `addr`: what
/// every role does (the global tier and agents call it alone, a region
/// through [`install_prometheus`]).
pub fn serve_prometheus(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            300.0, 900.0, 3600.0,
        ])?
        // A sync's latency has a target of its own, under 1 s at p99
        // (issue 19): buckets fine enough between 0.5 and 1 s to show it.
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("gangway_sync_seconds".into()),
            &[
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ],
        )?
        .install()?;
    describe_common();
    Ok(())
}

/// The metrics of more than one role.
fn describe_common() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "gangway_http_requests_total",
        "HTTP requests answered, by route (its template), method and status"
    );
    describe_histogram!(
        "gangway_http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request, by route and method"
    );
    describe_histogram!(
        "gangway_global_region_call_seconds",
        Unit::Seconds,
        "Global tier: a call to a region, sent to answer read, by region"
    );
    describe_counter!(
        "gangway_global_region_call_errors_total",
        "Global tier: calls to a region that failed, by region and kind \
         (unreachable, timeout, server_error)"
    );
    describe_gauge!(
        "gangway_agent_workers",
        "Agent: workers running on its nodes"
    );
    describe_histogram!(
        "gangway_agent_sync_seconds",
        Unit::Seconds,
        "Agent: a sync with the region, sent to answered (or failed)"
    );
    describe_counter!(
        "gangway_agent_sync_failures_total",
        "Agent: syncs that failed, by kind (transient, rejected, reregister)"
    );
    describe_counter!(
        "gangway_agent_checkpoint_upload_bytes_total",
        Unit::Bytes,
        "Agent: checkpoint bytes uploaded to the checkpoint store"
    );
    describe_histogram!(
        "gangway_agent_checkpoint_upload_seconds",
        Unit::Seconds,
        "Agent: time to upload and commit one checkpoint"
    );
    describe_counter!(
        "gangway_agent_checkpoint_upload_failures_total",
        "Agent: checkpoint uploads that failed"
    );
    describe_counter!(
        "gangway_agent_health_signals_total",
        "Agent: GPU and node health signals seen, by kind (xid, ecc, remap, thermal, \
         nvlink, node_down, rack_thermal)"
    );
}

/// Installs the global recorder and serves `/metrics` on `addr`, with the
/// region's metrics described.
pub fn install_prometheus(addr: SocketAddr) -> anyhow::Result<()> {
    serve_prometheus(addr)?;
    describe();
    // Not fenced until the peers' watchdog says so (a region without peers
    // never is).
    metrics::gauge!("gangway_region_fenced").set(0.0);
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        "gangway_gpus_stranded",
        "Schedulable GPUs of a type left free by a pass while work of that type that \
         could use them waits (its shape or place does not fit), by GPU type"
    );
    describe_gauge!(
        "gangway_tenant_goodput_ratio",
        "A tenant's allocated GPU time not lost to restarts, as a share (0-1), by tenant; \
         published once a minute by the leader"
    );
    describe_counter!(
        "gangway_log_chunks_refused_total",
        "Pieces of workers' output an agent sent for a worker not on its nodes (not kept)"
    );
    describe_counter!(
        "gangway_node_state_changes_total",
        "Nodes whose observed health state changed, by the state entered"
    );
    describe_gauge!(
        "gangway_gpus_allocated",
        "GPUs allocated to jobs, by GPU type"
    );
    describe_gauge!(
        "gangway_gpus_free",
        "GPUs free on schedulable nodes, by GPU type"
    );
    describe_gauge!(
        "gangway_queue_depth",
        "Units (gangs or array workers) waiting for GPUs"
    );
    describe_gauge!(
        "gangway_rack_power_budget_watts",
        "A rack's (leaf's) power budget for GPU draw, in watts, by rack (racks with a budget)"
    );
    describe_gauge!(
        "gangway_rack_power_headroom_watts",
        "A rack's power budget less what its allocated GPUs draw, in watts, by rack \
         (negative: over budget, after a budget was lowered under running work)"
    );
    describe_gauge!(
        "gangway_region_fenced",
        "1 while the region is fenced (no round trip to a majority of regions within the lease)"
    );
    describe_gauge!(
        "gangway_scheduler_leader",
        "1 while this replica leads scheduling"
    );
    describe_histogram!(
        "gangway_submit_phase_seconds",
        Unit::Seconds,
        "A create in the region, by phase: checks (spec, fleet, region state), insert (the job's \
         one statement), intent (waiting for a buddy region to hold its intent, batched with the \
         creates waiting for the same buddy)"
    );
    describe_histogram!(
        "gangway_intent_batch_size",
        "New jobs' intents handed to a buddy region in one request and one commit"
    );
    describe_histogram!(
        "gangway_intent_handover_seconds",
        Unit::Seconds,
        "A hand-over of a batch of intents, by step: buddy (the request to the buddy region, its \
         commit included) and mark (the commit here that makes the jobs schedulable)"
    );
    describe_histogram!(
        "gangway_global_create_phase_seconds",
        Unit::Seconds,
        "A create in the global tier, by call: claim (the key's claim region records where the \
         job goes) and create (the chosen region's answer)"
    );
    describe_histogram!(
        "gangway_sync_seconds",
        Unit::Seconds,
        "An agent's sync, as the region handles it (its database work included), by kind: quiet \
         (nothing reported changed anything: read only), changed, or failed"
    );
    describe_counter!(
        "gangway_agent_pushes_total",
        "Committed plans whose agents were woken at once (sent), or left to sync at their \
         interval because syncs were queueing for database connections (skipped_busy)"
    );
    describe_counter!(
        "gangway_sync_reports_deferred_total",
        "Workers' reports a sync left for the agent's next one because another transaction held \
         their job (the agent reports a worker until the region stops listing it)"
    );
    describe_histogram!(
        "gangway_health_tick_seconds",
        Unit::Seconds,
        "The leader's health tick: the snapshot, and each node's change in its own transaction"
    );
    describe_gauge!(
        "gangway_health_silent_nodes",
        "Nodes silent past the suspect limit at the last health tick"
    );
    describe_gauge!(
        "gangway_health_losses_held",
        "Silent nodes held suspect instead of lost at the last tick (a mass silence, or losses \
         paced)"
    );
    describe_counter!(
        "gangway_requests_shed_total",
        "Requests shed with 503 overloaded, by path"
    );
    describe_histogram!(
        "gangway_queue_wait_seconds",
        Unit::Seconds,
        "Submission to placement"
    );
    describe_histogram!(
        "gangway_schedule_pass_seconds",
        Unit::Seconds,
        "One scheduling pass"
    );
    describe_histogram!(
        "gangway_schedule_phase_seconds",
        Unit::Seconds,
        "One phase of a scheduling pass: snapshot, plan or commit"
    );
    describe_histogram!(
        "gangway_snapshot_read_seconds",
        Unit::Seconds,
        "One read of a scheduling pass's snapshot, by read (conn: waiting for a database \
         connection; fleet, live, queue, terms, history, running, reserved, usage, capacity, \
         power, partitions)"
    );
    describe_histogram!(
        "gangway_db_pool_wait_seconds",
        Unit::Seconds,
        "Waiting for a database connection, by pool (main; syncs: the agents' syncs' own; leases: \
         the peers' and the agents' liveness')"
    );
    describe_counter!("gangway_placements_total", "Placements by topology level");
    describe_counter!(
        "gangway_schedule_passes_total",
        "Scheduling passes by outcome"
    );
    describe_counter!("gangway_jobs_submitted_total", "Jobs accepted");
    describe_counter!(
        "gangway_admission_refusals_total",
        "Submits refused over the tenant's admission limits, by limit: queued_jobs or \
         requested_gpus"
    );
    describe_counter!(
        "gangway_preemptions_total",
        "Running jobs asked to checkpoint and stop, by cause: priority, reclaim (a tenant \
         taking back its guarantee), grow (an elastic job restarting larger) or operator"
    );
    describe_counter!(
        "gangway_health_effects_total",
        "What the node-health policy did about agents' signals, by action: ignore, throttle, \
         quarantine_gpu, drain_node, repair (node moves also count in \
         gangway_preemptions_total, cause drain, maintenance, repair, health, node_lost or fenced)"
    );
    describe_counter!(
        "gangway_jobs_handed_over_total",
        "Jobs moved between regions by a planned handover, by way (out: this region's copy \
         released; in: taken here) and cause (evacuating, failing_back, balancing: a queued job \
         handed to its buddy, which had room for it); evacuations' and fail backs' stops count \
         in gangway_preemptions_total under the same causes"
    );
    describe_counter!(
        "gangway_balancing_marked_total",
        "Queued jobs marked to be handed to their buddy region because they waited here for \
         the balancing time while the buddy had room for them"
    );
    describe_counter!(
        "gangway_balancing_called_off_total",
        "Balancing handovers called off before their move was recorded (the buddy did not \
         answer or refused, the job changed): the job stays and is schedulable here again"
    );
    describe_counter!(
        "gangway_evacuations_total",
        "Operators' evacuations of this region and fail backs, by op: evacuate or failback"
    );
    describe_counter!(
        "gangway_spare_swaps_total",
        "Spares swapped in for nodes failed or lost under running gangs, by the domain the \
         spare came from: leaf, spine or region"
    );
}
