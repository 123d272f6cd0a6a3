//! `gangway dev up` as a user runs it: three regions come up, the env file
//! works, Ctrl-C stops everything, and a second start keeps the data.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_shared::api::JobState;
use gangway_shared::client::{Client, ListQuery};

const BIN: &str = env!("CARGO_BIN_EXE_gangway");

struct DevUp(Child);

impl DevUp {
    fn start(state: &Path) -> DevUp {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state.with_extension("log"))
            .unwrap();
        DevUp(
            Command::new(BIN)
                .args(["dev", "up", "--state-dir"])
                .arg(state)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    /// Ctrl-C, then wait for a clean exit.
    fn interrupt(mut self) {
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                assert!(status.success(), "dev up exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "dev up did not stop on Ctrl-C");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for DevUp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read_env(state: &Path) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let path = state.join("env");
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "no env file; log: {}",
            std::fs::read_to_string(state.with_extension("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_up_runs_three_regions_stops_on_ctrl_c_and_resumes() {
    let root = tempfile::Builder::new()
        .prefix("gangway-devup-")
        .tempdir_in("/tmp")
        .unwrap();
    // PostgreSQL runs as user postgres when we are root: let it in.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = root.path().join("state");

    let dev = DevUp::start(&state);
    let env = read_env(&state);
    assert_eq!(env["GANGWAY_REGIONS"], "us-east,us-west,eu-central");
    assert!(env["GANGWAY_URL"].starts_with("https://"));
    for var in [
        "GANGWAY_CA_CERT",
        "GANGWAY_TOKEN",
        "GANGWAY_TOKEN_GLOBEX",
        "GANGWAY_ADMIN_TOKEN",
    ] {
        assert!(!env[var].is_empty(), "{var} in the env file");
    }
    let ca = std::fs::read(&env["GANGWAY_CA_CERT"]).unwrap();
    let client = Client::public(
        env["GANGWAY_URL"].clone(),
        env["GANGWAY_TOKEN"].clone(),
        Some(&ca),
    )
    .unwrap();
    let regions = client.regions().await.unwrap().regions;
    assert_eq!(regions.len(), 3);
    for r in &regions {
        assert!(r.healthy, "{} healthy", r.name);
        let status = r.status.as_ref().unwrap();
        let h100 = status
            .capacity
            .iter()
            .find(|c| c.gpu_type == "h100")
            .unwrap();
        assert_eq!(h100.schedulable, 48, "{}: the dev fleet's H100s", r.name);
    }

    // The CLI, as the README shows it: submit --wait through global →
    // region → agent, with everything taken from the env file.
    let out = Command::new(BIN)
        .args([
            "job",
            "submit",
            "--wait",
            "--json",
            "--gpus",
            "16",
            "--gpu-type",
            "h100",
        ])
        .args(["--idempotency-key", "hello-1", "--name", "hello"])
        .args(["--", "sh", "-c", "test \"$WORLD_SIZE\" = 16"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("GANGWAY_STATE_DIR", &state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let job: gangway_shared::api::Job = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    let progress = String::from_utf8_lossy(&out.stderr);
    for step in ["queued", "placed", "started", "finished"] {
        assert!(progress.contains(step), "--wait showed {step}: {progress}");
    }
    // A failing job: --wait exits 3.
    let out = Command::new(BIN)
        .args([
            "job",
            "submit",
            "--wait",
            "--gpus",
            "1",
            "--gpu-type",
            "a100",
            "--",
            "false",
        ])
        .env("GANGWAY_STATE_DIR", &state)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another tenant sees none of it.
    let globex = Client::public(
        env["GANGWAY_URL"].clone(),
        env["GANGWAY_TOKEN_GLOBEX"].clone(),
        Some(&ca),
    )
    .unwrap();
    assert!(globex
        .list(&ListQuery::default())
        .await
        .unwrap()
        .jobs
        .is_empty());
    assert_eq!(
        globex.get(job.id).await.unwrap_err().code(),
        Some("not_found")
    );

    // Reservations through the CLI: one admitted, one that overlaps it
    // refused with the earliest window and the command that reserves it.
    let cli = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env("GANGWAY_STATE_DIR", &state)
            .output()
            .unwrap()
    };
    let start = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() + 3600, 0)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let ask = |json: bool| {
        let mut a = vec![
            "reservation",
            "create",
            "--gpus",
            "48",
            "--gpu-type",
            "h100",
        ];
        a.extend([
            "--region",
            "us-east",
            "--start",
            &start,
            "--duration-s",
            "3600",
        ]);
        if json {
            a.push("--json");
        }
        cli(&a)
    };
    let out = ask(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held: gangway_shared::api::Reservation = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((held.region.as_str(), held.gpus), ("us-east", 48));
    let out = ask(false);
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(why.contains("the earliest window that would work"), "{why}");
    assert!(
        why.contains("to reserve it: gangway reservation create"),
        "{why}"
    );
    let out = cli(&["reservation", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.starts_with("ID") && listed.contains(&held.id.to_string()),
        "{listed}"
    );
    let out = cli(&["reservation", "delete", &held.id.to_string(), "--json"]);
    let gone: gangway_shared::api::Reservation = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gone.state, gangway_shared::api::ReservationState::Deleted);

    dev.interrupt();
    assert!(!state.join("env").exists(), "env file removed on stop");
    for r in ["us-east", "us-west", "eu-central"] {
        let pid = state.join("regions").join(r).join("pg/postmaster.pid");
        assert!(!pid.exists(), "{r}: PostgreSQL still running after Ctrl-C");
    }

    // Starting again on the same dir keeps the data (and the URLs).
    let dev = DevUp::start(&state);
    let env2 = read_env(&state);
    assert_eq!(env2["GANGWAY_URL"], env["GANGWAY_URL"]);
    let jobs = client.list(&ListQuery::default()).await.unwrap().jobs;
    assert_eq!(jobs.len(), 2);
    assert!(jobs
        .iter()
        .any(|j| j.id == job.id && j.state == JobState::Succeeded));
    dev.interrupt();
}
