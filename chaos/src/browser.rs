//! A real browser for the console's tests: Debian's Chromium, headless,
//! driven through its ChromeDriver over the W3C WebDriver protocol (a
//! handful of HTTP calls, spoken here with reqwest). Install both with
//! `apt-get install chromium chromium-driver` (`.ci/run` does).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// ChromeDriver and Chromium as Debian installs them; `GANGWAY_CHROMEDRIVER`
/// and `GANGWAY_CHROMIUM` name others.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// What to install when they are missing, quoted in the error.
pub const INSTALL_HINT: &str = "apt-get install -y chromium chromium-driver";

/// The W3C name of an element reference in answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A ChromeDriver and one browser session of it; both end on drop.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    base: String,
    /// Where the browser keeps its profile (fresh: no cookies).
    _profile: tempfile::TempDir,
}

fn path_of(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

impl Browser {
    /// Starts ChromeDriver on a free port and a headless Chromium session
    /// of `width`×`height` that trusts the test cloud's own certificates
    /// (its CA is made per test; TLS itself is tested elsewhere).
    pub async fn start(log_dir: &Path, width: u32, height: u32) -> Result<Browser> {
        let driver_bin = path_of("GANGWAY_CHROMEDRIVER", CHROMEDRIVER);
        let chromium = path_of("GANGWAY_CHROMIUM", CHROMIUM);
        for bin in [&driver_bin, &chromium] {
            if !bin.exists() {
                bail!("{} not found: {INSTALL_HINT}", bin.display());
            }
        }
        let port = gangway_devkit::free_port();
        let log = std::fs::File::create(log_dir.join("chromedriver.log"))?;
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", driver_bin.display()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let profile = tempfile::tempdir()?;
        let mut browser = Browser {
            driver,
            http,
            base: format!("http://127.0.0.1:{port}"),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = async {
                let v: Value = (browser.http.get(format!("{}/status", browser.base)))
                    .send()
                    .await?
                    .json()
                    .await?;
                anyhow::Ok(v["value"]["ready"].as_bool() == Some(true))
            };
            if ready.await.unwrap_or(false) {
                break;
            }
            if Instant::now() > deadline {
                bail!("chromedriver did not become ready in 20 s (see chromedriver.log)");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--ignore-certificate-errors".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser._profile.path().display()),
        ];
        let session: Value = browser
            .http
            .post(format!("{}/session", browser.base))
            .json(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "acceptInsecureCerts": true,
                "goog:loggingPrefs": {"browser": "ALL"},
                "goog:chromeOptions": {"binary": chromium, "args": args},
            }}}))
            .send()
            .await?
            .json()
            .await?;
        let id = session["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no session: {session}"))?;
        browser.base = format!("{}/session/{id}", browser.base);
        Ok(browser)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await?.json().await?;
        if let Some(err) = v["value"].get("error") {
            bail!("webdriver {path}: {err} {}", v["value"]["message"]);
        }
        Ok(v["value"].clone())
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    pub async fn url(&self) -> Result<String> {
        let v = self.call(reqwest::Method::GET, "/url", None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The page's HTML as the browser has it now (after scripts changed it).
    pub async fn source(&self) -> Result<String> {
        let v = self.call(reqwest::Method::GET, "/source", None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The first element `css` selects, if any.
    pub async fn find(&self, css: &str) -> Result<Option<String>> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(v.as_array()
            .and_then(|a| a.first())
            .and_then(|e| e[ELEMENT].as_str())
            .map(str::to_string))
    }

    /// Waits up to `within` for `css` to select something; its element.
    pub async fn wait_for(&self, css: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(e) = self.find(css).await? {
                return Ok(e);
            }
            if Instant::now() > deadline {
                bail!(
                    "nothing matched {css:?} within {within:?}; the page was at {}:\n{}",
                    self.url().await.unwrap_or_default(),
                    self.source().await.unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn text(&self, element: &str) -> Result<String> {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!("/element/{element}/text"),
                None,
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    pub async fn click(&self, element: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await
        .map(drop)
    }

    pub async fn type_into(&self, element: &str, text: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .map(drop)
    }

    pub async fn resize(&self, width: u32, height: u32) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await
        .map(drop)
    }

    /// The browser's console messages of level SEVERE since the last call
    /// (a Content-Security-Policy violation is one, and a failed fetch).
    pub async fn severe_logs(&self) -> Result<Vec<String>> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await?;
        let entries = v.as_array().context("the browser's log as a list")?;
        Ok(entries
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect())
    }

    /// A screenshot of the window, as PNG, written to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        use base64::Engine;
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .context("a screenshot in base64")?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the session (the browser with it), then the driver.
        let url = self.base.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    let _ = reqwest::Client::new()
                        .delete(url)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                });
            }
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
