//! `gangway dev up` as a user runs it: three regions come up, the env file
//! works, Ctrl-C stops everything, and a second start keeps the data.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_shared::api::{JobMode, JobSpec, JobState};
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
    for region in ["US_EAST", "US_WEST", "EU_CENTRAL"] {
        let url = &env[&format!("GANGWAY_REGION_{region}_URL")];
        let status = Client::new(url.clone(), "acme")
            .region_status()
            .await
            .unwrap();
        let h100 = status
            .capacity
            .iter()
            .find(|c| c.gpu_type == "h100")
            .unwrap();
        assert_eq!(h100.schedulable, 48, "{region}: the dev fleet's H100s");
    }
    let client = Client::new(env["GANGWAY_URL"].clone(), env["GANGWAY_TENANT"].clone());
    let spec = JobSpec {
        name: "hello".into(),
        gpus: 16,
        gpu_type: "h100".into(),
        priority: Default::default(),
        estimated_duration_s: 60,
        max_duration_s: None,
        command: vec!["sh".into(), "-c".into(), "test \"$WORLD_SIZE\" = 16".into()],
        env: Default::default(),
        gpus_per_worker: None,
        mode: JobMode::Gang,
        topology: Default::default(),
    };
    let job = client.submit(&spec, Some("hello-1")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j = client.get(job.id).await.unwrap();
        if j.state == JobState::Succeeded {
            break;
        }
        assert!(!j.state.is_terminal(), "job ended {}: {j:?}", j.state);
        assert!(Instant::now() < deadline, "job stuck in {}", j.state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, job.id);
    assert_eq!(jobs[0].state, JobState::Succeeded);
    dev.interrupt();
}
