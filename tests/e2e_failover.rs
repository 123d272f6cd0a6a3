//! A region dies, loses its database or its control plane, or is cut off,
//! and its jobs go on elsewhere, across real processes: the `gangway chaos`
//! drills (chaos/, docs/failover.md), each on a cloud of three `gangway
//! region`s (each with its own PostgreSQL, peers of each other, every link
//! through a proxy that can be cut), an agent each running the example
//! trainer as real processes with a checkpoint store per region, and
//! `gangway global` in front.
//!
//! Every drill checks, besides what is particular to it: the broken
//! region's jobs run again elsewhere at epoch 2, resuming from a checkpoint
//! they wrote; no job ever trained in two places at once (the trainers'
//! own logs) or ran in two regions' records at once (sampled every 100 ms);
//! no GPU was allocated twice; a create retried with the job's key returns
//! the adopted job; every job ends with its full step count.
//!
//! - region-kill: the home region (control plane, PostgreSQL, agent and its
//!   workers) is killed with SIGKILL; the other regions' jobs are
//!   undisturbed.
//! - agent-kill: the home's agent is killed in the middle of a checkpoint
//!   upload and started again: the half-uploaded checkpoint never becomes
//!   the job's, the worker the dead agent left is killed before the job
//!   runs again (in the same region, at the same epoch), and it resumes
//!   from its last whole checkpoint.
//! - global-kill: one of two global replicas is killed in the middle of a
//!   burst of keyed creates, which are retried at the other with their
//!   keys: every acknowledged job exists exactly once and succeeds.
//! - control-plane-kill: only the home's control plane dies; its agent
//!   fences and stops the worker; restarted, the home releases its copy.
//! - database-kill: only the home's PostgreSQL dies; the home fences; its
//!   database restarted, it releases its copy before placing anything.
//! - partition (through the CLI): the home is cut off from its peers and
//!   the global tier; it fences and stops its job, and once healed it
//!   releases its copy.
//! - database-failover: the home's database is a Patroni cluster (three
//!   members, synchronous replication, etcd); its primary's PostgreSQL is
//!   killed, then the primary's whole member, under creates every half
//!   second: the region neither fences nor moves its job, loses no
//!   acknowledged create, and refuses meanwhile only with 503 and
//!   Retry-After.
//!
//! region-kill and partition also run on a lab of machines, the faults
//! coming from the network and the hosts instead of these proxies:
//! tests/e2e_lab.rs (one lab at a time on a machine, so not here, beside
//! these drills' clouds).

mod support;

use std::path::Path;
use std::process::Command;

use gangway_chaos::{Drill, Report, TRAINING};
use support::BIN;

/// What every drill must show of the broken region's jobs: each ran again
/// elsewhere at epoch 2 within 30 s, succeeded with its full step count,
/// and resumed from a checkpoint (failed past its second, not from
/// scratch) — [`Report::moved_and_resumed`], which the lab's drills
/// (tests/e2e_lab.rs) are held to as well.
fn moved_and_resumed(report: &Report) {
    assert!(report.passed(), "{report}");
    let short = report.moved_and_resumed(30.0);
    assert!(short.is_empty(), "{short:?}\n{report}");
}

async fn drill(drill: Drill) -> Report {
    let report = gangway_chaos::run(drill, Path::new(BIN), true)
        .await
        .unwrap();
    eprintln!("{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_region_kill_drill_moves_a_dead_regions_jobs_and_loses_none() {
    let report = drill(Drill::RegionKill).await;
    moved_and_resumed(&report);
    assert_eq!(report.jobs.len(), 2, "{report}");
    for j in report.jobs.iter().filter(|j| j.home != report.region) {
        assert_eq!((j.epoch, &j.region), (1, &j.home), "undisturbed: {report}");
        assert_eq!(j.final_step, Some(TRAINING.total), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_kill_drill_resumes_from_the_last_whole_checkpoint_never_a_half_uploaded_one() {
    let report = drill(Drill::AgentKill).await;
    assert!(report.passed(), "{report}");
    let j = &report.jobs[0];
    assert_eq!((j.epoch, &j.region), (1, &report.region), "{report}");
    assert_eq!(j.final_step, Some(TRAINING.total), "{report}");
    let lost = j.lost.expect("lost work measured");
    assert!(lost.resumed >= TRAINING.every, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_kill_drill_loses_and_doubles_no_create_of_a_burst() {
    let report = drill(Drill::GlobalKill).await;
    assert!(report.passed(), "{report}");
    // The whole burst was acknowledged, part of it by the survivor.
    assert_eq!(report.jobs.len(), 48, "{report}");
    assert!(
        report.jobs.iter().any(|j| j.recovered_s.is_some()),
        "{report}"
    );
    for j in &report.jobs {
        assert_eq!(j.state, "succeeded", "{report}");
        assert_eq!(j.final_step, Some(30), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_kill_drill_moves_the_job_and_the_restarted_region_lets_it_go() {
    moved_and_resumed(&drill(Drill::ControlPlaneKill).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_kill_drill_fences_the_region_until_it_learns_its_job_moved() {
    moved_and_resumed(&drill(Drill::DatabaseKill).await);
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
    assert_eq!(job["final_step"], TRAINING.total, "{report}");
    assert!(
        job["lost"]["resumed"].as_u64() >= Some(TRAINING.every.into()),
        "{report}"
    );
}

/// The region's database is a Patroni cluster: its primary's PostgreSQL
/// is killed, then the primary's whole member, while a trainer job runs
/// and creates keep coming. Nothing fences or moves, the job runs on once
/// to its last step, every acknowledged create succeeds, and a refusal
/// meanwhile is only ever a 503 with Retry-After (the drill's invariants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_failover_drill_keeps_the_region_writing_through_its_primarys_death() {
    let report = drill(Drill::DatabaseFailover).await;
    // Both kills were survived with writes and placements after each.
    support::held_through_database_failover(&report, ["PostgreSQL killed", "member killed"]);
}
