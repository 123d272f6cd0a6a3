//! The real executor: one process per worker, in its own process group,
//! as its tenant's user and, where bubblewrap is installed, in a sandbox
//! ([`super::isolation`]).
//!
//! The worker is the leader of a new process group, so SIGTERM and SIGKILL go
//! to the group and reach whatever the worker started. When the leader ends,
//! stragglers left in its group get SIGKILL too: a worker that has exited
//! must not keep holding its GPUs. In a sandbox the process the agent
//! starts is bubblewrap, which waits for the sandbox; the job's processes
//! are in the group of the sandbox's init, so SIGUSR1 and SIGTERM go to
//! that group (never to bubblewrap, which they would end), and SIGKILL to
//! the init, which ends everything in the sandbox's PID namespace.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::process::Child;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::checkpoints::{Checkpoints, Uploader};

use super::isolation::{self, Isolation, RunAs, SandboxInfo, WorkerLaunch, WORKER_PATH};

use super::{
    sleep_opt, Control, Exit, WorkerSpec, CHECKPOINTED, CHECKPOINT_DEADLINE, MAX_DURATION_EXCEEDED,
    STOPPED,
};

/// Why a worker could not be started; reported as exit code 127.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error("empty command")]
    EmptyCommand,
    #[error("cannot create {}: {source}", path.display())]
    WorkDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open {}: {source}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot restore its checkpoint: {0}")]
    Restore(String),
    #[error("no user to run it as: {0}")]
    User(String),
    #[error("{0}")]
    Command(String),
}

/// The exit code reported for a worker that could not be started, as a
/// shell reports a command it cannot find.
pub(crate) const CANNOT_START_EXIT_CODE: i32 = 127;

/// The directory a worker runs in and logs to.
pub(crate) fn worker_dir(work_dir: &Path, spec: &WorkerSpec) -> PathBuf {
    crate::logs::worker_dir(work_dir, &spec.key)
}

/// Where a job's checkpoints live on this agent: one directory per job,
/// shared by its ranks and kept across attempts, so a restart finds them.
pub(crate) fn checkpoint_dir(work_dir: &Path, spec: &WorkerSpec) -> PathBuf {
    job_checkpoint_dir(work_dir, spec.key.job_id)
}

/// [`checkpoint_dir`] by job id.
pub(crate) fn job_checkpoint_dir(work_dir: &Path, job_id: uuid::Uuid) -> PathBuf {
    work_dir.join("checkpoints").join(job_id.to_string())
}

/// A complete checkpoint directory: (modification time, name) tells one
/// apart from the next, and the path is where it is.
type Entry = (SystemTime, OsString, PathBuf);

/// The newest complete checkpoint in `dir`: a directory whose name does
/// not start with `.` (a checkpoint is written under a dot-name and renamed
/// into place when whole), newest by modification time, then name.
fn newest_entry(dir: &Path) -> Option<Entry> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let modified = e.metadata().ok()?.modified().ok()?;
            Some((modified, e.file_name(), e.path()))
        })
        .max()
}

/// [`newest_entry`]'s path.
pub(crate) fn newest_checkpoint(dir: &Path) -> Option<String> {
    newest_entry(dir).map(|(_, _, path)| path.to_string_lossy().into_owned())
}

fn cannot_start(e: StartError) -> Exit {
    tracing::warn!(error = %e, "cannot start worker");
    Exit {
        exit_code: Some(CANNOT_START_EXIT_CODE),
        signal: None,
        message: Some(format!("cannot start: {e}")),
        checkpoint: None,
    }
}

/// Starts the worker and supervises it until it ends. With a checkpoint
/// store: a worker restored from a store key starts only once that
/// checkpoint is fetched and verified, and rank 0's new checkpoints are
/// uploaded while it runs (see [`crate::checkpoints`]).
pub(crate) async fn run(
    spec: &WorkerSpec,
    work_dir: &Path,
    control: &Control,
    store: Option<&Arc<Checkpoints>>,
    isolation: &Arc<Isolation>,
) -> Exit {
    let checkpoints = checkpoint_dir(work_dir, spec);
    // Looking the tenant's user up may create it (useradd).
    let user = {
        let (isolation, tenant) = (isolation.clone(), spec.tenant.clone());
        match tokio::task::spawn_blocking(move || isolation.run_as(&tenant)).await {
            Ok(Ok(user)) => user,
            Ok(Err(e)) => return cannot_start(StartError::User(e)),
            Err(e) => return cannot_start(StartError::User(e.to_string())),
        }
    };
    // A fetch may take a while: a stop meanwhile ends it before it starts.
    let restore = tokio::select! {
        r = restore_dir(spec, work_dir, store, user.as_ref()) => r,
        _ = control.stop.cancelled() => return not_started(),
        _ = control.kill.cancelled() => return not_started(),
        _ = control.checkpoint.cancelled() => return not_started(),
    };
    let restore = match restore {
        Ok(r) => r,
        Err(e) => return cannot_start(StartError::Restore(e)),
    };
    // What is there already is an earlier run's (uploaded then, or older
    // than what this run restored from): only what appears now is new.
    let baseline = newest_entry(&checkpoints);
    let launch = Start {
        spec,
        work_dir,
        checkpoints: &checkpoints,
        restore: restore.as_deref(),
        isolation,
        user: user.as_ref(),
    };
    match start(&launch).await {
        Ok((child, sandbox)) => {
            // A child that has not been waited for always has an id.
            let leader = child.id().expect("unreaped child has a pid") as libc::pid_t;
            let inner = match sandbox {
                Some(info) => info
                    .child_pid()
                    .await
                    .and_then(|p| Some((p as libc::pid_t, start_time(p)?))),
                None => None,
            };
            let group = Group {
                leader,
                inner,
                sandboxed: isolation.sandboxed(),
            };
            // Recorded, so that an agent started after this one crashed
            // stops it before anything runs on its GPUs again.
            let record = record_worker(work_dir, &group);
            let watch = match store {
                Some(store) if spec.key.rank == 0 => Some(Watch::spawn(
                    store.clone(),
                    spec,
                    checkpoints.clone(),
                    baseline,
                    user.as_ref().map(|u| u.uid),
                )),
                _ => None,
            };
            let (mut exit, upload_by) = supervise(child, &group, spec, control, &checkpoints).await;
            if let Some(record) = record {
                let _ = std::fs::remove_file(record);
            }
            exit.checkpoint = newest_checkpoint(&checkpoints);
            if let Some(watch) = watch {
                watch.finish(upload_by).await;
            }
            exit
        }
        Err(e) => cannot_start(e),
    }
}

/// Where the agent records the process groups of the workers it runs.
fn records_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("workers")
}

/// When process `pid` started (clock ticks since boot, `/proc/PID/stat`'s
/// `starttime`): with the pid, it names one process, whatever pids are
/// reused later.
fn start_time(pid: u32) -> Option<u64> {
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    Some(process.stat().ok()?.starttime)
}

/// Records a worker (the leader of its process group, and its sandbox's
/// init) as running; returns the record, to remove once it is reaped.
fn record_worker(work_dir: &Path, group: &Group) -> Option<PathBuf> {
    let dir = records_dir(work_dir);
    let pid = group.leader as u32;
    let started = start_time(pid)?;
    let path = dir.join(pid.to_string());
    let mut text = format!("{started}\n");
    if let Some((inner, inner_started)) = group.inner {
        text.push_str(&format!("{inner} {inner_started}\n"));
    }
    let written = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text));
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "cannot record a worker");
            None
        }
    }
}

/// Kills (SIGKILL, the whole process group) every worker a previous run
/// of the agent recorded that still runs, and waits until they are gone.
/// Workers are left running when the agent dies so that a crash does not
/// stop training by itself; but a new agent is a new boot to the region,
/// which launches the assignments again, so the old workers must be gone
/// first or two copies of a rank would share its GPUs. Returns how many
/// were killed.
pub(crate) fn reap_orphans(work_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(records_dir(work_dir)) else {
        return 0;
    };
    let mut killed = Vec::new();
    let mut sandboxes = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let pid: Option<u32> = entry.file_name().to_str().and_then(|n| n.parse().ok());
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut lines = text.lines();
        let recorded: Option<u64> = lines.next().and_then(|s| s.trim().parse().ok());
        // A sandbox's init: killing it ends every process in the sandbox.
        let inner: Option<(u32, u64)> = lines.next().and_then(|l| {
            let (p, t) = l.split_once(' ')?;
            Some((p.parse().ok()?, t.trim().parse().ok()?))
        });
        if let Some((inner, inner_started)) = inner {
            if start_time(inner) == Some(inner_started) {
                // SAFETY: signals the sandbox init this agent recorded (the
                // same process: its start time matches).
                unsafe { libc::kill(inner as libc::pid_t, libc::SIGKILL) };
                sandboxes.push(inner);
            }
        }
        if let (Some(pid), Some(recorded)) = (pid, recorded) {
            if start_time(pid) == Some(recorded) {
                // SAFETY: signals the process group this agent made for
                // the worker (the same process: its start time matches).
                unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
                killed.push(pid);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while killed
        .iter()
        .chain(&sandboxes)
        .any(|pid| group_running(*pid))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !killed.is_empty() {
        tracing::warn!(
            workers = killed.len(),
            "killed the workers a previous run of this agent left running (they are launched \
             again from their assignments)"
        );
    }
    killed.len()
}

/// Whether a process of group `pgid` still runs (zombies aside).
fn group_running(pgid: u32) -> bool {
    let Ok(processes) = procfs::process::all_processes() else {
        return false;
    };
    (processes.flatten())
        .filter_map(|p| p.stat().ok())
        .any(|s| s.state != 'Z' && u32::try_from(s.pgrp) == Ok(pgid))
}

fn not_started() -> Exit {
    Exit {
        exit_code: None,
        signal: None,
        message: Some("stopped before it started (while fetching its checkpoint)".into()),
        checkpoint: None,
    }
}

/// What `GANGWAY_RESTORE_FROM` is: a store key's verified local copy, or
/// the assignment's `restore_from` as it is (a path from before the store).
async fn restore_dir(
    spec: &WorkerSpec,
    work_dir: &Path,
    store: Option<&Arc<Checkpoints>>,
    user: Option<&RunAs>,
) -> Result<Option<String>, String> {
    match spec.restore_from.as_deref() {
        None => Ok(None),
        Some(key) if gangway_checkpoint::is_store_key(key) => {
            let store = store.ok_or_else(|| {
                format!(
                    "it resumes from {key} in the checkpoint store, but this agent has no \
                     checkpoint store (start it with --checkpoint-store, the region's URL)"
                )
            })?;
            let dir = store.restore(work_dir, spec.key.job_id, key).await?;
            // The worker's own copy, read as its user.
            if let Some(user) = user.cloned() {
                let (base, at) = (work_dir.to_path_buf(), dir.clone());
                tokio::task::spawn_blocking(move || {
                    isolation::own_dir(&base, &at, Some(&user))
                        .and_then(|_| isolation::give_tree(&at, &user))
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cannot give {} to the job's user: {e}", dir.display()))?;
            }
            Ok(Some(dir.to_string_lossy().into_owned()))
        }
        Some(other) => Ok(Some(other.to_string())),
    }
}

/// How often a rank-0 worker's checkpoint directory is looked at.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// How long after a failed upload the next try waits.
const UPLOAD_RETRY: Duration = Duration::from_secs(5);

/// Uploads a rank-0 worker's new checkpoints, one at a time, on a task of
/// its own: the worker and the agent's syncs never wait for it, except
/// for the final checkpoint of a worker asked to checkpoint and stop.
struct Watch {
    finish: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn spawn(
        store: Arc<Checkpoints>,
        spec: &WorkerSpec,
        dir: PathBuf,
        baseline: Option<Entry>,
        owner: Option<u32>,
    ) -> Watch {
        let who = Uploader {
            job_id: spec.key.job_id,
            epoch: spec.epoch,
            attempt: spec.key.attempt,
            node_id: spec.node_id.clone(),
            rank: spec.key.rank,
            owner,
        };
        let finish = CancellationToken::new();
        let task = tokio::spawn(
            watch(store, who, dir, baseline, finish.clone()).instrument(tracing::Span::current()),
        );
        Watch { finish, task }
    }

    /// The worker ended: upload what it left that is new, then stop. Waits
    /// for that until `by` (the deadline of a checkpoint request, so the
    /// final checkpoint is committed before the exit is reported); without
    /// one, or once it passes, the upload goes on in the background and is
    /// reported when it commits.
    async fn finish(mut self, by: Option<tokio::time::Instant>) {
        self.finish.cancel();
        // Past the deadline already (the worker ignored the request): no
        // time is left to wait with.
        let Some(by) = by.filter(|by| *by > tokio::time::Instant::now()) else {
            return;
        };
        if tokio::time::timeout_at(by, &mut self.task).await.is_err() {
            tracing::warn!(
                "the final checkpoint's upload outlives the checkpoint deadline: reporting the \
                 worker stopped now; the upload goes on and is reported once committed"
            );
        }
    }
}

async fn watch(
    store: Arc<Checkpoints>,
    who: Uploader,
    dir: PathBuf,
    mut last: Option<Entry>,
    finish: CancellationToken,
) {
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let finishing = tokio::select! {
            _ = finish.cancelled() => true,
            _ = sleep(WATCH_INTERVAL) => false,
        };
        let waiting = retry_at.is_some_and(|t| tokio::time::Instant::now() < t);
        if !finishing && waiting {
            continue;
        }
        let newest = newest_entry(&dir);
        let new = match (&newest, &last) {
            (Some((t, n, _)), Some((lt, ln, _))) => (t, n) != (lt, ln),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if let (true, Some(entry)) = (new, newest) {
            match store.upload(&entry.2, &who).await {
                Ok(_) => {
                    last = Some(entry);
                    retry_at = None;
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        dir = %entry.2.display(),
                        retry_in_s = UPLOAD_RETRY.as_secs(),
                        "cannot upload checkpoint (check the checkpoint store); it is not the job's \
                         restore point until it is uploaded"
                    );
                    retry_at = Some(tokio::time::Instant::now() + UPLOAD_RETRY);
                }
            }
        }
        if finishing {
            return;
        }
    }
}

/// What [`start`] needs.
struct Start<'a> {
    spec: &'a WorkerSpec,
    work_dir: &'a Path,
    checkpoints: &'a Path,
    restore: Option<&'a str>,
    isolation: &'a Isolation,
    user: Option<&'a RunAs>,
}

/// The worker's whole environment: a minimal `PATH`, `HOME` and `LANG`,
/// then the job's `env`, then the contract's variables (docs/jobs.md).
/// Nothing of the agent's own.
fn worker_env(s: &Start<'_>, dir: &Path) -> BTreeMap<String, String> {
    let spec = s.spec;
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("PATH", WORKER_PATH.to_string());
    set("HOME", dir.to_string_lossy().into_owned());
    set("LANG", "C.UTF-8".to_string());
    if let Some(user) = s.user {
        set("USER", user.name.clone());
        set("LOGNAME", user.name.clone());
    }
    env.extend(spec.env.clone());
    let gpus = spec.gpus.iter().map(u32::to_string).collect::<Vec<_>>();
    let contract = [
        ("GANGWAY_JOB_ID", spec.key.job_id.to_string()),
        ("RANK", spec.key.rank.to_string()),
        ("WORLD_SIZE", spec.world_size.to_string()),
        ("GANGWAY_WORLD_SIZE", spec.world_size.to_string()),
        ("LOCAL_RANK", spec.local_rank.to_string()),
        ("MASTER_ADDR", spec.master_addr.clone()),
        ("MASTER_PORT", spec.master_port.to_string()),
        ("CUDA_VISIBLE_DEVICES", gpus.join(",")),
        // The indices the agent reports are NVML's, in PCI bus order.
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
        ("GANGWAY_NODE_ID", spec.node_id.clone()),
        ("GANGWAY_ATTEMPT", spec.key.attempt.to_string()),
        (
            "GANGWAY_CHECKPOINT_DIR",
            s.checkpoints.to_string_lossy().into_owned(),
        ),
    ];
    for (k, v) in contract {
        env.insert(k.to_string(), v);
    }
    env.remove("GANGWAY_RESTORE_FROM");
    if let Some(from) = s.restore {
        env.insert("GANGWAY_RESTORE_FROM".to_string(), from.to_string());
    }
    env
}

async fn start(s: &Start<'_>) -> Result<(Child, Option<SandboxInfo>), StartError> {
    let spec = s.spec;
    let program = spec.command.first().ok_or(StartError::EmptyCommand)?;
    let dir = worker_dir(s.work_dir, spec);
    for d in [&dir, &s.checkpoints.to_path_buf()] {
        let (base, at, user) = (s.work_dir.to_path_buf(), d.clone(), s.user.cloned());
        tokio::task::spawn_blocking(move || isolation::own_dir(&base, &at, user.as_ref()))
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            .map_err(|source| StartError::WorkDir {
                path: d.clone(),
                source,
            })?;
    }
    let log = |name: &str| {
        let path = dir.join(name);
        isolation::open_log(&path, s.user).map_err(|source| StartError::Log { path, source })
    };
    let (stdout, stderr) = (log("stdout.log")?, log("stderr.log")?);

    let env = worker_env(s, &dir);
    let restore = s.restore.map(Path::new);
    let launch = WorkerLaunch {
        command: &spec.command,
        env,
        dir: &dir,
        writable: vec![s.checkpoints],
        readable: restore.into_iter().collect(),
        gpus: &spec.gpus,
    };
    let (mut cmd, sandbox) = s
        .isolation
        .command(&launch, s.user)
        .map_err(StartError::Command)?;
    cmd.stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    let mut cmd = tokio::process::Command::from(cmd);
    // The task that spawned the worker reaps it; dropping the handle (say, on
    // an agent crash) must not kill a training run.
    cmd.kill_on_drop(false);
    let child = cmd.spawn().map_err(|source| StartError::Spawn {
        program: program.clone(),
        source,
    })?;
    Ok((child, sandbox))
}

/// The processes of one worker, for signals.
#[derive(Clone, Copy, Debug)]
struct Group {
    /// The process the agent started (the worker, or bubblewrap), leader
    /// of its process group.
    leader: libc::pid_t,
    /// The sandbox's init (pid 1 inside), leader of the group the job's
    /// processes are in, and when it started (its pid may be reused once
    /// it is gone).
    inner: Option<(libc::pid_t, u64)>,
    /// In a sandbox: an exit code of 128 + N means ended by signal N (as
    /// bubblewrap reports it).
    sandboxed: bool,
}

impl Group {
    fn signal(&self, signal: libc::c_int) {
        // Once the init is gone so is everything in its PID namespace, and
        // its pid (and group id) may name another process.
        let inner = self
            .inner
            .filter(|(pid, started)| start_time(*pid as u32) == Some(*started))
            .map(|(pid, _)| pid);
        match (inner, self.inner) {
            (None, Some(_)) => {
                if signal == libc::SIGKILL {
                    signal_group(self.leader, signal);
                }
            }
            (Some(inner), _) if signal == libc::SIGKILL => {
                // From outside its PID namespace, SIGKILL reaches the init,
                // and every process in the sandbox dies with it.
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(inner, libc::SIGKILL) };
                signal_group(self.leader, signal);
            }
            // The init ignores what it has no handler for; the job's
            // processes get it.
            (Some(inner), _) => signal_group(inner, signal),
            (None, None) => signal_group(self.leader, signal),
        }
    }
}

/// Supervises the worker until it ends; returns its exit and, when it was
/// asked to checkpoint, the deadline it was given (its final checkpoint's
/// upload may use what is left of it).
async fn supervise(
    child: Child,
    group: &Group,
    spec: &WorkerSpec,
    control: &Control,
    checkpoints: &Path,
) -> (Exit, Option<tokio::time::Instant>) {
    let mut asked_by = None;
    let exit = supervise_until(child, group, spec, control, checkpoints, &mut asked_by).await;
    (exit, asked_by)
}

async fn supervise_until(
    mut child: Child,
    group: &Group,
    spec: &WorkerSpec,
    control: &Control,
    checkpoints: &Path,
    asked_by: &mut Option<tokio::time::Instant>,
) -> Exit {
    tracing::info!(pid = group.leader, sandbox_init = ?group.inner, "worker started");

    let mut reason = tokio::select! {
        status = child.wait() => return ended(status, group, None),
        _ = control.stop.cancelled() => STOPPED,
        _ = control.kill.cancelled() => STOPPED,
        _ = control.checkpoint.cancelled() => CHECKPOINTED,
        _ = sleep_opt(spec.max_duration) => MAX_DURATION_EXCEEDED,
    };

    if reason == CHECKPOINTED {
        // Ask for a checkpoint, then wait for a new complete one to appear
        // (or the deadline, or a plain stop), and stop the worker after.
        let before = newest_checkpoint(checkpoints);
        let within = control.checkpoint_deadline(spec.checkpoint_deadline);
        tracing::info!(
            deadline_s = within.as_secs_f64(),
            "sending SIGUSR1: checkpoint now"
        );
        group.signal(libc::SIGUSR1);
        let deadline = tokio::time::Instant::now() + within;
        *asked_by = Some(deadline);
        loop {
            tokio::select! {
                status = child.wait() => {
                    return ended(status, group, Some(CHECKPOINTED.to_string()));
                }
                _ = control.stop.cancelled() => { reason = STOPPED; break; }
                _ = control.kill.cancelled() => { reason = STOPPED; break; }
                _ = tokio::time::sleep_until(deadline) => {
                    reason = CHECKPOINT_DEADLINE;
                    break;
                }
                _ = sleep(Duration::from_millis(100)) => {
                    if newest_checkpoint(checkpoints) != before {
                        break;
                    }
                }
            }
        }
    }

    tracing::info!(
        reason,
        grace_s = spec.grace.as_secs_f64(),
        "sending SIGTERM"
    );
    group.signal(libc::SIGTERM);
    tokio::select! {
        status = child.wait() => return ended(status, group, Some(reason.to_string())),
        _ = sleep(spec.grace) => {}
        _ = control.kill.cancelled() => {}
    }
    tracing::warn!(reason, "worker outlived its grace period: sending SIGKILL");
    group.signal(libc::SIGKILL);
    let status = child.wait().await;
    ended(
        status,
        group,
        Some(format!("{reason} (killed after grace period)")),
    )
}

/// The exit of a reaped leader; any process left in its group is killed.
fn ended(status: io::Result<ExitStatus>, group: &Group, reason: Option<String>) -> Exit {
    // The group id cannot be reused while any member lives, so this reaches
    // only the worker's own stragglers (or no one).
    group.signal(libc::SIGKILL);
    match status {
        Ok(status) => {
            let (code, signal) = match (status.code(), status.signal()) {
                // bubblewrap exits 128 + N for a job ended by signal N.
                (Some(c), None) if group.sandboxed && (129..=128 + 64).contains(&c) => {
                    (None, Some(c - 128))
                }
                other => other,
            };
            let message = reason.unwrap_or_else(|| match (code, signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(sig)) => format!("ended by signal {sig}"),
                (None, None) => "exited".to_string(),
            });
            Exit {
                exit_code: code,
                signal,
                message: Some(message),
                checkpoint: None,
            }
        }
        Err(e) => Exit {
            exit_code: None,
            signal: None,
            message: Some(format!("cannot wait for worker: {e}")),
            checkpoint: None,
        },
    }
}

fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions. A negative pid
    // addresses the process group; `pgid` is > 0 (it came from a spawn).
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, signal, error = %err, "cannot signal worker process group");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::executor::test_support::spec;

    /// The executor's mechanics, without isolation (its own tests are in
    /// `isolation_tests`).
    fn off() -> Arc<Isolation> {
        Arc::new(Isolation::off())
    }

    fn sh(script: &str) -> WorkerSpec {
        spec(&["sh", "-c", script])
    }

    async fn wait_for_file(path: &Path) {
        for _ in 0..200 {
            if path.exists() {
                return;
            }
            sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never appeared", path.display());
    }

    /// Whether any process of the group still runs. Zombies do not count:
    /// an orphan is reaped by init, whenever init gets to it.
    fn group_alive(pgid: libc::pid_t) -> bool {
        group_running(pgid as u32)
    }

    #[tokio::test]
    async fn sets_the_worker_environment() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh(
            "echo $RANK $WORLD_SIZE $LOCAL_RANK $CUDA_VISIBLE_DEVICES $GANGWAY_JOB_ID > out; \
             echo $MASTER_ADDR $MASTER_PORT $GANGWAY_NODE_ID $GANGWAY_ATTEMPT $GANGWAY_WORLD_SIZE \
             $EXTRA >> out",
        );
        // The assignment's env comes first; the contract's names win.
        spec.env.insert("RANK".into(), "99".into());
        spec.env.insert("EXTRA".into(), "from-env".into());
        let exit = run(&spec, dir.path(), &Control::default(), None, &off()).await;
        assert_eq!(exit.exit_code, Some(0), "{exit:?}");

        let out = std::fs::read_to_string(worker_dir(dir.path(), &spec).join("out")).unwrap();
        assert_eq!(
            out,
            format!(
                "1 4 1 2,3 {}\n10.0.0.7 29500 node-a 0 4 from-env\n",
                spec.key.job_id
            )
        );
        assert!(worker_dir(dir.path(), &spec)
            .ends_with(format!("jobs/{}/rank-1-attempt-0", spec.key.job_id)));
    }

    #[tokio::test]
    async fn reports_the_exit_code_and_keeps_the_logs() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sh("echo hello; echo oops >&2; exit 3");
        let exit = run(&spec, dir.path(), &Control::default(), None, &off()).await;
        assert_eq!(exit.exit_code, Some(3));
        assert_eq!(exit.signal, None);
        let wd = worker_dir(dir.path(), &spec);
        assert_eq!(
            std::fs::read_to_string(wd.join("stdout.log")).unwrap(),
            "hello\n"
        );
        assert_eq!(
            std::fs::read_to_string(wd.join("stderr.log")).unwrap(),
            "oops\n"
        );
    }

    #[tokio::test]
    async fn a_stop_sends_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sh("echo $$ > pid; sleep 60");
        let ready = worker_dir(dir.path(), &spec).join("pid");
        let control = Control::default();
        let task = tokio::spawn({
            let (spec, control, work_dir) = (spec.clone(), control.clone(), dir.path().to_owned());
            async move { run(&spec, &work_dir, &control, None, &off()).await }
        });
        wait_for_file(&ready).await;
        sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        control.stop.cancel();
        let exit = task.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(exit.exit_code, None);
        assert_eq!(exit.signal, Some(libc::SIGTERM));
        assert_eq!(exit.message.as_deref(), Some(STOPPED));
        // The shell's `sleep` child was in the group and got the signal too.
        let pgid: libc::pid_t = std::fs::read_to_string(&ready)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!group_alive(pgid));
    }

    #[tokio::test]
    async fn a_restarted_agent_kills_the_workers_its_crashed_predecessor_left_running() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sh("echo $$ > pid; sleep 60");
        let ready = worker_dir(dir.path(), &spec).join("pid");
        let task = tokio::spawn({
            let (spec, work_dir) = (spec.clone(), dir.path().to_owned());
            async move { run(&spec, &work_dir, &Control::default(), None, &off()).await }
        });
        wait_for_file(&ready).await;
        sleep(Duration::from_millis(20)).await;
        // The agent dies: its task is gone, the worker is not.
        task.abort();
        let _ = task.await;
        let pgid: libc::pid_t = std::fs::read_to_string(&ready)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(group_alive(pgid), "a crash alone must not stop training");
        // The next agent kills it (group and all) before anything else.
        assert_eq!(reap_orphans(dir.path()), 1);
        assert!(!group_alive(pgid));
        assert_eq!(reap_orphans(dir.path()), 0, "its record is gone");
        // A record naming a pid now used by someone else kills nothing.
        std::fs::write(
            records_dir(dir.path()).join(std::process::id().to_string()),
            "1\n",
        )
        .unwrap();
        assert_eq!(reap_orphans(dir.path()), 0);
    }

    #[tokio::test]
    async fn a_worker_that_ignores_sigterm_gets_sigkill_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("trap '' TERM; echo $$ > ready; sleep 60");
        spec.grace = Duration::from_millis(300);
        let ready = worker_dir(dir.path(), &spec).join("ready");
        let control = Control::default();
        let task = tokio::spawn({
            let (spec, control, work_dir) = (spec.clone(), control.clone(), dir.path().to_owned());
            async move { run(&spec, &work_dir, &control, None, &off()).await }
        });
        wait_for_file(&ready).await;
        sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        control.stop.cancel();
        let exit = task.await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert_eq!(exit.exit_code, None);
        assert_eq!(exit.signal, Some(libc::SIGKILL));
        assert_eq!(
            exit.message.as_deref(),
            Some("stopped (killed after grace period)")
        );
        let pgid: libc::pid_t = std::fs::read_to_string(&ready)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!group_alive(pgid));
    }

    #[tokio::test]
    async fn a_missing_command_reports_127() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(&["gangway-no-such-command-xyz", "--flag"]);
        let exit = run(&spec, dir.path(), &Control::default(), None, &off()).await;
        assert_eq!(exit.exit_code, Some(127));
        assert_eq!(exit.signal, None);
        let message = exit.message.unwrap();
        assert!(
            message.starts_with("cannot start: gangway-no-such-command-xyz"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn max_duration_stops_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("sleep 60");
        spec.max_duration = Some(Duration::from_millis(200));
        let exit = run(&spec, dir.path(), &Control::default(), None, &off()).await;
        assert_eq!(exit.signal, Some(libc::SIGTERM));
        assert_eq!(exit.message.as_deref(), Some(MAX_DURATION_EXCEEDED));
    }

    /// A trainer that checkpoints on SIGUSR1 the way docs/jobs.md says:
    /// write under a dot-name, rename into place when whole.
    const TRAINER: &str = r#"
        echo "${GANGWAY_RESTORE_FROM:-none}" > restored_from
        checkpoint() {
            tmp="$GANGWAY_CHECKPOINT_DIR/.tmp-$$"
            mkdir -p "$tmp" && echo state > "$tmp/model" && mv "$tmp" "$GANGWAY_CHECKPOINT_DIR/step-$1"
        }
        trap 'checkpoint 2' USR1
        checkpoint 1
        touch ready
        while true; do sleep 0.05; done
    "#;

    #[tokio::test]
    async fn a_checkpoint_request_waits_for_the_new_checkpoint_then_stops() {
        let dir = tempfile::tempdir().unwrap();
        let spec = sh(TRAINER);
        let control = Control::default();
        let task = {
            let (spec, control, work) = (spec.clone(), control.clone(), dir.path().to_path_buf());
            tokio::spawn(async move { run(&spec, &work, &control, None, &off()).await })
        };
        wait_for_file(&worker_dir(dir.path(), &spec).join("ready")).await;
        control.checkpoint.cancel();
        let exit = task.await.unwrap();
        assert_eq!(exit.message.as_deref(), Some(CHECKPOINTED), "{exit:?}");
        let newest = exit.checkpoint.expect("a checkpoint");
        assert!(newest.ends_with("step-2"), "{newest}");
        assert!(Path::new(&newest).join("model").exists());
    }

    #[tokio::test]
    async fn a_worker_that_ignores_the_request_is_stopped_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("trap '' USR1; touch ready; while true; do sleep 0.05; done");
        spec.checkpoint_deadline = Duration::from_millis(300);
        let control = Control::default();
        let task = {
            let (spec, control, work) = (spec.clone(), control.clone(), dir.path().to_path_buf());
            tokio::spawn(async move { run(&spec, &work, &control, None, &off()).await })
        };
        wait_for_file(&worker_dir(dir.path(), &spec).join("ready")).await;
        let asked = Instant::now();
        control.checkpoint.cancel();
        let exit = task.await.unwrap();
        assert!(asked.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            exit.message.as_deref(),
            Some(CHECKPOINT_DEADLINE),
            "{exit:?}"
        );
        assert_eq!(exit.checkpoint, None);
    }

    #[tokio::test]
    async fn a_restarted_worker_is_told_where_to_restore_from() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("echo \"$GANGWAY_RESTORE_FROM\" > restored_from");
        spec.restore_from = Some("/ckpt/step-7".into());
        let exit = run(&spec, dir.path(), &Control::default(), None, &off()).await;
        assert_eq!(exit.exit_code, Some(0));
        let got =
            std::fs::read_to_string(worker_dir(dir.path(), &spec).join("restored_from")).unwrap();
        assert_eq!(got.trim(), "/ckpt/step-7");
    }
}
