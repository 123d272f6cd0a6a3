//! Placement benchmarks on the example fleets (figures in docs/benchmarks.md).
//!
//! Every fleet is pre-allocated to 0, 50 or 90 % by a seeded LCG, and the
//! allocated GPUs belong to running units with expected ends over the next
//! two days, so reservations have something to be computed from.
//!
//! - `decision/<fleet>/<allocated>%/<gpus>`: one `plan` call under Gangway's
//!   policy with a single queued gang of `gpus` GPUs (8 per worker),
//!   everything a pass does included (index build, placement, and the
//!   reservation when the gang does not fit).
//! - `reserve/h100-40k/<allocated>%/<case>`: single gangs that cannot start,
//!   so the decision is a reservation: `leaf-128` must fit one leaf,
//!   `region-8192` is larger than the free GPUs.
//! - `pass/h100-40k/<policy>/<allocated>%`: one `plan` call over 5,000 queued
//!   jobs whose sizes follow the Philly trace's shape (mostly 1 GPU, some
//!   2–64), under each policy kind.
//! - `partitions/mixed-40k/<allocated>%/<case>`: 6,000 such jobs over the
//!   mixed fleet's three GPU types, planned in one pass, as partitions at
//!   once, and each type's partition alone.
//!
//! - `depth/h100-10k/<queued>`: one `plan` call on a fully allocated
//!   fleet (what a busy region plans on most of the time) against the
//!   queue's depth, 1,000 to 50,000 Philly-shaped jobs (issue 23: a pass
//!   time that stays flat as the queue grows).
//!
//! Run: `cargo bench -p gangway-sched --bench placement -- --warm-up-time 1 --measurement-time 3`
//!
//! With `GANGWAY_BENCH_CLOCK=thread-cpu` (Linux) the figures are the CPU
//! time of the benchmark thread instead of wall time: on a shared machine
//! other processes then only slow it through the caches, not by taking the
//! CPU away.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gangway_sched::{
    plan, plan_partitioned, Level, Node, Plan, Policy, PolicyKind, Request, Running, Snapshot,
};
use gangway_shared::fleet::FleetFile;

/// Wall time, or the benchmark thread's CPU time when
/// `GANGWAY_BENCH_CLOCK=thread-cpu`.
struct Clock {
    thread_cpu: bool,
}

impl Clock {
    fn from_env() -> Clock {
        Clock {
            thread_cpu: std::env::var("GANGWAY_BENCH_CLOCK").as_deref() == Ok("thread-cpu"),
        }
    }

    fn now_ns(&self) -> u64 {
        if self.thread_cpu {
            thread_cpu_ns()
        } else {
            static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            EPOCH
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_nanos() as u64
        }
    }
}

#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call's duration.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> u64 {
    panic!("GANGWAY_BENCH_CLOCK=thread-cpu needs Linux")
}

impl Measurement for Clock {
    type Intermediate = u64;
    type Value = std::time::Duration;

    fn start(&self) -> u64 {
        self.now_ns()
    }

    fn end(&self, start: u64) -> std::time::Duration {
        std::time::Duration::from_nanos(self.now_ns() - start)
    }

    fn add(&self, a: &Self::Value, b: &Self::Value) -> Self::Value {
        *a + *b
    }

    fn zero(&self) -> Self::Value {
        std::time::Duration::ZERO
    }

    fn to_f64(&self, v: &Self::Value) -> f64 {
        v.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

/// Knuth's MMIX LCG: deterministic, no dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in 0..n.
    fn below(&mut self, n: u32) -> u32 {
        self.next() % n
    }
}

fn fleet(name: &str) -> Vec<Node> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/fleets")
        .join(name);
    let file = FleetFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
    file.expand(file.region_or("us-east"))
        .into_iter()
        .map(|n| Node {
            id: n.node_id,
            spine: n.spine,
            leaf: n.leaf,
            nvlink_domain: n.nvlink_domain,
            gpu_type: n.gpu_type,
            free: (0..n.gpus).collect(),
            gpus: n.gpus,
            schedulable: !n.spare,
        })
        .collect()
}

/// The snapshot clock in every benchmark.
const NOW: u64 = 1_000_000;

/// Allocates `percent` % of the schedulable GPUs the way a running fleet
/// looks: a quarter of the free GPUs sit on partly used nodes (1–7 free), the
/// rest on whole free nodes, all other nodes full; which node is which is
/// shuffled by a seeded LCG, so leaves and spines are mixed. Returns the
/// running units holding the allocated GPUs: full nodes in gangs of 1–8
/// nodes (consecutive in the shuffled order, so scattered), partly used
/// nodes' GPUs in units of 1, 2 or 4; each expected to end within two days.
fn allocate(nodes: &mut [Node], percent: u32, seed: u64) -> Vec<Running> {
    let mut rng = Lcg(seed);
    let mut order: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].schedulable).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u32 + 1) as usize);
    }
    let total: u32 = order.iter().map(|&i| nodes[i].gpus).sum();
    let free_target = total / 100 * (100 - percent);
    let mut partial_free = free_target / 4;
    let mut whole_free = free_target - partial_free;
    for &i in &order {
        let node = &mut nodes[i];
        let gpus = node.gpus;
        let keep = if whole_free >= gpus {
            whole_free -= gpus;
            gpus
        } else if partial_free > 0 {
            let k = (1 + rng.below(gpus - 1)).min(partial_free);
            partial_free -= k;
            k
        } else {
            0
        };
        // Jobs took the lowest GPUs, as the scheduler hands them out.
        node.free.drain(..(gpus - keep) as usize);
    }
    let mut running: Vec<Running> = Vec::new();
    let mut gang_left = 0;
    for &i in &order {
        let node = &nodes[i];
        let used = node.gpus - node.free.len() as u32;
        if used == 0 {
            continue;
        }
        let end = NOW + 60 + u64::from(rng.below(48 * 3600));
        let unit = |gpus: Vec<u32>, n: usize| Running {
            job: format!("run-{n:06}"),
            tenant: format!("tenant-{}", n % 4),
            gpu_type: node.gpu_type.clone(),
            priority: 0,
            gpus: vec![(node.id.clone(), gpus)],
            expected_end: end,
            ..Default::default()
        };
        if used == node.gpus {
            // A whole node: the next node of the current gang, or a new gang.
            match running.last_mut() {
                Some(r) if gang_left > 0 => {
                    r.gpus.push((node.id.clone(), (0..used).collect()));
                    gang_left -= 1;
                }
                _ => {
                    running.push(unit((0..used).collect(), running.len()));
                    gang_left = rng.below(8);
                }
            }
        } else {
            gang_left = 0;
            let mut g = 0;
            while g < used {
                let k = [1, 2, 4][rng.below(3) as usize].min(used - g);
                let mut r = unit((g..g + k).collect(), running.len());
                r.expected_end = NOW + 60 + u64::from(rng.below(48 * 3600));
                running.push(r);
                g += k;
            }
        }
    }
    running
}

fn gang(job: &str, gpus: u32, seq: u64) -> Request {
    let (workers, gpw) = if gpus <= 8 { (1, gpus) } else { (gpus / 8, 8) };
    Request {
        job: job.to_string(),
        ranks: (0..workers).collect(),
        tenant: "acme".into(),
        gpu_type: "h100".into(),
        gpus_per_worker: gpw,
        required: Level::Region,
        preferred: Level::Nvlink,
        priority: 0,
        seq,
        estimated_duration_s: 3600,
        min_workers: 0,
        submitted: 0,
        reservation: None,
    }
}

/// 5,000 jobs shaped like the Philly trace: ~70 % 1 GPU, then 2, 4, 8 and a
/// tail of 16–64-GPU gangs; three priorities, four tenants (two with quotas).
fn philly_queue(n: usize, seed: u64) -> Vec<Request> {
    let mut rng = Lcg(seed);
    (0..n)
        .map(|i| {
            let gpus = match rng.below(100) {
                0..=69 => 1,
                70..=74 => 2,
                75..=82 => 4,
                83..=92 => 8,
                93..=96 => 16,
                97..=98 => 32,
                _ => 64,
            };
            let mut r = gang(&format!("job-{i:05}"), gpus, i as u64);
            r.tenant = format!("tenant-{}", rng.below(4));
            r.priority = rng.below(3) as i32;
            if gpus > 8 && rng.below(4) == 0 {
                r.required = Level::Spine;
            }
            r
        })
        .collect()
}

fn snapshot(nodes: Vec<Node>, running: Vec<Running>, queue: Vec<Request>) -> Snapshot {
    let mut quotas = BTreeMap::new();
    quotas.insert(("tenant-0".to_string(), "h100".to_string()), 4_000);
    quotas.insert(("tenant-1".to_string(), "h100".to_string()), 8_000);
    Snapshot {
        generation: 1,
        nodes,
        queue,
        quotas,
        usage: BTreeMap::new(),
        now: NOW,
        running,
        ..Snapshot::default()
    }
}

fn describe(name: &str, p: &Plan) {
    let mut levels: BTreeMap<String, usize> = BTreeMap::new();
    for pl in &p.placements {
        *levels.entry(pl.level.to_string()).or_default() += 1;
    }
    let mut waits: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &p.waiting {
        *waits.entry(w.reason.code()).or_default() += 1;
    }
    let reserved: Vec<String> = p
        .reservations
        .iter()
        .map(|r| format!("{} at {} +{}s", r.job, r.level, r.start - NOW))
        .collect();
    eprintln!("{name}: placed {levels:?}, waiting {waits:?}, reservations {reserved:?}");
}

fn kind_name(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::Gangway => "gangway",
        PolicyKind::SlurmBackfill => "slurm_backfill",
        PolicyKind::FifoFirstFit => "fifo_first_fit",
    }
}

fn decisions(c: &mut Criterion<Clock>) {
    let policy = Policy::default();
    for fleet_name in ["h100-10k", "h100-40k"] {
        let base = fleet(&format!("{fleet_name}.toml"));
        for percent in [0, 50, 90] {
            let mut nodes = base.clone();
            let running = allocate(&mut nodes, percent, 42);
            let mut group = c.benchmark_group(format!("decision/{fleet_name}/{percent}%"));
            for gpus in [8, 64, 512, 2048] {
                let snap = snapshot(nodes.clone(), running.clone(), vec![gang("gang", gpus, 0)]);
                describe(
                    &format!("decision/{fleet_name}/{percent}%/{gpus}"),
                    &plan(&snap, &policy),
                );
                group.bench_with_input(BenchmarkId::from_parameter(gpus), &snap, |b, snap| {
                    b.iter(|| plan(black_box(snap), &policy))
                });
            }
            group.finish();
        }
    }
}

fn reservations(c: &mut Criterion<Clock>) {
    let policy = Policy::default();
    let base = fleet("h100-40k.toml");
    for percent in [50, 90] {
        let mut nodes = base.clone();
        let running = allocate(&mut nodes, percent, 42);
        let mut group = c.benchmark_group(format!("reserve/h100-40k/{percent}%"));
        let mut leaf = gang("gang", 128, 0);
        leaf.required = Level::Leaf;
        let region = gang("gang", 8192, 0);
        for (name, req) in [("leaf-128", leaf), ("region-8192", region)] {
            let snap = snapshot(nodes.clone(), running.clone(), vec![req]);
            describe(
                &format!("reserve/h100-40k/{percent}%/{name}"),
                &plan(&snap, &policy),
            );
            group.bench_with_input(BenchmarkId::from_parameter(name), &snap, |b, snap| {
                b.iter(|| plan(black_box(snap), &policy))
            });
        }
        group.finish();
    }
}

fn full_pass(c: &mut Criterion<Clock>) {
    let base = fleet("h100-40k.toml");
    // Gangway's discipline also with `pack_by_end` off, to see what placing
    // one-worker units by their ends costs a pass.
    for (kind, pack_by_end) in [
        (PolicyKind::Gangway, true),
        (PolicyKind::Gangway, false),
        (PolicyKind::SlurmBackfill, false),
        (PolicyKind::FifoFirstFit, false),
    ] {
        let policy = Policy {
            kind,
            pack_by_end,
            ..Default::default()
        };
        let name = match (kind, pack_by_end) {
            (PolicyKind::Gangway, false) => "gangway-best-fit".to_string(),
            _ => kind_name(kind).to_string(),
        };
        let mut group = c.benchmark_group(format!("pass/h100-40k/{name}"));
        group.sample_size(20);
        for percent in [0, 50, 90] {
            let mut nodes = base.clone();
            let running = allocate(&mut nodes, percent, 42);
            let snap = snapshot(nodes, running, philly_queue(5_000, 7));
            describe(
                &format!("pass/h100-40k/{name}/{percent}%"),
                &plan(&snap, &policy),
            );
            group.bench_with_input(
                BenchmarkId::from_parameter(format!("{percent}%")),
                &snap,
                |b, snap| b.iter(|| plan(black_box(snap), &policy)),
            );
        }
        group.finish();
    }
}

/// [`philly_queue`] spread over the mixed fleet's types: half h100, a
/// quarter each a100 and gb200 (4-GPU trays: gangs of 4 per worker).
fn mixed_queue(n: usize, seed: u64) -> Vec<Request> {
    let mut q = philly_queue(n, seed);
    for (i, r) in q.iter_mut().enumerate() {
        match i % 4 {
            2 => r.gpu_type = "a100".into(),
            3 => {
                r.gpu_type = "gb200".into();
                let gpus = r.gpus();
                let gpw = gpus.min(4) as u32;
                r.gpus_per_worker = gpw;
                r.ranks = (0..(gpus / u64::from(gpw)) as u32).collect();
            }
            _ => {}
        }
    }
    q
}

/// Scheduling partitions on the 40,960-GPU mixed fleet: one pass over every
/// type (`plan`), the types' partitions planned at once, one thread each
/// (`plan_partitioned`), and each type's partition alone (what one of the
/// region's partition loops plans). Wall time only: the thread-CPU clock
/// would not see the other threads.
fn partitions(c: &mut Criterion<Clock>) {
    let base = fleet("mixed-40k.toml");
    let policy = Policy::default();
    for percent in [50, 90] {
        let mut nodes = base.clone();
        let running = allocate(&mut nodes, percent, 42);
        let snap = snapshot(nodes, running, mixed_queue(6_000, 7));
        let name = format!("partitions/mixed-40k/{percent}%");
        describe(&format!("{name}/one pass"), &plan(&snap, &policy));
        describe(
            &format!("{name}/partitioned"),
            &plan_partitioned(&snap, &policy),
        );
        let mut group = c.benchmark_group(name);
        group.sample_size(20);
        group.bench_function("one pass", |b| b.iter(|| plan(black_box(&snap), &policy)));
        group.bench_function("partitioned", |b| {
            b.iter(|| plan_partitioned(black_box(&snap), &policy))
        });
        for ty in ["h100", "a100", "gb200"] {
            let part = snap.partition(ty);
            group.bench_function(format!("{ty} alone"), |b| {
                b.iter(|| plan(black_box(&part), &policy))
            });
        }
        group.finish();
    }
}

/// One pass on the whole `h100-10k` fleet allocated, against the queue's
/// depth (`DEPTHS`, default `1000,5000,20000,50000`).
fn depth(c: &mut Criterion<Clock>) {
    let mut nodes = fleet("h100-10k.toml");
    let running = allocate(&mut nodes, 100, 42);
    let policy = Policy::default();
    let depths: Vec<usize> = std::env::var("DEPTHS")
        .unwrap_or_else(|_| "1000,5000,20000,50000".into())
        .split(',')
        .map(|d| d.trim().parse().expect("DEPTHS: numbers"))
        .collect();
    let mut group = c.benchmark_group("depth/h100-10k");
    group.sample_size(10);
    for n in depths {
        let snap = snapshot(nodes.clone(), running.clone(), philly_queue(n, 7));
        describe(&format!("depth/h100-10k/{n}"), &plan(&snap, &policy));
        group.bench_with_input(BenchmarkId::from_parameter(n), &snap, |b, snap| {
            b.iter(|| plan(black_box(snap), &policy))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(Clock::from_env());
    targets = decisions, reservations, full_pass, partitions, depth
}
criterion_main!(benches);
