//! A tenant's job is hostile code: end to end, through the public API of a
//! cloud of real processes (three `gangway region`s, `gangway global` on
//! HTTPS, an agent per region running real workers with isolation on, as
//! `gangway agent` starts by default as root), jobs of tenant `globex` try,
//! one thing each, to reach the agent or tenant `acme`'s running job on the
//! same machine. Each prints what worked and exits 1 if anything did; the
//! test asserts every one succeeded, and checks from outside that nothing
//! changed: the agent and acme's worker still run, acme's checkpoint is as
//! it wrote it, nothing appeared where the jobs tried to write. Then
//! globex's own work — a checkpoint, a preemption, a restore from it —
//! succeeds through the same sandbox. docs/jobs.md says what a job can see.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gangway_chaos::cloud::{Cloud, Executor};
use gangway_shared::api::{Job, JobSpec, JobState};
use gangway_shared::client::Client;
use support::BIN;
use uuid::Uuid;

/// Where every job of the test runs: one agent, one machine.
const REGION: &str = "r1";

fn spec(name: &str, gpus: i64, script: &str, env: &[(&str, String)]) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "gpus": gpus, "gpus_per_worker": gpus, "gpu_type": "h100",
        "estimated_duration_s": 60, "region": REGION,
        "command": ["sh", "-c", script],
        "env": env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
    }))
    .unwrap()
}

async fn wait(client: &Client, id: Uuid, what: &str, cond: impl Fn(&Job) -> bool) -> Job {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(job) = client.get(id).await {
            if cond(&job) {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} ({}): {what} never happened: {job:?}",
                job.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ended(j: &Job) -> bool {
    matches!(
        j.state,
        JobState::Succeeded | JobState::Failed | JobState::Cancelled
    )
}

/// What a job's workers printed (the agent keeps it in their directories).
fn output(agent_dir: &Path, id: Uuid) -> String {
    let mut out = String::new();
    let Ok(ranks) = std::fs::read_dir(agent_dir.join("jobs").join(id.to_string())) else {
        return out;
    };
    for rank in ranks.flatten() {
        for log in ["stdout.log", "stderr.log"] {
            if let Ok(text) = std::fs::read_to_string(rank.path().join(log)) {
                out.push_str(&format!(
                    "[{} {log}]\n{text}",
                    rank.file_name().to_string_lossy()
                ));
            }
        }
    }
    out
}

/// The processes (as this machine numbers them) working in a directory of
/// job `id`'s, zombies aside.
fn workers_of(agent_dir: &Path, id: Uuid) -> Vec<u32> {
    let dir = agent_dir.join("jobs").join(id.to_string());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let cwd = std::fs::read_link(p.path().join("cwd")).ok()?;
            let stat = std::fs::read_to_string(p.path().join("stat")).ok()?;
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            (cwd.starts_with(&dir) && !zombie).then_some(pid)
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

/// Each attack: a line it prints when it worked. The job exits 1 then.
const PRELUDE: &str = "worked() { echo \"ATTACK WORKED: $*\"; failed=1; }; failed=0; ";
const VERDICT: &str = "; exit $failed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_jobs_reach_nothing_of_the_agent_or_of_another_tenant_and_their_own_work_succeeds()
{
    // Where the jobs try to write: gone first, so that what is found
    // after is this run's doing.
    let outside = [
        PathBuf::from("/etc/gangway-e2e-pwned"),
        PathBuf::from("/usr/local/bin/gangway-e2e-pwned"),
    ];
    for p in &outside {
        let _ = std::fs::remove_file(p);
    }
    let cloud = Cloud::start_with(Path::new(BIN), true, Executor::Real).await;
    let acme = cloud.tenant_client("acme");
    let globex = cloud.tenant_client("globex");
    let agent_dir = cloud.agent_dir(REGION);
    let store = cloud.store_dir(REGION);
    let agent_pid = cloud.agent_pid(REGION).expect("the region's agent runs");
    // The cloud's signing key: it mints agent (and service) tokens.
    let key = cloud.dir.path().join("keys/service-signing.pem");
    let logs = cloud.dir.path().display().to_string();

    // acme's job: a checkpoint, then it trains on (sleeps).
    let victim = acme
        .submit(
            &spec(
                "victim",
                8,
                "mkdir \"$GANGWAY_CHECKPOINT_DIR/.t\" && echo acme-weights > \"$GANGWAY_CHECKPOINT_DIR/.t/model\" \
                 && mv \"$GANGWAY_CHECKPOINT_DIR/.t\" \"$GANGWAY_CHECKPOINT_DIR/step-1\" && exec sleep 600",
                &[],
            ),
            None,
        )
        .await
        .unwrap();
    let theirs = agent_dir
        .join("checkpoints")
        .join(victim.id.to_string())
        .join("step-1");
    let deadline = Instant::now() + Duration::from_secs(90);
    let victim_pid = loop {
        let model = std::fs::read_to_string(theirs.join("model")).unwrap_or_default();
        if let (true, Some(pid)) = (
            model == "acme-weights\n",
            workers_of(&agent_dir, victim.id)
                .into_iter()
                .filter(|p| std::fs::metadata(format!("/proc/{p}")).is_ok_and(|m| m.uid() != 0))
                .max(),
        ) {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "acme's job never ran; logs in {logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The targets are real: as root, the test reaches every one.
    assert!(std::fs::read_to_string(&key)
        .unwrap()
        .contains("PRIVATE KEY"));
    assert!(std::fs::read(format!("/proc/{agent_pid}/environ"))
        .unwrap()
        .windows(19)
        .any(|w| w == b"GANGWAY_AGENT_TOKEN"));
    // Its checkpoint is in the region's store too.
    wait(&acme, victim.id, "its checkpoint recorded", |j| {
        j.checkpoint.is_some()
    })
    .await;
    assert!(std::fs::read_dir(&store).unwrap().next().is_some());
    let victim_uid = std::fs::metadata(format!("/proc/{victim_pid}"))
        .unwrap()
        .uid();
    assert_ne!(victim_uid, 0, "acme's worker runs as acme's user, not root");

    // The region's database listens on 127.0.0.1, which jobs reach.
    let db = cloud.database(REGION).to_string();
    let db_port = (db.split_whitespace())
        .find_map(|kv| kv.strip_prefix("port="))
        .expect("a port in the database's connection string")
        .to_string();
    let psql = ["/usr/bin/psql", "/usr/local/bin/psql"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("psql (Debian postgresql-client) to attack the database with");
    let env = [
        ("PSQL", psql.to_string()),
        ("DB_PORT", db_port),
        ("AGENT_PID", agent_pid.to_string()),
        ("VICTIM_PID", victim_pid.to_string()),
        ("THEIRS", theirs.display().to_string()),
        ("STORE", store.display().to_string()),
        ("AGENT_DIR", agent_dir.display().to_string()),
        ("KEY", key.display().to_string()),
    ];
    let attacks: [(&str, &str); 6] = [
        (
            "read-the-regions-database",
            // Refused for want of a password, not for want of a psql.
            r#"for u in postgres gangway "$(id -un)"; do
                   if out=$("$PSQL" -w -h 127.0.0.1 -p "$DB_PORT" -U "$u" -d gangway -c 'SELECT count(*) FROM jobs' </dev/null 2>&1); then
                       worked "read the region's database as $u"
                   else
                       echo "$out" | grep -q password || worked "psql failed otherwise, proving nothing: $out"
                   fi
               done"#,
        ),
        (
            "steal-the-agents-token",
            r#"env | grep -q '^GANGWAY_AGENT_TOKEN=' && worked "the agent's token in its environment"
               env | grep -q 'eyJ' && worked "a token in its environment"
               grep -qa GANGWAY_AGENT_TOKEN "/proc/$AGENT_PID/environ" 2>/dev/null && worked "read /proc/<agent>/environ"
               for p in /proc/[0-9]*; do grep -qa GANGWAY_AGENT_TOKEN "$p/environ" 2>/dev/null && worked "read $p/environ"; done
               cat "$KEY" >/dev/null 2>&1 && worked "read the signing key"
               ls "$AGENT_DIR" >/dev/null 2>&1 && worked "listed the agent's directory""#,
        ),
        (
            "read-or-overwrite-acmes-checkpoint",
            r#"cat "$THEIRS/model" 2>/dev/null && worked "read acme's checkpoint"
               echo forged 2>/dev/null > "$THEIRS/model" && worked "overwrote acme's checkpoint"
               ls "$(dirname "$THEIRS")" >/dev/null 2>&1 && worked "listed acme's checkpoints"
               find "$STORE" -type f 2>/dev/null | head -1 | grep -q . && worked "listed the checkpoint store"
               ls "$(dirname "$(dirname "$THEIRS")")" >/dev/null 2>&1 && worked "listed every job's checkpoints""#,
        ),
        (
            "signal-the-agent-and-acmes-worker",
            r#"kill -TERM "$AGENT_PID" 2>/dev/null && worked "signalled the agent"
               kill -TERM "$VICTIM_PID" 2>/dev/null && worked "signalled acme's worker"
               kill -0 "$AGENT_PID" 2>/dev/null && worked "sees the agent's process""#,
        ),
        (
            "write-outside-its-directories",
            r#"touch /etc/gangway-e2e-pwned 2>/dev/null && worked "wrote /etc"
               touch /usr/local/bin/gangway-e2e-pwned 2>/dev/null && worked "wrote /usr/local/bin"
               touch "$AGENT_DIR/pwned" 2>/dev/null && worked "wrote the agent's directory"
               mkdir "$STORE/pwned" 2>/dev/null && worked "wrote the checkpoint store"
               touch "$HOME/mine" || worked "could not write its own directory""#,
        ),
        (
            "run-as-root",
            r#"[ "$(id -u)" = 0 ] && worked "runs as root"
               [ "$(id -u)" = "$(stat -c %u /proc/$AGENT_PID 2>/dev/null)" ] && worked "runs as the agent's user"
               sudo -n true 2>/dev/null && worked "sudo""#,
        ),
    ];
    let mut jobs = Vec::new();
    for (name, script) in attacks {
        let script = format!("{PRELUDE}{script}{VERDICT}");
        let job = globex
            .submit(&spec(name, 1, &script, &env), None)
            .await
            .unwrap();
        jobs.push((name, job.id));
    }
    // And one that kills every process it may.
    let kill_all = globex
        .submit(
            &spec("kill-every-process-it-may", 1, "kill -KILL -1", &[]),
            None,
        )
        .await
        .unwrap();
    for (name, id) in &jobs {
        let done = wait(&globex, *id, "its end", ended).await;
        assert_eq!(
            done.state,
            JobState::Succeeded,
            "{name}: {}\nlogs in {logs}",
            output(&agent_dir, *id)
        );
    }
    wait(&globex, kill_all.id, "its end", ended).await;

    // From outside: nothing moved.
    assert!(alive(agent_pid), "the agent was killed");
    assert_eq!(
        cloud.agent_pid(REGION),
        Some(agent_pid),
        "the agent restarted"
    );
    assert!(alive(victim_pid), "acme's worker was killed");
    let v = acme.get(victim.id).await.unwrap();
    assert_eq!((v.state, v.preemptions), (JobState::Running, 0), "{v:?}");
    assert_eq!(
        std::fs::read_to_string(theirs.join("model")).unwrap(),
        "acme-weights\n"
    );
    for p in outside
        .into_iter()
        .chain([agent_dir.join("pwned"), store.join("pwned")])
    {
        assert!(!p.exists(), "{} was written", p.display());
    }

    // globex's own work goes on in the same sandbox: it checkpoints, is
    // preempted (SIGUSR1, then SIGTERM), and resumes from its checkpoint.
    let own = globex
        .submit(
            &spec(
                "own-work",
                1,
                r#"if [ -n "${GANGWAY_RESTORE_FROM:-}" ]; then
                       [ "$(cat "$GANGWAY_RESTORE_FROM/model")" = globex-2 ] || { echo "restored $GANGWAY_RESTORE_FROM: wrong"; exit 3; }
                       echo restored; exit 0
                   fi
                   ckpt() { mkdir "$GANGWAY_CHECKPOINT_DIR/.t" && echo "globex-$1" > "$GANGWAY_CHECKPOINT_DIR/.t/model" \
                            && mv "$GANGWAY_CHECKPOINT_DIR/.t" "$GANGWAY_CHECKPOINT_DIR/step-$1"; }
                   trap 'ckpt 2' USR1
                   ckpt 1
                   while true; do sleep 0.1; done"#,
                &[],
            ),
            None,
        )
        .await
        .unwrap();
    wait(&globex, own.id, "a checkpoint recorded", |j| {
        j.state == JobState::Running && j.checkpoint.is_some()
    })
    .await;
    let (operator, _) = cloud.operator();
    operator
        .call_json(
            reqwest::Method::POST,
            &format!("/v1/admin/jobs/{}/preempt", own.id),
            None,
        )
        .await
        .unwrap();
    let done = wait(&globex, own.id, "its end", ended).await;
    assert_eq!(
        (done.state, done.preemptions),
        (JobState::Succeeded, 1),
        "{}\nlogs in {logs}",
        output(&agent_dir, own.id)
    );
    assert!(output(&agent_dir, own.id).contains("restored"));

    acme.cancel(victim.id).await.unwrap();
}
