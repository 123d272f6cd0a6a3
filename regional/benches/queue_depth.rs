//! A scheduling pass's time as the queue grows (issue 23): a full region
//! (every GPU of the fleet allocated) whose queue grows to `DEPTHS` waiting
//! jobs, and at each depth `ROUNDS` rounds of: a few new jobs submitted
//! (what a busy region's wake-ups bring), one pass with the queue held
//! between passes (`store/queue.rs`: only what changed is read), and one
//! pass that reads the whole queue, as every pass did before — side by side
//! on the same database, alternated.
//!
//! `cargo bench -p gangway-regional --bench queue_depth`
//! Environment: `DEPTHS` (default `1000,5000,20000,50000`), `ROUNDS`
//! (default 10), `FLEET` (default deploy/fleets/h100-10k.toml),
//! `NEW_PER_ROUND` (default 10).
//!
//! Not a criterion bench: one run of a whole pipeline, timed in phases.

use std::time::Duration;

use gangway_regional::config::Planning;
use gangway_regional::scheduling::{run_partition_pass, PassOutcome};
use gangway_regional::store::{NewJob, QueueRead};
use gangway_regional::Store;
use gangway_shared::agent::RegisterRequest;
use gangway_shared::fleet::FleetFile;
use uuid::Uuid;

#[path = "../tests/common/mod.rs"]
mod common;

mod bench_util;
use bench_util::{env_or, philly_gpus, throwaway_pg};

fn job(i: usize, gpus: i32) -> NewJob {
    common::job(&format!("tenant-{}", i % 8), "h100", gpus, gpus.min(8))
}

/// Submits `n` jobs (numbered from `from`) of `gpus` GPUs each (Philly-shaped
/// sizes when `None`), 16 at a time.
async fn submit(store: &Store, from: usize, n: usize, gpus: Option<i32>) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for c in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while i < n {
                let g = gpus.unwrap_or_else(|| philly_gpus(from + i) as i32);
                store.submit(&job(from + i, g)).await?;
                i += 16;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let depths: Vec<usize> = std::env::var("DEPTHS")
        .unwrap_or_else(|_| "1000,5000,20000,50000".into())
        .split(',')
        .map(|d| d.trim().parse())
        .collect::<Result<_, _>>()?;
    let rounds = env_or("ROUNDS", 10).max(1);
    let new_per_round = env_or("NEW_PER_ROUND", 10);
    let fleet_path = std::env::var("FLEET").unwrap_or_else(|_| {
        format!(
            "{}/../deploy/fleets/h100-10k.toml",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let nodes =
        gangway_agent::nodes_from_fleet(&FleetFile::load(&fleet_path)?, "bench", "127.0.0.1");
    let gpus: usize = (nodes.iter())
        .filter(|n| !n.spare && n.gpu_type == "h100")
        .map(|n| n.gpus.len())
        .sum();

    let (_dir, mut pg) = throwaway_pg("gangway-bench-")?;

    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        pg.create_database("queue").await?;
        let url = pg.connection_string("queue");
        // Two stores on the one database: `held` keeps each pool's queue
        // between passes; `whole` forgets it before each of its passes.
        let held = Store::connect(&url, "bench", 20)?;
        held.migrate().await?;
        let whole = Store::connect(&url, "bench", 20)?;
        let req = RegisterRequest {
            agent_id: "bench-agent".into(),
            boot_id: Uuid::new_v4(),
            executor: "sim".into(),
            nodes,
            host_id: None,
        };
        held.admit_as_registered(&req).await?;
        held.register_agent(&req).await?;
        let planning = Planning::with_agent_timeout(Duration::from_secs(24 * 3600));

        // Fill the fleet with 8-GPU gangs.
        submit(&held, 0, gpus / 8, Some(8)).await?;
        loop {
            let o = run_partition_pass(&held, &planning, "h100").await?;
            if o.placements == 0 && !o.stale {
                break;
            }
        }
        println!("fleet {fleet_path}: {gpus} h100 GPUs, all allocated; {rounds} rounds per depth, {new_per_round} new jobs a round");
        println!("| queued jobs | queue read | snapshot p50 | plan p50 | commit p50 | pass p50 | pass max |");
        println!("|---:|---|---:|---:|---:|---:|---:|");
        let mut next = gpus / 8;
        let mut queued = 0;
        for depth in depths {
            if depth > queued {
                submit(&held, next, depth - queued, None).await?;
                next += depth - queued;
                queued = depth;
            }
            let mut runs: [Vec<PassOutcome>; 2] = [Vec::new(), Vec::new()];
            let mut changed = Vec::new();
            for _ in 0..rounds {
                submit(&held, next, new_per_round, None).await?;
                next += new_per_round;
                queued += new_per_round;
                // The held store's queue first (its snapshot reads what
                // changed since its previous pass, the other store's
                // commits included), then the whole read.
                let o = run_partition_pass(&held, &planning, "h100").await?;
                if let Some(QueueRead::Changes { changed: c }) = o.queue_read {
                    changed.push(c as f64);
                }
                runs[0].push(o);
                whole.forget_queues();
                runs[1].push(run_partition_pass(&whole, &planning, "h100").await?);
            }
            for (label, outcomes) in ["held, changes read", "whole"].iter().zip(&runs) {
                let phase = |f: fn(&PassOutcome) -> Duration| {
                    median(outcomes.iter().map(|o| ms(f(o))).collect())
                };
                let total = |o: &PassOutcome| o.phases.snapshot + o.phases.plan + o.phases.commit;
                println!(
                    "| {queued} | {label} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
                    phase(|o| o.phases.snapshot),
                    phase(|o| o.phases.plan),
                    phase(|o| o.phases.commit),
                    median(outcomes.iter().map(|o| ms(total(o))).collect()),
                    outcomes.iter().map(|o| ms(total(o))).fold(0.0, f64::max),
                );
            }
            // Where the held store's snapshots went, read by read.
            let reads: Vec<String> = (runs[0][0].reads.iter())
                .enumerate()
                .map(|(i, (read, _))| {
                    let took = median(runs[0].iter().map(|o| ms(o.reads[i].1)).collect());
                    format!("{read} {took:.1}")
                })
                .collect();
            println!("|   | (held: snapshot reads, median ms: {}) | | | | | |", reads.join(", "));
            if !changed.is_empty() {
                println!("|   | (jobs read as changed, median: {:.0}) | | | | | |", median(changed));
            }
        }
        anyhow::Ok(())
    })?;
    pg.stop()?;
    Ok(())
}
