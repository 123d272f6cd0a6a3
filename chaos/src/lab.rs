//! A lab of machines: every host a Linux network namespace with its own
//! address, hostname, `/etc/hosts`, `/etc/gangway` and `/var/lib/gangway`,
//! the hosts joined by virtual bridges as a real cloud's machines are by
//! switches — nothing one host runs is reachable over another's loopback.
//!
//! ```text
//!   harness 10.199.0.1 (this process: the tenants' and operators' side)
//!   global-1 .0.2, global-2 .0.3 ("global.lab")
//!        │                         WAN bridge 10.199.0.0/24
//!   ─────┴──────┬───────────────────────┬───────────────────────┬──
//!          r1-router .0.11         r2-router .0.12         r3-router .0.13
//!               │ LAN 10.199.1.0/24     │ 10.199.2.0/24         │ 10.199.3.0/24
//!   r1-db .1.10 (PostgreSQL, TLS only)
//!   r1-cp1 .1.11, r1-cp2 .1.12 ("region.r1.lab": both addresses)
//!   r1-gpu1 … r1-gpu4 .1.21–.24 (an agent each, real mode, 8 GPUs declared)
//! ```
//!
//! Each region is a LAN behind a router; the regions and the global tier
//! meet on the WAN. A region's links are cut where a real one's would be:
//! its router's WAN link goes down (`ip link set … down`), and it still
//! reaches its own database and agents. A host is killed as a power cut
//! would: its links go down (nothing it sends gets out, not even the
//! kernel's goodbyes to its peers), then every process in its namespace
//! gets SIGKILL — workers too, until none is left. A whole region loses
//! power host by host the same way ([`Lab::power_off`]), and boots again on
//! its data ([`Lab::power_on`]): links up, routes put back (the kernel
//! drops the routes through a link that goes down), every process started
//! again from the same files. Any host's link can be made lossy and slow
//! ([`Lab::impair`]: nftables drops, a `tc tbf` rate).
//!
//! A region's database may instead be a Patroni cluster on hosts of its
//! own ([`LabOptions::patroni`]): `r1-etcd` (.1.30) and three PostgreSQL
//! hosts `r1-db1` … `r1-db3` (.1.31–.33) under Patroni, a synchronous
//! standby for every commit, each serving TLS alone to the region's LAN;
//! its control planes reach whichever is the primary through a multi-host
//! URL (`target_session_attrs=read-write`). A member's host loses power as
//! any other's does ([`Lab::power_off`]); booted again, its Patroni rejoins
//! as a standby.
//!
//! The harness also has an address on each region's LAN, 10.199.R.254: a
//! management path, as an operator's out-of-band network, through which
//! it watches a region whose router is cut off. No host routes anything
//! through it, and the harness's namespace forwards nothing from the
//! lab's bridges.
//!
//! Every process runs from the paths the Debian package installs and is
//! configured from the reference files (deploy/config/), with TLS on every
//! hop: tenant → global → region, agent → region, region ↔ region, and
//! region → PostgreSQL (`sslmode=verify-full`; the server accepts only
//! `hostssl` connections). `/etc/gangway` and `/var/lib/gangway` are each
//! host's own directory under the lab's, bound in a mount namespace of the
//! host's processes, as `/etc/hosts` is.
//!
//! Needs root, `ip` and `tc` (iproute2), `unshare` and `runuser`
//! (util-linux), `nft` (nftables) to impair a link,
//! PostgreSQL's server binaries and, for the agents' sandboxes,
//! bubblewrap. One lab runs at a time on a machine (its names and
//! addresses are fixed): [`Lab::start`] waits for a lock on
//! `/run/lock/gangway-lab.lock` (or `/tmp`'s), held until the lab is gone —
//! tests of one binary run in parallel threads, and a `gangway chaos --lab`
//! may run beside them; a lab left by a killed process (its lock released
//! with it) is removed by the next one.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_auth::dev::DevMaterial;
use gangway_auth::jwt::{claims_for, Role};
use gangway_auth::tls::DevCa;
use gangway_devkit::{
    PatroniCluster, PatroniHost, PatroniHosts, PatroniOptions, PgBinaries, PgCluster, PgOptions,
};
use gangway_shared::api::RegionStatus;
use gangway_shared::client::Client;
use gangway_shared::tokens;

use crate::cloud::{DRILL_TIMERS, HA_TIMERS, SHORT_TIMERS};
use crate::procs::{agent_token, Proc};
use crate::supervisor::Target;

/// The lab's regions.
pub const REGIONS: [&str; 3] = ["r1", "r2", "r3"];
/// Control-plane replicas per region.
pub const CONTROL_PLANES: usize = 2;
/// GPU machines (an agent each) per region, two per leaf.
pub const AGENTS: usize = 4;
/// GPUs each machine declares.
pub const GPUS_PER_MACHINE: u32 = 8;
/// Replicas of the global tier.
pub const GLOBALS: usize = 2;

/// Members of a region's Patroni cluster ([`LabOptions::patroni`]).
pub const PATRONI_MEMBERS: usize = 3;

/// Prefix of every namespace, bridge and link the lab makes.
const PREFIX: &str = "gwlab";
/// The lab's addresses: 10.199.0.0/24 the WAN, 10.199.R.0/24 region R's LAN.
const NET: [u8; 2] = [10, 199];
/// Where the hosts find each other (`/etc/hosts`): `NAME.lab`.
const DOMAIN: &str = "lab";

const REGION_TOML: &str = include_str!("../../deploy/config/region.toml");
const AGENT_TOML: &str = include_str!("../../deploy/config/agent.toml");
const GLOBAL_TOML: &str = include_str!("../../deploy/config/global.toml");

/// Bound over `/etc/gangway`, `/var/lib/gangway` and `/etc/hosts` in a
/// mount namespace of the host's own, with its hostname set, before the
/// command runs: `host-exec HOSTNAME HOST_DIR STORE_DIR COMMAND…`.
const HOST_EXEC: &str = r#"#!/bin/sh
set -e
hostname "$1"
mount --bind "$2/etc" /etc/gangway
mount --bind "$2/var" /var/lib/gangway
mount --bind "$2/hosts" /etc/hosts
if [ -n "$3" ]; then mount --bind "$3" /var/lib/gangway/checkpoints; fi
shift 3
exec "$@"
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRole {
    Router,
    /// A PostgreSQL server: the region's one, or a member of its Patroni
    /// cluster.
    Database,
    /// The etcd of a region's Patroni cluster.
    Etcd,
    Control,
    Agent,
    Global,
}

/// One machine of the lab.
#[derive(Clone, Debug)]
pub struct Host {
    /// Its hostname, `r1-cp1`; `r1-cp1.lab` to the others.
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address (a router's on its region's LAN).
    pub ip: Ipv4Addr,
    pub region: Option<String>,
    pub role: HostRole,
    /// Its files: `etc/` (its `/etc/gangway`), `var/` (its
    /// `/var/lib/gangway`), `hosts`, and `log/`.
    pub dir: PathBuf,
}

impl Host {
    /// Where the host's process `what` logs.
    pub fn log(&self, what: &str) -> PathBuf {
        self.dir.join("log").join(format!("{what}.log"))
    }
}

/// How [`Lab::impair`] degrades a host's link.
#[derive(Clone, Copy, Debug)]
pub struct Impairment {
    /// Packets lost at random, each way (%).
    pub loss_pct: u32,
    /// The most the host sends (kbit/s).
    pub rate_kbit: u32,
}

/// How a lab is set up.
#[derive(Clone, Debug, Default)]
pub struct LabOptions {
    /// The region whose database is a Patroni cluster of three members and
    /// an etcd, each on a host of its own (the others keep one PostgreSQL
    /// host). Every region then runs with [`HA_TIMERS`] instead of CI's
    /// short ones, so that a database failing over does not fence its
    /// region.
    pub patroni: Option<String>,
}

/// A running lab: three regions and the global tier on 25 hosts (29 with
/// a Patroni cluster).
pub struct Lab {
    /// First, so that they drop first.
    procs: Mutex<Vec<(String, Proc)>>,
    /// The region whose database is a Patroni cluster, and the cluster.
    patroni: Option<(String, std::sync::Arc<PatroniCluster>)>,
    pub hosts: Vec<Host>,
    /// The lab's files (hosts' directories, databases, keys); removed with
    /// the lab unless [`Lab::keep`] was called.
    pub dir: tempfile::TempDir,
    /// A tenant's (`acme`) client of the first global replica.
    pub tenant: Client,
    /// The `gangway` binary every host runs.
    bin: PathBuf,
    auth: DevMaterial,
    service: String,
    ca_pem: String,
    keep: std::sync::atomic::AtomicBool,
    /// Each region's database superuser password.
    passwords: Mutex<std::collections::BTreeMap<String, String>>,
    /// The hosts without power ([`Lab::power_off`]) and the regions cut
    /// off ([`Lab::cut_region`]), for [`Lab::mend_all`].
    off: Mutex<std::collections::BTreeSet<String>>,
    cut: Mutex<std::collections::BTreeSet<String>>,
    /// The machine's one-lab lock, held while the lab lives: last, so
    /// that it is released once the lab is gone.
    _lock: std::fs::File,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.procs.get_mut().unwrap().clear();
        teardown();
        if *self.keep.get_mut() {
            self.dir.disable_cleanup(true);
            eprintln!("the lab's files are kept in {}", self.dir.path().display());
        }
    }
}

/// 10.199.`a`.`b`.
fn addr(a: u8, b: u8) -> Ipv4Addr {
    Ipv4Addr::new(NET[0], NET[1], a, b)
}

/// Region `name`'s number (1-based): its LAN is 10.199.N.0/24.
fn region_no(name: &str) -> u8 {
    REGIONS
        .iter()
        .position(|r| *r == name)
        .expect("a lab region") as u8
        + 1
}

/// The name its agents, peers and the global tier call region `name` by:
/// both its control-plane replicas' addresses.
pub fn region_host(name: &str) -> String {
    format!("region.{name}.{DOMAIN}")
}

fn plan(dir: &Path, patroni: Option<&str>) -> Vec<Host> {
    let host = |name: String, ip, region: Option<&str>, role| Host {
        ns: format!("{PREFIX}-{name}"),
        dir: dir.join("hosts").join(&name),
        name,
        ip,
        region: region.map(String::from),
        role,
    };
    let mut hosts = Vec::new();
    for g in 1..=GLOBALS {
        hosts.push(host(
            format!("global-{g}"),
            addr(0, 1 + g as u8),
            None,
            HostRole::Global,
        ));
    }
    for r in REGIONS {
        let n = region_no(r);
        hosts.push(host(
            format!("{r}-router"),
            addr(n, 1),
            Some(r),
            HostRole::Router,
        ));
        if patroni == Some(r) {
            hosts.push(host(
                format!("{r}-etcd"),
                addr(n, 30),
                Some(r),
                HostRole::Etcd,
            ));
            // Named as PatroniCluster names its members (scope `r`).
            for m in 1..=PATRONI_MEMBERS {
                hosts.push(host(
                    format!("{r}-db{m}"),
                    addr(n, 30 + m as u8),
                    Some(r),
                    HostRole::Database,
                ));
            }
        } else {
            hosts.push(host(
                format!("{r}-db"),
                addr(n, 10),
                Some(r),
                HostRole::Database,
            ));
        }
        for c in 1..=CONTROL_PLANES {
            hosts.push(host(
                format!("{r}-cp{c}"),
                addr(n, 10 + c as u8),
                Some(r),
                HostRole::Control,
            ));
        }
        for a in 1..=AGENTS {
            hosts.push(host(
                format!("{r}-gpu{a}"),
                addr(n, 20 + a as u8),
                Some(r),
                HostRole::Agent,
            ));
        }
    }
    hosts
}

/// Runs `program` with `args`; its stderr in the error.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program` with `args`, `input` on its standard input; its stderr
/// in the error.
fn run_fed(program: &str, args: &[&str], input: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child.stdin.take().unwrap().write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `ip -batch -` (in namespace `ns` if given) with these commands, one a
/// line.
fn ip_batch(ns: Option<&str>, commands: &str) -> anyhow::Result<()> {
    let mut args = Vec::new();
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    args.extend(["-batch", "-"]);
    run_fed("ip", &args, commands).context("iproute2")
}

/// Every process in namespace `ns`, killed with SIGKILL.
fn kill_namespace(ns: &str) {
    let Ok(pids) = run("ip", &["netns", "pids", ns]) else {
        return;
    };
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: a plain syscall on a pid just listed; one gone meanwhile
        // makes it fail harmlessly.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Removes every namespace and bridge of a lab (this one's, or one a
/// killed test left): their processes first.
fn teardown() {
    let namespaces = run("ip", &["netns", "list"]).unwrap_or_default();
    let ours: Vec<&str> = (namespaces.lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    // Twice: a process may fork while the first round kills.
    for _ in 0..2 {
        for ns in &ours {
            kill_namespace(ns);
        }
    }
    for ns in &ours {
        let _ = run("ip", &["netns", "del", ns]);
    }
    let links = run("ip", &["-o", "link", "show"]).unwrap_or_default();
    for l in links.lines() {
        let name = l.split(':').nth(1).map(str::trim).unwrap_or_default();
        let name = name.split('@').next().unwrap_or_default();
        if name.starts_with(PREFIX) {
            let _ = run("ip", &["link", "del", name]);
        }
    }
}

/// Kills every process in namespace `ns` until none is left (a process
/// may fork while a round kills: a trainer starts a `sleep` every step).
fn kill_all_in(ns: &str) {
    for _ in 0..100 {
        let pids = run("ip", &["netns", "pids", ns]).unwrap_or_default();
        if pids.split_whitespace().next().is_none() {
            return;
        }
        kill_namespace(ns);
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!(
        ns,
        "processes are left in the namespace after 100 rounds of SIGKILL"
    );
}

/// The machine's one-lab lock (see the module's documentation), once this
/// process holds it.
fn lock() -> anyhow::Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    let dir = if Path::new("/run/lock").is_dir() {
        "/run/lock"
    } else {
        "/tmp"
    };
    let path = Path::new(dir).join("gangway-lab.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the lab's lock {}", path.display()))?;
    let fd = file.as_raw_fd();
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(file);
    }
    eprintln!(
        "another lab runs on this machine: waiting for it to end ({})",
        path.display()
    );
    loop {
        // SAFETY: as above; blocks until the holder releases it.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
}

/// Writes `contents` to `path`, making its directory; `private`: 0600.
fn write(path: &Path, contents: impl AsRef<[u8]>, private: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    let mode = if private { 0o600 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// A reference configuration file with `set`'s keys replaced: what an
/// operator does with the file the package installs. A flag list
/// (`["--a", "1", …]`) sets keys too, numbers as numbers.
fn configure(reference: &str, set: Vec<(&str, toml::Value)>, flags: &[&str]) -> String {
    let mut table: toml::Table = reference.parse().expect("the reference file is TOML");
    for (k, v) in set {
        table.insert(k.to_string(), v);
    }
    for pair in flags.chunks(2) {
        let key = pair[0].trim_start_matches("--");
        let value = match pair[1].parse::<i64>() {
            Ok(n) => toml::Value::Integer(n),
            Err(_) => toml::Value::String(pair[1].to_string()),
        };
        table.insert(key.to_string(), value);
    }
    toml::to_string(&table).expect("a TOML table serializes")
}

fn s(v: impl Into<String>) -> toml::Value {
    toml::Value::String(v.into())
}

fn list(v: impl IntoIterator<Item = String>) -> toml::Value {
    toml::Value::Array(v.into_iter().map(toml::Value::String).collect())
}

impl Lab {
    /// Builds the lab's network, writes every host's files, starts its
    /// databases, control planes, agents and global replicas with `bin`
    /// (the `gangway` binary), and waits until the global tier sees every
    /// region with all its GPUs schedulable.
    pub async fn start(bin: &Path) -> anyhow::Result<Lab> {
        Lab::start_with(bin, LabOptions::default()).await
    }

    /// [`Lab::start`], set up as `opts` says.
    pub async fn start_with(bin: &Path, opts: LabOptions) -> anyhow::Result<Lab> {
        if let Some(r) = &opts.patroni {
            if !REGIONS.contains(&r.as_str()) {
                bail!("no lab region {r} (one of {})", REGIONS.join(", "));
            }
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("the lab needs root (network namespaces, bind mounts): run the tests as root");
        }
        for tool in ["ip", "unshare", "runuser"] {
            run("sh", &["-c", &format!("command -v {tool}")]).with_context(|| {
                format!("the lab needs `{tool}`: apt-get install -y iproute2 util-linux")
            })?;
        }
        let lock = tokio::task::spawn_blocking(lock).await??;
        teardown();
        // The mount points the package's paths are bound on.
        for d in ["/etc/gangway", "/var/lib/gangway"] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {d}"))?;
        }
        let dir = tempfile::Builder::new().prefix("gangway-lab-").tempdir()?;
        {
            // Traversable by the `postgres` user.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        }
        let auth = DevMaterial::load_or_create(&dir.path().join("pki"))?;
        let ca = DevCa::from_pem(
            &std::fs::read_to_string(&auth.ca_cert)?,
            &std::fs::read_to_string(auth.dir.join("tls/ca-key.pem"))?,
        )?;
        let ca_pem = ca.cert_pem();
        let hosts = plan(dir.path(), opts.patroni.as_deref());
        network(&hosts)?;
        write(&dir.path().join("host-exec"), HOST_EXEC, false)?;
        {
            // What jobs write for the harness to read: bound into every
            // sandbox of every GPU machine (its subdirectories are made
            // writable by whoever needs them).
            use std::os::unix::fs::PermissionsExt;
            let shared = dir.path().join("shared");
            std::fs::create_dir_all(&shared)?;
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o711))?;
        }
        // Each region's checkpoint store: a file system its control planes
        // and machines share (S3 in production).
        for r in REGIONS {
            std::fs::create_dir_all(dir.path().join("stores").join(r))?;
        }
        let mut databases = Vec::new();
        let timers: Vec<&str> = if opts.patroni.is_some() {
            DRILL_TIMERS
                .iter()
                .chain(HA_TIMERS.iter())
                .copied()
                .collect()
        } else {
            DRILL_TIMERS
                .iter()
                .chain(SHORT_TIMERS.iter())
                .copied()
                .collect()
        };
        for h in &hosts {
            write_host_files(h, &hosts, &auth, &ca, &dir.path().join("shared"), &timers)?;
        }
        let service = crate::procs::token(&auth.service_key, Role::Service, None);
        let tenant_token = auth.tenant_key.sign(&claims_for(
            Role::Tenant,
            "acme-lab",
            Some("acme"),
            None,
            tokens::ISSUER,
            tokens::PUBLIC_AUDIENCE,
            Duration::from_secs(3600),
        ))?;
        let global_ip = hosts[0].ip;
        let tenant = Client::public(
            format!("https://{global_ip}:8443"),
            tenant_token,
            Some(ca_pem.as_bytes()),
        )
        .map_err(anyhow::Error::msg)?;
        let mut lab = Lab {
            procs: Mutex::new(Vec::new()),
            patroni: None,
            hosts,
            dir,
            tenant,
            bin: bin.to_path_buf(),
            auth,
            service,
            ca_pem,
            keep: Default::default(),
            passwords: Default::default(),
            off: Default::default(),
            cut: Default::default(),
            _lock: lock,
        };
        // Kept while it comes up: a lab that does not is read from its logs.
        lab.keep();
        // The databases first (initdb takes a moment each), side by side;
        // a Patroni cluster's beside them.
        let cluster = opts.patroni.clone().map(|region| {
            let hosts = lab.hosts.clone();
            let root = lab.dir.path().join(format!("patroni-{region}"));
            tokio::task::spawn_blocking(move || start_patroni(&root, &region, &hosts))
        });
        for h in (lab.hosts.iter()).filter(|h| h.role == HostRole::Database) {
            if h.region == opts.patroni {
                continue;
            }
            let h = h.clone();
            databases.push(tokio::task::spawn_blocking(move || init_database(&h)));
        }
        for d in databases {
            let (region, password) = d.await??;
            lab.passwords.lock().unwrap().insert(region, password);
        }
        if let (Some(cluster), Some(region)) = (cluster, &opts.patroni) {
            let cluster = cluster.await??;
            (lab.passwords.lock().unwrap()).insert(region.clone(), cluster.password().to_string());
            lab.patroni = Some((region.clone(), std::sync::Arc::new(cluster)));
        }
        for h in &lab.hosts {
            if !lab.runs_patroni(h) {
                lab.start_host(h)?;
            }
        }
        crate::procs::until_ready(
            &lab.tenant,
            REGIONS.len(),
            AGENTS as u32 * GPUS_PER_MACHINE,
            lab.dir.path(),
        )
        .await;
        lab.keep.store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(lab)
    }

    /// Keeps the lab's files (its logs) once it is gone.
    pub fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> &Host {
        (self.hosts.iter())
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no lab host {name}"))
    }

    /// The hosts of `region` in `role`.
    pub fn hosts_of(&self, region: &str, role: HostRole) -> Vec<&Host> {
        (self.hosts.iter())
            .filter(|h| h.region.as_deref() == Some(region) && h.role == role)
            .collect()
    }

    /// Runs `args` of `bin` on host `h` (its namespace, hostname and
    /// files), logging to `h`'s `log/{what}.log`; killed with the lab.
    fn spawn(
        &self,
        h: &Host,
        what: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let mut cmd = self.on_host(h);
        cmd.arg(&self.bin).args(args);
        self.start_logged(h, what, cmd, env)
    }

    /// A command that runs on host `h`: in its network namespace, with its
    /// hostname and its files bound where the package puts them.
    fn on_host(&self, h: &Host) -> Command {
        let store = match (&h.region, h.role) {
            (Some(r), HostRole::Control | HostRole::Agent) => {
                self.dir.path().join("stores").join(r).display().to_string()
            }
            _ => String::new(),
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &h.ns, "unshare", "--mount", "--uts", "sh"])
            .arg(self.dir.path().join("host-exec"))
            .arg(&h.name)
            .arg(&h.dir)
            .arg(store);
        cmd
    }

    fn start_logged(
        &self,
        h: &Host,
        what: &str,
        mut cmd: Command,
        env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let log = crate::procs::log_file(&h.dir.join("log"), &format!("{what}.log"));
        cmd.env("GANGWAY_LOG", "info")
            .envs(env.iter().copied())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {what} on {}", h.name))?;
        self.procs
            .lock()
            .unwrap()
            .push((h.name.clone(), Proc(child)));
        Ok(())
    }

    /// Starts host `h`'s processes as its role and files say: a database
    /// host's PostgreSQL, a control-plane host's `gangway region`, a GPU
    /// machine's `gangway agent`, a global host's `gangway global` (a
    /// router runs nothing).
    fn start_host(&self, h: &Host) -> anyhow::Result<()> {
        match h.role {
            HostRole::Database if self.runs_patroni(h) => {
                let (_, cluster) = self.patroni.as_ref().unwrap();
                cluster.restart_member(&h.name)
            }
            HostRole::Database => self.start_database(h),
            HostRole::Etcd => bail!(
                "{} (etcd) is not booted again in the lab: the Patroni cluster's handle \
                 started it once",
                h.name
            ),
            HostRole::Control => {
                let region = h.region.as_deref().unwrap();
                let password = (self.passwords.lock().unwrap().get(region).cloned())
                    .with_context(|| format!("no database password for {region}"))?;
                // Every database host of the region: with a Patroni
                // cluster, whichever takes writes.
                let dbs = self.hosts_of(region, HostRole::Database);
                let servers: Vec<String> = (dbs.iter())
                    .map(|d| format!("{}.{DOMAIN}:5432", d.name))
                    .collect();
                let primary = if dbs.len() > 1 {
                    "&target_session_attrs=read-write"
                } else {
                    ""
                };
                let url = format!(
                    "postgres://postgres:{password}@{}/postgres\
                     ?sslmode=verify-full&sslrootcert=/etc/gangway/tls/ca.pem{primary}",
                    servers.join(",")
                );
                self.spawn(
                    h,
                    "region",
                    &["region"],
                    &[
                        ("GANGWAY_CONFIG", "/etc/gangway/region.toml"),
                        ("GANGWAY_DATABASE_URL", &url),
                    ],
                )
            }
            HostRole::Agent => self.spawn(
                h,
                "agent",
                &["agent"],
                &[("GANGWAY_CONFIG", "/etc/gangway/agent.toml")],
            ),
            HostRole::Global => self.spawn(
                h,
                "global",
                &["global"],
                &[("GANGWAY_CONFIG", "/etc/gangway/global.toml")],
            ),
            HostRole::Router => Ok(()),
        }
    }

    /// Whether host `h`'s processes are a Patroni cluster's (its etcd, or
    /// a member), started and driven by the cluster's handle.
    fn runs_patroni(&self, h: &Host) -> bool {
        matches!(h.role, HostRole::Database | HostRole::Etcd)
            && (self.patroni.as_ref()).is_some_and(|(r, _)| h.region.as_deref() == Some(r))
    }

    /// The region whose database is a Patroni cluster, and the cluster
    /// (its members named as their hosts).
    pub fn patroni(&self) -> Option<(&str, &std::sync::Arc<PatroniCluster>)> {
        self.patroni.as_ref().map(|(r, c)| (r.as_str(), c))
    }

    fn start_database(&self, h: &Host) -> anyhow::Result<()> {
        let bins = PgBinaries::find()?;
        let data = h.dir.join("var/postgresql");
        // Left by a postmaster killed with its host: every process of the
        // host is gone, and a pid reused meanwhile must not keep the
        // database from starting again (crash recovery follows).
        let _ = std::fs::remove_file(data.join("postmaster.pid"));
        let mut cmd = self.on_host(h);
        cmd.args(["runuser", "-u", "postgres", "--"])
            .arg(&bins.postgres)
            .arg("-D")
            .arg(&data);
        for (k, v) in [
            ("listen_addresses", h.ip.to_string()),
            ("port", "5432".into()),
            ("unix_socket_directories", String::new()),
            ("ssl", "on".into()),
            (
                "ssl_cert_file",
                data.join("server.pem").display().to_string(),
            ),
            (
                "ssl_key_file",
                data.join("server-key.pem").display().to_string(),
            ),
            ("max_connections", "200".into()),
            ("fsync", "off".into()),
            ("synchronous_commit", "off".into()),
            ("full_page_writes", "off".into()),
        ] {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        self.start_logged(h, "postgresql", cmd, &[])
    }

    /// A client of one control-plane replica itself (by its address), with
    /// a service token.
    pub fn replica(&self, h: &Host) -> Client {
        Client::region(
            format!("https://{}:7001", h.ip),
            "acme",
            Some(self.ca_pem.as_bytes()),
        )
        .expect("the lab's CA is valid PEM")
        .with_token(self.service.clone())
    }

    /// What replica `h` says of its region, if it answers.
    pub async fn status(&self, h: &Host) -> Option<RegionStatus> {
        self.replica(h).region_status().await.ok()
    }

    /// The replica of `region` that leads, once one says so (within
    /// `within`).
    pub async fn leader(&self, region: &str, within: Duration) -> anyhow::Result<&Host> {
        let deadline = Instant::now() + within;
        loop {
            for h in self.hosts_of(region, HostRole::Control) {
                if self.status(h).await.is_some_and(|s| s.leader) {
                    return Ok(h);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "no replica of {region} leads; logs in {}",
                    self.dir.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills host `name` as a power cut would: see [`Lab::power_off`].
    pub fn kill_host(&self, name: &str) -> anyhow::Result<()> {
        self.power_off(&[name])
    }

    /// Host `h`'s links: `eth0`, and a router's `wan0`.
    fn links(h: &Host) -> &'static [&'static str] {
        match h.role {
            HostRole::Router => &["eth0", "wan0"],
            _ => &["eth0"],
        }
    }

    /// Hosts `names` lose power, one after another as a room's racks go
    /// dark: first every one's links go down, so that nothing any of them
    /// sends gets out (not even the kernel's FIN or RST for a socket its
    /// killed process held: a dead machine says no goodbye), then every
    /// process in each one's namespace gets SIGKILL — the workers its
    /// agent started too — until none is left.
    pub fn power_off(&self, names: &[&str]) -> anyhow::Result<()> {
        let hosts: Vec<&Host> = names.iter().map(|n| self.host(n)).collect();
        for h in &hosts {
            for link in Self::links(h) {
                run("ip", &["-n", &h.ns, "link", "set", link, "down"])?;
            }
        }
        for h in &hosts {
            kill_namespace(&h.ns);
        }
        // Ours reaped (SIGKILL again, and waited for), then whatever
        // forked meanwhile.
        self.procs
            .lock()
            .unwrap()
            .retain(|(host, _)| !names.contains(&host.as_str()));
        for h in &hosts {
            kill_all_in(&h.ns);
        }
        // A Patroni member's handle learns that its processes are gone (as
        // killed, not as a crash it should report).
        for h in hosts.iter().filter(|h| self.runs_patroni(h)) {
            if let (HostRole::Database, Some((_, cluster))) = (h.role, &self.patroni) {
                cluster.kill_member(&h.name)?;
            }
        }
        (self.off.lock().unwrap()).extend(names.iter().map(|n| n.to_string()));
        Ok(())
    }

    /// Hosts `names` boot again, in that order: links up, their routes put
    /// back (the kernel dropped those through a link that went down), and
    /// their processes started from the same files, on the data they left
    /// (a database recovers from its crash).
    pub fn power_on(&self, names: &[&str]) -> anyhow::Result<()> {
        for name in names {
            let h = self.host(name);
            for link in Self::links(h) {
                run("ip", &["-n", &h.ns, "link", "set", link, "up"])?;
            }
            ip_batch(Some(&h.ns), &routes(h))?;
            self.start_host(h)?;
            self.off.lock().unwrap().remove(*name);
        }
        Ok(())
    }

    /// Every host of region `region`, in the order it boots: its router,
    /// its database, its control planes, its GPU machines.
    pub fn region_hosts(&self, region: &str) -> Vec<&str> {
        let order = [
            HostRole::Router,
            HostRole::Etcd,
            HostRole::Database,
            HostRole::Control,
            HostRole::Agent,
        ];
        (order.iter())
            .flat_map(|role| self.hosts_of(region, *role))
            .map(|h| h.name.as_str())
            .collect()
    }

    /// Cuts (or mends) region `region`'s links to the rest of the cloud:
    /// its router's WAN link goes down. Its replicas still reach their
    /// database and agents. Mended, the router's routes to the other
    /// regions are put back.
    pub fn cut_region(&self, region: &str, cut: bool) -> anyhow::Result<()> {
        let router = &self.hosts_of(region, HostRole::Router)[0];
        let state = if cut { "down" } else { "up" };
        run("ip", &["-n", &router.ns, "link", "set", "wan0", state])?;
        if cut {
            self.cut.lock().unwrap().insert(region.to_string());
        } else {
            ip_batch(Some(&router.ns), &routes(router))?;
            self.cut.lock().unwrap().remove(region);
        }
        Ok(())
    }

    /// Breaks `target` (`broken`) or mends it, as the drills ask a cloud
    /// to: a whole region loses power host by host, or boots again
    /// ([`Lab::power_off`], [`Lab::power_on`]); a region's links are cut at
    /// its router or mended ([`Lab::cut_region`]). The other parts are not
    /// broken on the lab (yet).
    pub fn apply(&self, target: &Target, broken: bool) -> anyhow::Result<()> {
        match target {
            Target::Region { region } => {
                let hosts = self.region_hosts(region);
                if broken {
                    self.power_off(&hosts)
                } else {
                    self.power_on(&hosts)
                }
            }
            Target::Links { region } => self.cut_region(region, broken),
            other => bail!(
                "{other} is not broken on the lab of machines: only a whole region \
                 (region-kill) or its links (partition)"
            ),
        }
    }

    /// Mends what is broken: boots every host without power, heals every
    /// region cut off.
    pub fn mend_all(&self) -> anyhow::Result<()> {
        let off: Vec<String> = self.off.lock().unwrap().iter().cloned().collect();
        // In boot order, region by region.
        let mut order: Vec<&str> = Vec::new();
        for r in REGIONS {
            order.extend(
                self.region_hosts(r)
                    .into_iter()
                    .filter(|h| off.iter().any(|o| o == h)),
            );
        }
        let rest: Vec<&str> = (self.hosts.iter())
            .map(|h| h.name.as_str())
            .filter(|h| off.iter().any(|o| o == h) && !order.contains(h))
            .collect();
        order.extend(rest);
        self.power_on(&order)?;
        let cut: Vec<String> = self.cut.lock().unwrap().iter().cloned().collect();
        for r in cut {
            self.cut_region(&r, false)?;
        }
        Ok(())
    }

    /// Region `region`'s database as the harness reaches it (its address,
    /// over TLS: the server takes nothing else), for the drills' checks.
    pub fn database_url(&self, region: &str) -> String {
        let dbs = self.hosts_of(region, HostRole::Database);
        let servers: Vec<String> = dbs.iter().map(|d| format!("{}:5432", d.ip)).collect();
        let primary = if dbs.len() > 1 {
            "&target_session_attrs=read-write"
        } else {
            ""
        };
        let password = (self.passwords.lock().unwrap().get(region).cloned()).unwrap_or_default();
        format!(
            "postgres://postgres:{password}@{}/postgres?sslmode=require&connect_timeout=5{primary}",
            servers.join(",")
        )
    }

    /// The URLs of region `region`'s control-plane replicas, by address.
    pub fn replica_urls(&self, region: &str) -> Vec<String> {
        (self.hosts_of(region, HostRole::Control).into_iter())
            .map(|h| format!("https://{}:7001", h.ip))
            .collect()
    }

    /// The URLs of the global tier's replicas, by address.
    pub fn global_urls(&self) -> Vec<String> {
        (self.hosts.iter())
            .filter(|h| h.role == HostRole::Global)
            .map(|h| format!("https://{}:8443", h.ip))
            .collect()
    }

    /// Where jobs write what the harness reads: bound into every sandbox
    /// of every GPU machine.
    pub fn shared(&self) -> PathBuf {
        self.dir.path().join("shared")
    }

    /// Where region `region`'s checkpoint store keeps its objects.
    pub fn store_dir(&self, region: &str) -> PathBuf {
        self.dir.path().join("stores").join(region)
    }

    /// Impairs host `name`'s link as `how` says, or mends it (`None`):
    /// packets lost at random both ways (nftables' `numgen`, in the host's
    /// namespace) and what it sends held to a rate (`tc tbf`, whose queue
    /// delays what waits). `tc netem` would add a fixed delay too, but the
    /// kernels CI runs on are built without it (`CONFIG_NET_SCH_NETEM` is
    /// not set), so the lab uses what they have.
    pub fn impair(&self, name: &str, how: Option<Impairment>) -> anyhow::Result<()> {
        let h = self.host(name);
        let _ = run("tc", &["-n", &h.ns, "qdisc", "del", "dev", "eth0", "root"]);
        let _ = run(
            "ip",
            &[
                "netns", "exec", &h.ns, "nft", "delete", "table", "inet", PREFIX,
            ],
        );
        let Some(how) = how else {
            return Ok(());
        };
        run(
            "tc",
            &[
                "-n",
                &h.ns,
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "tbf",
                "rate",
                &format!("{}kbit", how.rate_kbit),
                "burst",
                "16kb",
                "latency",
                "400ms",
            ],
        )?;
        let loss = how.loss_pct.min(100);
        let rules = format!(
            "table inet {PREFIX} {{\n\
             \x20 chain in {{ type filter hook input priority 0; policy accept; \
             iifname \"eth0\" numgen random mod 100 < {loss} counter drop; }}\n\
             \x20 chain out {{ type filter hook output priority 0; policy accept; \
             oifname \"eth0\" numgen random mod 100 < {loss} counter drop; }}\n}}\n"
        );
        run_fed("ip", &["netns", "exec", &h.ns, "nft", "-f", "-"], &rules)
            .with_context(|| format!("nft on {name} (the Debian package nftables)"))?;
        Ok(())
    }

    /// Packets [`Lab::impair`] has dropped on host `name`'s link so far,
    /// both ways.
    pub fn dropped(&self, name: &str) -> anyhow::Result<u64> {
        let h = self.host(name);
        let table = run(
            "ip",
            &[
                "netns", "exec", &h.ns, "nft", "list", "table", "inet", PREFIX,
            ],
        )?;
        let words: Vec<&str> = table.split_whitespace().collect();
        Ok((words.windows(2))
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum())
    }

    /// Everything host `name`'s process `what` has logged.
    pub fn log_of(&self, name: &str, what: &str) -> String {
        std::fs::read_to_string(self.host(name).log(what)).unwrap_or_default()
    }

    /// The lab's CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The lab's key material (the dev CA and signing keys).
    pub fn auth(&self) -> &DevMaterial {
        &self.auth
    }
}

/// Bridges, namespaces, links, addresses and routes.
fn network(hosts: &[Host]) -> anyhow::Result<()> {
    let wan = format!("{PREFIX}-wan");
    let mut root = String::new();
    for br in std::iter::once(wan.clone()).chain(REGIONS.iter().map(|r| format!("{PREFIX}-{r}"))) {
        writeln!(root, "link add {br} type bridge")?;
        writeln!(root, "link set {br} up")?;
    }
    writeln!(root, "addr add {}/24 dev {wan}", addr(0, 1))?;
    for h in hosts {
        run("ip", &["netns", "add", &h.ns])?;
    }
    // Each host's links: `{PREFIX}{i}` on the bridge, renamed `eth0`
    // inside (a router's second, to the WAN, `wan0`).
    let mut inside: Vec<String> = vec![String::new(); hosts.len()];
    for (i, h) in hosts.iter().enumerate() {
        let lan = match &h.region {
            Some(r) => format!("{PREFIX}-{r}"),
            None => wan.clone(),
        };
        let mut legs = vec![(format!("{PREFIX}{i}"), lan, "eth0", h.ip)];
        if h.role == HostRole::Router {
            let n = region_no(h.region.as_deref().unwrap());
            legs.push((
                format!("{PREFIX}{i}w"),
                wan.clone(),
                "wan0",
                addr(0, 10 + n),
            ));
        }
        let cmds = &mut inside[i];
        for (outer, bridge, name, ip) in legs {
            let peer = format!("{outer}p");
            writeln!(root, "link add {outer} type veth peer name {peer}")?;
            writeln!(root, "link set {peer} netns {}", h.ns)?;
            writeln!(root, "link set {outer} master {bridge}")?;
            writeln!(root, "link set {outer} up")?;
            writeln!(cmds, "link set {peer} name {name}")?;
            writeln!(cmds, "addr add {ip}/24 dev {name}")?;
            writeln!(cmds, "link set {name} up")?;
        }
        writeln!(cmds, "link set lo up")?;
        cmds.push_str(&routes(h));
    }
    // The harness's management path: an address on each region's LAN, so
    // that it reaches (watches) every host of a region whose router is
    // cut off. Nothing is routed through it: no host has a route via it.
    for r in REGIONS {
        writeln!(
            root,
            "addr add {}/24 dev {PREFIX}-{r}",
            addr(region_no(r), 254)
        )?;
    }
    ip_batch(None, &root)?;
    // Nor does the harness's namespace forward what reaches it on the
    // lab's bridges, whatever the machine's ip_forward says.
    for br in std::iter::once(wan).chain(REGIONS.iter().map(|r| format!("{PREFIX}-{r}"))) {
        let key = format!("net.ipv4.conf.{br}.forwarding=0");
        if let Err(e) = run("sysctl", &["-qw", &key]) {
            if run("sysctl", &["-n", "net.ipv4.ip_forward"]).is_ok_and(|v| v.trim() != "0") {
                return Err(e.context("the machine forwards IPv4: the lab's bridges must not"));
            }
        }
    }
    for (h, cmds) in hosts.iter().zip(&inside) {
        ip_batch(Some(&h.ns), cmds)?;
        if h.role == HostRole::Router {
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    &h.ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.ip_forward=1",
                ],
            )?;
        }
    }
    Ok(())
}

/// Host `h`'s routes, as `ip -batch` lines: a LAN host's default route
/// through its region's router, a router's to the other regions' LANs
/// through their routers, a global host's to every region's LAN. `replace`,
/// so that they also put back what the kernel dropped when a link went
/// down.
fn routes(h: &Host) -> String {
    let mut cmds = String::new();
    match (&h.region, h.role) {
        (Some(r), HostRole::Router) => {
            let me = region_no(r);
            for other in REGIONS.iter().map(|o| region_no(o)).filter(|o| *o != me) {
                let _ = writeln!(
                    cmds,
                    "route replace {}/24 via {}",
                    addr(other, 0),
                    addr(0, 10 + other)
                );
            }
        }
        (Some(r), _) => {
            let _ = writeln!(cmds, "route replace default via {}", addr(region_no(r), 1));
        }
        (None, _) => {
            for r in REGIONS.iter().map(|r| region_no(r)) {
                let _ = writeln!(
                    cmds,
                    "route replace {}/24 via {}",
                    addr(r, 0),
                    addr(0, 10 + r)
                );
            }
        }
    }
    cmds
}

/// Host `h`'s files: `/etc/hosts`, its certificates and keys, its role's
/// configuration from the reference file, and the directories it writes.
fn write_host_files(
    h: &Host,
    all: &[Host],
    auth: &DevMaterial,
    ca: &DevCa,
    shared: &Path,
    timers: &[&str],
) -> anyhow::Result<()> {
    let etc = h.dir.join("etc");
    let var = h.dir.join("var");
    std::fs::create_dir_all(&var)?;
    std::fs::create_dir_all(h.dir.join("log"))?;
    // Every host knows every other by name; a region's name stands for
    // both its replicas, the global tier's for both of its.
    let mut hosts = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for o in all {
        writeln!(hosts, "{} {}.{DOMAIN} {}", o.ip, o.name, o.name)?;
        if o.role == HostRole::Control {
            writeln!(
                hosts,
                "{} {}",
                o.ip,
                region_host(o.region.as_deref().unwrap())
            )?;
        }
        if o.role == HostRole::Global {
            writeln!(hosts, "{} global.{DOMAIN}", o.ip)?;
        }
    }
    write(&h.dir.join("hosts"), hosts, false)?;
    write(&etc.join("tls/ca.pem"), ca.cert_pem(), false)?;
    let keys = auth.dir.join("keys");
    let copy_key = |file: &str, private: bool| -> anyhow::Result<()> {
        write(
            &etc.join("keys").join(file),
            std::fs::read(keys.join(file))?,
            private,
        )
    };
    let service_kid = auth.service_key.kid().to_string();
    let tenant_kid = auth.tenant_key.kid().to_string();
    let operator_kid = auth.operator_key.kid().to_string();
    let peers_of = |region: &str| -> Vec<IpAddr> {
        (all.iter())
            .filter(|o| o.role == HostRole::Control && o.region.as_deref() == Some(region))
            .map(|o| IpAddr::V4(o.ip))
            .collect()
    };
    match (h.role, h.region.as_deref()) {
        (HostRole::Router | HostRole::Etcd, _) => {}
        (HostRole::Database, Some(_)) => {
            let name = format!("{}.{DOMAIN}", h.name);
            let (cert, key) = ca.issue_server_cert(&[&name], &[IpAddr::V4(h.ip)])?;
            write(&h.dir.join("db-server.pem"), cert, false)?;
            write(&h.dir.join("db-server-key.pem"), key, true)?;
        }
        (HostRole::Control, Some(region)) => {
            // One certificate for the region's name, its replicas' own
            // names and their addresses.
            let region_name = region_host(region);
            let own = format!("{}.{DOMAIN}", h.name);
            let (cert, key) = ca.issue_server_cert(&[&region_name, &own], &peers_of(region))?;
            write(&etc.join("tls/region.pem"), cert, false)?;
            write(&etc.join("tls/region-key.pem"), key, true)?;
            copy_key("service-signing.pub.pem", false)?;
            copy_key("service-signing.pem", true)?;
            write(&etc.join("fleet.toml"), inventory(region), false)?;
            std::fs::create_dir_all(var.join("checkpoints"))?;
            let flags = timers;
            let config = configure(
                REGION_TOML,
                vec![
                    ("name", s(region)),
                    (
                        "service-key",
                        list([format!(
                            "{service_kid}=/etc/gangway/keys/service-signing.pub.pem"
                        )]),
                    ),
                    (
                        "peer-signing-key",
                        s(format!(
                            "{service_kid}=/etc/gangway/keys/service-signing.pem"
                        )),
                    ),
                    (
                        "peer",
                        list(
                            (REGIONS.iter().filter(|r| **r != region))
                                .map(|r| format!("{r}=https://{}:7001", region_host(r))),
                        ),
                    ),
                    ("checkpoint-store", s("file:///var/lib/gangway/checkpoints")),
                    // The lab's jobs are short: nothing waits 5 minutes.
                    ("preemption-min-run-s", toml::Value::Integer(0)),
                ],
                flags,
            );
            write(&etc.join("region.toml"), config, false)?;
        }
        (HostRole::Agent, Some(region)) => {
            std::fs::create_dir_all(var.join("checkpoints"))?;
            std::fs::create_dir_all(var.join("agent"))?;
            // Real mode: registers as itself (its hostname), declaring its
            // GPUs (no NVIDIA driver in the lab).
            let token = agent_token(&auth.service_key, &h.name, region);
            write(&etc.join("agent.token"), token, true)?;
            let config = configure(
                AGENT_TOML,
                vec![
                    ("region", s(region)),
                    (
                        "region-url",
                        s(format!("https://{}:7001", region_host(region))),
                    ),
                    ("checkpoint-store", s("file:///var/lib/gangway/checkpoints")),
                    ("gpus", toml::Value::Integer(GPUS_PER_MACHINE.into())),
                    ("gpu-type", s("h100")),
                    ("address", s(h.ip.to_string())),
                    // What the harness reads of jobs (a drill's trainer
                    // logs), bound into every sandbox.
                    ("sandbox-bind", list([shared.display().to_string()])),
                ],
                &[],
            );
            write(&etc.join("agent.toml"), config, false)?;
        }
        (HostRole::Global, _) => {
            let globals: Vec<IpAddr> = (all.iter())
                .filter(|o| o.role == HostRole::Global)
                .map(|o| IpAddr::V4(o.ip))
                .collect();
            let name = format!("global.{DOMAIN}");
            let (cert, key) = ca.issue_server_cert(&[&name], &globals)?;
            write(&etc.join("tls/global.pem"), cert, false)?;
            write(&etc.join("tls/global-key.pem"), key, true)?;
            copy_key("tenant-signing.pub.pem", false)?;
            copy_key("operator-signing.pub.pem", false)?;
            copy_key("service-signing.pem", true)?;
            let config = configure(
                GLOBAL_TOML,
                vec![
                    (
                        "region",
                        list(
                            (REGIONS.iter())
                                .map(|r| format!("{r}=https://{}:7001", region_host(r))),
                        ),
                    ),
                    (
                        "tenant-key",
                        list([format!(
                            "{tenant_kid}=/etc/gangway/keys/tenant-signing.pub.pem"
                        )]),
                    ),
                    (
                        "operator-key",
                        list([format!(
                            "{operator_kid}=/etc/gangway/keys/operator-signing.pub.pem"
                        )]),
                    ),
                    (
                        "service-signing-key",
                        s(format!(
                            "{service_kid}=/etc/gangway/keys/service-signing.pem"
                        )),
                    ),
                ],
                &[],
            );
            write(&etc.join("global.toml"), config, false)?;
        }
        (role, None) => bail!("a {role:?} host outside every region"),
    }
    Ok(())
}

/// Region `region`'s inventory: its machines by name, two to a leaf.
fn inventory(region: &str) -> String {
    let mut f = String::from("[[spine]]\n");
    for leaf in 0..AGENTS.div_ceil(2) {
        let first = leaf * 2 + 1;
        let last = (first + 1).min(AGENTS);
        writeln!(
            f,
            "  [[spine.leaf]]\n  names = [\"{region}-gpu[{first}-{last}]\"]\n  \
             gpu_type = \"h100\"\n  gpus_per_node = {GPUS_PER_MACHINE}"
        )
        .unwrap();
    }
    f
}

/// Host `h`'s database: initdb (as `postgres`), its certificate, and a
/// `pg_hba.conf` that takes TLS connections from the lab alone. Returns
/// its region and the superuser's password.
fn init_database(h: &Host) -> anyhow::Result<(String, String)> {
    use std::os::unix::fs::PermissionsExt;
    let data = h.dir.join("var/postgresql");
    let mut pg = PgCluster::init_or_open(&data, PgOptions::for_tests())?;
    pg.detach();
    let password = pg
        .password()
        .context("a new cluster has a password")?
        .to_string();
    let user = run("id", &["-u", "postgres"])?.trim().parse::<u32>()?;
    let group = run("id", &["-g", "postgres"])?.trim().parse::<u32>()?;
    for (from, to) in [
        ("db-server.pem", "server.pem"),
        ("db-server-key.pem", "server-key.pem"),
    ] {
        let to = data.join(to);
        std::fs::copy(h.dir.join(from), &to)?;
        std::os::unix::fs::chown(&to, Some(user), Some(group))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
    }
    let hba = format!(
        "local all all trust\nhostssl all all {}/16 scram-sha-256\n",
        addr(0, 0)
    );
    std::fs::write(data.join("pg_hba.conf"), hba)?;
    // The host's directories, traversable by `postgres`.
    for d in [&h.dir, &h.dir.join("var")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))?;
    }
    Ok((h.region.clone().unwrap(), password))
}

/// Region `region`'s database as a Patroni cluster on its hosts (see the
/// module's documentation): etcd on `{region}-etcd`, member `{region}-dbN`
/// on the host of that name with its certificate, TLS alone from the
/// region's LAN, the harness's management address (10.199.R.254) the one
/// plain-text client. CI's timers (Patroni's `ttl` 8 s), durable enough
/// for process kills (`fsync` off).
fn start_patroni(root: &Path, region: &str, hosts: &[Host]) -> anyhow::Result<PatroniCluster> {
    let on = |h: &Host| PatroniHost {
        addr: h.ip,
        exec: ["ip", "netns", "exec", h.ns.as_str()]
            .into_iter()
            .map(Into::into)
            .collect(),
        tls: None,
    };
    let of = |role| {
        (hosts.iter())
            .filter(|h| h.region.as_deref() == Some(region) && h.role == role)
            .collect::<Vec<_>>()
    };
    let etcd = of(HostRole::Etcd)
        .first()
        .map(|h| on(h))
        .context("no etcd host in the lab's plan")?;
    let mut members = Vec::new();
    for h in of(HostRole::Database) {
        let cert = std::fs::read_to_string(h.dir.join("db-server.pem"))?;
        let key = std::fs::read_to_string(h.dir.join("db-server-key.pem"))?;
        members.push(PatroniHost {
            tls: Some((cert, key)),
            ..on(h)
        });
    }
    let n = region_no(region);
    let opts = PatroniOptions {
        scope: region.to_string(),
        members: members.len(),
        hosts: Some(PatroniHosts {
            etcd,
            members,
            clients: vec![format!("{}/24", addr(n, 0))],
            admin: format!("{}/32", addr(n, 254)),
        }),
        // The lab's directory goes with the lab (or stays, kept).
        keep_dir: true,
        ..PatroniOptions::for_tests()
    };
    PatroniCluster::start(root, opts)
        .with_context(|| format!("starting {region}'s database as a Patroni cluster"))
}
