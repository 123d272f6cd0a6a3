//! Helpers shared by the simulator's integration tests.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use gangway_sim::{SimOutcome, Trace};

/// A Philly-format trace from (seconds after 2017-10-01, duration, gpus, tenant).
pub fn trace(rows: &[(u64, f64, u32, &str)]) -> Trace {
    let mut text = String::from("timestamp,duration,num_gpus,gpu_time,cluster\n");
    for &(at, dur, gpus, tenant) in rows {
        let (h, m, s) = (at / 3600, at / 60 % 60, at % 60);
        text.push_str(&format!(
            "2017-10-01 {h:02}:{m:02}:{s:02},{dur},{gpus},{},{tenant}\n",
            dur * f64::from(gpus)
        ));
    }
    Trace::parse(&text).unwrap()
}

/// Work conservation after failures, with no locality slowdown: the GPU
/// time allocated is the trace's work plus what failures threw away, and no
/// restart lost more than one checkpoint interval of the unit's GPUs.
pub fn assert_only_work_since_checkpoints_lost(
    o: &SimOutcome,
    rows: &[(u64, f64, u32, &str)],
    interval_s: u64,
) {
    let work: f64 = rows.iter().map(|r| r.1 * f64::from(r.2)).sum();
    let lost: f64 = o.jobs.iter().map(|j| j.lost_gpu_s).sum();
    let allocated = o.metrics.gpu_hours * 3600.0;
    assert!(
        (allocated - (work + lost)).abs() < 1e-6,
        "{allocated} vs {}",
        work + lost
    );
    for j in &o.jobs {
        let restarts = f64::from(j.starts - 1);
        assert!(
            j.lost_gpu_s <= restarts * interval_s as f64 * j.gpus as f64,
            "{j:?}"
        );
    }
}
