//! An operator evacuates a whole region and fails it back, across real
//! processes (docs/failover.md, "Planned evacuation and fail back"): a
//! cloud of three `gangway region`s (each with its own database, peers of
//! each other), an agent each serving a simulated fleet, and `gangway
//! global` in front ([`gangway_chaos::cloud::Cloud`], short timers).
//!
//! Keyed jobs run in r1; `gangway region evacuate r1` (through the global
//! tier) moves each to another region at epoch 2 through a checkpoint
//! written at the evacuation — its new owner resumes from exactly that
//! checkpoint, and no work is lost — while r1 takes no new jobs (a create
//! that would have gone there lands elsewhere). Sampled every 100 ms, no
//! job is ever starting or running in two regions. `gangway region
//! failback r1` brings them home at epoch 3, where they succeed.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_chaos::cloud::{Cloud, REGIONS};
use gangway_shared::api::{Evacuation, EvacuationState, Job, JobSpec, JobState};
use gangway_shared::client::Client;
use gangway_shared::ids::{job_id_for_key, rendezvous};
use support::BIN;
use uuid::Uuid;

const HOME: &str = "r1";

/// An 8-GPU job: 300 s estimated × 0.05 = 15 s of simulated work.
fn spec(name: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": 8, "gpus_per_worker": 8, "gpu_type": "h100",
        "estimated_duration_s": 300, "command": ["train"]
    }))
    .unwrap()
}

/// `n` idempotency keys whose jobs rank `region` first (the global tier
/// sends them there while it has room), each with a different second
/// region (its buddy) when it can.
fn keys_homed_at(region: &str, n: usize, prefix: &str) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for i in 0.. {
        let key = format!("{prefix}-{i}");
        let order = rendezvous(job_id_for_key("acme", &key), REGIONS);
        if order[0] != region {
            continue;
        }
        let buddy = order[1].to_string();
        if out.iter().all(|(_, b)| *b != buddy) || i > 200 {
            out.push((key, buddy));
        }
        if out.len() == n {
            break;
        }
    }
    out.into_iter().map(|(k, _)| k).collect()
}

fn operator(cloud: &Cloud) -> (Client, Vec<String>) {
    cloud.operator()
}

/// `gangway region <args…> --json`, waiting for it; its JSON document.
async fn cli(args: Vec<String>) -> Evacuation {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .arg("region")
            .args(&args)
            .arg("--json")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "gangway region exited {:?}: {stderr}",
        out.status.code()
    );
    eprintln!("{stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn live(j: &Job) -> bool {
    matches!(j.state, JobState::Starting | JobState::Running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evacuating_a_region_moves_its_jobs_with_zero_lost_work_and_fail_back_brings_them_home() {
    let t0 = std::time::Instant::now();
    let cloud = Arc::new(Cloud::start(Path::new(BIN), true).await);
    eprintln!("cloud up after {:.1} s", t0.elapsed().as_secs_f64());
    let (admin, flags) = operator(&cloud);
    let within = Duration::from_secs(20);

    // Two keyed jobs that go to r1, running there.
    let mut jobs: Vec<Uuid> = Vec::new();
    for key in keys_homed_at(HOME, 2, "evac") {
        let job = cloud.tenant.submit(&spec(&key), Some(&key)).await.unwrap();
        assert_eq!(job.region, HOME, "{job:?}");
        jobs.push(job.id);
    }
    for id in &jobs {
        cloud
            .wait_for(*id, "running in r1", within, |j| {
                j.region == HOME && j.state == JobState::Running
            })
            .await
            .unwrap();
    }
    // Let them do some work, so a lost checkpoint would show.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Sample every region's own copy of each job every 100 ms: never
    // starting or running in two regions at once.
    let doubles = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (cloud, doubles, stop, jobs) =
            (cloud.clone(), doubles.clone(), stop.clone(), jobs.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                for id in &jobs {
                    let mut running = Vec::new();
                    for r in REGIONS {
                        if cloud.copy_in(r, *id).await.is_some_and(|j| live(&j)) {
                            running.push(r);
                        }
                    }
                    if running.len() > 1 {
                        doubles
                            .lock()
                            .unwrap()
                            .push(format!("{id} runs in {running:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Evacuate r1 through the global tier, with the CLI, waiting for it.
    let mut args = vec![
        "evacuate".to_string(),
        HOME.into(),
        "--reason".into(),
        "e2e".into(),
    ];
    args.extend(flags.clone());
    let done = cli(args).await;
    eprintln!("evacuated after {:.1} s", t0.elapsed().as_secs_f64());
    assert_eq!(done.state, EvacuationState::Evacuated, "{done:?}");
    assert_eq!((done.jobs_left, done.moved), (0, 2), "{done:?}");
    for j in &done.jobs {
        assert_eq!(j.step, "moved", "{done:?}");
        assert!(j.to.as_deref().is_some_and(|t| t != HOME), "{done:?}");
    }

    // Each job runs elsewhere at epoch 2, resuming from the checkpoint r1's
    // workers wrote when they were stopped: zero lost work.
    for id in &jobs {
        let moved = cloud
            .wait_for(*id, "running elsewhere at epoch 2", within, |j| {
                j.region != HOME && j.epoch == 2 && j.state == JobState::Running
            })
            .await
            .unwrap();
        assert_eq!(moved.adopted_from.as_deref(), Some(HOME), "{moved:?}");
        let home = cloud.copy_in(HOME, *id).await.unwrap();
        assert_eq!(home.state, JobState::Cancelled, "{home:?}");
        assert_eq!(home.moved_to.as_deref(), Some(moved.region.as_str()));
        assert_eq!(
            home.preemptions, 1,
            "checkpointed and stopped once: {home:?}"
        );
        assert!(home.lost_gpu_s < 1.0, "work lost at the stop: {home:?}");
        // The simulated executor's checkpoint is how far the run got (it is
        // not a checkpoint-store object, so `checkpoint` is empty).
        let ckpt = home.restore_from.clone().expect("a checkpoint at the stop");
        let done: f64 = ckpt.strip_prefix("sim:").unwrap().parse().unwrap();
        assert!(done > 0.05, "{ckpt}");
        assert_eq!(
            moved.restore_from.as_deref(),
            Some(ckpt.as_str()),
            "{moved:?}"
        );
        assert!(moved.checkpoint.is_none() && home.checkpoint.is_none());
        let events = cloud.tenant.events(*id).await.unwrap().events;
        assert!(
            events.iter().any(|e| e.kind == "requeued"
                && e.message.contains("handed over from region r1")
                && e.message.contains(&ckpt)),
            "{events:?}"
        );
    }

    // While r1 is evacuated, the global tier says so, and a create that
    // would have gone there lands elsewhere.
    let mut seen = false;
    for _ in 0..50 {
        let regions = cloud.tenant.regions().await.unwrap().regions;
        let r1 = regions.iter().find(|r| r.name == HOME).unwrap();
        if r1.status.as_ref().is_some_and(|s| s.evacuating) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the global tier never saw r1 evacuating");
    let key = keys_homed_at(HOME, 1, "while-evacuated").remove(0);
    let created = cloud.tenant.submit(&spec("new"), Some(&key)).await.unwrap();
    assert_ne!(created.region, HOME, "{created:?}");
    let status = admin
        .call_json(
            reqwest::Method::GET,
            "/v1/admin/regions/r1/evacuation",
            None,
        )
        .await
        .unwrap();
    assert_eq!(status["state"], "evacuated", "{status}");
    let audit = admin
        .call_json(
            reqwest::Method::GET,
            "/v1/admin/audit?region=r1&action=region.evacuate",
            None,
        )
        .await
        .unwrap();
    assert!(audit.to_string().contains("ops-e2e"), "{audit}");

    // Fail back: every job comes home at epoch 3 and succeeds there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut args = vec!["failback".to_string(), HOME.into()];
    args.extend(flags);
    let back = cli(args).await;
    eprintln!("failed back after {:.1} s", t0.elapsed().as_secs_f64());
    assert_eq!(back.state, EvacuationState::None, "{back:?}");
    assert_eq!(back.moved, 2, "{back:?}");
    for id in &jobs {
        let home = cloud
            .wait_for(*id, "back in r1 at epoch 3", within, |j| {
                j.region == HOME && j.epoch == 3
            })
            .await
            .unwrap();
        assert_eq!(home.moved_to, None, "{home:?}");
        let ckpt = home.restore_from.clone().unwrap();
        let done: f64 = ckpt.strip_prefix("sim:").unwrap().parse().unwrap();
        assert!(done > 0.1, "it kept the work done elsewhere: {ckpt}");
    }
    for id in &jobs {
        let j = cloud
            .wait_for(*id, "succeeded in r1", Duration::from_secs(30), |j| {
                j.state.is_terminal()
            })
            .await
            .unwrap();
        assert_eq!(
            (j.state, j.region.as_str(), j.epoch),
            (JobState::Succeeded, HOME, 3)
        );
    }
    // Listed once each: the released copies they left are not.
    let listed = cloud
        .tenant
        .list(&gangway_shared::client::ListQuery::default())
        .await
        .unwrap()
        .jobs;
    for id in &jobs {
        let copies: Vec<&Job> = listed.iter().filter(|j| j.id == *id).collect();
        assert_eq!(copies.len(), 1, "{copies:?}");
        assert_eq!(copies[0].region, HOME);
    }
    eprintln!("succeeded after {:.1} s", t0.elapsed().as_secs_f64());
    stop.cancel();
    sampler.await.unwrap();
    eprintln!("sampler done after {:.1} s", t0.elapsed().as_secs_f64());
    let doubles = doubles.lock().unwrap().clone();
    assert!(doubles.is_empty(), "a job ran in two regions: {doubles:?}");
    drop(cloud);
    eprintln!("cloud down after {:.1} s", t0.elapsed().as_secs_f64());
}
