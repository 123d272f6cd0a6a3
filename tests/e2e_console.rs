//! The web console in a real browser (headless Chromium through its
//! ChromeDriver) against a cloud of real processes: three `gangway
//! region`s, `gangway global` on HTTPS, simulated agents. A tenant signs
//! in, submits a job with the CLI and watches it appear and finish on the
//! console without reloading; opens its timeline; another tenant sees
//! none of it; an operator sees the regions, and the fleet map colour a
//! node the CLI cordoned; every page also in a narrow window. The
//! browser reports no Content-Security-Policy violation. Screenshots of
//! the main pages are written where the test prints (`screenshots:`).

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gangway_chaos::browser::Browser;
use gangway_chaos::cloud::{Cloud, Executor};
use support::BIN;

/// `gangway args…` with `flags` (the connection's) before any `--`.
fn cli(flags: &[String], args: &[&str]) -> String {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let out = Command::new(BIN)
        .args(&args[..split])
        .args(flags)
        .args(&args[split..])
        .output()
        .expect("the CLI runs");
    assert!(
        out.status.success(),
        "gangway {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Where the screenshots go: `$GANGWAY_CONSOLE_SCREENSHOTS`, else under
/// the build's test directory.
fn screenshots() -> PathBuf {
    let dir = std::env::var_os("GANGWAY_CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    // Straight to the process's standard error, past the test harness's
    // capture: the log of a passing run says it too.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "screenshots: {}", dir.display());
    dir
}

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_from_the_cli_is_watched_to_its_end_and_an_operator_sees_the_fleet() {
    let cloud = Cloud::start_with(std::path::Path::new(BIN), true, Executor::Sim).await;
    // The operator's price book (the global tier reads it at each request).
    std::fs::write(
        cloud.dir.path().join("prices.toml"),
        "currency = \"USD\"\nprovider = \"Gangway (test)\"\n[[price]]\ngpu_type = \"h100\"\n\
         effective = \"2020-01-01T00:00:00Z\"\nper_gpu_hour = 2.49\n",
    )
    .unwrap();
    let shots = screenshots();
    let shot = |name: &str| shots.join(format!("{name}.png"));
    let browser = Browser::start(cloud.dir.path(), 1280, 900)
        .await
        .expect("headless Chromium (apt-get install -y chromium chromium-driver)");
    let base = cloud.tenant.base().trim_end_matches('/').to_string();
    // Signs out whoever is signed in (the button in the page's corner),
    // then in with `credential`.
    let sign_in = |credential: String| {
        let (browser, base) = (&browser, &base);
        async move {
            if let Some(out) = browser.find(".who button").await.unwrap() {
                browser.click(&out).await.unwrap();
            } else {
                browser.goto(&format!("{base}/")).await.unwrap();
            }
            let field = browser.wait_for("#credential", WAIT).await.unwrap();
            browser.type_into(&field, &credential).await.unwrap();
            let button = browser.find("#sign-in").await.unwrap().unwrap();
            browser.click(&button).await.unwrap();
        }
    };

    // A tenant signs in: its (empty) list of jobs.
    browser.goto(&format!("{base}/")).await.unwrap();
    browser.wait_for("#credential", WAIT).await.unwrap();
    browser.screenshot(&shot("sign-in")).await.unwrap();
    let (token, acme) = cloud.tenant_cli("acme");
    sign_in(token).await;
    browser.wait_for("#no-jobs", WAIT).await.unwrap();

    // A job submitted with the CLI appears, runs and finishes on the page
    // as it stands: the page refreshes itself.
    let out = cli(
        &acme,
        &[
            "job",
            "submit",
            "--json",
            "--name",
            "console-demo",
            "--gpus",
            "16",
            "--gpu-type",
            "h100",
            "--estimated-duration-s",
            "200",
            "--",
            "train",
        ],
    );
    let job: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    // And one that stays running (its simulated run is 1,000 s), in r1.
    cli(
        &acme,
        &[
            "job",
            "submit",
            "--name",
            "console-long",
            "--gpus",
            "8",
            "--gpu-type",
            "h100",
            "--region",
            "r1",
            "--estimated-duration-s",
            "20000",
            "--",
            "train",
        ],
    );
    let row = format!("tr[data-job='{id}']");
    browser.wait_for(&row, WAIT).await.unwrap();
    browser
        .wait_for(&format!("{row}[data-state='running']"), WAIT)
        .await
        .unwrap();
    browser.screenshot(&shot("jobs")).await.unwrap();
    browser
        .wait_for(&format!("{row}[data-state='succeeded']"), WAIT)
        .await
        .unwrap();

    // Its timeline: queued → placed (on which nodes and GPUs, at which
    // level) → started → finished.
    let link = browser
        .find(&format!("{row} a"))
        .await
        .unwrap()
        .expect("the job links to its page");
    browser.click(&link).await.unwrap();
    browser
        .wait_for("#timeline li[data-kind='finished']", WAIT)
        .await
        .unwrap();
    for kind in ["queued", "placed", "started"] {
        assert!(
            browser
                .find(&format!("#timeline li[data-kind='{kind}']"))
                .await
                .unwrap()
                .is_some(),
            "the timeline shows {kind}"
        );
    }
    let placement = browser
        .find("#timeline li[data-kind='placed'] .placement")
        .await
        .unwrap()
        .expect("the placement names its nodes and GPUs");
    let placed = browser.text(&placement).await.unwrap();
    assert!(placed.contains("GPUs 0, 1, 2"), "{placed}");
    let state = browser.find("#job-state").await.unwrap().unwrap();
    assert_eq!(browser.text(&state).await.unwrap(), "succeeded");
    browser.screenshot(&shot("job")).await.unwrap();

    browser.goto(&format!("{base}/usage")).await.unwrap();
    browser.wait_for("#gpu-hours", WAIT).await.unwrap();
    let billed = browser
        .wait_for("#billed", WAIT)
        .await
        .expect("the month's costs, priced by the book");
    assert!(browser.text(&billed).await.unwrap().ends_with("USD"));
    browser.screenshot(&shot("usage")).await.unwrap();
    let csp: Vec<String> = (browser.severe_logs().await.unwrap().into_iter())
        .filter(|m| m.contains("Content Security Policy") || m.contains("Refused"))
        .collect();
    assert!(csp.is_empty(), "the pages broke their own policy: {csp:?}");

    // Another tenant: none of acme's jobs, and acme's job's page is not
    // found.
    let (token, _) = cloud.tenant_cli("globex");
    sign_in(token).await;
    browser.wait_for("#no-jobs", WAIT).await.unwrap();
    assert!(!browser.source().await.unwrap().contains(&id));
    browser.goto(&format!("{base}/jobs/{id}")).await.unwrap();
    browser.wait_for("#error", WAIT).await.unwrap();
    let page = browser.source().await.unwrap();
    assert!(
        !page.contains("console-demo"),
        "globex sees acme's job: {page}"
    );

    // An operator: the regions, then the fleet map colours a node the
    // CLI cordons.
    let (_, ops) = cloud.operator();
    let admin_token = ops[ops.iter().position(|f| f == "--admin-token").unwrap() + 1].clone();
    sign_in(admin_token).await;
    browser.wait_for("[data-region='r1']", WAIT).await.unwrap();
    browser.screenshot(&shot("regions")).await.unwrap();
    let nodes: serde_json::Value = serde_json::from_str(&cli(
        &ops,
        &["admin", "node", "list", "--region", "r1", "--json"],
    ))
    .unwrap();
    let node = nodes["regions"]["r1"]["nodes"][0]["node_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a node of r1: {nodes}"))
        .to_string();
    browser.goto(&format!("{base}/fleet/r1")).await.unwrap();
    browser
        .wait_for(&format!("[data-node='{node}']"), WAIT)
        .await
        .unwrap();
    cli(
        &ops,
        &[
            "admin",
            "node",
            "cordon",
            &node,
            "--region",
            "r1",
            "--reason",
            "console test",
        ],
    );
    browser
        .wait_for(
            &format!("[data-node='{node}'][data-state='cordoned']"),
            WAIT,
        )
        .await
        .unwrap();
    browser.screenshot(&shot("fleet")).await.unwrap();
    // The queue by tenant: acme's long job, placed, in the CLI and on the
    // page.
    let queue: serde_json::Value =
        serde_json::from_str(&cli(&ops, &["admin", "queue", "--region", "r1", "--json"])).unwrap();
    let acme_row = queue["regions"]["r1"]["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["tenant"] == "acme").cloned())
        .unwrap_or_else(|| panic!("acme in r1's queue: {queue}"));
    assert_eq!(acme_row["active_gpus"].as_u64(), Some(8), "{acme_row}");
    for (page, marker, name) in [
        ("/queue", "#queue-tenants", "queue"),
        ("/audit", "tr[data-action='node.cordon']", "audit"),
        ("/maintenance", "main h1", "maintenance"),
    ] {
        browser.goto(&format!("{base}{page}")).await.unwrap();
        browser.wait_for(marker, WAIT).await.unwrap();
        browser.screenshot(&shot(name)).await.unwrap();
    }

    // A narrow window: the map still draws, a column of leaves.
    browser.resize(420, 900).await.unwrap();
    browser.goto(&format!("{base}/fleet/r1")).await.unwrap();
    browser
        .wait_for(&format!("[data-node='{node}']"), WAIT)
        .await
        .unwrap();
    browser.screenshot(&shot("fleet-narrow")).await.unwrap();
    let csp: Vec<String> = (browser.severe_logs().await.unwrap().into_iter())
        .filter(|m| m.contains("Content Security Policy") || m.contains("Refused"))
        .collect();
    assert!(csp.is_empty(), "the pages broke their own policy: {csp:?}");
}
