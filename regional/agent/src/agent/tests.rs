//! The agent against a fake region (axum on 127.0.0.1:0).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use gangway_shared::agent::{
    AgentGpu, AgentNode, Assignment, Desired, RegisterRequest, RegisterResponse, SyncRequest,
    SyncResponse, WorkerStatus,
};
use gangway_shared::error::{codes, ErrorBody};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::{AgentConfig, ExecutorKind};

#[derive(Default)]
struct Fake {
    registrations: Vec<RegisterRequest>,
    /// Syncs the fake answered with assignments.
    syncs: Vec<SyncRequest>,
    /// Syncs the fake refused.
    refused: usize,
    assignments: Vec<Assignment>,
    /// Answer this many registrations with 503 first.
    failing_registrations: usize,
    /// Answer the next sync with `unknown_agent`.
    forget_agent: bool,
    /// Answer syncs with 503 while set (a region restarting).
    unavailable: bool,
}

type Shared = Arc<Mutex<Fake>>;

fn error(status: StatusCode, code: &str) -> Response {
    let body = ErrorBody {
        code: code.to_string(),
        message: code.replace('_', " "),
        request_id: None,
        earliest_start: None,
        earliest_end: None,
    };
    (status, Json(body)).into_response()
}

async fn register(State(fake): State<Shared>, Json(req): Json<RegisterRequest>) -> Response {
    let mut fake = fake.lock().unwrap();
    if fake.failing_registrations > 0 {
        fake.failing_registrations -= 1;
        return error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE);
    }
    fake.registrations.push(req);
    Json(RegisterResponse {
        fence_after_ms: 0,
        fence_checkpoint_s: 0,
        region: "test-1".into(),
        sync_interval_ms: 20,
    })
    .into_response()
}

async fn sync(
    State(fake): State<Shared>,
    UrlPath(agent_id): UrlPath<String>,
    Json(req): Json<SyncRequest>,
) -> Response {
    assert_eq!(agent_id, "agent-1");
    let mut fake = fake.lock().unwrap();
    if fake.forget_agent {
        fake.forget_agent = false;
        fake.refused += 1;
        return error(StatusCode::NOT_FOUND, codes::UNKNOWN_AGENT);
    }
    if fake.unavailable {
        fake.refused += 1;
        return error(StatusCode::SERVICE_UNAVAILABLE, codes::UNAVAILABLE);
    }
    // Like the region: once a worker's exit is recorded, stop listing it.
    for report in &req.workers {
        if matches!(report.status, WorkerStatus::Exited { .. }) {
            fake.assignments.retain(|a| {
                (a.job_id, a.rank, a.attempt) != (report.job_id, report.rank, report.attempt)
            });
        }
    }
    fake.syncs.push(req);
    Json(SyncResponse {
        assignments: fake.assignments.clone(),
    })
    .into_response()
}

async fn fake_region(fake: Shared) -> SocketAddr {
    let app = Router::new()
        .route("/internal/v1/agents/register", post(register))
        .route("/internal/v1/agents/{agent_id}/sync", post(sync))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn config(addr: SocketAddr, executor: ExecutorKind, work_dir: &Path) -> AgentConfig {
    AgentConfig {
        region_url: format!("http://{addr}"),
        agent_id: "agent-1".into(),
        nodes: vec![AgentNode {
            node_id: "node-a".into(),
            spine: "s0".into(),
            leaf: "s0-l0".into(),
            nvlink_domain: "node-a".into(),
            gpu_type: "h100".into(),
            spare: false,
            address: "127.0.0.1".into(),
            gpus: (0..2)
                .map(|index| AgentGpu {
                    index,
                    uuid: format!("GPU-sim-node-a-{index}"),
                })
                .collect(),
            gpu_power_w: None,
            rack_power_budget_w: None,
        }],
        executor,
        time_factor: 1.0,
        work_dir: work_dir.to_path_buf(),
        default_sync_interval: Duration::from_millis(20),
        fence_after: None,
        token: None,
        machine_boot_id: Some("machine-boot-1".into()),
        health_poll_interval: Duration::from_secs(10),
    }
}

fn run_assignment(script: &str) -> Assignment {
    Assignment {
        job_id: Uuid::new_v4(),
        rank: 0,
        attempt: 1,
        desired: Desired::Run,
        node_id: "node-a".into(),
        gpus: vec![0, 1],
        world_size: 1,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        estimated_duration_s: 1,
        max_duration_s: None,
        grace_period_s: 5,
        checkpoint_deadline_s: 5,
        restore_from: None,
    }
}

/// Polls `cond` on the fake's state until it holds (5 s at most).
async fn until(fake: &Shared, what: &str, cond: impl Fn(&Fake) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond(&fake.lock().unwrap()) {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn statuses(req: &SyncRequest) -> Vec<&WorkerStatus> {
    req.workers.iter().map(|w| &w.status).collect()
}

async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f).await.expect("took too long")
}

#[tokio::test]
async fn runs_an_assignment_reports_it_and_registers_again_when_forgotten() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    let assignment = run_assignment("sleep 0.2; exit 0");
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment);
    fake.lock().unwrap().failing_registrations = 2;
    let addr = fake_region(fake.clone()).await;

    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(super::run(
        config(addr, ExecutorKind::Real, work.path()),
        shutdown.clone(),
    ));

    until(&fake, "Running report", |f| {
        f.syncs.iter().any(|s| {
            s.workers
                .iter()
                .any(|w| w.job_id == job_id && w.status == WorkerStatus::Running)
        })
    })
    .await;
    until(&fake, "Exited report", |f| {
        f.syncs.iter().any(|s| {
            s.workers.iter().any(|w| {
                w.job_id == job_id
                    && w.attempt == 1
                    && matches!(
                        w.status,
                        WorkerStatus::Exited {
                            exit_code: Some(0),
                            signal: None,
                            ..
                        }
                    )
            })
        })
    })
    .await;
    // Once the region stops listing it, the exit is no longer reported.
    until(&fake, "empty report after the exit", |f| {
        f.syncs.last().is_some_and(|s| s.workers.is_empty())
    })
    .await;
    {
        let f = fake.lock().unwrap();
        assert_eq!(f.registrations.len(), 1, "two 503s were retried");
        assert_eq!(f.registrations[0].executor, "real");
        assert_eq!(f.registrations[0].nodes.len(), 1);
        // Running reports, then exactly the reports of one run: never a
        // second launch of the same (job, rank, attempt).
        let seen: Vec<_> = f
            .syncs
            .iter()
            .flat_map(|s| statuses(s).into_iter().cloned())
            .collect();
        let first_exit = seen
            .iter()
            .position(|s| s != &WorkerStatus::Running)
            .unwrap();
        assert!(first_exit > 0);
        assert!(seen[first_exit..]
            .iter()
            .all(|s| matches!(s, WorkerStatus::Exited { .. })));
    }

    // The region forgets the agent: it registers again, with the same boot.
    fake.lock().unwrap().forget_agent = true;
    let syncs_before = fake.lock().unwrap().syncs.len();
    until(&fake, "second registration and a sync after it", |f| {
        f.registrations.len() == 2 && f.syncs.len() > syncs_before + 1
    })
    .await;
    {
        let f = fake.lock().unwrap();
        assert_eq!(f.refused, 1);
        assert_eq!(f.registrations[0].boot_id, f.registrations[1].boot_id);
        assert!(f
            .syncs
            .iter()
            .all(|s| s.boot_id == f.registrations[0].boot_id));
    }

    shutdown.cancel();
    within(Duration::from_secs(2), agent)
        .await
        .unwrap()
        .unwrap();
}

fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[tokio::test]
async fn a_region_outage_leaves_workers_running_and_shutdown_stops_them() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    let assignment = run_assignment("echo $$ > pid; sleep 60");
    let job_id = assignment.job_id;
    let pid_file = work
        .path()
        .join(format!("jobs/{job_id}/rank-0-attempt-1/pid"));
    fake.lock().unwrap().assignments.push(assignment);
    let addr = fake_region(fake.clone()).await;

    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(super::run(
        config(addr, ExecutorKind::Real, work.path()),
        shutdown.clone(),
    ));
    until(&fake, "Running report", |f| {
        f.syncs.iter().any(|s| !s.workers.is_empty())
    })
    .await;
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = text.trim().parse::<libc::pid_t>() {
                break pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // The region goes away for a while, then comes back.
    fake.lock().unwrap().unavailable = true;
    until(&fake, "three refused syncs", |f| f.refused >= 3).await;
    assert!(process_alive(pid));
    let syncs_before = {
        let mut f = fake.lock().unwrap();
        f.unavailable = false;
        f.syncs.len()
    };
    until(&fake, "a sync after the outage", |f| {
        f.syncs.len() > syncs_before
    })
    .await;
    {
        let f = fake.lock().unwrap();
        let last = f.syncs.last().unwrap();
        assert_eq!(last.workers.len(), 1);
        assert_eq!(last.workers[0].job_id, job_id);
        assert_eq!(last.workers[0].status, WorkerStatus::Running);
        assert_eq!(
            f.registrations.len(),
            1,
            "an outage is not a reason to re-register"
        );
    }
    assert!(process_alive(pid));

    // Shutdown stops the real worker (SIGTERM ends `sh` and `sleep`).
    shutdown.cancel();
    within(Duration::from_secs(3), agent)
        .await
        .unwrap()
        .unwrap();
    assert!(!process_alive(pid));
}

#[tokio::test]
async fn a_sim_agent_runs_for_the_scaled_duration() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    let mut assignment = run_assignment("ignored by the sim executor");
    assignment.estimated_duration_s = 100;
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment);
    let addr = fake_region(fake.clone()).await;

    let mut config = config(addr, ExecutorKind::Sim, work.path());
    config.time_factor = 0.002; // 100 s → 0.2 s
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let agent = tokio::spawn(super::run(config, shutdown.clone()));
    until(&fake, "simulated exit", |f| {
        f.syncs.iter().any(|s| {
            s.workers.iter().any(|w| {
                w.job_id == job_id
                    && w.status
                        == WorkerStatus::Exited {
                            exit_code: Some(0),
                            signal: None,
                            message: Some("simulated run finished".into()),
                        }
            })
        })
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(fake.lock().unwrap().registrations[0].executor, "sim");
    shutdown.cancel();
    within(Duration::from_secs(1), agent)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn reports_the_machine_boot_and_running_checkpoints_and_takes_the_deadline_asked_for() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    // A worker that writes a complete checkpoint (renamed into place) and
    // then ignores SIGUSR1.
    let mut assignment = run_assignment(
        "trap '' USR1; mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && \
         mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/step-1\"; \
         mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.half-written\"; \
         while true; do sleep 0.05; done",
    );
    assignment.checkpoint_deadline_s = 60;
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment.clone());
    let addr = fake_region(fake.clone()).await;
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(super::run(
        config(addr, ExecutorKind::Real, work.path()),
        shutdown.clone(),
    ));
    // The running worker's report carries its newest complete checkpoint.
    until(&fake, "a running report with the checkpoint", |f| {
        f.syncs.iter().any(|s| {
            s.workers.iter().any(|w| {
                w.job_id == job_id
                    && w.status == WorkerStatus::Running
                    && w.checkpoint
                        .as_deref()
                        .is_some_and(|c| c.ends_with("step-1"))
            })
        })
    })
    .await;
    {
        let f = fake.lock().unwrap();
        let last = f.syncs.last().unwrap();
        assert_eq!(last.nodes.len(), 1);
        assert_eq!(last.nodes[0].node_id, "node-a");
        assert_eq!(last.nodes[0].boot_id, "machine-boot-1");
    }
    // Asked to checkpoint within 1 s (less than the 60 s it launched
    // with): it is stopped after 1 s, not 60.
    let asked = Instant::now();
    {
        let mut f = fake.lock().unwrap();
        let mut checkpoint = assignment.clone();
        checkpoint.desired = Desired::Checkpoint;
        checkpoint.checkpoint_deadline_s = 1;
        f.assignments = vec![checkpoint];
    }
    until(&fake, "the exit after the deadline", |f| {
        f.syncs.iter().any(|s| {
            s.workers
                .iter()
                .any(|w| w.job_id == job_id && matches!(w.status, WorkerStatus::Exited { .. }))
        })
    })
    .await;
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    shutdown.cancel();
    within(Duration::from_secs(5), agent)
        .await
        .unwrap()
        .unwrap();
}
