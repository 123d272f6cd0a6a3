//! The cloud on a lab of machines (chaos/src/lab.rs, issue 21): 25 hosts,
//! each a network namespace with its own address and hostname — per
//! region a PostgreSQL host, two control-plane replicas and four GPU
//! machines behind a router, and two global replicas — every process
//! configured from the reference files, TLS on every hop. Faults come from
//! the network and the hosts, not from a proxy inside Gangway:
//!
//! 1. a gang runs end to end across two machines of a region; another,
//!    over all four, one of them behind a slow and lossy link (nftables
//!    drops, a `tc tbf` rate), runs once and succeeds;
//! 2. the leading control-plane replica's host loses power (link down,
//!    every process killed, no goodbye to the database): the other replica
//!    leads, and every job submitted before and after finishes — none lost;
//! 3. the links of the region running a job are cut at its router: it
//!    fences, its machines stop the job, and the job moves to a buddy
//!    region and finishes there.
//!
//! One lab for the three (it takes half a minute to bring up), in that
//! order: each leaves the lab whole for the next but the third.
//!
//! And two of the failover drills (`gangway chaos … --lab`,
//! docs/failover.md), each on a lab of its own, judged as their loopback
//! versions are (tests/e2e_failover.rs: [`Report::moved_and_resumed`] and
//! every invariant the drill checks):
//!
//! 4. region-kill: every host of the home region (router, database, both
//!    control-plane replicas, four GPU machines) loses power — links down,
//!    SIGKILL to every process, workers included; its jobs run again
//!    elsewhere at epoch 2 from a checkpoint; booted again on its data, the
//!    region releases its copies;
//! 5. partition (through the CLI): the home's router leaves the WAN; the
//!    home fences and stops its job, which moves; healed, the home releases
//!    its copy.
//!
//! 6. database-failover: the home's database is a Patroni cluster on hosts
//!    of its own (etcd and three PostgreSQL hosts, TLS alone); its
//!    primary's PostgreSQL is killed, then its primary's host loses power,
//!    under creates every half second: no fence, no move, no restart, no
//!    acknowledged create lost, refusals only 503 with Retry-After.
//!
//! The tests of this binary run in parallel threads, but one lab at a time
//! runs on a machine: [`Lab::start`] waits for the machine's lab lock,
//! held until the lab is gone (and the other test binaries run after this
//! one).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use gangway_chaos::lab::{HostRole, Impairment, Lab};
use gangway_chaos::{Drill, On, Report, TRAINING};
use gangway_shared::api::{Job, JobSpec, JobState};
use gangway_shared::client::Client;
use support::BIN;
use uuid::Uuid;

/// A job of `gpus` GPUs (8 a machine) in `region`, running `script`.
fn job(name: &str, gpus: u32, region: &str, script: &str, estimate_s: u32) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": gpus, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": estimate_s, "region": region,
        "command": ["sh", "-c", script],
    }))
    .unwrap()
}

/// Polls the global tier until `cond` holds for job `id`.
async fn until(
    client: &Client,
    lab: &Lab,
    id: Uuid,
    what: &str,
    within: Duration,
    cond: impl Fn(&Job) -> bool,
) -> Job {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        if let Ok(j) = client.get(id).await {
            if cond(&j) {
                return j;
            }
            last = Some(j);
        }
        if Instant::now() >= deadline {
            lab.keep();
            panic!(
                "job {id}: {what} did not happen within {within:?}; last seen {last:#?}; \
                 the lab's logs are in {}",
                lab.dir.path().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Files named `stdout.log` under `dir` holding `needle`.
fn logs_with(dir: &Path, needle: &str, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            logs_with(&p, needle, found);
        } else if p.file_name().is_some_and(|n| n == "stdout.log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            found.extend(
                text.lines()
                    .filter(|l| l.contains(needle))
                    .map(String::from),
            );
        }
    }
}

/// Keeps the lab's logs when the test fails.
struct KeepOnPanic<'a>(&'a Lab);

impl Drop for KeepOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.keep();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_lab_of_machines_a_gang_runs_across_hosts_a_dead_leader_host_loses_no_job_and_a_cut_region_moves_its_jobs(
) {
    let lab = Lab::start(Path::new(BIN))
        .await
        .unwrap_or_else(|e| panic!("the lab did not come up: {e:#}"));
    let _keep = KeepOnPanic(&lab);
    let t = &lab.tenant;

    // No plain path in: a client trusting another CA is refused by the
    // global tier (and the regions' database takes TLS alone: hostssl).
    let other = gangway_auth::tls::DevCa::generate().cert_pem();
    let forged = Client::public(
        t.base().to_string(),
        "x".to_string(),
        Some(other.as_bytes()),
    )
    .unwrap();
    assert!(
        forged.regions().await.is_err(),
        "a client trusting another CA reached the global tier"
    );

    // 1. A 16-GPU gang in r1: two machines, each rank on its own.
    let script = "echo \"lab-gang $GANGWAY_JOB_ID rank $RANK of $WORLD_SIZE on $GANGWAY_NODE_ID \
                  master $MASTER_ADDR\"";
    let gang = t
        .submit(&job("lab-gang", 16, "r1", script, 5), None)
        .await
        .unwrap();
    let done = until(
        t,
        &lab,
        gang.id,
        "the gang succeeding",
        Duration::from_secs(90),
        |j| j.state == JobState::Succeeded || j.state == JobState::Failed,
    )
    .await;
    assert_eq!(done.state, JobState::Succeeded, "{done:#?}");
    let nodes: std::collections::BTreeSet<_> =
        done.workers.iter().filter_map(|w| w.node.clone()).collect();
    assert_eq!(
        nodes.len(),
        2,
        "the gang's ranks on two machines: {done:#?}"
    );
    for rank in 0..2 {
        let mut lines = Vec::new();
        for node in &nodes {
            let host = lab.host(node);
            logs_with(
                &host.dir.join("var/agent"),
                &gang.id.to_string(),
                &mut lines,
            );
        }
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("rank {rank} of 2")))
            .unwrap_or_else(|| {
                panic!("no output of rank {rank} on the gang's machines: {lines:?}")
            });
        // Rank 0's machine is the master every rank dials: an address on
        // r1's network, not a loopback one.
        assert!(line.contains("master 10.199.1."), "{line}");
    }

    // 1b. A slow, lossy link to one machine (5 % of packets lost each
    // way, 2 Mbit/s out) is not a failure: a gang over all four of r1's
    // machines, that one included, runs once and succeeds; its node is not
    // taken for lost (no move, no preemption, no lost GPU-time).
    let lossy = Impairment {
        loss_pct: 5,
        rate_kbit: 2_000,
    };
    lab.impair("r1-gpu3", Some(lossy)).unwrap();
    let wide = t
        .submit(&job("lab-lossy", 32, "r1", "sleep 6", 6), None)
        .await
        .unwrap();
    let wide = until(
        t,
        &lab,
        wide.id,
        "the gang over a lossy link finishing",
        Duration::from_secs(120),
        |j| matches!(j.state, JobState::Succeeded | JobState::Failed),
    )
    .await;
    let dropped = lab.dropped("r1-gpu3").unwrap();
    lab.impair("r1-gpu3", None).unwrap();
    assert!(dropped > 0, "the link lost nothing: not impaired");
    assert_eq!(wide.state, JobState::Succeeded, "{wide:#?}");
    assert!(
        wide.workers
            .iter()
            .any(|w| w.node.as_deref() == Some("r1-gpu3")),
        "{wide:#?}"
    );
    assert_eq!(
        (
            wide.epoch,
            wide.preemptions,
            wide.node_moves,
            wide.lost_gpu_s
        ),
        (1, 0, 0, 0.0),
        "{wide:#?}"
    );

    // 2. The leader's host loses power with work in flight.
    let leader = lab
        .leader("r1", Duration::from_secs(30))
        .await
        .unwrap()
        .name
        .clone();
    let mut ids = Vec::new();
    for i in 0..4 {
        let j = t
            .submit(
                &job(&format!("lab-before-{i}"), 8, "r1", "sleep 3", 3),
                None,
            )
            .await
            .unwrap();
        ids.push(j.id);
    }
    until(
        t,
        &lab,
        ids[0],
        "a job running",
        Duration::from_secs(60),
        |j| j.state == JobState::Running,
    )
    .await;
    lab.kill_host(&leader).unwrap();
    let next = lab.leader("r1", Duration::from_secs(60)).await.unwrap();
    assert_ne!(next.name, leader, "the dead host cannot lead");
    // A create the global tier answers 503 (the region not answering
    // yet) is retried with its key, as the CLI does.
    let spec = job("lab-after", 8, "r1", "sleep 1", 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        match t.submit(&spec, Some("lab-after")).await {
            Ok(j) => break j,
            Err(e) if Instant::now() < deadline && e.to_string().contains("503") => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the create after the leader's host died: {e}"),
        }
    };
    ids.push(after.id);
    for id in &ids {
        let j = until(t, &lab, *id, "finishing", Duration::from_secs(120), |j| {
            matches!(
                j.state,
                JobState::Succeeded | JobState::Failed | JobState::Cancelled
            )
        })
        .await;
        assert_eq!(j.state, JobState::Succeeded, "{j:#?}");
    }

    // 3. The links of the region running a job cut at its router.
    let mut spec = job("lab-moves", 8, "", "sleep 20", 20);
    spec.region = None; // a pinned job stays; this one may move
    let victim = t.submit(&spec, None).await.unwrap();
    let running = until(
        t,
        &lab,
        victim.id,
        "running",
        Duration::from_secs(60),
        |j| j.state == JobState::Running,
    )
    .await;
    let home = running.region.clone();
    lab.cut_region(&home, true).unwrap();
    let moved = until(
        t,
        &lab,
        victim.id,
        "running elsewhere",
        Duration::from_secs(90),
        |j| j.region != home && j.state == JobState::Running,
    )
    .await;
    assert_eq!(moved.epoch, 2, "{moved:#?}");
    // Inside the cut-off region, its replicas fenced and its machines
    // stopped the job (before it could have ended by itself).
    let cp = lab.hosts_of(&home, HostRole::Control);
    assert!(
        cp.iter().any(|h| lab
            .log_of(&h.name, "region")
            .contains("fenced (placing nothing")),
        "{home} never fenced; logs in {}",
        lab.dir.path().display()
    );
    for h in lab.hosts_of(&home, HostRole::Agent) {
        let pids = std::process::Command::new("ip")
            .args(["netns", "pids", &h.ns])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            assert!(
                !cmd.contains("sleep 20"),
                "{} still runs the moved job: {cmd}",
                h.name
            );
        }
    }
    let finished = until(
        t,
        &lab,
        victim.id,
        "finishing elsewhere",
        Duration::from_secs(90),
        |j| matches!(j.state, JobState::Succeeded | JobState::Failed),
    )
    .await;
    assert_eq!(finished.state, JobState::Succeeded, "{finished:#?}");
    assert_ne!(finished.region, home, "{finished:#?}");
}

/// `drill` run on a lab of machines of its own; its report, printed.
async fn drill_on_a_lab(drill: Drill) -> Report {
    let on = On::Lab {
        bin: Path::new(BIN),
    };
    let report: Report = gangway_chaos::run_on(drill, on)
        .await
        .unwrap_or_else(|e| panic!("the drill did not run: {e:#}"));
    eprintln!("{report}");
    assert!(report.lab, "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_lab_of_machines_a_region_that_loses_power_host_by_host_moves_its_jobs_loses_none_and_lets_them_go_once_booted(
) {
    let report = drill_on_a_lab(Drill::RegionKill).await;
    assert!(report.passed(), "{report}");
    let short = report.moved_and_resumed(30.0);
    assert!(short.is_empty(), "{short:?}\n{report}");
    assert_eq!(report.jobs.len(), 2, "{report}");
    for j in report.jobs.iter().filter(|j| j.home != report.region) {
        assert_eq!((j.epoch, &j.region), (1, &j.home), "undisturbed: {report}");
        assert_eq!(j.final_step, Some(TRAINING.total), "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_lab_of_machines_a_database_whose_primary_loses_power_fails_over_with_no_job_restarted_moved_or_lost(
) {
    let report = drill_on_a_lab(Drill::DatabaseFailover).await;
    // Writes and placements came back after each: the primary's
    // PostgreSQL killed, then its host powered off.
    support::held_through_database_failover(&report, ["PostgreSQL killed", "host powered off"]);
}

#[test]
fn on_a_lab_of_machines_a_region_whose_router_leaves_the_wan_fences_and_lets_its_moved_job_go_once_healed(
) {
    let out = std::process::Command::new(BIN)
        .args(["chaos", "partition", "--lab", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}: {stderr}",
        out.status.code()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["lab"], true, "{report}");
    assert_eq!(report["violations"], serde_json::json!([]), "{report}");
    let job = &report["jobs"][0];
    assert_eq!(job["home"], report["region"], "{report}");
    assert_eq!(job["epoch"], 2, "{report}");
    assert_ne!(job["region"], report["region"], "{report}");
    assert_eq!(job["state"], "succeeded", "{report}");
    assert_eq!(job["final_step"], TRAINING.total, "{report}");
    assert!(
        job["recovered_s"].as_f64().is_some_and(|s| s < 30.0),
        "{report}"
    );
    assert!(
        job["lost"]["resumed"].as_u64() >= Some(TRAINING.every.into()),
        "{report}"
    );
}
