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
    /// The sync interval registrations are told (0: 20 ms).
    sync_interval_ms: u64,
    /// Answer this many syncs with `report_again` (reports left for later).
    report_again: usize,
    /// When each answered sync arrived.
    sync_times: Vec<Instant>,
    /// List a worker started once a sync reports it running, as the
    /// region does.
    hears_starts: bool,
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
        sync_interval_ms: if fake.sync_interval_ms == 0 {
            20
        } else {
            fake.sync_interval_ms
        },
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
    // Like the region: once a worker's exit is recorded, stop listing it;
    // one heard running is listed started.
    for report in &req.workers {
        let of = |a: &Assignment| {
            (a.job_id, a.rank, a.attempt) == (report.job_id, report.rank, report.attempt)
        };
        if matches!(report.status, WorkerStatus::Exited { .. }) {
            fake.assignments.retain(|a| !of(a));
        } else if fake.hears_starts {
            fake.assignments
                .iter_mut()
                .filter(|a| of(a))
                .for_each(|a| a.started = true);
        }
    }
    fake.syncs.push(req);
    fake.sync_times.push(Instant::now());
    let report_again = fake.report_again > 0;
    fake.report_again = fake.report_again.saturating_sub(1);
    Json(SyncResponse {
        assignments: fake.assignments.clone(),
        report_again,
        logs_kept: true,
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
        region_ca_pem: None,
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
                    ..AgentGpu::default()
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
        checkpoint_store: None,
        isolation: Default::default(),
    }
}

fn run_assignment(script: &str) -> Assignment {
    Assignment {
        job_id: Uuid::new_v4(),
        tenant: "acme".into(),
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
        epoch: 1,
        started: false,
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

/// An agent running on its own task until [`Started::stop`].
struct Started {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Started {
    fn agent(config: AgentConfig) -> Started {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(super::run(config, shutdown.clone()));
        Started { shutdown, task }
    }

    /// Shuts it down; it must return cleanly within `limit`.
    async fn stop(self, limit: Duration) {
        self.shutdown.cancel();
        within(limit, self.task).await.unwrap().unwrap();
    }
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

    let agent = Started::agent(config(addr, ExecutorKind::Real, work.path()));

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

    agent.stop(Duration::from_secs(2)).await;
}

/// Whether `pid` runs; a zombie (an orphan not yet reaped by init) does
/// not.
fn process_alive(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The processes (as this machine numbers them: a sandboxed worker's `$$`
/// is its PID namespace's) whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<libc::pid_t> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.parse().ok()?;
            (std::fs::read_link(p.path().join("cwd")).ok()? == dir).then_some(pid)
        })
        .collect()
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

    let agent = Started::agent(config(addr, ExecutorKind::Real, work.path()));
    until(&fake, "Running report", |f| {
        f.syncs.iter().any(|s| !s.workers.is_empty())
    })
    .await;
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if text.trim().parse::<libc::pid_t>().is_ok() {
                let running = processes_in(pid_file.parent().unwrap());
                if let Some(pid) = running.iter().copied().max() {
                    break pid;
                }
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
    agent.stop(Duration::from_secs(3)).await;
    // The shell is reaped before `run` returns; `sleep`, signalled with it
    // but not the agent's child, may take a moment longer on a busy machine.
    within(Duration::from_secs(5), async {
        while process_alive(pid) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
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
    let started = Instant::now();
    let agent = Started::agent(config);
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
    agent.stop(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_worker_the_region_heard_running_is_reported_again_only_when_its_checkpoint_moves() {
    let fake = Shared::default();
    fake.lock().unwrap().hears_starts = true;
    let work = tempfile::tempdir().unwrap();
    // A checkpoint at once, another when the test says so.
    let assignment = run_assignment(
        "mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && \
         mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/step-1\"; \
         while [ ! -e go ]; do sleep 0.02; done; sleep 0.05; \
         mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && \
         mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/step-2\"; \
         sleep 60",
    );
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment);
    let addr = fake_region(fake.clone()).await;
    let agent = Started::agent(config(addr, ExecutorKind::Real, work.path()));
    let reported = |f: &Fake, step: &str| {
        f.syncs.iter().any(|s| {
            s.workers.iter().any(|w| {
                w.status == WorkerStatus::Running
                    && w.checkpoint.as_deref().is_some_and(|c| c.ends_with(step))
            })
        })
    };
    // Heard running (with its checkpoint), then syncs that carry no
    // worker while it runs on as recorded.
    let quiet_after = |f: &Fake, n: usize| {
        f.syncs.len() >= n
            && f.syncs[f.syncs.len() - n..]
                .iter()
                .all(|s| s.workers.is_empty())
    };
    until(&fake, "the running report with step-1", |f| {
        reported(f, "step-1")
    })
    .await;
    until(&fake, "syncs with nothing to report", |f| quiet_after(f, 3)).await;
    // A new checkpoint: reported once more, then quiet again.
    let dir = work.path().join(format!("jobs/{job_id}/rank-0-attempt-1"));
    std::fs::write(dir.join("go"), "").unwrap();
    until(&fake, "the running report with step-2", |f| {
        reported(f, "step-2")
    })
    .await;
    until(&fake, "syncs with nothing to report", |f| quiet_after(f, 3)).await;
    {
        let f = fake.lock().unwrap();
        let carried = f.syncs.iter().filter(|s| !s.workers.is_empty()).count();
        assert!(
            carried <= 4,
            "{carried} of {} syncs carried the worker",
            f.syncs.len()
        );
    }
    // A region that no longer has it recorded running hears it again.
    fake.lock().unwrap().assignments[0].started = false;
    let before = fake.lock().unwrap().syncs.len();
    until(&fake, "the worker reported again", |f| {
        f.syncs[before..]
            .iter()
            .any(|s| s.workers.iter().any(|w| w.job_id == job_id))
    })
    .await;
    agent.stop(Duration::from_secs(5)).await;
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
    let agent = Started::agent(config(addr, ExecutorKind::Real, work.path()));
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
    agent.stop(Duration::from_secs(5)).await;
}

/// A store in `dir`, and an agent config that uses it.
fn store_config(addr: SocketAddr, work: &Path, store: &Path) -> AgentConfig {
    let mut c = config(addr, ExecutorKind::Real, work);
    c.checkpoint_store = Some(format!("file://{}", store.display()));
    c
}

fn uploaded(f: &Fake) -> Vec<gangway_shared::agent::CheckpointRecord> {
    f.syncs
        .iter()
        .flat_map(|s| s.checkpoints.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn rank_zeros_checkpoints_are_uploaded_committed_and_reported_until_accepted() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    // Two complete checkpoints (renamed into place), one left half
    // written under a dot-name, then it trains on.
    let mut assignment = run_assignment(
        "for s in 1 2; do \
           mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && echo $s > \"$GANGWAY_CHECKPOINT_DIR/.tmp/step\" && \
           mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/step-$s\"; sleep 0.7; \
         done; \
         mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.half\" && echo x > \"$GANGWAY_CHECKPOINT_DIR/.half/step\"; \
         while true; do sleep 0.05; done",
    );
    assignment.epoch = 3;
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment);
    let addr = fake_region(fake.clone()).await;
    let agent = Started::agent(store_config(addr, work.path(), &store_dir));
    until(&fake, "both checkpoints reported", |f| {
        uploaded(f).iter().any(|r| r.name == "step-2")
    })
    .await;
    let syncs_then = fake.lock().unwrap().syncs.len();
    until(&fake, "a few more syncs", |f| {
        f.syncs.len() > syncs_then + 3
    })
    .await;
    {
        let f = fake.lock().unwrap();
        let all = uploaded(&f);
        let mut keys: Vec<&str> = all.iter().map(|r| r.key.as_str()).collect();
        keys.dedup();
        assert_eq!(
            keys,
            [
                gangway_checkpoint::key(job_id, 3, 1, 1),
                gangway_checkpoint::key(job_id, 3, 2, 1)
            ],
            "seq from step-N, under the assignment's epoch; nothing from the dot-dir"
        );
        let r = all.iter().find(|r| r.name == "step-2").unwrap();
        assert_eq!((r.epoch, r.seq, r.attempt, r.rank), (3, 2, 1, 0));
        assert_eq!((r.size_bytes, r.files), (2, 1));
        assert_eq!(r.node_id, "node-a");
        // Each is reported until a sync carrying it succeeds, then no more:
        // every sync of the real agent says it uploads (Some), mostly empty.
        assert!(f.syncs.iter().all(|s| s.checkpoints.is_some()));
        let last = f.syncs.last().unwrap();
        assert_eq!(last.checkpoints, Some(vec![]));
    }
    // Committed in the store: the manifest says what the report said.
    let store = gangway_checkpoint::CheckpointStore::open(store_dir.to_str().unwrap()).unwrap();
    let newest = store.newest(job_id).await.unwrap().expect("committed");
    assert_eq!(newest.name, "step-2");
    assert_eq!(newest.agent_id, "agent-1");
    agent.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_checkpoint_request_commits_the_final_checkpoint_before_the_exit_is_reported() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    // Checkpoints only when asked, then exits; a big file makes the upload
    // take a moment.
    let mut assignment = run_assignment(
        "trap 'mkdir -p \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && \
               head -c 20000000 /dev/zero > \"$GANGWAY_CHECKPOINT_DIR/.tmp/weights\" && \
               mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/final\"; exit 0' USR1; \
         touch ready; while true; do sleep 0.05; done",
    );
    assignment.checkpoint_deadline_s = 30;
    let job_id = assignment.job_id;
    let ready = work
        .path()
        .join(format!("jobs/{job_id}/rank-0-attempt-1/ready"));
    fake.lock().unwrap().assignments.push(assignment.clone());
    let addr = fake_region(fake.clone()).await;
    let agent = Started::agent(store_config(addr, work.path(), &store_dir));
    while !ready.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    {
        let mut f = fake.lock().unwrap();
        let mut checkpoint = assignment.clone();
        checkpoint.desired = Desired::Checkpoint;
        f.assignments = vec![checkpoint];
    }
    until(&fake, "the exit", |f| {
        f.syncs.iter().any(|s| {
            s.workers
                .iter()
                .any(|w| w.job_id == job_id && matches!(w.status, WorkerStatus::Exited { .. }))
        })
    })
    .await;
    {
        let f = fake.lock().unwrap();
        let first_exit = f
            .syncs
            .iter()
            .position(|s| {
                s.workers
                    .iter()
                    .any(|w| matches!(w.status, WorkerStatus::Exited { .. }))
            })
            .unwrap();
        // The checkpoint was reported no later than the exit.
        let before: Vec<_> = f.syncs[..=first_exit]
            .iter()
            .flat_map(|s| s.checkpoints.clone().unwrap_or_default())
            .collect();
        assert!(
            before
                .iter()
                .any(|r| r.name == "final" && r.size_bytes == 20_000_000),
            "{before:?}"
        );
    }
    agent.stop(Duration::from_secs(5)).await;
}

/// Runs `assignment` on a real agent with the store in `store_dir` until
/// it exits; returns its exit status and what it wrote to `out`.
async fn run_to_exit(
    assignment: Assignment,
    work: &Path,
    store_dir: &Path,
) -> (WorkerStatus, String) {
    let fake = Shared::default();
    let job_id = assignment.job_id;
    fake.lock().unwrap().assignments.push(assignment);
    let addr = fake_region(fake.clone()).await;
    let agent = Started::agent(store_config(addr, work, store_dir));
    until(&fake, "the exit", |f| {
        f.syncs.iter().any(|s| {
            s.workers
                .iter()
                .any(|w| w.job_id == job_id && matches!(w.status, WorkerStatus::Exited { .. }))
        })
    })
    .await;
    let status = fake
        .lock()
        .unwrap()
        .syncs
        .iter()
        .flat_map(|s| s.workers.clone())
        .find(|w| matches!(w.status, WorkerStatus::Exited { .. }))
        .unwrap()
        .status;
    agent.stop(Duration::from_secs(5)).await;
    let out = std::fs::read_to_string(work.join(format!("jobs/{job_id}/rank-0-attempt-1/out")))
        .unwrap_or_default();
    (status, out)
}

#[tokio::test]
async fn a_restart_fetches_its_checkpoint_verified_and_a_bad_one_fails_the_start() {
    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("store");
    let store = gangway_checkpoint::CheckpointStore::open(store_dir.to_str().unwrap()).unwrap();
    let src = work.path().join("src/step-40");
    std::fs::create_dir_all(src.join("opt")).unwrap();
    std::fs::write(src.join("step"), "40").unwrap();
    std::fs::write(src.join("opt/state"), "adam").unwrap();
    let read_back =
        "cat \"$GANGWAY_RESTORE_FROM/step\" \"$GANGWAY_RESTORE_FROM/opt/state\" > out; \
                     echo \" $GANGWAY_RESTORE_FROM\" >> out";
    let up = |job_id, seq| gangway_checkpoint::Upload {
        job_id,
        epoch: 1,
        seq,
        attempt: 1,
        agent_id: "elsewhere".into(),
        node_id: "node-z".into(),
        rank: 0,
        owner: None,
    };

    // A whole checkpoint: fetched into this agent's work dir under the
    // name the job gave it, and handed over.
    let mut good = run_assignment(read_back);
    let m = store.upload(&src, &up(good.job_id, 40)).await.unwrap();
    good.restore_from = Some(m.key.clone());
    let (status, out) = run_to_exit(good.clone(), work.path(), &store_dir).await;
    assert!(
        matches!(
            status,
            WorkerStatus::Exited {
                exit_code: Some(0),
                ..
            }
        ),
        "{status:?}"
    );
    let restored = work.path().join(format!(
        "restore/{}/epoch-1-seq-40-attempt-1/step-40",
        good.job_id
    ));
    assert_eq!(out, format!("40adam {}\n", restored.display()));

    // A file changed in the store: the start fails and says why.
    let mut bad = run_assignment(read_back);
    let m = store.upload(&src, &up(bad.job_id, 41)).await.unwrap();
    std::fs::write(store_dir.join(&m.key).join("data/opt/state"), "sgd!").unwrap();
    bad.restore_from = Some(m.key.clone());
    let (status, out) = run_to_exit(bad, work.path(), &store_dir).await;
    let WorkerStatus::Exited {
        exit_code: Some(127),
        message: Some(message),
        ..
    } = status
    else {
        panic!("{status:?}")
    };
    assert!(
        message.starts_with("cannot start: cannot restore its checkpoint"),
        "{message}"
    );
    assert!(message.contains("file opt/state: sha256"), "{message}");
    assert!(message.contains("does not match the manifest"), "{message}");
    assert_eq!(out, "", "the worker never ran");

    // A partial upload (objects, no manifest) is no checkpoint to restore.
    let mut partial = run_assignment(read_back);
    let m = store
        .upload_data(&src, &up(partial.job_id, 42))
        .await
        .unwrap();
    partial.restore_from = Some(m.key);
    let (status, _) = run_to_exit(partial, work.path(), &store_dir).await;
    let WorkerStatus::Exited {
        exit_code: Some(127),
        message: Some(message),
        ..
    } = status
    else {
        panic!("{status:?}")
    };
    assert!(message.contains("never committed"), "{message}");
}

#[test]
fn sync_intervals_are_spread_by_a_tenth_either_way() {
    let interval = Duration::from_secs(1);
    let draws: Vec<Duration> = (0..200).map(|_| super::jittered(interval)).collect();
    let (lo, hi) = (Duration::from_millis(900), Duration::from_millis(1100));
    assert!(draws.iter().all(|d| (lo..hi).contains(d)), "{draws:?}");
    // Spread, not one value: agents started together drift apart.
    let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
    assert!(*max - *min > Duration::from_millis(100), "{min:?}..{max:?}");
    assert_eq!(super::jittered(Duration::ZERO), Duration::ZERO);
}

/// A region that left some of the agent's reports for later (their job was
/// held by another agent's sync) gets them again soon, not an interval
/// later: the job's GPUs stay allocated until it hears them. Otherwise the
/// agent keeps to its interval.
#[tokio::test]
async fn syncs_again_soon_when_the_region_left_reports_for_later() {
    let fake = Shared::default();
    let work = tempfile::tempdir().unwrap();
    {
        let mut f = fake.lock().unwrap();
        f.sync_interval_ms = 10_000;
        f.report_again = 2;
    }
    let addr = fake_region(fake.clone()).await;
    let agent = Started::agent(config(addr, ExecutorKind::Sim, work.path()));
    // Two answers ask again: three syncs, each soon after the one before
    // (a fifth of the interval at most), though the interval is 10 s.
    until(&fake, "three syncs", |f| f.syncs.len() >= 3).await;
    {
        let f = fake.lock().unwrap();
        let gaps: Vec<_> = f.sync_times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g < Duration::from_secs(5)),
            "well within the interval: {gaps:?}"
        );
    }
    // The third answer does not ask again: no fourth sync for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fake.lock().unwrap().syncs.len(),
        3,
        "the interval holds again"
    );
    agent.stop(Duration::from_secs(10)).await;
}

#[test]
fn a_soon_wait_is_a_short_random_part_of_the_interval() {
    let interval = Duration::from_secs(1);
    let waits: Vec<_> = (0..200).map(|_| super::soon(interval)).collect();
    assert!(waits
        .iter()
        .all(|w| *w >= interval / 50 && *w < interval / 5));
    // Agents that met on one job come back apart.
    let mut distinct = waits.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 100,
        "{} distinct waits of 200",
        distinct.len()
    );
    assert_eq!(super::soon(Duration::ZERO), Duration::ZERO);
}
