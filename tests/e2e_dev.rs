//! `gangway dev up` as a user runs it: three regions come up, the env file
//! works, Ctrl-C stops everything, and a second start keeps the data.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gangway_shared::api::{Cluster, ClusterList, ClusterState, JobState};
use gangway_shared::client::{Client, ListQuery};

const BIN: &str = env!("CARGO_BIN_EXE_gangway");

struct DevUp(Child);

impl DevUp {
    fn start(state: &Path) -> DevUp {
        DevUp::start_with(state, &[])
    }

    fn start_with(state: &Path, flags: &[&str]) -> DevUp {
        DevUp::start_env(state, flags, &[])
    }

    fn start_env(state: &Path, flags: &[&str], env: &[(&str, &str)]) -> DevUp {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state.with_extension("log"))
            .unwrap();
        DevUp(
            Command::new(BIN)
                .args(["dev", "up", "--state-dir"])
                .arg(state)
                .args(flags)
                .envs(env.iter().copied())
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

/// The env file `dev up` writes once the cloud is ready; fails at once if
/// `dev up` exits first.
fn read_env(dev: &mut DevUp, state: &Path) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let path = state.join("env");
    let log = || std::fs::read_to_string(state.with_extension("log")).unwrap_or_default();
    while !path.exists() {
        if let Some(status) = dev.0.try_wait().unwrap() {
            panic!(
                "dev up exited ({status}) before it was ready; log: {}",
                log()
            );
        }
        assert!(Instant::now() < deadline, "no env file; log: {}", log());
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

/// A state directory for one `dev up` under /tmp, open to PostgreSQL
/// (it runs as user postgres when we are root).
fn state_root(prefix: &str) -> tempfile::TempDir {
    let root = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// An HTTPS client trusting the cloud's CA (its env file names it).
fn https(env: &BTreeMap<String, String>) -> reqwest::Client {
    let pem = std::fs::read(&env["GANGWAY_CA_CERT"]).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

/// One `gangway dev up` at a time: two choose their ports each on its own,
/// and could choose the same.
static ONE_DEV_UP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_up_runs_three_regions_stops_on_ctrl_c_and_resumes() {
    let _one = ONE_DEV_UP.lock().await;
    let root = state_root("gangway-devup-");
    let state = root.path().join("state");

    let mut dev = DevUp::start(&state);
    let env = read_env(&mut dev, &state);
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
    // An operator reserves on globex's behalf, then deletes it.
    let out = cli(&[
        "reservation",
        "create",
        "--for-tenant",
        "globex",
        "--gpus",
        "8",
        "--gpu-type",
        "h100",
        "--region",
        "us-east",
        "--start",
        &start,
        "--duration-s",
        "60",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: gangway_shared::api::Reservation = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.tenant, "globex");
    assert_eq!(
        globex.get_reservation(theirs.id).await.unwrap().gpus,
        8,
        "globex sees it as its own"
    );
    let out = cli(&[
        "reservation",
        "delete",
        "--operator",
        &theirs.id.to_string(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Dedicated clusters through the CLI: made (the same key: the same
    // cluster), refused when no leaf has the free nodes, shown, listed,
    // grown, run on, and deleted.
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let make = |nodes: &str| {
        let mut a = vec!["cluster", "create", "--gpu-type", "h100", "--nodes", nodes];
        a.extend(["--level", "leaf", "--region", "us-east", "--name", "train"]);
        a.extend(["--idempotency-key", "cl-1", "--json"]);
        cli(&a)
    };
    let made: Cluster = serde_json::from_slice(&ok(make("2")).stdout).unwrap();
    assert_eq!(
        (made.region.as_str(), made.members.len(), made.state),
        ("us-east", 2, ClusterState::Ready)
    );
    assert_eq!(made.name.as_deref(), Some("train"));
    assert_eq!(made.domain.len(), 2, "inside one leaf: {:?}", made.domain);
    let again: Cluster = serde_json::from_slice(&ok(make("2")).stdout).unwrap();
    assert_eq!(again.id, made.id);
    // Each leaf has three H100 nodes besides its spare.
    let out = cli(&[
        "cluster",
        "create",
        "--gpu-type",
        "h100",
        "--nodes",
        "4",
        "--level",
        "leaf",
        "--region",
        "us-east",
    ]);
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(why.contains("cluster_unavailable"), "{why}");
    assert!(why.contains("nothing was bound"), "{why}");
    assert!(why.contains("--level spine"), "{why}");
    let id = made.id.to_string();
    let shown = String::from_utf8_lossy(&ok(cli(&["cluster", "get", &id])).stdout).into_owned();
    assert!(shown.starts_with("ID") && shown.contains(&id), "{shown}");
    assert!(shown.contains("SCHEDULABLE"), "{shown}");
    for m in &made.members {
        assert!(shown.contains(&m.node_id), "{shown}");
    }
    assert!(shown.contains("created"), "{shown}");
    let got: Cluster =
        serde_json::from_slice(&ok(cli(&["cluster", "get", &id, "--json"])).stdout).unwrap();
    assert_eq!(got.events.first().map(|e| e.kind.as_str()), Some("created"));
    let listed = String::from_utf8_lossy(&ok(cli(&["cluster", "list"])).stdout).into_owned();
    assert!(listed.starts_with("ID") && listed.contains(&id), "{listed}");
    let list: ClusterList =
        serde_json::from_slice(&ok(cli(&["cluster", "list", "--json"])).stdout).unwrap();
    assert_eq!(list.clusters.len(), 1);
    let grown: Cluster = serde_json::from_slice(
        &ok(cli(&["cluster", "resize", &id, "--nodes", "3", "--json"])).stdout,
    )
    .unwrap();
    assert_eq!((grown.nodes, grown.members.len()), (3, 3));
    // A job naming the cluster runs there, and only there.
    let out = ok(cli(&[
        "job",
        "submit",
        "--wait",
        "--json",
        "--gpus",
        "8",
        "--gpu-type",
        "h100",
        "--cluster",
        &id,
        "--",
        "true",
    ]));
    let ran: gangway_shared::api::Job = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (ran.region.as_str(), ran.state),
        ("us-east", JobState::Succeeded)
    );
    let node = ran.workers[0].node.clone().unwrap();
    assert!(grown.members.iter().any(|m| m.node_id == node), "{node}");
    // Nothing runs on it now: the delete completes at once.
    let out = ok(cli(&["cluster", "delete", &id, "--wait", "--json"]));
    let gone: Cluster = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gone.state, ClusterState::Deleted);
    let out = cli(&["cluster", "get", &uuid::Uuid::new_v4().to_string()]);
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(why.contains("gangway cluster list"), "{why}");

    dev.interrupt();
    assert!(!state.join("env").exists(), "env file removed on stop");
    for r in ["us-east", "us-west", "eu-central"] {
        let pid = state.join("regions").join(r).join("pg/postmaster.pid");
        assert!(!pid.exists(), "{r}: PostgreSQL still running after Ctrl-C");
    }

    // Starting again on the same dir keeps the data (and the URLs).
    let mut dev = DevUp::start(&state);
    let env2 = read_env(&mut dev, &state);
    assert_eq!(env2["GANGWAY_URL"], env["GANGWAY_URL"]);
    let jobs = client.list(&ListQuery::default()).await.unwrap().jobs;
    assert_eq!(jobs.len(), 3, "hello, the failing one and the cluster's");
    assert!(jobs
        .iter()
        .any(|j| j.id == job.id && j.state == JobState::Succeeded));
    dev.interrupt();
}

/// The drills against a cloud `gangway dev up` runs (issue 7): `gangway
/// chaos region-kill --dev`, then `partition --dev`, break its parts
/// through its control API (a whole region; a region's links), pass, and
/// leave it whole; the control API refuses a caller without its token and
/// names a part it does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_drills_run_against_a_running_dev_cloud_and_leave_it_whole() {
    let _one = ONE_DEV_UP.lock().await;
    let root = state_root("gangway-devchaos-");
    let state = root.path().join("state");
    let mut dev = DevUp::start_with(&state, &["--short-timers"]);
    let env = read_env(&mut dev, &state);
    let endpoint: gangway_chaos::control::Endpoint =
        serde_json::from_slice(&std::fs::read(state.join("control.json")).unwrap()).unwrap();
    let http = reqwest::Client::new();
    let cloud = format!("{}/v1/cloud", endpoint.url);
    let anonymous = http.get(&cloud).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let body: serde_json::Value = anonymous.json().await.unwrap();
    assert_eq!(body["code"], "unauthorized");
    let unknown = http
        .post(format!("{}/v1/cloud/break", endpoint.url))
        .bearer_auth(&endpoint.token)
        .json(&serde_json::json!({"part": "region", "region": "mars"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(body["code"], "unknown_part", "{body}");

    for drill in ["region-kill", "partition"] {
        let out = Command::new(BIN)
            .args(["chaos", drill, "--dev", "--json", "--state-dir"])
            .arg(&state)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{drill}: {e}; exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(out.status.success(), "{drill}: {report:#}");
        assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
        let region = report["region"].as_str().unwrap();
        let moved: Vec<&serde_json::Value> = (report["jobs"].as_array().unwrap().iter())
            .filter(|j| j["home"] == region)
            .collect();
        assert!(!moved.is_empty(), "{report:#}");
        for j in moved {
            assert_eq!(j["epoch"], 2, "{report:#}");
            assert_ne!(j["region"], region, "{report:#}");
            assert_eq!(j["state"], "succeeded", "{report:#}");
        }
        // Whole again: nothing broken, every region healthy.
        let info: gangway_chaos::control::CloudInfo = (http.get(&cloud))
            .bearer_auth(&endpoint.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(
            info.regions.iter().all(|r| r.broken.is_empty())
                && info.globals.iter().all(|g| !g.broken),
            "{info:?}"
        );
    }
    let ca = std::fs::read(&env["GANGWAY_CA_CERT"]).unwrap();
    let client = Client::public(
        env["GANGWAY_URL"].clone(),
        env["GANGWAY_TOKEN"].clone(),
        Some(&ca),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let regions = client
            .regions()
            .await
            .map(|l| l.regions)
            .unwrap_or_default();
        if regions.len() == 3 && regions.iter().all(|r| r.healthy) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not whole after the drills: {regions:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    dev.interrupt();
    assert!(
        !state.join("control.json").exists(),
        "the control endpoint outlived the cloud"
    );
}

/// A Prometheus text exposition's samples: name, labels, value.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            Some((name.to_string(), labels, value.parse().ok()?))
        })
        .collect()
}

/// The sum of `name`'s samples whose labels include every one of `with`.
fn metric(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(text)
        .into_iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

async fn scrape(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// JSON log lines of `file` whose request span has `request_id`.
fn lines_of_request(file: &Path, request_id: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["span"]["request_id"] == request_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_logged_as_json_with_one_id_across_tiers_and_counted_by_route() {
    let _one = ONE_DEV_UP.lock().await;
    let root = state_root("gangway-devobs-");
    let state = root.path().join("state");
    let mut dev = DevUp::start_env(
        &state,
        &["--regions", "us-east", "--log-format", "json"],
        &[("GANGWAY_LOG", "info,gangway::access=debug")],
    );
    let env = read_env(&mut dev, &state);
    let http = https(&env);
    let url = &env["GANGWAY_URL"];
    let token = &env["GANGWAY_TOKEN"];
    let global_metrics = &env["GANGWAY_GLOBAL_METRICS_URL"];
    let creates = |text: &str| {
        metric(
            text,
            "gangway_http_request_duration_seconds_count",
            &[("route", "/v1/jobs"), ("method", "POST")],
        )
    };
    let before = creates(&scrape(global_metrics).await);

    // A create with the caller's own request id: answered with it, and
    // the region's log lines of the create carry it too.
    let resp = http
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(token)
        .header("x-request-id", "e2e-obs-create.1")
        .json(&serde_json::json!({
            "name": "observed", "gpus": 1, "gpus_per_worker": 1, "gpu_type": "h100",
            "priority": "normal", "estimated_duration_s": 60, "command": ["true"]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{:?}", resp.text().await);
    assert_eq!(resp.headers()["x-request-id"], "e2e-obs-create.1");
    let job: gangway_shared::api::Job = resp.json().await.unwrap();
    let resp = http
        .get(format!("{url}/v1/jobs/{}", job.id))
        .bearer_auth(token)
        .header("x-request-id", "e2e-obs-get.1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // An id a caller should not be able to put into log lines is replaced
    // by one of ours.
    let resp = http
        .get(format!("{url}/v1/jobs"))
        .bearer_auth(token)
        .header("x-request-id", "evil\" id {injected}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let given = resp.headers()["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(given).is_ok(), "replaced: {given}");

    // Logs: every line of the global tier's is a JSON object; the create's
    // lines name its tenant in both tiers; the read's names the job.
    let logs = state.join("logs");
    let global_log = logs.join("global.log");
    let region_log = logs.join("us-east-region.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let in_global = lines_of_request(&global_log, "e2e-obs-create.1");
        let in_region = lines_of_request(&region_log, "e2e-obs-create.1");
        let read = lines_of_request(&global_log, "e2e-obs-get.1");
        let done = in_global
            .iter()
            .any(|l| l["span"]["tenant"] == "acme" && l["target"] == "gangway::access")
            && in_region
                .iter()
                .any(|l| l["span"]["tenant"] == "acme" && l["target"] == "gangway::access")
            && read
                .iter()
                .any(|l| l["span"]["job_id"] == job.id.to_string());
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the create's and the read's log lines: global {in_global:?}, region {in_region:?}, \
             read {read:?}; files in {}",
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = std::fs::read_to_string(&global_log).unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a global log line that is not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
    }

    // Metrics: the create counted by its route (never its ids), and timed;
    // the read by its route template; the global tier's calls to the
    // region timed; the agent's syncs timed.
    let text = scrape(global_metrics).await;
    assert_eq!(creates(&text) - before, 1.0, "one more create timed");
    assert!(
        metric(
            &text,
            "gangway_http_requests_total",
            &[("route", "/v1/jobs"), ("method", "POST"), ("status", "201")]
        ) >= 1.0
    );
    assert!(
        metric(
            &text,
            "gangway_http_requests_total",
            &[
                ("route", "/v1/jobs/{id}"),
                ("method", "GET"),
                ("status", "200")
            ]
        ) >= 1.0
    );
    assert!(
        !text.contains(&job.id.to_string()),
        "no job id in a label: {text}"
    );
    assert!(
        metric(
            &text,
            "gangway_global_region_call_seconds_count",
            &[("region", "us-east")]
        ) >= 1.0
    );
    let region = scrape(&env["GANGWAY_REGION_US_EAST_METRICS_URL"]).await;
    assert!(
        metric(
            &region,
            "gangway_http_requests_total",
            &[("route", "/v1/jobs"), ("method", "POST"), ("status", "201")]
        ) >= 1.0,
        "{region}"
    );
    let agent = scrape(&env["GANGWAY_REGION_US_EAST_AGENT_METRICS_URL"]).await;
    assert!(
        metric(&agent, "gangway_agent_sync_seconds_count", &[]) >= 1.0,
        "{agent}"
    );
    assert!(agent.contains("gangway_agent_workers"), "{agent}");
    dev.interrupt();
}

/// The public API as a user's HTTP client calls it: status and JSON body.
struct Api(reqwest::Client);

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        token: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.0.request(method, url).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    }

    async fn get(&self, url: &str, token: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::GET, url, token, None).await
    }

    async fn post(
        &self,
        url: &str,
        token: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::POST, url, token, Some(body))
            .await
    }

    async fn delete(&self, url: &str, token: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::DELETE, url, token, None).await
    }
}

/// An answer that is `status` with `code`.
fn refused((status, body): (u16, serde_json::Value), want: u16, code: &str) {
    assert_eq!(
        (status, body["code"].as_str()),
        (want, Some(code)),
        "{body}"
    );
}

/// Polls `check` until it holds, for at most `within`.
async fn within<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn job_body(name: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name, "gpus": 1, "gpus_per_worker": 1, "gpu_type": "h100",
        "priority": "normal", "estimated_duration_s": 3600, "command": ["train"]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_and_suspended_tenants_are_refused_by_every_replica_within_seconds() {
    use serde_json::json;
    let _one = ONE_DEV_UP.lock().await;
    let root = state_root("gangway-devkeys-");
    let state = root.path().join("state");
    let mut dev = DevUp::start_with(&state, &["--globals", "2", "--executor", "sim"]);
    let env = read_env(&mut dev, &state);
    let api = Api(https(&env));
    let replicas: Vec<&str> = env["GANGWAY_GLOBAL_REPLICAS"].split(',').collect();
    let [a, b] = replicas[..] else {
        panic!("two replicas: {replicas:?}")
    };
    let acme = env["GANGWAY_TOKEN"].as_str();
    let globex = env["GANGWAY_TOKEN_GLOBEX"].as_str();
    let admin = env["GANGWAY_ADMIN_TOKEN"].as_str();
    // The promise: every replica refuses within 5 s; a margin for a slow
    // machine's polling.
    let promised = Duration::from_secs(5 + 5);

    // A tenant makes a read key and a submit key on one replica.
    let keys_a = format!("{a}/v1/keys");
    let (s, read) = api
        .post(&keys_a, acme, json!({"name": "dash", "scope": "read"}))
        .await;
    assert_eq!(s, 201, "{read}");
    let (s, ci) = api
        .post(
            &keys_a,
            acme,
            json!({"name": "ci", "expires_in_s": 7_776_000}),
        )
        .await;
    assert_eq!(s, 201, "{ci}");
    let read_secret = read["secret"].as_str().unwrap().to_string();
    let ci_secret = ci["secret"].as_str().unwrap().to_string();
    let ci_id = ci["key"]["key_id"].as_str().unwrap().to_string();
    assert!(ci_secret.starts_with("gwk_") && ci_secret.contains(&ci_id));
    assert_eq!(
        (ci["key"]["scope"].as_str(), ci["key"]["tenant"].as_str()),
        (Some("submit"), Some("acme"))
    );
    // Bad requests change nothing.
    for bad in [
        json!({"name": "x", "scope": "admin"}),
        json!({"name": "x", "tenant": "globex"}),
        json!({"name": "has space"}),
        json!({"name": "x", "expires_in_s": 0}),
    ] {
        refused(api.post(&keys_a, acme, bad).await, 422, "invalid_api_key");
    }

    // The other replica serves both keys, each within its scope.
    let (s, job) = api
        .post(&format!("{b}/v1/jobs"), &ci_secret, job_body("by-key"))
        .await;
    assert_eq!((s, job["tenant"].as_str()), (201, Some("acme")), "{job}");
    assert_eq!(api.get(&format!("{b}/v1/jobs"), &read_secret).await.0, 200);
    let by_read_key = api
        .post(&format!("{b}/v1/jobs"), &read_secret, job_body("no"))
        .await;
    refused(by_read_key, 403, "key_scope");
    refused(
        api.get(&format!("{b}/v1/admin/tenants"), &ci_secret).await,
        403,
        "key_scope",
    );
    // A forged key (a real id, another secret) and a made-up one are refused.
    let forged = format!("gwk_{ci_id}_{}", "0".repeat(64));
    let made_up = format!("gwk_0123456789abcdef_{}", "ab".repeat(32));
    for token in [&forged, &made_up] {
        assert_eq!(api.get(&format!("{b}/v1/jobs"), token).await.0, 401);
    }
    // Another tenant sees none of them and cannot revoke them.
    let (s, theirs) = api.get(&format!("{b}/v1/keys"), globex).await;
    assert_eq!(
        (s, theirs["keys"].as_array().unwrap().len()),
        (200, 0),
        "{theirs}"
    );
    assert_eq!(
        api.delete(&format!("{b}/v1/keys/{ci_id}"), globex).await.0,
        404
    );
    // The tenant's list, from either replica: both keys, no secret or
    // hash, and the used one's last use once a replica noted it.
    within(promised, "the key's last use listed", || async {
        let (s, mine) = api.get(&keys_a, acme).await;
        let text = mine.to_string();
        assert!(
            s == 200 && !text.contains(&ci_secret[21..]) && !text.contains("sha256"),
            "{text}"
        );
        let keys = mine["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        keys.iter()
            .any(|k| k["key_id"] == ci_id.as_str() && k["last_used_at"].is_string())
    })
    .await;

    // Revoked on one replica: refused there at once, on the other (which
    // let it in a moment ago, so holds it in its cache) within seconds.
    assert_eq!(api.get(&format!("{b}/v1/jobs"), &ci_secret).await.0, 200);
    let (s, revoked) = api.delete(&format!("{a}/v1/keys/{ci_id}"), acme).await;
    assert!(s == 200 && revoked["revoked_at"].is_string(), "{revoked}");
    let at_once = api.get(&format!("{a}/v1/jobs"), &ci_secret).await.0;
    assert_eq!(at_once, 401, "the revoking replica refuses it at once");
    within(
        promised,
        "the other replica refuses the revoked key",
        || async { api.get(&format!("{b}/v1/jobs"), &ci_secret).await.0 == 401 },
    )
    .await;
    // The read key is untouched.
    assert_eq!(api.get(&format!("{a}/v1/jobs"), &read_secret).await.0, 200);

    // An operator's key works on admin endpoints only; a tenant's token
    // makes no operator key.
    let ops = json!({"name": "ops-bot", "scope": "admin"});
    let (s, op) = api
        .post(&format!("{a}/v1/admin/keys"), admin, ops.clone())
        .await;
    assert_eq!(s, 201, "{op}");
    let op_secret = op["secret"].as_str().unwrap();
    assert_eq!(
        api.get(&format!("{b}/v1/admin/tenants"), op_secret).await.0,
        200
    );
    refused(
        api.get(&format!("{b}/v1/jobs"), op_secret).await,
        403,
        "key_scope",
    );
    assert_eq!(
        api.post(&format!("{a}/v1/admin/keys"), acme, ops).await.0,
        403
    );

    // Tenants as records: made once, suspended on one replica and refused
    // on both (token and key alike), its job stopped; another tenant
    // untouched; resumed.
    let tenants = |r: &str| format!("{r}/v1/admin/tenants");
    let (s, t) = api
        .post(
            &tenants(a),
            admin,
            json!({"tenant": "acme", "display_name": "Acme Corp"}),
        )
        .await;
    assert_eq!((s, t["state"].as_str()), (201, Some("active")), "{t}");
    refused(
        api.post(&tenants(b), admin, json!({"tenant": "acme"}))
            .await,
        409,
        "tenant_exists",
    );
    refused(
        api.post(&tenants(b), admin, json!({"tenant": "Not Ok"}))
            .await,
        422,
        "invalid_tenant",
    );
    let suspend = json!({"stop_jobs": true});
    let (s, changed) = api
        .post(&format!("{}/acme/suspend", tenants(b)), admin, suspend)
        .await;
    assert_eq!(
        (s, changed["tenant"]["state"].as_str()),
        (200, Some("suspended")),
        "{changed}"
    );
    assert!(changed["stopped_jobs"].as_u64().unwrap() >= 1, "{changed}");
    for replica in [a, b] {
        for token in [acme, read_secret.as_str()] {
            within(promised, "a suspended tenant refused", || async {
                let (s, e) = api.get(&format!("{replica}/v1/jobs"), token).await;
                s == 403 && e["code"] == "tenant_suspended"
            })
            .await;
        }
        let other = api.get(&format!("{replica}/v1/jobs"), globex).await.0;
        assert_eq!(other, 200, "another tenant is served");
    }
    let (s, list) = api.get(&tenants(a), admin).await;
    assert_eq!(s, 200);
    assert_eq!(list["tenants"][0]["tenant"], "acme");
    assert_eq!(list["tenants"][0]["state"], "suspended");
    let (s, audit) = api
        .get(&format!("{a}/v1/admin/audit?action=tenant.suspend"), admin)
        .await;
    assert!(
        s == 200 && audit.to_string().contains("tenant/acme"),
        "{audit}"
    );
    let (s, _) = api
        .post(&format!("{}/acme/resume", tenants(a)), admin, json!({}))
        .await;
    assert_eq!(s, 200);
    for replica in [a, b] {
        within(promised, "a resumed tenant served", || async {
            api.get(&format!("{replica}/v1/jobs"), acme).await.0 == 200
        })
        .await;
    }
    dev.interrupt();
}

/// The text of a job's output read so far: `(rank, stream) → text`.
fn output_of(chunks: &[serde_json::Value]) -> BTreeMap<(u64, String), String> {
    let mut out: BTreeMap<(u64, String), String> = BTreeMap::new();
    for c in chunks {
        let key = (
            c["rank"].as_u64().unwrap(),
            c["stream"].as_str().unwrap().to_string(),
        );
        out.entry(key)
            .or_default()
            .push_str(c["text"].as_str().unwrap());
    }
    out
}

/// `GET {logs}?follow=true` as `token`, in the background: the chunks
/// the stream gave once it ended.
fn follow_logs(
    http: &reqwest::Client,
    logs: &str,
    token: &str,
) -> tokio::task::JoinHandle<Vec<serde_json::Value>> {
    let (http, logs, token) = (http.clone(), logs.to_string(), token.to_string());
    tokio::spawn(async move {
        let resp = http
            .get(format!("{logs}?follow=true"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        let body = resp.text().await.unwrap();
        body.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_output_is_read_while_it_runs_followed_and_kept_after_its_node_is_lost_or_it_moves()
{
    use serde_json::json;
    let _one = ONE_DEV_UP.lock().await;
    let root = state_root("gangway-devlogs-");
    let state = root.path().join("state");
    let mut dev = DevUp::start_with(&state, &["--regions", "us-east,us-west"]);
    let env = read_env(&mut dev, &state);
    let http = https(&env);
    let api = Api(http.clone());
    let url = env["GANGWAY_URL"].clone();
    let acme = env["GANGWAY_TOKEN"].clone();
    let globex = env["GANGWAY_TOKEN_GLOBEX"].as_str();
    let submit = |script: &str| {
        json!({
            "name": "talker", "gpus": 2, "gpus_per_worker": 1, "gpu_type": "h100",
            "priority": "normal", "estimated_duration_s": 60,
            "command": ["sh", "-c", script]
        })
    };

    // Two ranks, each writing a line every 0.2 s for 5 s, then one to stderr.
    let script =
        "for i in $(seq 1 25); do echo \"out $RANK $i\"; sleep 0.2; done; echo \"err $RANK\" >&2";
    let (s, job) = api
        .post(&format!("{url}/v1/jobs"), &acme, submit(script))
        .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let logs = format!("{url}/v1/jobs/{id}/logs");

    // Followed from the start, as a stream of chunks.
    let follow = follow_logs(&http, &logs, &acme);
    // Readable while it runs.
    within(
        Duration::from_secs(60),
        "output while the job runs",
        || async {
            let (s, l) = api.get(&logs, &acme).await;
            assert_eq!(s, 200, "{l}");
            let out = output_of(l["chunks"].as_array().unwrap());
            let running = !l["finished"].as_bool().unwrap();
            running
                && out
                    .get(&(0, "stdout".into()))
                    .is_some_and(|t| t.contains("out 0 3\n"))
        },
    )
    .await;
    // Another tenant gets nothing, not even that it exists.
    assert_eq!(api.get(&logs, globex).await.0, 404);

    // The stream ends with the job, every line of both ranks in it, in order.
    let followed = tokio::time::timeout(Duration::from_secs(120), follow)
        .await
        .expect("the follow ends once the job has")
        .unwrap();
    let out = output_of(&followed);
    for rank in [0u64, 1] {
        let want: String = (1..=25).map(|i| format!("out {rank} {i}\n")).collect();
        assert_eq!(out[&(rank, "stdout".to_string())], want);
        assert_eq!(out[&(rank, "stderr".to_string())], format!("err {rank}\n"));
    }
    // After it ended: one rank's, read whole again.
    let (s, l) = api.get(&format!("{logs}?rank=1"), &acme).await;
    assert!(s == 200 && l["finished"] == true, "{l}");
    let out = output_of(l["chunks"].as_array().unwrap());
    assert_eq!(
        out.keys().map(|k| k.0).collect::<BTreeSet<_>>(),
        BTreeSet::from([1])
    );
    refused(
        api.get(&format!("{logs}?rank=x"), &acme).await,
        400,
        "invalid_query",
    );
    // The CLI prints one rank's, stdout and stderr apart.
    let out = Command::new(BIN)
        .args(["job", "logs", &id, "--rank", "0"])
        .env("GANGWAY_STATE_DIR", &state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("out 0 1\n") && stdout.ends_with("out 0 25\n"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("err 0"));

    // A job that moves to the other region and back (an evacuation of its
    // region, then the fail back): one cursor reads its output whole, each
    // part from the region that ran it, in the order it was written.
    let gangway = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("GANGWAY_STATE_DIR", &state)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    let mover = "step=0; [ -n \"$GANGWAY_RESTORE_FROM\" ] && step=$(cat \"$GANGWAY_RESTORE_FROM/step\"); \
        echo \"from $step\"; d=$GANGWAY_CHECKPOINT_DIR; \
        trap 'mkdir -p \"$d/.t\" && echo $step > \"$d/.t/step\" && mv \"$d/.t\" \"$d/s$step\"' USR1; \
        trap 'exit 143' TERM; \
        while [ $step -lt 150 ]; do step=$((step+1)); echo \"step $step\"; sleep 0.1 & wait $!; done; \
        echo done";
    let mut body = submit(mover);
    body["gpus"] = json!(1);
    let (s, job) = api.post(&format!("{url}/v1/jobs"), &acme, body).await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().unwrap();
    let (home, away) = match job["region"].as_str().unwrap() {
        "us-east" => ("us-east", "us-west"),
        _ => ("us-west", "us-east"),
    };
    let logs = format!("{url}/v1/jobs/{id}/logs");
    let follow = follow_logs(&http, &logs, &acme);
    let has = |region: &'static str, text: &'static str| {
        let (api, logs, acme) = (&api, &logs, &acme);
        move || async move {
            let (_, l) = api.get(logs, acme).await;
            (l["chunks"].as_array().into_iter().flatten())
                .any(|c| c["region"] == region && c["text"].as_str().unwrap().contains(text))
        }
    };
    within(
        Duration::from_secs(60),
        "output at home",
        has(home, "step 5\n"),
    )
    .await;
    gangway(&[
        "region", "evacuate", home, "--reason", "e2e", "--wait-s", "120",
    ]);
    within(Duration::from_secs(60), "output away", has(away, "step")).await;
    gangway(&["region", "failback", home, "--wait-s", "120"]);
    within(
        Duration::from_secs(120),
        "the mover succeeded at home",
        || async {
            let (_, j) = api.get(&format!("{url}/v1/jobs/{id}"), &acme).await;
            j["state"] == "succeeded" && j["region"] == home
        },
    )
    .await;
    // Read page by page, as a client would, to the end.
    let (mut read, mut after) = (Vec::new(), String::new());
    loop {
        let (s, l) = api.get(&format!("{logs}?after={after}"), &acme).await;
        assert_eq!(s, 200, "{l}");
        read.extend(l["chunks"].as_array().unwrap().iter().cloned());
        after = l["next_after"].as_str().unwrap().to_string();
        if !l["more"].as_bool().unwrap() {
            assert!(l["finished"].as_bool().unwrap(), "{l}");
            break;
        }
    }
    let mut regions: Vec<&str> = read.iter().map(|c| c["region"].as_str().unwrap()).collect();
    regions.dedup();
    assert_eq!(
        regions,
        [home, away, home],
        "ran at home, away, then home again"
    );
    let text: String = (read.iter())
        .filter(|c| c["stream"] == "stdout")
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert!(text.starts_with("from 0\nstep 1\n"), "{text}");
    assert!(text.ends_with("step 150\ndone\n"), "{text}");
    assert_eq!(text.matches("from ").count(), 3, "{text}");
    // Nothing after the last cursor; a cursor not made by a read is refused.
    let (s, l) = api.get(&format!("{logs}?after={after}"), &acme).await;
    assert!(s == 200 && l["chunks"] == json!([]), "{l}");
    refused(
        api.get(&format!("{logs}?after=42"), &acme).await,
        400,
        "invalid_query",
    );
    // The stream that followed it from the start saw the same chunks, each
    // once (in the same order but where a region was slow to answer).
    let followed = tokio::time::timeout(Duration::from_secs(60), follow)
        .await
        .expect("the follow ends once the job has")
        .unwrap();
    let by_region = |mut chunks: Vec<serde_json::Value>| {
        chunks.sort_by_key(|c| (c["region"].to_string(), c["seq"].as_i64()));
        chunks
    };
    assert_eq!(by_region(followed), by_region(read.clone()));
    // The CLI says where each part ran.
    let (stdout, stderr) = gangway(&["job", "logs", id, "--rank", "0"]);
    assert_eq!(stdout, text);
    assert!(
        stderr.contains(&format!("output of the attempt in region {away}"))
            && stderr.contains(&format!("output of the attempt in region {home}")),
        "{stderr}"
    );

    // A job whose machine dies (its agent and workers killed, its disk
    // wiped): what it wrote is read from the region, not from the node.
    let (s, job) = api
        .post(
            &format!("{url}/v1/jobs"),
            &acme,
            submit("i=0; while true; do i=$((i+1)); echo \"tick $i\"; sleep 0.2; done"),
        )
        .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let region = job["region"].as_str().unwrap().to_string();
    let logs = format!("{url}/v1/jobs/{id}/logs");
    within(
        Duration::from_secs(60),
        "the second job's output",
        || async {
            let (_, l) = api.get(&logs, &acme).await;
            l.to_string().contains("tick 5\\n")
        },
    )
    .await;
    let agent_dir = state.join("regions").join(&region).join("agent");
    let killed = Command::new("pkill")
        .args(["-KILL", "-f"])
        .arg(agent_dir.to_str().unwrap())
        .status()
        .unwrap();
    assert!(killed.success(), "the agent was running");
    std::fs::remove_dir_all(agent_dir.join("jobs").join(&id)).unwrap();
    let (s, l) = api.get(&format!("{logs}?rank=0"), &acme).await;
    assert_eq!(s, 200);
    let out = output_of(l["chunks"].as_array().unwrap());
    assert!(out[&(0, "stdout".to_string())].starts_with("tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n"));
    dev.interrupt();
}

/// A span as an OTLP receiver got it: service, name, ids, attributes.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf) on loopback that
/// keeps every span it is sent; its address.
async fn otlp_receiver() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = got.clone();
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut spans = keep.lock().unwrap();
                for rs in req.resource_spans {
                    let service = (rs.resource.iter())
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .map(|a| text(&a.value))
                        .unwrap_or_default();
                    for s in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        spans.push(Received {
                            service: service.clone(),
                            name: s.name,
                            trace_id: s.trace_id,
                            span_id: s.span_id,
                            parent_span_id: s.parent_span_id,
                            attributes: (s.attributes.iter())
                                .map(|a| (a.key.clone(), text(&a.value)))
                                .collect(),
                        });
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_request_from_the_global_tier_to_the_regions_database() {
    let _one = ONE_DEV_UP.lock().await;
    let (addr, spans) = otlp_receiver().await;
    let root = state_root("gangway-devtrace-");
    let state = root.path().join("state");
    let endpoint = format!("http://{addr}");
    let mut dev = DevUp::start_env(
        &state,
        &["--regions", "us-east", "--executor", "sim"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let env = read_env(&mut dev, &state);
    let http = https(&env);
    let (url, token) = (&env["GANGWAY_URL"], &env["GANGWAY_TOKEN"]);
    let (_, job) = Api(http.clone())
        .post(&format!("{url}/v1/jobs"), token, job_body("traced"))
        .await;
    let resp = http
        .get(format!("{url}/v1/jobs/{}", job["id"].as_str().unwrap()))
        .bearer_auth(token)
        .header("x-request-id", "trace-me-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // The read's request span in the global tier, the region's request
    // span under it, and the region's database work under that: one trace.
    let mut last = Vec::new();
    within(
        Duration::from_secs(60),
        "the read's spans, one trace across tiers",
        || {
            let got = spans.lock().unwrap().clone();
            let of_request = |service: &str| -> Vec<Received> {
                got.iter()
                    .filter(|s| {
                        s.service == service
                            && s.name == "request"
                            && s.attributes.get("request_id").map(String::as_str)
                                == Some("trace-me-1")
                    })
                    .cloned()
                    .collect()
            };
            let (global, region) = (of_request("gangway-global"), of_request("gangway-region"));
            let linked = global.iter().any(|g| {
                region.iter().any(|r| {
                    let in_trace = |s: &Received| s.trace_id == g.trace_id;
                    r.trace_id == g.trace_id
                        && got.iter().any(|p| {
                            in_trace(p)
                                && p.service == "gangway-global"
                                && p.span_id == r.parent_span_id
                        })
                        && got.iter().any(|d| {
                            in_trace(d)
                                && d.name == "db"
                                && d.parent_span_id == r.span_id
                                && d.attributes.get("db.operation").map(String::as_str)
                                    == Some("get_job")
                                && d.attributes.get("db.system").map(String::as_str)
                                    == Some("postgresql")
                        })
                })
            });
            last = got;
            async move { linked }
        },
    )
    .await;
    assert!(!last.is_empty());
    dev.interrupt();
}
