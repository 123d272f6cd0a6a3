//! Rolling maintenance over a simulated 1,024-node region: how long a
//! reboot of every node takes under a 10 % wave cap, and the capacity lost
//! while it runs.
//!
//! `cargo bench -p gangway-regional --bench rolling_maintenance`
//! Environment: `FLEET` (default deploy/fleets/h100-1k.toml), `PER_LEAF`
//! (K, default 2), `MAX_PERCENT` (M, default 10), `JOB_FILL` (percent of
//! the GPUs given long-running sim jobs before the plan starts, default 50:
//! half 8-GPU jobs, half 16-GPU gangs over two nodes), `AGENTS` (sim agents
//! serving the fleet, default 4), `TICK_MS` (the leader's health tick,
//! default 1000, the region's default), `SYNC_MS` (the agents' sync
//! interval, default 1000, the region's default), `SAMPLE_MS` (how often
//! nodes out are counted, default 100).
//!
//! Not a criterion bench and not part of `cargo test`: one run of a whole
//! region (in-process region as leader on a throwaway PostgreSQL, the real
//! sim agents over HTTP), timed once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gangway_agent::{AgentConfig, ExecutorKind};
use gangway_regional::store::NewJob;
use gangway_regional::{AppState, RegionConfig};
use gangway_shared::api::{JobMode, MaintenanceStart, TopologyLevel};
use gangway_shared::fleet::FleetFile;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod bench_util;
use bench_util::{env_or, throwaway_pg};

async fn count(client: &tokio_postgres::Client, sql: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

fn main() -> anyhow::Result<()> {
    let per_leaf = env_or("PER_LEAF", 2) as u32;
    let max_percent = env_or("MAX_PERCENT", 10) as u32;
    let job_fill = env_or("JOB_FILL", 50);
    let agents = env_or("AGENTS", 4).max(1) as usize;
    let tick = Duration::from_millis(env_or("TICK_MS", 1000));
    let sync = Duration::from_millis(env_or("SYNC_MS", 1000));
    let sample = Duration::from_millis(env_or("SAMPLE_MS", 100));
    let fleet_path = std::env::var("FLEET").unwrap_or_else(|_| {
        format!(
            "{}/../deploy/fleets/h100-1k.toml",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let fleet = FleetFile::load(&fleet_path)?;
    let nodes = gangway_agent::nodes_from_fleet(&fleet, "bench", "127.0.0.1");
    let total_nodes = nodes.iter().filter(|n| !n.spare).count();
    let gpus: usize = nodes
        .iter()
        .filter(|n| !n.spare)
        .map(|n| n.gpus.len())
        .sum();

    let (dir, mut pg) = throwaway_pg("gangway-bench-maint-")?;

    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        pg.create_database("bench").await?;
        let url = pg.connection_string("bench");
        let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let mut cfg = RegionConfig::new("bench", addr, &url);
        cfg.pool_size = 16;
        cfg.health_tick_interval = tick;
        cfg.agent_sync_interval = sync;
        let state: AppState = gangway_regional::prepare(cfg, Duration::from_secs(30)).await?;
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gangway_regional::serve_on(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        while !state.is_leader() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The sim agents, each serving a contiguous share of the nodes.
        let chunk = nodes.len().div_ceil(agents);
        let mut agent_tasks = Vec::new();
        for (i, share) in nodes.chunks(chunk).enumerate() {
            let config = AgentConfig {
                region_url: format!("http://{addr}"),
                region_ca_pem: None,
                agent_id: format!("sim-{i}"),
                nodes: share.to_vec(),
                executor: ExecutorKind::Sim,
                time_factor: 1.0,
                work_dir: dir.path().join(format!("agent-{i}")),
                default_sync_interval: sync,
                token: None,
                machine_boot_id: None,
                health_poll_interval: Duration::from_secs(5),
                fence_after: None,
                checkpoint_store: None,
                isolation: Default::default(),
            };
            agent_tasks.push(tokio::spawn(gangway_agent::run(config, shutdown.clone())));
        }
        while count(&db, "SELECT count(*) FROM nodes WHERE observed = 'healthy'").await?
            < nodes.len() as i64
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Long-running work, so drains have jobs to checkpoint and move.
        let fill_gpus = gpus as u64 * job_fill / 100;
        let mut jobs = 0;
        let mut given = 0;
        while given < fill_gpus {
            let g: i32 = if jobs % 2 == 0 { 8 } else { 16 };
            let new = NewJob {
                id: Uuid::new_v4(),
                tenant: format!("tenant-{}", jobs % 4),
                idempotency_key: None,
                spec: serde_json::from_value(serde_json::json!({"name": "m", "gpus": g,
                    "gpu_type": "h100", "estimated_duration_s": 1_000_000, "command": ["t"],
                    "gpus_per_worker": 8}))?,
                name: "m".into(),
                mode: JobMode::Gang,
                gpu_type: "h100".into(),
                gpus: g,
                gpus_per_worker: 8,
                workers: g / 8,
                priority: 1,
                required: TopologyLevel::Region,
                preferred: TopologyLevel::Nvlink,
            };
            state.store.submit(&new).await?;
            jobs += 1;
            given += g as u64;
        }
        let running_sql = "SELECT count(*) FROM jobs WHERE state = 'running'";
        let deadline = Instant::now() + Duration::from_secs(120);
        while count(&db, running_sql).await? < jobs && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let running_before = count(&db, running_sql).await?;
        println!(
            "fleet {fleet_path}: {total_nodes} nodes, {gpus} GPUs; {agents} sim agents; \
             {running_before}/{jobs} jobs running on {given} GPUs; \
             K = {per_leaf} per leaf, M = {max_percent} %; health tick {} ms, sync {} ms",
            tick.as_millis(),
            sync.as_millis()
        );

        // The plan.
        let req = MaintenanceStart {
            all: true,
            per_leaf: Some(per_leaf),
            region_percent: Some(max_percent),
            reason: Some("bench".into()),
            ..MaintenanceStart::default()
        };
        let started = Instant::now();
        let plan = state
            .store
            .start_maintenance("bench", &req)
            .await?
            .map_err(|e| anyhow::anyhow!("refused: {e:?}"))?;
        let mut samples: Vec<(f64, i64)> = Vec::new();
        let mut last_print = 0u64;
        let out_sql = "SELECT count(*) FROM nodes WHERE NOT spare AND \
                       (operator_state <> 'active' OR observed NOT IN ('healthy', 'degraded'))";
        let finished = loop {
            let out = count(&db, out_sql).await?;
            let t = started.elapsed().as_secs_f64();
            samples.push((t, out));
            let p = state
                .store
                .get_maintenance(plan.plan_id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("plan gone"))?;
            if t as u64 >= last_print + 5 {
                last_print = t as u64;
                println!(
                    "  t = {t:>6.1} s: {out:>4} nodes out; steps {:?}; held {}",
                    p.steps,
                    p.held.as_ref().map(|h| h.to_string()).unwrap_or_default()
                );
            }
            if p.state != "running" {
                break started.elapsed();
            }
            if t > 3600.0 {
                anyhow::bail!("not done after an hour: {p:?}");
            }
            tokio::time::sleep(sample).await;
        };

        // What the database says: each node's time out (step started →
        // done) times its GPUs, and the waves (nodes started together).
        let row = db
            .query_one(
                "SELECT count(*) FILTER (WHERE s.step = 'done'),
                        count(DISTINCT s.started_at),
                        COALESCE(sum(EXTRACT(EPOCH FROM s.finished_at - s.started_at)
                                     * (SELECT count(*) FROM gpus g WHERE g.node_id = s.node_id)),
                                 0)::float8,
                        COALESCE(avg(EXTRACT(EPOCH FROM s.finished_at - s.started_at)), 0)::float8,
                        COALESCE(max(EXTRACT(EPOCH FROM s.finished_at - s.started_at)), 0)::float8,
                        EXTRACT(EPOCH FROM max(s.finished_at) - min(s.started_at))::float8
                 FROM maintenance_steps s WHERE s.plan_id = $1",
                &[&plan.plan_id],
            )
            .await?;
        let done: i64 = row.get(0);
        let waves: i64 = row.get(1);
        let gpu_s: f64 = row.get(2);
        let mean_out_s: f64 = row.get(3);
        let max_out_s: f64 = row.get(4);
        let db_span: f64 = row.get(5);
        let max_out = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let mean_out = samples.iter().map(|s| s.1 as f64).sum::<f64>() / samples.len() as f64;
        let wall = finished.as_secs_f64();
        let running_after = count(&db, running_sql).await?;
        let moves = count(&db, "SELECT COALESCE(sum(node_moves), 0)::int8 FROM jobs").await?;
        let lost_job_gpu_s = db
            .query_one("SELECT COALESCE(sum(lost_gpu_s), 0)::float8 FROM jobs", &[])
            .await?
            .get::<_, f64>(0);
        println!("plan {}: {done}/{total_nodes} nodes done", plan.plan_id);
        println!("wall time, start → every node done:  {wall:.1} s (database: first start → last done {db_span:.1} s)");
        println!("waves (distinct start times):        {waves}");
        println!(
            "nodes out per sample ({} samples every {} ms): max {max_out}, mean {mean_out:.1} ({:.1} % of the fleet)",
            samples.len(),
            sample.as_millis(),
            mean_out * 100.0 / total_nodes as f64
        );
        println!("time each node was out:              mean {mean_out_s:.2} s, max {max_out_s:.2} s");
        println!(
            "capacity lost:                       {gpu_s:.0} GPU-s = {:.2} GPU-h; {:.2} % of the fleet's {gpus} GPUs over the {wall:.1} s",
            gpu_s / 3600.0,
            gpu_s * 100.0 / (gpus as f64 * wall)
        );
        println!(
            "jobs: {running_after}/{jobs} running after; {moves} moves; lost GPU time (after the last checkpoint) {lost_job_gpu_s:.0} GPU-s"
        );

        shutdown.cancel();
        for t in agent_tasks {
            let _ = t.await;
        }
        server.await??;
        anyhow::Ok(())
    })?;
    pg.stop()?;
    Ok(())
}
