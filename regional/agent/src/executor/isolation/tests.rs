//! Workers as hostile code: each test runs a job that tries something it
//! must not be able to do, on this machine, with the real sandbox
//! (bubblewrap, setpriv) or the tenant's user alone, and checks that it
//! failed — and that the job's own work still succeeds. The agent runs
//! as root here, as in production (the whole suite does: PostgreSQL is
//! started with runuser).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::executor::real::{checkpoint_dir, run, worker_dir};
use crate::executor::test_support::spec;
use crate::executor::{Control, WorkerSpec};

/// A work directory outside `/tmp` (so that the sandbox must hide it: a
/// private `/tmp` would hide it anyway).
fn work_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("gangway-isolation-")
        .tempdir_in("/var/tmp")
        .unwrap()
}

fn isolation(mode: IsolationMode, work: &Path) -> Arc<Isolation> {
    assert!(
        is_root(),
        "these tests run workers as other users: run them as root (as CI does)"
    );
    let config = IsolationConfig {
        mode,
        ..IsolationConfig::default()
    };
    Arc::new(
        Isolation::resolve(&config, work, None).expect(
            "a sandbox needs bubblewrap and setpriv: apt-get install bubblewrap util-linux",
        ),
    )
}

fn job(tenant: &str, script: &str) -> WorkerSpec {
    let mut s = spec(&["sh", "-c", script]);
    s.tenant = tenant.into();
    s
}

async fn run_to_end(spec: &WorkerSpec, work: &Path, iso: &Arc<Isolation>) -> crate::executor::Exit {
    tokio::time::timeout(
        Duration::from_secs(30),
        run(spec, work, &Control::default(), None, iso),
    )
    .await
    .expect("the worker ends within 30 s")
}

/// Starts `spec` on a task of its own and waits until it has written the
/// file `ready` in its directory.
async fn start_until_ready(
    spec: &WorkerSpec,
    work: &Path,
    iso: &Arc<Isolation>,
) -> (Control, tokio::task::JoinHandle<crate::executor::Exit>) {
    let control = Control::default();
    let task = {
        let (s, control, work, iso) = (
            spec.clone(),
            control.clone(),
            work.to_path_buf(),
            iso.clone(),
        );
        tokio::spawn(async move { run(&s, &work, &control, None, &iso).await })
    };
    let ready = worker_dir(work, spec).join("ready");
    for _ in 0..500 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (control, task)
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

#[tokio::test]
async fn a_sandboxed_worker_runs_as_its_tenants_user_with_nothing_of_the_agents_environment() {
    let work = work_dir();
    let iso = isolation(IsolationMode::Sandbox, work.path());
    let mut s = job(
        "acme",
        "id -u > uid; id -un > user; echo \"$HOME\" > home; \
         env | cut -d= -f1 | grep -vx 'PWD\\|SHLVL\\|_\\|OLDPWD' | sort > keys",
    );
    s.env.insert("EXTRA".into(), "from-the-job".into());
    let exit = run_to_end(&s, work.path(), &iso).await;
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    let dir = worker_dir(work.path(), &s);
    let user = lookup_user("gw-acme")
        .unwrap()
        .expect("the agent made the tenant's user");
    assert_eq!(read(&dir, "uid").trim(), user.uid.to_string());
    assert_ne!(user.uid, 0);
    assert_eq!(read(&dir, "user").trim(), "gw-acme");
    assert_eq!(read(&dir, "home").trim(), dir.to_string_lossy());
    // Exactly the job's variables, the contract's and the minimal ones:
    // nothing of the agent's (this test process has CARGO_*, RUST_*, …).
    let keys: Vec<String> = read(&dir, "keys").lines().map(String::from).collect();
    let mut want: Vec<&str> = vec![
        "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES",
        "EXTRA",
        "GANGWAY_ATTEMPT",
        "GANGWAY_CHECKPOINT_DIR",
        "GANGWAY_JOB_ID",
        "GANGWAY_NODE_ID",
        "GANGWAY_WORLD_SIZE",
        "HOME",
        "LANG",
        "LOCAL_RANK",
        "LOGNAME",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PATH",
        "RANK",
        "USER",
        "WORLD_SIZE",
    ];
    want.sort();
    assert_eq!(keys, want);
    // Its directories are its own, and no one else's to list.
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (user.uid, 0o700)
    );
    let ckpt = std::fs::metadata(checkpoint_dir(work.path(), &s)).unwrap();
    assert_eq!(
        (ckpt.uid(), ckpt.permissions().mode() & 0o777),
        (user.uid, 0o700)
    );
    let jobs = std::fs::metadata(work.path().join("jobs")).unwrap();
    assert_eq!((jobs.uid(), jobs.permissions().mode() & 0o777), (0, 0o711));
}

/// What a hostile job tries against the agent: each line it prints is an
/// attack that worked.
const AGAINST_THE_AGENT: &str = r#"
    kill -0 "$AGENT_PID" 2>/dev/null && echo "signalled the agent"
    cat "/proc/$AGENT_PID/environ" >/dev/null 2>&1 && echo "read the agent's environment"
    cat "/proc/$AGENT_PID/cmdline" >/dev/null 2>&1 && echo "read the agent's command line"
    cat "$SECRET" >/dev/null 2>&1 && echo "read the agent's token file"
    ls "$WORK/workers" >/dev/null 2>&1 && echo "listed the agent's worker records"
    touch /etc/gangway-isolation-test 2>/dev/null && echo "wrote /etc"
    touch "$WORK/planted" 2>/dev/null && echo "wrote the agent's directory"
    touch /usr/gangway-isolation-test 2>/dev/null && echo "wrote /usr"
    echo done
"#;

/// The agent's token in a file of its work directory, world-readable by
/// mistake: the sandbox hides it all the same.
fn plant_secret(work: &Path) -> std::path::PathBuf {
    let secret = work.join("agent.token");
    std::fs::write(&secret, "agent-secret").unwrap();
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::create_dir_all(work.join("workers")).unwrap();
    secret
}

/// Runs `s` against this process (the agent), its work dir and `secret`,
/// to a clean exit.
async fn attack_the_agent(s: &mut WorkerSpec, work: &Path, secret: &Path, iso: &Arc<Isolation>) {
    for (k, v) in [
        ("AGENT_PID", std::process::id().to_string()),
        ("SECRET", secret.to_string_lossy().into_owned()),
        ("WORK", work.to_string_lossy().into_owned()),
    ] {
        s.env.insert(k.into(), v);
    }
    let exit = run_to_end(s, work, iso).await;
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
}

#[tokio::test]
async fn a_sandboxed_worker_reaches_no_process_file_or_directory_of_the_agent() {
    let work = work_dir();
    let iso = isolation(IsolationMode::Sandbox, work.path());
    let secret = plant_secret(work.path());
    let mut s = job(
        "acme",
        &format!("{{ {AGAINST_THE_AGENT} }} > out; ls /proc | grep -c '^[0-9]' > processes"),
    );
    attack_the_agent(&mut s, work.path(), &secret, &iso).await;
    let dir = worker_dir(work.path(), &s);
    assert_eq!(read(&dir, "out"), "done\n");
    // Its own PID namespace: the sandbox's init, the shell, ls and grep.
    let seen: u32 = read(&dir, "processes").trim().parse().unwrap();
    assert!(seen <= 5, "the job saw {seen} processes");
    assert!(!Path::new("/etc/gangway-isolation-test").exists());
    assert!(!work.path().join("planted").exists());
}

#[tokio::test]
async fn without_a_sandbox_the_tenants_user_alone_keeps_the_agent_out_of_reach() {
    let work = work_dir();
    let iso = isolation(IsolationMode::User, work.path());
    let secret = plant_secret(work.path());
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o600)).unwrap();
    let mut s = job("acme", &format!("{{ {AGAINST_THE_AGENT} }} > out"));
    attack_the_agent(&mut s, work.path(), &secret, &iso).await;
    // Without a PID namespace the agent's command line is in sight (so
    // the agent takes its token from a file or its environment, never
    // its arguments); the rest is refused.
    assert_eq!(
        read(&worker_dir(work.path(), &s), "out"),
        "read the agent's command line\ndone\n"
    );
}

async fn another_tenants_checkpoint_is_out_of_reach(mode: IsolationMode) {
    let work = work_dir();
    let iso = isolation(mode, work.path());
    // acme's job writes a checkpoint the way docs/jobs.md says.
    let acme = job(
        "acme",
        "mkdir \"$GANGWAY_CHECKPOINT_DIR/.tmp\" && echo weights > \"$GANGWAY_CHECKPOINT_DIR/.tmp/model\" \
         && mv \"$GANGWAY_CHECKPOINT_DIR/.tmp\" \"$GANGWAY_CHECKPOINT_DIR/step-1\"",
    );
    let exit = run_to_end(&acme, work.path(), &iso).await;
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    let theirs = checkpoint_dir(work.path(), &acme);
    assert_eq!(read(&theirs.join("step-1"), "model"), "weights\n");
    // globex's job, on the same machine, knows where it is.
    let mut globex = job(
        "globex",
        r#"
        cat "$THEIRS/step-1/model" 2>/dev/null && echo "read their checkpoint"
        ls "$THEIRS" >/dev/null 2>&1 && echo "listed their checkpoints"
        echo forged > "$THEIRS/step-1/model" 2>/dev/null && echo "overwrote their checkpoint"
        rm -rf "$THEIRS/step-1" 2>/dev/null # checked below: the model is still there
        ls "$(dirname "$THEIRS")" >/dev/null 2>&1 && echo "listed every job's checkpoints"
        mkdir "$GANGWAY_CHECKPOINT_DIR/step-1" && echo mine > "$GANGWAY_CHECKPOINT_DIR/step-1/model" \
            && cat "$GANGWAY_CHECKPOINT_DIR/step-1/model" >/dev/null && echo "wrote its own"
        "#,
    );
    globex
        .env
        .insert("THEIRS".into(), theirs.to_string_lossy().into_owned());
    let exit = run_to_end(&globex, work.path(), &iso).await;
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    assert_eq!(
        read(&worker_dir(work.path(), &globex), "stdout.log"),
        "wrote its own\n"
    );
    assert_eq!(read(&theirs.join("step-1"), "model"), "weights\n");
}

#[tokio::test]
async fn another_tenants_checkpoint_is_out_of_reach_in_a_sandbox() {
    another_tenants_checkpoint_is_out_of_reach(IsolationMode::Sandbox).await;
}

#[tokio::test]
async fn another_tenants_checkpoint_is_out_of_reach_as_a_user_alone() {
    another_tenants_checkpoint_is_out_of_reach(IsolationMode::User).await;
}

#[tokio::test]
async fn a_sandboxed_worker_checkpoints_on_sigusr1_and_stops_on_sigterm() {
    let work = work_dir();
    let iso = isolation(IsolationMode::Sandbox, work.path());
    let s = job(
        "acme",
        r#"
        checkpoint() {
            mkdir "$GANGWAY_CHECKPOINT_DIR/.tmp" && echo "$1" > "$GANGWAY_CHECKPOINT_DIR/.tmp/step" \
                && mv "$GANGWAY_CHECKPOINT_DIR/.tmp" "$GANGWAY_CHECKPOINT_DIR/step-$1"
        }
        trap 'checkpoint 2' USR1
        trap 'echo terminated; exit 143' TERM
        checkpoint 1
        touch ready
        while true; do sleep 0.05; done
        "#,
    );
    let (control, task) = start_until_ready(&s, work.path(), &iso).await;
    let dir = worker_dir(work.path(), &s);
    control.checkpoint.cancel();
    let exit = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        exit.message.as_deref(),
        Some(crate::executor::CHECKPOINTED),
        "{exit:?}"
    );
    assert!(
        exit.checkpoint
            .as_deref()
            .is_some_and(|c| c.ends_with("step-2")),
        "{exit:?}"
    );
    // SIGTERM reached the job, not bubblewrap: it ran its handler.
    assert_eq!(read(&dir, "stdout.log"), "terminated\n");
    assert_eq!(exit.signal, Some(libc::SIGTERM), "{exit:?}");
}

#[tokio::test]
async fn a_sandboxed_worker_that_ignores_sigterm_is_killed_with_everything_it_started() {
    let work = work_dir();
    let iso = isolation(IsolationMode::Sandbox, work.path());
    // It forks a child that leaves its process group, too.
    let mut s = job(
        "acme",
        "trap '' TERM; setsid sh -c 'trap \"\" TERM; while true; do sleep 0.05; done' & \
         touch ready; while true; do sleep 0.05; done",
    );
    s.grace = Duration::from_millis(300);
    let (control, task) = start_until_ready(&s, work.path(), &iso).await;
    let dir = worker_dir(work.path(), &s);
    let user = lookup_user("gw-acme").unwrap().unwrap();
    assert!(!processes_of(user.uid).is_empty());
    control.stop.cancel();
    let exit = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit:?}");
    // The escaped child died with the sandbox's PID namespace.
    for _ in 0..100 {
        if processes_in(&dir).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes_in(&dir), Vec::<u32>::new());
}

#[tokio::test]
async fn a_log_planted_as_a_symbolic_link_is_not_followed() {
    let work = work_dir();
    let iso = isolation(IsolationMode::Sandbox, work.path());
    let target = work.path().join("agent-owned");
    std::fs::write(&target, "the agent's\n").unwrap();
    let s = job("acme", "echo written-through-the-link");
    // A previous run of the same worker left its directory with a link.
    let dir = worker_dir(work.path(), &s);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("stdout.log")).unwrap();
    let exit = run_to_end(&s, work.path(), &iso).await;
    assert_eq!(exit.exit_code, Some(127), "{exit:?}");
    assert!(exit.message.unwrap().contains("stdout.log"));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "the agent's\n");
}

#[test]
fn long_tenant_names_make_valid_distinct_user_names() {
    assert_eq!(tenant_user_name("acme"), "gw-acme");
    let a = tenant_user_name(&"a".repeat(63));
    let b = tenant_user_name(&format!("{}b", "a".repeat(62)));
    assert!(a.len() <= 32 && b.len() <= 32, "{a} {b}");
    assert_ne!(a, b);
}

/// Processes (as the host numbers them) running as `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    proc_entries()
        .into_iter()
        .filter(|(_, p)| std::fs::metadata(p).is_ok_and(|m| m.uid() == uid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Processes whose working directory is `dir`, zombies aside.
fn processes_in(dir: &Path) -> Vec<u32> {
    proc_entries()
        .into_iter()
        .filter(|(_, p)| std::fs::read_link(p.join("cwd")).is_ok_and(|c| c == dir))
        .filter(|(_, p)| {
            std::fs::read_to_string(p.join("stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
        })
        .map(|(pid, _)| pid)
        .collect()
}

fn proc_entries() -> Vec<(u32, std::path::PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect()
}
