//! `gangway sim`: replays a workload trace through the scheduler core under
//! each policy and prints the metrics side by side (or as JSON).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use gangway_sched::{PolicyKind, PreemptionPolicy};
use gangway_shared::fleet::FleetFile;
use gangway_sim::{
    human_duration, policy_label, render_table, Entitlements, LocalityModel, Metrics, Progress,
    SimConfig, Simulation, SpareMode, Trace, POLICIES,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyChoice {
    /// All three, side by side.
    All,
    /// Gangway's policy.
    Gangway,
    /// FIFO with first fit, no topology awareness (plain Kubernetes).
    Fifo,
    /// Slurm-like priority with EASY backfill and tree topology.
    Slurm,
}

impl PolicyChoice {
    fn kinds(self) -> Vec<PolicyKind> {
        match self {
            PolicyChoice::All => POLICIES.to_vec(),
            PolicyChoice::Gangway => vec![PolicyKind::Gangway],
            PolicyChoice::Fifo => vec![PolicyKind::FifoFirstFit],
            PolicyChoice::Slurm => vec![PolicyKind::SlurmBackfill],
        }
    }
}

/// Replay a workload trace through the scheduler core.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// The trace: a CSV in the Philly format (timestamp, duration, num_gpus, cluster).
    #[arg(long)]
    trace: PathBuf,
    /// The fleet file (e.g. deploy/fleets/philly.toml).
    #[arg(long)]
    fleet: PathBuf,
    /// Which policies to run on the same trace and seed.
    #[arg(long, value_enum, default_value = "all")]
    policy: PolicyChoice,
    /// Load scaling: inter-arrival times are divided by this factor (1 = as recorded).
    #[arg(long, default_value_t = 1.0)]
    load: f64,
    /// Replay only the first N jobs by submit time.
    #[arg(long)]
    max_jobs: Option<usize>,
    /// Tenant guarantees: a CSV of `tenant,weight` rows after a header
    /// (e.g. philly_vc_nodes.csv: vc, node num); each tenant is guaranteed
    /// its weight's share of the fleet and may borrow beyond it.
    #[arg(long)]
    quotas: Option<PathBuf>,
    /// Also enforce the guarantees as hard quotas (no borrowing).
    #[arg(long, requires = "quotas")]
    quota_caps: bool,
    /// Reserve this % of the fleet's GPUs at the start: the tenants with
    /// the largest guarantees each get an open-ended capacity reservation
    /// of their guarantee (taken out of their share of the pool) until the
    /// reservations cover the share; their jobs run in it while they fit.
    #[arg(
        long,
        default_value_t = 0.0,
        requires = "quotas",
        conflicts_with = "quota_caps"
    )]
    reserve_pct: f64,
    /// Reservations keep their idle GPUs to themselves instead of lending
    /// them to preemptible (low-priority) work.
    #[arg(long, requires = "reserve_pct")]
    no_borrow: bool,
    /// Fair-share weights, e.g. `a=2,b=0.5` (1 for tenants not named).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<String>,
    /// Half-life of the decayed past usage fair sharing weighs, in seconds
    /// of virtual time (0 = no history).
    #[arg(long, default_value_t = 86_400)]
    history_half_life_s: u64,
    /// Never preempt (Gangway's policy otherwise preempts low-priority work
    /// and reclaims lent capacity).
    #[arg(long)]
    no_preemption: bool,
    /// Gangway's policy never moves small jobs (low-priority, or of a
    /// tenant beyond its guarantee) out of a reserved gang's way.
    #[arg(long)]
    no_defrag: bool,
    /// Seconds a run must have run before it may be preempted.
    #[arg(long, default_value_t = PreemptionPolicy::default().min_run_s)]
    min_run_s: u64,
    /// Preemptions after which a job is no longer a victim of priority
    /// preemption.
    #[arg(long, default_value_t = PreemptionPolicy::default().max_preemptions)]
    max_preemptions: u32,
    /// Victims chosen in one planning pass, at most.
    #[arg(long, default_value_t = PreemptionPolicy::default().max_victims_per_pass)]
    max_victims_per_pass: usize,
    /// Seconds a victim has to checkpoint and stop.
    #[arg(long, default_value_t = PreemptionPolicy::default().checkpoint_deadline_s)]
    checkpoint_deadline_s: u64,
    /// Gangway's policy: seconds of waiting that lift a unit one rank in
    /// smaller-work-first (0 = submission order within a tenant).
    #[arg(long, default_value_t = gangway_sched::Policy::default().size_aging_s)]
    size_aging_s: u64,
    /// Gangway's policy: a gang waits for its preferred level only while
    /// that start is within this % of its run time of the first start at
    /// any level (0 = never waits for locality).
    #[arg(long, default_value_t = gangway_sched::Policy::default().locality_patience_pct)]
    locality_patience_pct: u32,
    /// Gangway's policy: place one-worker units by best fit alone, not by
    /// when they end (`Policy::pack_by_end` off).
    #[arg(long)]
    no_pack_by_end: bool,
    /// Seconds a victim takes to write its checkpoint on demand (GPU time
    /// lost); longer than the deadline = it stops without one.
    #[arg(long, default_value_t = 30)]
    checkpoint_write_s: u64,
    /// Seconds of run time between a job's checkpoints (0 = never checkpoint).
    #[arg(long, default_value_t = 3600)]
    checkpoint_interval_s: u64,
    /// Node failures per node per day (0 = none).
    #[arg(long, default_value_t = 0.0)]
    node_failure_rate: f64,
    /// Seconds a failed node stays out of service.
    #[arg(long, default_value_t = 14_400)]
    repair_time_s: u64,
    /// What the fleet's spare nodes do: `swap` (the nearest idle spare
    /// takes a failed node's place under running work, which restarts there
    /// from its checkpoint; repaired nodes refill the pool), `off` (spares
    /// stay out, failures requeue their jobs at the front) or `capacity`
    /// (spares are ordinary nodes).
    #[arg(long, default_value = "swap")]
    spares: SpareMode,
    /// Seed for failures and estimate noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Locality table: relative throughput per level, e.g.
    /// `nvlink=1,leaf=0.75,spine=0.56,region=0.42` (default: V100 calibration).
    #[arg(long, conflicts_with = "locality_csv")]
    locality: Option<String>,
    /// Calibrate the locality table from Gavel's consolidation CSV for the
    /// fleet's GPU type.
    #[arg(long)]
    locality_csv: Option<PathBuf>,
    /// Noise of runtime estimates: duration × exp(σ·Z) (0 = perfect estimates).
    #[arg(long, default_value_t = 0.0)]
    estimate_noise: f64,
    /// Tenants whose jobs run at low priority (comma-separated).
    #[arg(long, value_delimiter = ',')]
    low_priority_tenants: Vec<String>,
    /// Queued units shown to each planning pass (oldest first).
    #[arg(long, default_value_t = gangway_sched::QueueWindow::default().cap)]
    queue_window: usize,
    /// Beyond those, each tenant's oldest this many queued units are shown too.
    #[arg(long, default_value_t = gangway_sched::QueueWindow::default().per_tenant)]
    queue_window_per_tenant: usize,
    /// At least this many seconds of virtual time between planning passes
    /// (a scheduler loop's period; 0 = a pass at every event).
    #[arg(long, default_value_t = 0)]
    pass_interval_s: u64,
    /// Run the policies one after another instead of in parallel threads.
    #[arg(long)]
    sequential: bool,
    /// Print the metrics as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write every placement of the run as the usage ledger's rows
    /// (one per placement and clock hour, docs/billing.md), CSV for
    /// PostgreSQL's COPY into `usage_ledger`: the input of the billing
    /// export's benchmark (docs/benchmarks.md). One policy only.
    #[arg(long)]
    usage_out: Option<PathBuf>,
    /// With --usage-out: the wall-clock time the run's first second is.
    #[arg(long, default_value = "2026-11-01T00:00:00Z", requires = "usage_out")]
    usage_start: chrono::DateTime<chrono::Utc>,
    /// With --usage-out: the region the rows name.
    #[arg(long, default_value = "us-east", requires = "usage_out")]
    usage_region: String,
}

/// The columns `--usage-out` writes, in order (for `COPY usage_ledger (…)`).
pub const USAGE_COLUMNS: &str = "usage_id,job_id,epoch,attempt,rank,tenant,region,gpu_type,priority,gpus,started_at,ended_at,gpu_seconds,ended_by,cause,checkpointed_at";

pub fn run(args: SimArgs) -> anyhow::Result<u8> {
    let started = Instant::now();
    let trace = Trace::load(&args.trace)?;
    let fleet = FleetFile::load(&args.fleet)?;
    let nodes = fleet.expand(fleet.region_or("sim"));
    let entitlements = args
        .quotas
        .as_ref()
        .map(Entitlements::load)
        .transpose()
        .context("reading --quotas")?;
    let locality = match (&args.locality, &args.locality_csv) {
        (Some(spec), _) => LocalityModel::parse(spec)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let gpu_type = nodes
                .iter()
                .find(|n| !n.spare)
                .map(|n| n.gpu_type.as_str())
                .unwrap_or_default();
            LocalityModel::from_gavel_csv(&text, gpu_type)?
        }
        (None, None) => LocalityModel::default(),
    };
    let mut weights = BTreeMap::new();
    for spec in &args.weights {
        let (tenant, w) = spec
            .split_once('=')
            .with_context(|| format!("--weights {spec:?}: expected tenant=weight"))?;
        let w: f64 = w
            .trim()
            .parse()
            .with_context(|| format!("--weights {spec:?}: the weight is not a number"))?;
        weights.insert(tenant.trim().to_string(), w);
    }
    let config = SimConfig {
        load: args.load,
        max_jobs: args.max_jobs,
        checkpoint_interval_s: args.checkpoint_interval_s,
        node_failure_rate: args.node_failure_rate,
        repair_time_s: args.repair_time_s,
        seed: args.seed,
        entitlements,
        quota_caps: args.quota_caps,
        weights,
        history_half_life_s: args.history_half_life_s,
        preemption: PreemptionPolicy {
            enabled: !args.no_preemption,
            min_run_s: args.min_run_s,
            max_preemptions: args.max_preemptions,
            max_victims_per_pass: args.max_victims_per_pass,
            checkpoint_deadline_s: args.checkpoint_deadline_s,
            defrag: !args.no_defrag,
        },
        size_aging_s: args.size_aging_s,
        locality_patience_pct: args.locality_patience_pct,
        pack_by_end: !args.no_pack_by_end,
        checkpoint_write_s: args.checkpoint_write_s,
        locality,
        estimate_noise: args.estimate_noise,
        low_priority_tenants: args
            .low_priority_tenants
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        queue_window: args.queue_window,
        queue_window_per_tenant: args.queue_window_per_tenant,
        pass_interval_s: args.pass_interval_s,
        spares: args.spares,
        scheduled_failures: Vec::new(),
        reserve_pct: args.reserve_pct,
        lend_reserved: !args.no_borrow,
    };
    let sim = Simulation::new(&trace, &nodes, config)?;
    let kinds = args.policy.kinds();
    if let Some(path) = &args.usage_out {
        if kinds.len() != 1 {
            anyhow::bail!("--usage-out writes one run's usage: choose it with --policy gangway, fifo or slurm");
        }
        let started = Instant::now();
        eprintln!(
            "replaying {} jobs on {} GPUs under {}, recording its placements",
            sim.summary().jobs,
            sim.summary().fleet_gpus,
            policy_label(kinds[0])
        );
        let outcome = run_with_progress(&sim, kinds[0]);
        let rows = write_usage(&sim, &outcome.placements, &args, path)?;
        eprintln!(
            "wrote {rows} usage rows of {} placements to {} ({:.1} s); load them with\n  \\copy usage_ledger ({USAGE_COLUMNS}) FROM '{}' WITH (FORMAT csv, HEADER)",
            outcome.placements.len(),
            path.display(),
            started.elapsed().as_secs_f64(),
            path.display()
        );
        let metrics = [outcome.metrics];
        print!(
            "{}",
            render_table(sim.summary(), args.load, args.seed, &metrics)
        );
        return Ok(0);
    }
    eprintln!(
        "replaying {} jobs on {} GPUs under {} ({}), locality {}",
        sim.summary().jobs,
        sim.summary().fleet_gpus,
        kinds
            .iter()
            .map(|&k| policy_label(k))
            .collect::<Vec<_>>()
            .join(", "),
        if args.sequential || kinds.len() == 1 {
            "one after another"
        } else {
            "in parallel"
        },
        sim.config().locality,
    );
    let results: Vec<(Metrics, f64)> = if args.sequential || kinds.len() == 1 {
        kinds.iter().map(|&k| replay(&sim, k)).collect()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = kinds
                .iter()
                .map(|&k| {
                    let sim = &sim;
                    s.spawn(move || replay(sim, k))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a simulation thread panicked"))
                .collect()
        })
    };
    let total_s = started.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "workload": sim.summary(),
            "config": sim.config(),
            "policies": results.iter().map(|(m, _)| m).collect::<Vec<_>>(),
            "wall_s": {
                "total": total_s,
                "per_policy": results
                    .iter()
                    .map(|(m, s)| (policy_label(m.policy).to_string(), *s))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            },
        });
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        let metrics: Vec<Metrics> = results.iter().map(|(m, _)| m.clone()).collect();
        write!(
            out,
            "{}",
            render_table(sim.summary(), args.load, args.seed, &metrics)
        )?;
        writeln!(
            out,
            "wall time: {:.1} s in all ({})",
            total_s,
            results
                .iter()
                .map(|(m, s)| format!("{} {s:.1} s", policy_label(m.policy)))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    Ok(0)
}

/// One policy's run, with progress on stderr at most every few seconds.
fn replay(sim: &Simulation, kind: PolicyKind) -> (Metrics, f64) {
    let started = Instant::now();
    let outcome = run_with_progress(sim, kind);
    let wall = started.elapsed().as_secs_f64();
    eprintln!("  {:<15} done in {wall:.1} s", policy_label(kind));
    (outcome.metrics, wall)
}

/// `sim`'s run under `kind`, with progress on stderr at most every 5 s.
fn run_with_progress(sim: &Simulation, kind: PolicyKind) -> gangway_sim::SimOutcome {
    let started = Instant::now();
    let mut last = Instant::now();
    let mut report = |p: &Progress| {
        if last.elapsed().as_secs_f64() >= 5.0 {
            last = Instant::now();
            eprintln!(
                "  {:<15} t={:>8}  {:>6}/{} jobs done, {} waiting, {} running ({:.0} s)",
                policy_label(p.policy),
                human_duration(p.now_s as f64),
                p.jobs_done,
                p.jobs_total,
                p.waiting,
                p.running,
                started.elapsed().as_secs_f64()
            );
        }
    };
    sim.run_with_progress(kind, &mut report)
}

/// Writes `placements` as usage-ledger rows: one per placement and clock
/// hour, ids derived as the region derives them (so the same placement is
/// the same rows), the job's epoch 1. Returns the rows written.
fn write_usage(
    sim: &Simulation,
    placements: &[gangway_sim::PlacementRecord],
    args: &SimArgs,
    path: &std::path::Path,
) -> anyhow::Result<u64> {
    use chrono::{DurationRound, TimeDelta};
    use gangway_sim::PlacementEnd;
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "{USAGE_COLUMNS}")?;
    let at = |s: u64| args.usage_start + TimeDelta::seconds(s as i64);
    let ts = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let hour = TimeDelta::hours(1);
    let mut rows = 0u64;
    for p in placements.iter().filter(|p| p.end_s > p.start_s) {
        let job = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("gangway-sim/j{}", p.job).as_bytes(),
        );
        let (from, until) = (at(p.start_s), at(p.end_s));
        let (ended_by, cause) = match p.ended_by {
            PlacementEnd::Succeeded => ("succeeded", None),
            PlacementEnd::Preempted(c) => ("preempted", Some(c.as_str())),
            PlacementEnd::NodeLost => ("node_lost", Some("node_lost")),
            PlacementEnd::Running => ("running", None),
        };
        let mut h = from.duration_trunc(hour)?;
        while h < until {
            let (s, e) = (h.max(from), (h + hour).min(until));
            let last = h + hour >= until;
            let id = uuid::Uuid::new_v5(
                &uuid::Uuid::NAMESPACE_OID,
                format!(
                    "{job}/1/{}/{}/{}/{}",
                    p.attempt,
                    p.rank,
                    from.timestamp(),
                    h.timestamp()
                )
                .as_bytes(),
            );
            writeln!(
                out,
                "{id},{job},1,{},{},{},{},{},{},{},{},{},{},{},{},{}",
                p.attempt,
                p.rank,
                sim.tenant_name(p.tenant),
                args.usage_region,
                sim.gpu_type(),
                p.priority,
                p.gpus,
                ts(s),
                ts(e),
                f64::from(p.gpus) * (e - s).as_seconds_f64(),
                if last { ended_by } else { "running" },
                if last { cause.unwrap_or("") } else { "" },
                p.checkpointed_s.map(|c| ts(at(c))).unwrap_or_default(),
            )?;
            rows += 1;
            h += hour;
        }
    }
    out.flush()?;
    Ok(rows)
}
