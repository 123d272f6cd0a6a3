//! Agent self-fencing end to end across real processes: a `gangway region`
//! on a real throwaway PostgreSQL and a `gangway agent` (real executor)
//! that reaches it only through a TCP proxy this test controls. The test
//! cuts the proxy: the agent, with no successful sync for its lease, asks
//! its worker to checkpoint and stops it — well before the region's
//! `lost_after_s`, while the region still holds the worker's GPUs. When the
//! proxy is restored the agent reports the fenced exit, and the job
//! requeues at the front and resumes from the checkpoint.

mod support;

use support::{agent_token, log_file, shared_out, token, Proc, BIN};

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gangway_auth::jwt::{Role, SigningKey};
use gangway_shared::api::{JobMode, JobSpec, JobState};
use gangway_shared::client::Client;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const FLEET: &str = r#"
[[spine]]
  [[spine.leaf]]
  nodes = 1
  gpu_type = "h100"
  gpus_per_node = 8
"#;

/// The region declares a silent node lost after this many seconds.
const LOST_AFTER_S: u64 = 12;
/// The agents' lease.
const FENCE_AFTER_S: u64 = 3;

/// Checkpoints on SIGUSR1 (noting it in its log) and exits; a run restored
/// from a checkpoint checks it and succeeds at once.
const TRAINER: &str = r#"
    echo "attempt $GANGWAY_ATTEMPT restore ${GANGWAY_RESTORE_FROM:-none}" >> "$OUT/log"
    if [ -n "$GANGWAY_RESTORE_FROM" ]; then
        [ -f "$GANGWAY_RESTORE_FROM/state" ] || exit 7
        exit 0
    fi
    checkpoint() {
        tmp="$GANGWAY_CHECKPOINT_DIR/.tmp-$$"
        mkdir -p "$tmp" && echo "attempt $GANGWAY_ATTEMPT" > "$tmp/state"
        mv "$tmp" "$GANGWAY_CHECKPOINT_DIR/ckpt-attempt-$GANGWAY_ATTEMPT"
        echo "checkpointed" >> "$OUT/log"
    }
    trap 'checkpoint; exit 0' USR1
    while true; do sleep 0.05; done
"#;

/// A TCP proxy to `upstream` that can be cut (every connection closed, new
/// ones closed at once) and restored.
struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watch) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut watch = watch.clone();
                if *watch.borrow() {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut out) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Proxy { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

#[tokio::test]
async fn an_agent_cut_off_from_its_region_checkpoints_and_stops_its_workers_before_they_are_lost() {
    let db = gangway_devkit::fresh_database("e2e_fence").await;
    // Kept when the test fails (for its processes' logs), removed at the end.
    let mut dir = tempfile::tempdir().unwrap();
    dir.disable_cleanup(true);
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(&fleet, FLEET).unwrap();
    let policy = dir.path().join("health.toml");
    std::fs::write(
        &policy,
        format!("suspect_after_s = 2\nlost_after_s = {LOST_AFTER_S}\n"),
    )
    .unwrap();
    let key = SigningKey::generate("e2e-service");
    std::fs::write(dir.path().join("service.pub.pem"), key.public_pem()).unwrap();
    let port = gangway_devkit::free_port();

    // A lease that leaves no time to checkpoint before lost is refused at
    // start-up, with a message that says why.
    let refused = Command::new(BIN)
        .args(["region", "--name", "test", "--database-url", &db])
        .arg("--service-key")
        .arg(format!(
            "e2e-service={}",
            dir.path().join("service.pub.pem").display()
        ))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        // Plain HTTP on loopback: this test is about the region, not its links.
        .arg("--insecure-http")
        .arg("--health-policy")
        .arg(&policy)
        .args(["--fence-after-s", "10", "--fence-checkpoint-s", "5"])
        .env("GANGWAY_LOG", "error")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("must exceed the agents' lease"), "{stderr}");

    let _region = Proc(
        Command::new(BIN)
            .args(["region", "--name", "test", "--database-url", &db])
            .arg("--service-key")
            .arg(format!(
                "e2e-service={}",
                dir.path().join("service.pub.pem").display()
            ))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            // Plain HTTP on loopback: this test is about the region, not its links.
            .arg("--insecure-http")
            .args([
                "--schedule-interval-ms",
                "100",
                "--agent-sync-interval-ms",
                "200",
            ])
            .args(["--grace-period-s", "2", "--checkpoint-deadline-s", "10"])
            .arg("--health-policy")
            .arg(&policy)
            .args(["--fence-after-s", &FENCE_AFTER_S.to_string()])
            .args(["--fence-checkpoint-s", "3"])
            .arg("--inventory")
            .arg(&fleet)
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "region.log"))
            .spawn()
            .unwrap(),
    );
    let proxy = Proxy::start(port).await;
    let _agent = Proc(
        Command::new(BIN)
            .env(
                "GANGWAY_AGENT_TOKEN",
                agent_token(&key, "test-agent", "test"),
            )
            .args(["agent", "--region", "test", "--agent-id", "test-agent"])
            .arg("--region-url")
            .arg(format!("http://127.0.0.1:{}", proxy.port))
            .arg("--insecure-http")
            .arg("--fleet")
            .arg(&fleet)
            .args(["--executor", "real"])
            .arg("--work-dir")
            .arg(dir.path().join("agent"))
            .arg("--sandbox-bind")
            .arg(shared_out(dir.path()))
            .env("GANGWAY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "agent.log"))
            .spawn()
            .unwrap(),
    );
    let client = Arc::new(
        Client::new(format!("http://127.0.0.1:{port}"), "acme").with_token(token(
            &key,
            Role::Service,
            None,
        )),
    );
    let logs = dir.path().display().to_string();
    let until = |what: &'static str, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let logs = logs.clone();
        move || {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; logs in {logs}"
            );
        }
    };

    let check = until("the agent's GPUs", 60);
    loop {
        if let Ok(s) = client.region_status().await {
            if s.capacity.iter().any(|c| c.schedulable == 8) {
                break;
            }
        }
        check();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let spec = JobSpec {
        name: "fence".into(),
        gpus: 2,
        gpu_type: "h100".into(),
        priority: Default::default(),
        estimated_duration_s: 600,
        max_duration_s: None,
        command: vec!["sh".into(), "-c".into(), TRAINER.into()],
        env: [("OUT".to_string(), out.to_string_lossy().into_owned())].into(),
        gpus_per_worker: None,
        mode: JobMode::Gang,
        min_gpus: None,
        topology: Default::default(),
        region: None,
        reservation: None,
        cluster: None,
    };
    let job = client.submit(&spec, None).await.unwrap();
    let check = until("the job to run", 60);
    while client.get(job.id).await.unwrap().state != JobState::Running {
        check();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Cut the agent off.
    proxy.set_cut(true);
    let cut_at = Instant::now();
    let log = out.join("log");
    let check = until("the fenced worker's checkpoint", 30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("checkpointed")
    {
        check();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fenced_after = cut_at.elapsed();
    assert!(
        fenced_after >= Duration::from_millis(FENCE_AFTER_S * 1000 - 500),
        "fenced too early: {fenced_after:?}"
    );
    assert!(
        fenced_after < Duration::from_secs(LOST_AFTER_S),
        "fenced only after the region's lost deadline: {fenced_after:?}"
    );
    // The worker has stopped while the region still counts the job
    // running on its GPUs (the node is not lost yet): nothing else can have
    // been given those GPUs while the old worker ran.
    let j = client.get(job.id).await.unwrap();
    assert_eq!(j.state, JobState::Running, "{j:?}");
    let agent_log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(agent_log.contains("fenced"), "{agent_log}");

    // Back in touch: the agent reports the fenced exit; the job requeues at
    // the front and resumes from its checkpoint.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_cut(false);
    let check = until("the job to resume and succeed", 60);
    let done = loop {
        let j = client.get(job.id).await.unwrap();
        if j.state == JobState::Succeeded {
            break j;
        }
        assert!(!j.state.is_terminal(), "{j:?}");
        check();
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The checkpoint it wrote while fenced was committed to the checkpoint
    // store (the agent's, which needs no region), reported once it was
    // back, and fetched for the restart.
    let key = done.restore_from.clone().expect("a checkpoint");
    let newest = done.checkpoint.clone().expect("its newest checkpoint");
    assert_eq!(
        (newest.key.as_str(), newest.name.as_str()),
        (key.as_str(), "ckpt-attempt-1")
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("attempt 2 restore ") && text.contains("/ckpt-attempt-1\n"),
        "{text}"
    );
    let events = client.events(job.id).await.unwrap().events;
    let preempted = events
        .iter()
        .find(|e| e.kind == "preempted")
        .expect("a preempted event");
    assert_eq!(preempted.detail["cause"], "fenced", "{preempted:?}");
    assert!(
        !events.iter().any(|e| e.kind == "worker_exited"),
        "a fenced exit is no failure: {events:?}"
    );
    dir.disable_cleanup(false);
}
