//! A region dies, or is cut off, and its jobs go on elsewhere, across real
//! processes: the `gangway chaos` drills (chaos/, docs/failover.md), each on
//! a cloud of three `gangway region`s (each with its own database, peers of
//! each other, every link through a proxy that can be cut), an agent each
//! serving a simulated fleet, and `gangway global` in front.
//!
//! - region-kill: the home region of a job (control plane and agent) is
//!   killed; its buddy adopts the job at the next epoch once a majority has
//!   not heard from the home for the adoption time, and runs it; a retried
//!   create with the job's key returns the adopted job; every job succeeds.
//! - partition (through the CLI): a region cut off from its peers and the
//!   global tier fences itself and stops its job, which its buddy adopts;
//!   sampled every 100 ms the job never runs in two regions at once, and
//!   once healed the home releases its copy.

mod support;

use std::path::Path;
use std::process::Command;

use support::BIN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_region_kill_drill_moves_a_dead_regions_jobs_and_loses_none() {
    let report = gangway_chaos::run(gangway_chaos::Drill::RegionKill, Path::new(BIN), true)
        .await
        .unwrap();
    eprintln!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(report.jobs.len(), 2, "{report}");
    let moved: Vec<_> = report
        .jobs
        .iter()
        .filter(|j| j.home == report.region)
        .collect();
    assert!(!moved.is_empty());
    for j in &moved {
        assert_eq!(j.epoch, 2, "{report}");
        assert_ne!(j.region, report.region, "{report}");
        assert!(j.recovered_s.is_some_and(|s| s < 30.0), "{report}");
    }
    for j in report.jobs.iter().filter(|j| j.home != report.region) {
        assert_eq!((j.epoch, &j.region), (1, &j.home), "undisturbed: {report}");
    }
}

#[test]
fn the_partition_drill_never_runs_a_job_in_two_regions() {
    let out = Command::new(BIN)
        .args(["chaos", "partition", "--short-timers", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}: {stderr}",
        out.status.code()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["violations"], serde_json::json!([]), "{report}");
    let job = &report["jobs"][0];
    assert_eq!(job["epoch"], 2, "{report}");
    assert_ne!(job["region"], report["region"], "{report}");
    assert_eq!(job["state"], "succeeded", "{report}");
}
