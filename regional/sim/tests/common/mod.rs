//! Helpers shared by the simulator's integration tests.

use gangway_sim::Trace;

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
