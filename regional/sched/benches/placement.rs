//! Placement benchmarks on the example fleets (figures in docs/benchmarks.md).
//!
//! - `decision/<fleet>/<allocated>%/<gpus>`: one `plan` call with a single
//!   queued gang of `gpus` GPUs (8 per worker), everything a pass does
//!   included (index build, placement), on a fleet pre-allocated to 0, 50 or
//!   90 % by a seeded LCG.
//! - `pass/h100-40k/<allocated>%/5000`: one `plan` call over 5,000 queued jobs
//!   whose sizes follow the Philly trace's shape (mostly 1 GPU, some 2–64).
//!
//! Run: `cargo bench -p gangway-sched --bench placement -- --warm-up-time 1 --measurement-time 3`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gangway_sched::{plan, Level, Node, Plan, Policy, Request, Snapshot};
use gangway_shared::fleet::FleetFile;

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

/// Allocates `percent` % of the schedulable GPUs the way a running fleet
/// looks: a quarter of the free GPUs sit on partly used nodes (1–7 free), the
/// rest on whole free nodes, all other nodes full; which node is which is
/// shuffled by a seeded LCG, so leaves and spines are mixed.
fn allocate(nodes: &mut [Node], percent: u32, seed: u64) {
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

fn snapshot(nodes: Vec<Node>, queue: Vec<Request>) -> Snapshot {
    let mut quotas = BTreeMap::new();
    quotas.insert(("tenant-0".to_string(), "h100".to_string()), 4_000);
    quotas.insert(("tenant-1".to_string(), "h100".to_string()), 8_000);
    Snapshot {
        generation: 1,
        nodes,
        queue,
        quotas,
        usage: BTreeMap::new(),
        ..Default::default()
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
    eprintln!("{name}: placed {levels:?}, waiting {waits:?}");
}

fn decisions(c: &mut Criterion) {
    let policy = Policy::default();
    for fleet_name in ["h100-10k", "h100-40k"] {
        let base = fleet(&format!("{fleet_name}.toml"));
        for percent in [0, 50, 90] {
            let mut nodes = base.clone();
            allocate(&mut nodes, percent, 42);
            let mut group = c.benchmark_group(format!("decision/{fleet_name}/{percent}%"));
            for gpus in [8, 64, 512, 2048] {
                let snap = snapshot(nodes.clone(), vec![gang("gang", gpus, 0)]);
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

fn full_pass(c: &mut Criterion) {
    let policy = Policy::default();
    let base = fleet("h100-40k.toml");
    let mut group = c.benchmark_group("pass/h100-40k");
    group.sample_size(20);
    for percent in [0, 50, 90] {
        let mut nodes = base.clone();
        allocate(&mut nodes, percent, 42);
        let snap = snapshot(nodes, philly_queue(5_000, 7));
        describe(
            &format!("pass/h100-40k/{percent}%/5000"),
            &plan(&snap, &policy),
        );
        group.bench_with_input(
            BenchmarkId::new(format!("{percent}%"), 5000),
            &snap,
            |b, snap| b.iter(|| plan(black_box(snap), &policy)),
        );
    }
    group.finish();
}

criterion_group!(benches, decisions, full_pass);
criterion_main!(benches);
