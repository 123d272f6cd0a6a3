//! Jobs accepted, placed and committed per second by the regional service on
//! a real PostgreSQL (durable settings: fsync on), over its HTTP API.
//!
//! `cargo bench -p gangway-regional --bench service_throughput`
//! Environment: `JOBS` (default 5000), `CONCURRENCY` (default 16),
//! `FLEET` (default deploy/fleets/h100-10k.toml), `PLACEMENT_COPIES` for
//! the backlog phase: `on` (the default: the triggers of V22 as deployed,
//! the jobs without a buddy, as in a region without peers), `buddy` (every
//! job has a buddy: each placement is queued for it), `off` (the two
//! triggers dropped: the cost they add, side by side), `bare` (the
//! triggers and V22's index on allocations dropped). `PROFILE=1` loads
//! `pg_stat_statements` (nested statements too) and tracks PL/pgSQL
//! functions, and prints where the backlog phase's database time went:
//! the statements and functions that took the most. `DB`: `single` (the
//! default: one server) or `ha` (a three-member Patroni cluster with a
//! synchronous standby, durable, on this machine: every commit waits for
//! the standby's flush; needs the Debian packages `patroni` and
//! `etcd-server`), to compare the submit path's cost side by side.
//!
//! Not a criterion bench: one run of a whole pipeline, timed in phases.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gangway_devkit::{PatroniCluster, PatroniOptions, PgCluster, PgOptions};
use gangway_regional::{AppState, RegionConfig};
use gangway_shared::agent::{AgentGpu, AgentNode, RegisterRequest};
use gangway_shared::api::{JobMode, JobSpec};
use gangway_shared::client::Client;
use gangway_shared::fleet::FleetFile;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod bench_util;
use bench_util::{env_or, philly_gpus};

/// The region's database: one server, or a Patroni cluster.
#[allow(clippy::large_enum_variant)] // one per run
enum Db {
    Single(PgCluster),
    Ha(PatroniCluster),
}

impl Db {
    fn start(dir: &std::path::Path, extra: Vec<(String, String)>) -> anyhow::Result<Db> {
        match std::env::var("DB").as_deref().unwrap_or("single") {
            "single" => {
                let options = PgOptions {
                    extra_settings: extra,
                    ..PgOptions::default()
                };
                let mut pg = PgCluster::init_or_open(&dir.join("pg"), options)?;
                pg.start()?;
                Ok(Db::Single(pg))
            }
            "ha" => {
                let options = PatroniOptions {
                    scope: "bench".into(),
                    extra_settings: extra,
                    ..PatroniOptions::default()
                };
                let c = PatroniCluster::start(&dir.join("patroni"), options)?;
                c.wait_for_sync_standby(Duration::from_secs(60))?;
                Ok(Db::Ha(c))
            }
            other => anyhow::bail!("DB is single or ha, not {other:?}"),
        }
    }

    async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Db::Single(pg) => pg.create_database(name).await,
            Db::Ha(c) => c.create_database(name).await,
        }
    }

    fn connection_string(&self, db: &str) -> String {
        match self {
            Db::Single(pg) => pg.connection_string(db),
            Db::Ha(c) => c.connection_url(db),
        }
    }

    fn describe(&self) -> String {
        match self {
            Db::Single(_) => "one PostgreSQL server".into(),
            Db::Ha(c) => format!(
                "a Patroni cluster of {} (primary {}, synchronous standby {})",
                c.member_names().len(),
                c.primary().unwrap_or_default(),
                c.sync_standbys().join(",")
            ),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let jobs = env_or("JOBS", 5000);
    let concurrency = env_or("CONCURRENCY", 16);
    let fleet_path = std::env::var("FLEET").unwrap_or_else(|_| {
        format!(
            "{}/../deploy/fleets/h100-10k.toml",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let fleet = FleetFile::load(&fleet_path)?;
    let nodes: Vec<AgentNode> = fleet
        .expand("bench")
        .into_iter()
        .map(|n| AgentNode {
            gpus: (0..n.gpus)
                .map(|i| AgentGpu {
                    index: i,
                    uuid: format!("GPU-{}-{i}", n.node_id),
                    ..AgentGpu::default()
                })
                .collect(),
            node_id: n.node_id,
            spine: n.spine,
            leaf: n.leaf,
            nvlink_domain: n.nvlink_domain,
            gpu_type: n.gpu_type,
            spare: n.spare,
            address: "127.0.0.1".into(),
            gpu_power_w: n.gpu_power_w,
            rack_power_budget_w: n.rack_power_budget_w,
        })
        .collect();
    let backlog_nodes = nodes.clone();
    let gpus: usize = nodes
        .iter()
        .filter(|n| !n.spare)
        .map(|n| n.gpus.len())
        .sum();

    let dir = tempfile::Builder::new()
        .prefix("gangway-bench-")
        .tempdir_in("/tmp")?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let profile = std::env::var("PROFILE").is_ok_and(|v| v == "1");
    let mut extra = Vec::new();
    if profile {
        for (k, v) in [
            ("shared_preload_libraries", "pg_stat_statements"),
            ("pg_stat_statements.track", "all"),
            ("track_functions", "all"),
        ] {
            extra.push((k.into(), v.into()));
        }
    }
    let pg = Db::start(dir.path(), extra)?;

    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        pg.create_database("bench").await?;
        let url = pg.connection_string("bench");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let mut cfg = RegionConfig::new("bench", addr, &url);
        cfg.pool_size = concurrency + 4;
        cfg.schedule_interval = Duration::from_millis(50);
        cfg.agent_timeout = Duration::from_secs(3600);
        let state: AppState = gangway_regional::prepare(cfg, Duration::from_secs(30)).await?;
        let req = RegisterRequest {
            agent_id: "bench-agent".into(),
            boot_id: Uuid::new_v4(),
            executor: "sim".into(),
            nodes,
            host_id: None,
        };
        state.store.admit_as_registered(&req).await?;
        state.store.register_agent(&req).await?;
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(gangway_regional::serve_on(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        let base = format!("http://{addr}");
        // Wait for leadership so the loop places as jobs arrive.
        while !state.is_leader() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        println!(
            "fleet {fleet_path}: {gpus} schedulable GPUs; {jobs} jobs, {concurrency} concurrent clients; the database: {}",
            pg.describe()
        );
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..concurrency {
            let client = Client::new(base.clone(), format!("tenant-{}", c % 8));
            tasks.push(tokio::spawn(async move {
                let mut i = c;
                let mut took = Vec::new();
                while i < jobs {
                    let sent = Instant::now();
                    let spec = JobSpec {
                        name: format!("bench-{i}"),
                        gpus: philly_gpus(i),
                        gpu_type: "h100".into(),
                        priority: Default::default(),
                        estimated_duration_s: 3600,
                        max_duration_s: None,
                        command: vec!["train".into()],
                        env: Default::default(),
                        gpus_per_worker: Some(philly_gpus(i).min(8)),
                        mode: JobMode::Gang,
                        min_gpus: None,
                        topology: Default::default(),
                        region: None,
                        reservation: None,
                        cluster: None,
                    };
                    client
                        .submit(&spec, Some(&format!("bench-{i}")))
                        .await
                        .expect("submit");
                    took.push(sent.elapsed());
                    i += concurrency;
                }
                took
            }));
        }
        let mut latencies = Vec::new();
        for t in tasks {
            latencies.extend(t.await?);
        }
        let submitted = started.elapsed();
        latencies.sort();
        let pct = |p: f64| {
            let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
            latencies[i - 1].as_secs_f64() * 1000.0
        };
        // Wait until the loop has placed every job that fits.
        let status_client = Client::new(base.clone(), "tenant-0");
        let mut last = u64::MAX;
        let mut stable = 0;
        loop {
            let s = status_client.region_status().await?;
            let queued = s.queued_jobs;
            if queued == 0 || (queued == last && { stable += 1; stable } > 10) {
                break;
            }
            if queued != last {
                stable = 0;
            }
            last = queued;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let placed_at = started.elapsed();
        let s = status_client.region_status().await?;
        let allocated: u32 = s.capacity.iter().map(|c| c.allocated).sum();
        let placed_jobs = jobs as u64 - s.queued_jobs;
        println!(
            "submit over HTTP:          {:>8.0} jobs/s  ({jobs} in {:.2} s; p50 {:.1} ms, p99 {:.1} ms)",
            jobs as f64 / submitted.as_secs_f64(),
            submitted.as_secs_f64(),
            pct(0.5),
            pct(0.99)
        );
        println!(
            "submitted and placed:      {:>8.0} jobs/s  ({placed_jobs} placed, {allocated} GPUs, all done at {:.2} s)",
            placed_jobs as f64 / placed_at.as_secs_f64(),
            placed_at.as_secs_f64()
        );

        shutdown.cancel();
        server.await??;

        // The scheduling pipeline alone: a backlog placed by back-to-back
        // passes (snapshot, plan, generation-checked commit).
        pg.create_database("backlog").await?;
        let store = gangway_regional::Store::connect(
            &pg.connection_string("backlog"),
            "bench",
            concurrency + 4,
        )?;
        store.migrate().await?;
        let req = RegisterRequest {
            agent_id: "bench-agent".into(),
            boot_id: Uuid::new_v4(),
            executor: "sim".into(),
            nodes: backlog_nodes,
            host_id: None,
        };
        store.admit_as_registered(&req).await?;
        store.register_agent(&req).await?;
        let mut submits = Vec::new();
        for c in 0..concurrency {
            let store = store.clone();
            submits.push(tokio::spawn(async move {
                let mut i = c;
                while i < jobs {
                    let g = philly_gpus(i) as i32;
                    let per = g.min(8);
                    let new = gangway_regional::store::NewJob {
                        id: Uuid::new_v4(),
                        tenant: format!("tenant-{}", i % 8),
                        idempotency_key: None,
                        spec: serde_json::from_value(serde_json::json!({"name": "b", "gpus": g,
                            "gpu_type": "h100", "estimated_duration_s": 3600, "command": ["t"],
                            "gpus_per_worker": per}))
                        .expect("spec"),
                        name: "b".into(),
                        mode: JobMode::Gang,
                        gpu_type: "h100".into(),
                        gpus: g,
                        gpus_per_worker: per,
                        workers: g / per,
                        priority: 1,
                        required: gangway_shared::api::TopologyLevel::Region,
                        preferred: gangway_shared::api::TopologyLevel::Nvlink,
                    };
                    store.submit(&new).await.expect("submit");
                    i += concurrency;
                }
            }));
        }
        for t in submits {
            t.await?;
        }
        let copies = std::env::var("PLACEMENT_COPIES").unwrap_or_else(|_| "on".into());
        let (db, conn) =
            tokio_postgres::connect(&pg.connection_string("backlog"), tokio_postgres::NoTls)
                .await?;
        tokio::spawn(conn);
        match copies.as_str() {
            "on" => {}
            "buddy" => {
                db.execute("UPDATE jobs SET buddy = 'bench-buddy'", &[])
                    .await?;
            }
            "off" => {
                db.batch_execute(
                    "DROP TRIGGER allocations_queue_opened ON allocations;
                     DROP TRIGGER allocations_queue_ended ON allocations;",
                )
                .await?;
            }
            "bare" => {
                db.batch_execute(
                    "DROP TRIGGER allocations_queue_opened ON allocations;
                     DROP TRIGGER allocations_queue_ended ON allocations;
                     DROP INDEX allocations_by_placement;",
                )
                .await?;
            }
            other => anyhow::bail!("PLACEMENT_COPIES is on, buddy, off or bare, not {other:?}"),
        }
        println!("placement copies: {copies}");
        if profile {
            db.batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
                 SELECT pg_stat_statements_reset(); SELECT pg_stat_reset();",
            )
            .await?;
        }
        let started = Instant::now();
        let mut passes = 0;
        let mut placed = 0;
        let mut slowest = Duration::ZERO;
        loop {
            let t = Instant::now();
            let o = gangway_regional::scheduling::run_pass(&store, Duration::from_secs(3600)).await?;
            slowest = slowest.max(t.elapsed());
            if o.placements > 0 {
                println!(
                    "  pass {passes}: {} placed, {} waiting; snapshot {:.0} ms, plan {:.0} ms, commit {:.0} ms",
                    o.placements,
                    o.waiting,
                    o.phases.snapshot.as_secs_f64() * 1000.0,
                    o.phases.plan.as_secs_f64() * 1000.0,
                    o.phases.commit.as_secs_f64() * 1000.0
                );
            }
            if o.placements == 0 && passes == 0 {
                // The backlog is all queued: a first pass that places
                // nothing is a fault, not a measurement.
                let counts = db
                    .query_one(
                        "SELECT (SELECT count(*) FROM jobs WHERE state = 'queued'),
                                (SELECT count(*) FROM agents),
                                (SELECT count(*) FROM nodes),
                                (SELECT count(*) FROM allocations WHERE released_at IS NULL)",
                        &[],
                    )
                    .await?;
                anyhow::bail!(
                    "the first pass placed nothing: {o:?}; queued jobs, agents, nodes, open allocations: {:?}",
                    (0..4).map(|i| counts.get::<_, i64>(i)).collect::<Vec<_>>()
                );
            }
            passes += 1;
            placed += o.placements;
            if o.placements == 0 && !o.stale {
                break;
            }
        }
        let took = started.elapsed();
        let queued: i64 = db
            .query_one("SELECT count(*) FROM placement_outbox", &[])
            .await?
            .get(0);
        println!("placements queued for a buddy: {queued}");
        println!(
            "backlog placed by passes:  {:>8.0} jobs/s  ({placed} jobs in {passes} passes, {:.2} s; slowest pass {:.0} ms)",
            placed as f64 / took.as_secs_f64(),
            took.as_secs_f64(),
            slowest.as_secs_f64() * 1000.0
        );
        if profile {
            print_profile(&db).await?;
        }
        anyhow::Ok(())
    })?;
    if let Db::Single(mut pg) = pg {
        pg.stop()?;
    }
    Ok(())
}

/// Where the backlog phase's database time went: the statements (nested
/// ones, run by triggers and functions, included) and the PL/pgSQL
/// functions that took the most, as PostgreSQL counted them.
async fn print_profile(db: &tokio_postgres::Client) -> anyhow::Result<()> {
    // Backends flush their function counts within a second of going idle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let statements = db
        .query(
            "SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g')
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
             ORDER BY total_exec_time DESC LIMIT 15",
            &[],
        )
        .await?;
    println!("statements, most time first (nested ones counted in their callers too):");
    println!("{:>8} {:>10} {:>9}  query", "calls", "total ms", "rows");
    for r in &statements {
        let query: String = r.get(3);
        println!(
            "{:>8} {:>10.1} {:>9}  {}",
            r.get::<_, i64>(0),
            r.get::<_, f64>(1),
            r.get::<_, i64>(2),
            query.chars().take(150).collect::<String>()
        );
    }
    let functions = db
        .query(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions
             ORDER BY total_time DESC LIMIT 10",
            &[],
        )
        .await?;
    println!("functions, most time first:");
    println!(
        "{:>8} {:>10} {:>10}  function",
        "calls", "total ms", "self ms"
    );
    for r in &functions {
        println!(
            "{:>8} {:>10.1} {:>10.1}  {}",
            r.get::<_, i64>(1),
            r.get::<_, f64>(2),
            r.get::<_, f64>(3),
            r.get::<_, String>(0)
        );
    }
    Ok(())
}
