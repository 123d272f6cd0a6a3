//! Real processes on loopback: children killed with their handle, logs,
//! dev keys as arguments, the global tier, readiness, and a TCP proxy that
//! can be cut (a network partition). The drills and the end-to-end tests
//! use them.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use gangway_auth::dev::DevMaterial;

use gangway_auth::jwt::{claims_for, Role, SigningKey};
use gangway_shared::tokens;

use crate::supervisor::Launch;

/// A child process killed when the test ends, however it ends.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A log file for a child process in the test's directory (appended to, so
/// a restarted process keeps its history).
pub fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .unwrap()
}

/// A token for a region: the global tier's service role, or an agent's
/// naming its region.
pub fn token(key: &SigningKey, role: Role, region: Option<&str>) -> String {
    key.sign(&claims_for(
        role,
        "e2e",
        None,
        region,
        tokens::ISSUER,
        tokens::REGION_AUDIENCE,
        Duration::from_secs(3600),
    ))
    .unwrap()
}

/// `KID=PATH` of a dev key's PEM under `auth`'s `keys/` (`file`:
/// `service-signing.pem`, `service-signing.pub.pem`,
/// `tenant-signing.pub.pem`, `operator-signing.pub.pem`).
pub fn key_arg(auth: &DevMaterial, file: &str) -> String {
    let key = if file.starts_with("tenant") {
        &auth.tenant_key
    } else if file.starts_with("operator") {
        &auth.operator_key
    } else {
        &auth.service_key
    };
    format!(
        "{}={}",
        key.kid(),
        auth.dir.join("keys").join(file).display()
    )
}

/// A region's TLS flags in a cloud of `auth`'s: the dev certificate
/// (localhost, 127.0.0.1) and key, and the dev CA for its peers.
pub fn region_tls(auth: &DevMaterial) -> Vec<std::ffi::OsString> {
    vec![
        "--tls-cert".into(),
        auth.server_cert.clone().into(),
        "--tls-key".into(),
        auth.server_key.clone().into(),
        "--ca".into(),
        auth.ca_cert.clone().into(),
    ]
}

/// `bin`'s `gangway global` on HTTPS at `port` in front of `regions` (name,
/// URL), logging to `dir/global.log`.
pub fn spawn_global(
    bin: &Path,
    dir: &Path,
    auth: &DevMaterial,
    port: u16,
    regions: &[(&str, String)],
) -> Proc {
    spawn_global_as(bin, dir, auth, port, regions, "global")
}

/// [`spawn_global`] logging to `dir/{name}.log` (one of several replicas).
pub fn spawn_global_as(
    bin: &Path,
    dir: &Path,
    auth: &DevMaterial,
    port: u16,
    regions: &[(&str, String)],
    name: &str,
) -> Proc {
    global_launch(bin, dir, auth, port, regions, name)
        .spawn()
        .unwrap()
}

/// How [`spawn_global_as`] starts its replica.
pub fn global_launch(
    bin: &Path,
    dir: &Path,
    auth: &DevMaterial,
    port: u16,
    regions: &[(&str, String)],
    name: &str,
) -> Launch {
    let mut l = Launch::new(bin, dir.join(format!("{name}.log")))
        .args(["global", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(&auth.server_cert)
        .arg("--tls-key")
        .arg(&auth.server_key)
        .arg("--region-ca")
        .arg(&auth.ca_cert)
        .args(["--tenant-key", &key_arg(auth, "tenant-signing.pub.pem")])
        .args(["--operator-key", &key_arg(auth, "operator-signing.pub.pem")])
        .args([
            "--service-signing-key",
            &key_arg(auth, "service-signing.pem"),
        ])
        // Tenants' costs are priced by the book a test writes there
        // (read at each request: none yet, costs answer 503).
        .arg("--price-book")
        .arg(dir.join("prices.toml"))
        .env("GANGWAY_LOG", "info");
    for (name, url) in regions {
        l = l.arg("--region").arg(format!("{name}={url}"));
    }
    l
}

/// Waits (up to 90 s) until the global tier behind `client` sees `regions`
/// regions, every one healthy with `schedulable` GPUs of a type
/// schedulable; panics naming `logs` otherwise.
pub async fn until_ready(
    client: &gangway_shared::client::Client,
    regions: usize,
    schedulable: u32,
    logs: &Path,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(list) = client.regions().await {
            let ready = list.regions.len() == regions
                && list.regions.iter().all(|r| {
                    r.healthy
                        && r.status.as_ref().is_some_and(|s| {
                            s.capacity.iter().any(|c| c.schedulable == schedulable)
                        })
                });
            if ready {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cloud did not come up; logs in {}",
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TCP proxy on loopback that can be cut: while cut it drops every
/// connection it has and every new one, as a network partition would.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards a new loopback port to `target_port`.
    pub async fn start(target_port: u16) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
            std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, k) = (cut.clone(), conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped
                }
                let conn = tokio::spawn(async move {
                    let Ok(mut out) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await
                    else {
                        return;
                    };
                    // Bytes pass as they come: Nagle's algorithm would hold
                    // a small write back for the other end's delayed ACK.
                    let _ = (inbound.set_nodelay(true), out.set_nodelay(true));
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                });
                let mut list = k.lock().unwrap();
                list.retain(|h| !h.is_finished());
                list.push(conn);
            }
        });
        Proxy {
            port,
            cut,
            conns,
            task,
        }
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.cut.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for h in self.conns.lock().unwrap().drain(..) {
                h.abort();
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// `bin`'s `gangway agent` with id `{region}-agent`, serving `fleet` with
/// the simulated executor (time factor 0.05) for the region at
/// `region_port`, working and logging under `dir` (`{log}.log`).
pub fn spawn_sim_agent(
    bin: &Path,
    dir: &Path,
    auth: &DevMaterial,
    region: &str,
    region_port: u16,
    fleet: &Path,
    log: &str,
) -> Proc {
    agent_launch(bin, dir, auth, region, region_port, fleet, log)
        .args(["--executor", "sim", "--time-factor", "0.05"])
        .spawn()
        .unwrap()
}

/// `bin`'s `gangway agent` with id `{region}-agent` serving `fleet` for the
/// region at `region_port`, working in `dir/{log}` and logging to
/// `dir/{log}.log`; its executor is for the caller to add.
pub fn agent_launch(
    bin: &Path,
    dir: &Path,
    auth: &DevMaterial,
    region: &str,
    region_port: u16,
    fleet: &Path,
    log: &str,
) -> Launch {
    let agent_id = format!("{region}-agent");
    let agent_token = agent_token(&auth.service_key, &agent_id, region);
    Launch::new(bin, dir.join(format!("{log}.log")))
        .env("GANGWAY_AGENT_TOKEN", agent_token)
        .env("GANGWAY_LOG", "info")
        .args(["agent", "--region", region, "--agent-id", &agent_id])
        .arg("--region-url")
        .arg(format!("https://127.0.0.1:{region_port}"))
        .arg("--region-ca")
        .arg(&auth.ca_cert)
        .arg("--simulate")
        .arg(fleet)
        .arg("--work-dir")
        .arg(dir.join(log))
        // The drills' trainers log where the drill reads.
        .arg("--sandbox-bind")
        .arg(crate::cloud::shared_dir(dir))
}

/// Kills with SIGKILL the process group of every process working in a
/// directory under `dir` (a dead machine's workers: the agent starts each
/// in a process group of its own). Linux: reads `/proc/*/cwd`.
pub fn kill_processes_under(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let inside = std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir));
        if inside {
            // SAFETY: plain syscalls on pids we just read; a process gone
            // meanwhile makes them fail harmlessly.
            unsafe {
                let group = libc::getpgid(pid);
                if group > 1 && group != libc::getpgid(0) {
                    libc::killpg(group, libc::SIGKILL);
                }
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// An agent token for `agent_id` of `region` (its subject is the agent).
pub fn agent_token(key: &SigningKey, agent_id: &str, region: &str) -> String {
    key.sign(&claims_for(
        Role::Agent,
        agent_id,
        None,
        Some(region),
        tokens::ISSUER,
        tokens::REGION_AUDIENCE,
        Duration::from_secs(3600),
    ))
    .unwrap()
}
