//! Writes a month of a frontier lab's work on a 16,384-GPU region as a
//! Philly-format trace (timestamp, duration, num_gpus, gpu_time, cluster),
//! for the failure and spare-pool experiment in docs/benchmarks.md:
//!
//! ```sh
//! cargo run --release -p gangway-sim --example frontier_trace > deploy/traces/frontier-16k.csv
//! ```
//!
//! Deterministic (SplitMix64 by `SimRng`, seed 7). Four tenants, arrivals over 30 days
//! from 2026-11-01, offered load about 93 % of 16,384 GPUs over the 30 days:
//! - `pretrain`: one 8,192-GPU run of 20 days, submitted first;
//! - `midtrain`: six 1,024-GPU runs of 2–4 days, one every 5 days;
//! - `research`: gangs of 64–512 GPUs (powers of two), 2–24 h, Poisson;
//! - `eval`: one-node jobs of 1–8 GPUs, 10 min–4 h, Poisson.

use gangway_sim::SimRng;

const DAY: f64 = 86_400.0;
const SPAN_DAYS: f64 = 30.0;

struct Row {
    at_s: f64,
    duration_s: f64,
    gpus: u32,
    tenant: &'static str,
}

fn main() {
    let mut rng = SimRng::new(7);
    let mut rows = vec![Row {
        at_s: 0.0,
        duration_s: 20.0 * DAY,
        gpus: 8192,
        tenant: "pretrain",
    }];
    for i in 0..6 {
        rows.push(Row {
            at_s: f64::from(i) * 5.0 * DAY + 3600.0,
            duration_s: (2.0 + 2.0 * rng.next_f64()) * DAY,
            gpus: 1024,
            tenant: "midtrain",
        });
    }
    // research: mean 224 GPUs × 13 h ≈ 121 GPU-days a job; 2,100 jobs ≈ 70
    // a day fill what pretrain and midtrain leave, with eval, to ~95 %.
    poisson(&mut rng, &mut rows, 2_100, |rng| Row {
        at_s: 0.0,
        duration_s: (2.0 + 22.0 * rng.next_f64()) * 3600.0,
        gpus: 64 << rng.below(4),
        tenant: "research",
    });
    poisson(&mut rng, &mut rows, 8_000, |rng| Row {
        at_s: 0.0,
        duration_s: 600.0 + (4.0 * 3600.0 - 600.0) * rng.next_f64(),
        gpus: [1, 2, 4, 8][rng.below(4) as usize],
        tenant: "eval",
    });
    rows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    println!("timestamp,duration,num_gpus,gpu_time,cluster");
    for r in rows {
        let t = r.at_s.floor() as u64;
        let (day, rest) = (t / 86_400, t % 86_400);
        let duration = r.duration_s.round();
        println!(
            "2026-11-{:02} {:02}:{:02}:{:02},{duration:.1},{},{:.1},{}",
            day + 1,
            rest / 3600,
            rest % 3600 / 60,
            rest % 60,
            r.gpus,
            duration * f64::from(r.gpus),
            r.tenant
        );
    }
}

/// `n` jobs from `make` at exponential inter-arrival times over the span.
fn poisson(
    rng: &mut SimRng,
    rows: &mut Vec<Row>,
    n: u32,
    mut make: impl FnMut(&mut SimRng) -> Row,
) {
    let rate = f64::from(n) / (SPAN_DAYS * DAY);
    let mut at = 0.0;
    for _ in 0..n {
        at += rng.exp(rate);
        if at >= SPAN_DAYS * DAY {
            break;
        }
        let mut row = make(rng);
        row.at_s = at;
        rows.push(row);
    }
}
