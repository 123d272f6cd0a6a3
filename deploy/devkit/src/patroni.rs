//! [`PatroniCluster`]: a throwaway or dev PostgreSQL HA cluster — one etcd
//! and N Patroni members (a primary and synchronous standbys) on 127.0.0.1,
//! or each on a host of its own ([`PatroniHosts`]: a lab's network
//! namespaces, each member serving TLS), from the Debian packages `patroni`
//! and `etcd-server` and the PostgreSQL binaries of [`PgBinaries::find`].
//!
//! Every process (etcd, each member's Patroni) runs under a small Python
//! supervisor of ours (Patroni needs Python anyway): it is a child
//! subreaper, so the postmaster that Patroni detaches (it calls `setsid`
//! and lets its launcher exit) stays below it; it holds a pipe from this
//! process on its stdin, and when that pipe closes — this process exited by
//! any means, SIGKILL included, or [`PatroniCluster::kill_member`] /
//! Drop asked — or when its Patroni exits, it SIGKILLs everything below it.
//! So nothing outlives the cluster handle, and "kill the member" is "the
//! host died".

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use crate::binaries::PgBinaries;
use crate::cluster::{block_on_private_runtime, file_tail, free_port, quote_ident, SUPERUSER};
use crate::user::{check_traversable, RunAs};

/// Names the Patroni executable (else `patroni` on PATH, else /usr/bin/patroni).
pub const PATRONI_BIN_ENV: &str = "GANGWAY_PATRONI_BIN";

/// Names the etcd executable (else `etcd` on PATH, else /usr/bin/etcd).
pub const ETCD_BIN_ENV: &str = "GANGWAY_ETCD_BIN";

/// How to get Patroni and etcd, quoted when they are missing.
pub const PATRONI_INSTALL_HINT: &str =
    "install them with `apt-get update && apt-get install -y patroni etcd-server` (Debian \
packages), or name the executables in GANGWAY_PATRONI_BIN and GANGWAY_ETCD_BIN";

/// The replication role Patroni creates; standbys stream as it.
pub const REPLICATION_USER: &str = "replicator";

/// Each member's log (Patroni's and its PostgreSQL's), in its directory.
pub const PATRONI_LOG_FILE: &str = "patroni.log";

/// etcd's log, in the cluster's root directory.
pub const ETCD_LOG_FILE: &str = "etcd.log";

/// Patroni's REST requests of ours give up after this long, so that a
/// dead or stuck member never hangs the harness.
const REST_TIMEOUT: Duration = Duration::from_secs(2);

/// A commit that takes longer than this does not count as "accepts writes".
const WRITE_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest directory path usable as a unix socket directory.
const MAX_SOCKET_DIR_LEN: usize = 90;

/// Environment that would redirect Patroni, etcd, libpq or Python.
const SCRUBBED_PREFIXES: [&str; 4] = ["PATRONI_", "ETCD", "PG", "PYTHON"];

/// How a [`PatroniCluster`] is set up.
#[derive(Clone, Debug)]
pub struct PatroniOptions {
    /// Patroni's scope (the cluster's name in etcd) and the prefix of the
    /// member names, `<scope>-db1`…: ASCII letters, digits, `-` and `_`.
    pub scope: String,
    /// How many members (PostgreSQL servers); at least 1.
    pub members: usize,
    /// Seconds the leader lock lives without a refresh: a dead primary is
    /// replaced after about this long.
    pub ttl: u32,
    /// Seconds between Patroni's HA loops.
    pub loop_wait: u32,
    /// Seconds Patroni retries etcd and PostgreSQL operations before it
    /// gives up (and a leader demotes itself). Keep
    /// `loop_wait + 2 * retry_timeout <= ttl`.
    pub retry_timeout: u32,
    /// `synchronous_mode_strict`: with no synchronous standby left, refuse
    /// commits rather than accept them unreplicated.
    pub synchronous_mode_strict: bool,
    /// Synchronous standbys the primary waits for.
    pub synchronous_node_count: u32,
    /// Tests only: `fsync=off` and `pg_basebackup --no-sync` (process kills
    /// lose nothing; a crash of the machine may). `full_page_writes` and
    /// `synchronous_commit` stay on: pg_rewind and the synchronous
    /// guarantee need them.
    pub fast: bool,
    pub max_connections: u32,
    /// How long [`PatroniCluster::start`] waits for a writable primary and
    /// streaming standbys.
    pub start_timeout: Duration,
    /// Leave the directory in place on drop (its processes are killed all
    /// the same).
    pub keep_dir: bool,
    /// Further PostgreSQL settings, each member's (`name`, `value`).
    pub extra_settings: Vec<(String, String)>,
    /// Where etcd and each member run when each is a machine of its own (a
    /// lab's hosts); `None`: all on 127.0.0.1.
    pub hosts: Option<PatroniHosts>,
}

/// A cluster whose processes each run on a host of their own: etcd on one,
/// each member on another, every one on its host's standard ports (etcd
/// 2379/2380, PostgreSQL 5432, Patroni's REST API 8008). The handle still
/// watches and drives the cluster from where it runs: it must reach every
/// host's address.
#[derive(Clone, Debug)]
pub struct PatroniHosts {
    pub etcd: PatroniHost,
    /// One per member, in order (`<scope>-db1` first).
    pub members: Vec<PatroniHost>,
    /// Networks (CIDR) whose clients and standbys PostgreSQL accepts,
    /// over TLS alone when the members have certificates (`hostssl`).
    pub clients: Vec<String>,
    /// The one address (CIDR) from which the handle itself connects, with
    /// or without TLS: an operator's management path.
    pub admin: String,
}

/// One host of a [`PatroniHosts`].
#[derive(Clone, Debug)]
pub struct PatroniHost {
    pub addr: Ipv4Addr,
    /// What runs a program on the host: prepended to its command line
    /// (`ip netns exec NS` for a network namespace); empty for here.
    pub exec: Vec<OsString>,
    /// The server's certificate and key (PEM), for a member: its
    /// PostgreSQL then serves TLS and takes its clients over TLS alone.
    pub tls: Option<(String, String)>,
}

impl PatroniHost {
    fn local() -> Self {
        Self {
            addr: Ipv4Addr::LOCALHOST,
            exec: Vec::new(),
            tls: None,
        }
    }
}

impl Default for PatroniOptions {
    /// For `gangway dev up --db ha`: durable, ttl 10 s, loop_wait 2 s,
    /// retry_timeout 4 s (failover after about 10–12 s).
    fn default() -> Self {
        Self {
            scope: "gangway".into(),
            members: 3,
            ttl: 10,
            loop_wait: 2,
            retry_timeout: 4,
            synchronous_mode_strict: false,
            synchronous_node_count: 1,
            fast: false,
            max_connections: 200,
            start_timeout: Duration::from_secs(120),
            keep_dir: false,
            extra_settings: Vec::new(),
            hosts: None,
        }
    }
}

impl PatroniOptions {
    /// Throwaway clusters for tests: durability off, ttl 8 s, loop_wait
    /// 1 s, retry_timeout 3 s — a dead primary is replaced after about
    /// 9–11 s, and a leader on a loaded 2-core machine still has several
    /// seconds to spare before its lock lapses.
    pub fn for_tests() -> Self {
        Self {
            ttl: 8,
            loop_wait: 1,
            retry_timeout: 3,
            fast: true,
            ..Self::default()
        }
    }
}

/// One member as Patroni's `GET /cluster` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub name: String,
    /// `leader`, `sync_standby` or `replica` (`standby_leader` never here).
    pub role: String,
    /// `running`, `starting`, `stopped`, `creating replica`, `crashed`, …
    pub state: String,
    pub port: Option<u16>,
    pub timeline: Option<u64>,
    /// Bytes behind the leader; `None` for the leader or when unknown.
    pub lag: Option<u64>,
}

impl MemberStatus {
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }

    pub fn is_sync_standby(&self) -> bool {
        self.role == "sync_standby"
    }

    pub fn is_running(&self) -> bool {
        self.state == "running"
    }
}

/// A process under our supervisor (see the module docs).
#[derive(Debug)]
struct Supervised {
    child: Child,
    /// Its end of the pipe: writing `k` or closing it kills the tree.
    stdin: Option<ChildStdin>,
}

impl Supervised {
    /// Asks the supervisor to kill everything below it and exit (no wait).
    fn signal_kill(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"k\n");
        }
    }

    /// Whether it has exited (reaped here), and how.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the supervisor to exit; SIGKILLs it (and only it) past
    /// `timeout`. True when it exited by itself.
    fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return true,
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return false;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// The supervisor: argv is `uid gid groups cwd program args…` (uid -1: no
/// change). See the module docs.
const SUPERVISOR_PY: &str = r#"
import ctypes, os, select, signal, sys, time
uid, gid = int(sys.argv[1]), int(sys.argv[2])
groups = [int(g) for g in sys.argv[3].split(',') if g]
cwd, prog = sys.argv[4], sys.argv[5:]
me = os.getpid()
def say(msg):
    sys.stderr.write('gangway-supervisor[%d]: %s\n' % (me, msg))
    sys.stderr.flush()
try:
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        say('cannot become a child subreaper (errno %d)' % ctypes.get_errno())
except Exception as e:
    say('cannot become a child subreaper: %s' % e)
class Stop(Exception):
    pass
def on_signal(signum, frame):
    raise Stop('got signal %d' % signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)
pid = os.fork()
if pid == 0:
    try:
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if uid >= 0:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        os.execv(prog[0], prog)
    except BaseException as e:
        say('cannot run %s: %s' % (prog[0], e))
    os._exit(127)
say('started %s (pid %d)' % (' '.join(prog[:1]), pid))
status = None
def reap():
    global status
    while True:
        try:
            p, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if p == 0:
            return
        if p == pid and status is None:
            status = st
def descendants():
    kids = {}
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % d) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    found, todo = [], [me]
    while todo:
        for c in kids.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found
reason = None
try:
    while reason is None:
        ready, _, _ = select.select([0], [], [], 0.2)
        if ready:
            data = os.read(0, 64)
            if not data:
                reason = 'its owner is gone'
            elif b'k' in data:
                reason = 'asked to kill'
        reap()
        if reason is None and status is not None:
            reason = '%s exited (%d)' % (prog[0], os.waitstatus_to_exitcode(status))
except Stop as e:
    reason = str(e)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
killed = set()
deadline = time.time() + 10
while True:
    found = descendants()
    for p in found:
        try:
            os.kill(p, signal.SIGKILL)
            killed.add(p)
        except OSError:
            pass
    reap()
    if not found or time.time() > deadline:
        break
    time.sleep(0.02)
say('%s: killed %d processes' % (reason, len(killed)))
"#;

#[derive(Debug)]
struct Member {
    name: String,
    dir: PathBuf,
    host: PatroniHost,
    pg_port: u16,
    rest_port: u16,
    proc: Mutex<Option<Supervised>>,
}

impl Member {
    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join(PATRONI_LOG_FILE)
    }

    fn config_file(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn lock(&self) -> MutexGuard<'_, Option<Supervised>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A Patroni cluster: one etcd and [`PatroniOptions::members`] PostgreSQL
/// servers, `synchronous_mode` on, all on 127.0.0.1 (or each on its host,
/// [`PatroniOptions::hosts`]) under one directory.
///
/// Methods block (they wait on processes and poll); from async code call
/// them in `spawn_blocking`, or accept that the runtime's thread waits.
/// Dropping it SIGKILLs every process and removes the directory unless
/// [`PatroniOptions::keep_dir`] (or [`PatroniCluster::keep_dir`]).
#[derive(Debug)]
pub struct PatroniCluster {
    root: PathBuf,
    opts: PatroniOptions,
    bins: PgBinaries,
    patroni: PathBuf,
    python: PathBuf,
    run_as: Option<RunAs>,
    password: String,
    etcd_host: PatroniHost,
    etcd_port: u16,
    etcd: Mutex<Option<Supervised>>,
    members: Vec<Member>,
    keep: bool,
}

impl PatroniCluster {
    /// Makes `root` (absent or empty; the PostgreSQL servers' user must be
    /// able to traverse the directories above it), starts etcd and the
    /// members, and waits until a primary accepts writes and every standby
    /// streams from it ([`wait_ready`](Self::wait_ready), up to
    /// [`PatroniOptions::start_timeout`]).
    pub fn start(root: &Path, opts: PatroniOptions) -> Result<Self> {
        if opts.members == 0 {
            bail!("a Patroni cluster needs at least one member");
        }
        if opts.scope.is_empty()
            || !(opts.scope.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            bail!(
                "Patroni scope {:?} must be ASCII letters, digits, `-` and `_`",
                opts.scope
            );
        }
        let etcd = find_program(ETCD_BIN_ENV, "etcd")?;
        let patroni = find_program(PATRONI_BIN_ENV, "patroni")?;
        let python = python_of(&patroni);
        let bins = PgBinaries::find()?;
        let missing: Vec<&str> = ["pg_basebackup", "pg_rewind", "pg_controldata"]
            .into_iter()
            .filter(|b| !bins.bin_dir.join(b).is_file())
            .collect();
        if !missing.is_empty() {
            bail!(
                "Patroni needs {} next to postgres in {}: install the full `postgresql` package \
                 (`apt-get update && apt-get install -y postgresql`)",
                missing.join(", "),
                bins.bin_dir.display()
            );
        }

        let root =
            std::path::absolute(root).with_context(|| format!("resolving {}", root.display()))?;
        let run_as = RunAs::for_current_process()?;
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let root = root
            .canonicalize()
            .with_context(|| format!("resolving {}", root.display()))?;
        if std::fs::read_dir(&root)?.next().is_some() {
            bail!(
                "{} is not empty: a Patroni cluster starts in a fresh directory (remove it first)",
                root.display()
            );
        }
        if let Some(user) = &run_as {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))?;
            check_traversable(&root, user)?;
        }

        if let Some(h) = &opts.hosts {
            if h.members.len() != opts.members {
                bail!(
                    "{} hosts named for {} Patroni members",
                    h.members.len(),
                    opts.members
                );
            }
        }
        // On hosts of their own, every process on its standard ports.
        let placed = opts.hosts.is_some();
        let port = |standard: u16| if placed { standard } else { free_port() };
        let members = (1..=opts.members)
            .map(|i| {
                let name = format!("{}-db{i}", opts.scope);
                Member {
                    dir: root.join(&name),
                    name,
                    host: (opts.hosts.as_ref())
                        .map_or_else(PatroniHost::local, |h| h.members[i - 1].clone()),
                    pg_port: port(5432),
                    rest_port: port(8008),
                    proc: Mutex::new(None),
                }
            })
            .collect();
        let keep = opts.keep_dir;
        let cluster = Self {
            etcd_host: (opts.hosts.as_ref()).map_or_else(PatroniHost::local, |h| h.etcd.clone()),
            etcd_port: port(2379),
            root,
            opts,
            bins,
            patroni,
            python,
            run_as,
            password: new_password()?,
            etcd: Mutex::new(None),
            members,
            keep,
        };
        cluster.start_etcd(&etcd)?;
        for m in &cluster.members {
            cluster.prepare_member(m)?;
        }
        for m in &cluster.members {
            *m.lock() = Some(cluster.spawn_member(m)?);
        }
        let t0 = Instant::now();
        cluster.wait_ready(cluster.opts.start_timeout)?;
        tracing::info!(
            root = %cluster.root.display(),
            members = cluster.members.len(),
            elapsed = ?t0.elapsed(),
            "Patroni cluster is ready"
        );
        Ok(cluster)
    }

    fn start_etcd(&self, etcd: &Path) -> Result<()> {
        let peer_port = if self.opts.hosts.is_some() {
            2380
        } else {
            free_port()
        };
        let name = format!("{}-etcd", self.opts.scope);
        let ip = self.etcd_host.addr;
        let client = format!("http://{ip}:{}", self.etcd_port);
        let peer = format!("http://{ip}:{peer_port}");
        let data = self.root.join("etcd");
        let mut argv: Vec<OsString> = vec![etcd.into()];
        for (flag, value) in [
            ("--name", name.clone()),
            ("--data-dir", data.to_string_lossy().into_owned()),
            ("--listen-client-urls", client.clone()),
            ("--advertise-client-urls", client),
            ("--listen-peer-urls", peer.clone()),
            ("--initial-advertise-peer-urls", peer.clone()),
            ("--initial-cluster", format!("{name}={peer}")),
            ("--initial-cluster-state", "new".into()),
            ("--initial-cluster-token", self.opts.scope.clone()),
            ("--logger", "zap".into()),
            ("--log-outputs", "stderr".into()),
            // Patroni rewrites its keys every loop: keep history short.
            ("--auto-compaction-mode", "periodic".into()),
            ("--auto-compaction-retention", "1h".into()),
        ] {
            argv.push(flag.into());
            argv.push(value.into());
        }
        let log = self.root.join(ETCD_LOG_FILE);
        let mut proc =
            self.spawn_supervised(&log, None, &self.root, &self.etcd_host.exec, &argv, &[])?;
        let deadline = Instant::now() + self.opts.start_timeout;
        loop {
            if let Some(status) = proc.exited() {
                bail!(
                    "etcd exited during startup ({status}); last lines of {}:\n{}",
                    log.display(),
                    file_tail(&log, 30)
                );
            }
            if let Ok((200, body)) = http_get(ip, self.etcd_port, "/health", REST_TIMEOUT) {
                if body.contains("true") {
                    break;
                }
            }
            if Instant::now() > deadline {
                proc.signal_kill();
                proc.wait(Duration::from_secs(10));
                bail!(
                    "etcd did not answer on {ip}:{} within {:?}; last lines of {}:\n{}",
                    self.etcd_port,
                    self.opts.start_timeout,
                    log.display(),
                    file_tail(&log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        *self.etcd.lock().unwrap_or_else(|e| e.into_inner()) = Some(proc);
        Ok(())
    }

    /// The member's directory (owned by the servers' user) and its config.
    fn prepare_member(&self, m: &Member) -> Result<()> {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&m.dir)
            .with_context(|| format!("creating {}", m.dir.display()))?;
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(&m.dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {} to {}", m.dir.display(), user.name))?;
        }
        let path = m.config_file();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(self.member_config(m).as_bytes()))
            .with_context(|| format!("writing {}", path.display()))?;
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        }
        if let Some((cert, key)) = &m.host.tls {
            for (file, pem) in [("server.pem", cert), ("server-key.pem", key)] {
                let path = m.dir.join(file);
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .and_then(|mut f| f.write_all(pem.as_bytes()))
                    .with_context(|| format!("writing {}", path.display()))?;
                if let Some(user) = &self.run_as {
                    std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
                }
            }
        }
        Ok(())
    }

    /// Patroni's YAML for member `m` (every string double-quoted, so JSON
    /// escapes are YAML's).
    fn member_config(&self, m: &Member) -> String {
        let o = &self.opts;
        let dir = m.dir.to_string_lossy();
        let socket_dir = if dir.len() <= MAX_SOCKET_DIR_LEN && !dir.contains([',', ' ', '\'']) {
            dir.to_string()
        } else {
            String::new()
        };
        let mut c = String::new();
        let mut line = |s: String| {
            c.push_str(&s);
            c.push('\n');
        };
        line("# Written by gangway-devkit (PatroniCluster).".into());
        line(format!("scope: {}", q(&o.scope)));
        line(format!("namespace: {}", q("/gangway/")));
        line(format!("name: {}", q(&m.name)));
        line("log:\n  level: \"INFO\"".into());
        line("restapi:".into());
        let ip = m.host.addr;
        line(format!("  listen: \"{ip}:{}\"", m.rest_port));
        line(format!("  connect_address: \"{ip}:{}\"", m.rest_port));
        // Changing endpoints (switchover, restart, …) need the password.
        line(format!(
            "  authentication:\n    username: \"gangway\"\n    password: {}",
            q(&self.password)
        ));
        line("etcd3:".into());
        line(format!(
            "  hosts: \"{}:{}\"",
            self.etcd_host.addr, self.etcd_port
        ));
        line("  protocol: \"http\"".into());
        line("watchdog:\n  mode: \"off\"".into());
        line("bootstrap:".into());
        line("  dcs:".into());
        line(format!("    ttl: {}", o.ttl));
        line(format!("    loop_wait: {}", o.loop_wait));
        line(format!("    retry_timeout: {}", o.retry_timeout));
        line("    maximum_lag_on_failover: 1048576".into());
        line("    synchronous_mode: true".into());
        line(format!(
            "    synchronous_mode_strict: {}",
            o.synchronous_mode_strict
        ));
        line(format!(
            "    synchronous_node_count: {}",
            o.synchronous_node_count.max(1)
        ));
        line("    postgresql:".into());
        line("      use_pg_rewind: true".into());
        line("      use_slots: true".into());
        line("      parameters:".into());
        for (k, v) in [
            ("max_connections", o.max_connections.to_string()),
            ("wal_log_hints", "on".into()),
            ("wal_keep_size", "256MB".into()),
            ("max_wal_senders", (self.members.len() + 5).to_string()),
            (
                "max_replication_slots",
                (self.members.len() + 5).to_string(),
            ),
        ] {
            line(format!("        {k}: {}", q(&v)));
        }
        line("  initdb:".into());
        line("    - encoding: \"UTF8\"".into());
        line("    - \"no-locale\"".into());
        line("    - auth-local: \"trust\"".into());
        line("    - auth-host: \"scram-sha-256\"".into());
        line("postgresql:".into());
        line(format!("  listen: \"{ip}:{}\"", m.pg_port));
        line(format!("  connect_address: \"{ip}:{}\"", m.pg_port));
        line(format!(
            "  data_dir: {}",
            q(&m.data_dir().to_string_lossy())
        ));
        line(format!(
            "  bin_dir: {}",
            q(&self.bins.bin_dir.to_string_lossy())
        ));
        line(format!(
            "  pgpass: {}",
            q(&m.dir.join("pgpass").to_string_lossy())
        ));
        line("  remove_data_directory_on_rewind_failure: true".into());
        line("  remove_data_directory_on_diverged_timelines: true".into());
        line("  basebackup:".into());
        line("    - checkpoint: \"fast\"".into());
        if o.fast {
            line("    - \"no-sync\"".into());
        }
        line("  authentication:".into());
        line("    superuser:".into());
        line(format!("      username: {}", q(SUPERUSER)));
        line(format!("      password: {}", q(&self.password)));
        line("    replication:".into());
        line(format!("      username: {}", q(REPLICATION_USER)));
        line(format!("      password: {}", q(&self.password)));
        line("  parameters:".into());
        let mut local: Vec<(String, String)> = vec![("unix_socket_directories".into(), socket_dir)];
        if o.fast {
            local.push(("fsync".into(), "off".into()));
        }
        if m.host.tls.is_some() {
            local.push(("ssl".into(), "on".into()));
            for (k, file) in [
                ("ssl_cert_file", "server.pem"),
                ("ssl_key_file", "server-key.pem"),
            ] {
                local.push((k.into(), m.dir.join(file).to_string_lossy().into_owned()));
            }
        }
        local.extend(o.extra_settings.iter().cloned());
        for (k, v) in &local {
            line(format!("    {}: {}", q(k), q(v)));
        }
        line("  pg_hba:".into());
        for rule in self.hba_rules(m) {
            line(format!("    - {}", q(&rule)));
        }
        c
    }

    /// Member `m`'s `pg_hba.conf`: on 127.0.0.1, local TCP; on hosts of
    /// their own, the clients' networks (over TLS alone when it has a
    /// certificate), then the handle's management address.
    fn hba_rules(&self, m: &Member) -> Vec<String> {
        let mut rules = vec!["local all all trust".to_string()];
        let Some(hosts) = &self.opts.hosts else {
            rules.push(format!(
                "host replication {REPLICATION_USER} 127.0.0.1/32 scram-sha-256"
            ));
            rules.push("host all all 127.0.0.1/32 scram-sha-256".into());
            return rules;
        };
        let kind = if m.host.tls.is_some() {
            "hostssl"
        } else {
            "host"
        };
        for net in &hosts.clients {
            rules.push(format!(
                "{kind} replication {REPLICATION_USER} {net} scram-sha-256"
            ));
            rules.push(format!("{kind} all all {net} scram-sha-256"));
        }
        rules.push(format!("host all all {} scram-sha-256", hosts.admin));
        rules
    }

    fn spawn_member(&self, m: &Member) -> Result<Supervised> {
        let argv: Vec<OsString> = vec![
            self.patroni.clone().into(),
            m.config_file().into_os_string(),
        ];
        let mut env = vec![("HOME".to_string(), m.dir.to_string_lossy().into_owned())];
        if let Some(user) = &self.run_as {
            env.push(("USER".into(), user.name.clone()));
            env.push(("LOGNAME".into(), user.name.clone()));
        }
        self.spawn_supervised(
            &m.log_file(),
            self.run_as.as_ref(),
            &m.dir,
            &m.host.exec,
            &argv,
            &env,
        )
    }

    /// Starts `argv` under our supervisor (as `user` when given, on the
    /// host `exec` runs programs on), its stdout and stderr appended to
    /// `log`.
    fn spawn_supervised(
        &self,
        log: &Path,
        user: Option<&RunAs>,
        cwd: &Path,
        exec: &[OsString],
        argv: &[OsString],
        env: &[(String, String)],
    ) -> Result<Supervised> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = match exec.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.python);
                cmd
            }
            None => Command::new(&self.python),
        };
        cmd.arg("-I").arg("-c").arg(SUPERVISOR_PY);
        match user {
            Some(u) => {
                let groups: Vec<String> = u.groups.iter().map(|g| g.to_string()).collect();
                cmd.arg(u.uid.to_string())
                    .arg(u.gid.to_string())
                    .arg(groups.join(","));
            }
            None => {
                cmd.args(["-1", "-1", ""]);
            }
        }
        cmd.arg(cwd).args(argv);
        cmd.current_dir("/")
            .stdin(Stdio::piped())
            .stdout(file.try_clone()?)
            .stderr(file)
            // Keep terminal signals (Ctrl-C) away: we stop it ourselves.
            .process_group(0);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p)) {
                cmd.env_remove(&key);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| {
            format!(
                "spawning {} (the supervisor of {})",
                self.python.display(),
                argv[0].to_string_lossy()
            )
        })?;
        let stdin = child.stdin.take();
        Ok(Supervised { child, stdin })
    }

    fn member(&self, name: &str) -> Result<&Member> {
        self.members
            .iter()
            .find(|m| m.name == name)
            .with_context(|| {
                format!(
                    "no member {name:?} in Patroni cluster {} (members: {})",
                    self.opts.scope,
                    self.member_names().join(", ")
                )
            })
    }

    /// The members' names, `<scope>-db1`…
    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    /// The superuser's password (also the replication role's and the REST
    /// API's, user `gangway`). TCP connections need it (SCRAM).
    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn options(&self) -> &PatroniOptions {
        &self.opts
    }

    /// etcd's client URL, `http://127.0.0.1:N`.
    pub fn etcd_url(&self) -> String {
        format!("http://{}:{}", self.etcd_host.addr, self.etcd_port)
    }

    /// Member `name`'s PostgreSQL port.
    ///
    /// # Panics
    /// When there is no such member.
    pub fn pg_port(&self, member: &str) -> u16 {
        self.member_or_panic(member).pg_port
    }

    /// Member `name`'s Patroni REST port.
    ///
    /// # Panics
    /// When there is no such member.
    pub fn rest_port(&self, member: &str) -> u16 {
        self.member_or_panic(member).rest_port
    }

    /// Member `name`'s directory: `patroni.yml`, `patroni.log`, `data/`.
    ///
    /// # Panics
    /// When there is no such member.
    pub fn member_dir(&self, member: &str) -> PathBuf {
        self.member_or_panic(member).dir.clone()
    }

    /// Member `name`'s log: Patroni's, with its PostgreSQL's interleaved.
    ///
    /// # Panics
    /// When there is no such member.
    pub fn log_file(&self, member: &str) -> PathBuf {
        self.member_or_panic(member).log_file()
    }

    fn member_or_panic(&self, name: &str) -> &Member {
        self.member(name).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Multi-host URL over every member, for the primary alone:
    /// `postgres://postgres:PW@127.0.0.1:p1,127.0.0.1:p2,…/DB?target_session_attrs=read-write&connect_timeout=10`
    /// (libpq and tokio-postgres try the hosts in turn and keep the first
    /// that is writable). It holds the superuser's password.
    pub fn connection_url(&self, db: &str) -> String {
        let hosts: Vec<String> = (self.members.iter())
            .map(|m| format!("{}:{}", m.host.addr, m.pg_port))
            .collect();
        format!(
            "postgres://{SUPERUSER}:{}@{}/{}?target_session_attrs=read-write&connect_timeout=10",
            self.password,
            hosts.join(","),
            percent_encode(db)
        )
    }

    /// URL of one member, whatever its role:
    /// `postgres://postgres:PW@127.0.0.1:N/DB`.
    ///
    /// # Panics
    /// When there is no such member.
    pub fn member_url(&self, member: &str, db: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:{}@{}:{}/{}?connect_timeout=10",
            self.password,
            self.member_or_panic(member).host.addr,
            self.pg_port(member),
            percent_encode(db)
        )
    }

    /// A connection to the primary ([`connection_url`](Self::connection_url))
    /// whose connection task runs on the current tokio runtime.
    pub async fn connect(&self, db: &str) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.connection_url(db), NoTls)
            .await
            .with_context(|| {
                format!(
                    "connecting to the primary of Patroni cluster {} ({})",
                    self.opts.scope,
                    self.root.display()
                )
            })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "devkit patroni connection ended");
            }
        });
        Ok(client)
    }

    /// `CREATE DATABASE name` on the primary; already existing is fine.
    pub async fn create_database(&self, name: &str) -> Result<()> {
        let client = self.connect("postgres").await?;
        match client
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(name)))
            .await
        {
            Ok(()) => Ok(()),
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_DATABASE)
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
            {
                Ok(())
            }
            Err(e) => Err(e).with_context(|| format!("CREATE DATABASE {name}")),
        }
    }

    /// [`create_database`](Self::create_database) from synchronous code.
    pub fn create_database_blocking(&self, name: &str) -> Result<()> {
        block_on_private_runtime(|| self.create_database(name))
    }

    /// The members as Patroni sees them (`GET /cluster` on the first
    /// member that answers within 2 s).
    pub fn status(&self) -> Result<Vec<MemberStatus>> {
        let mut errors = Vec::new();
        for m in &self.members {
            match http_get(m.host.addr, m.rest_port, "/cluster", REST_TIMEOUT) {
                Ok((200, body)) => {
                    return parse_cluster(&body)
                        .with_context(|| format!("reading GET /cluster of {}: {body}", m.name))
                }
                Ok((code, body)) => errors.push(format!("{}: HTTP {code} {body}", m.name)),
                Err(e) => errors.push(format!("{}: {e:#}", m.name)),
            }
        }
        bail!(
            "no Patroni member answered GET /cluster: {}",
            errors.join("; ")
        )
    }

    /// The leader, when Patroni knows one and its PostgreSQL runs. This is
    /// etcd's view: a leader killed a moment ago stays until its lock
    /// lapses (ttl); [`wait_for_primary`](Self::wait_for_primary) checks
    /// that the primary takes writes.
    pub fn primary(&self) -> Option<String> {
        let status = self.status().ok()?;
        status
            .into_iter()
            .find(|m| m.is_leader() && m.is_running())
            .map(|m| m.name)
    }

    /// The synchronous standbys in Patroni's view (its `/sync` key).
    pub fn sync_standbys(&self) -> Vec<String> {
        (self.status().unwrap_or_default().into_iter())
            .filter(MemberStatus::is_sync_standby)
            .map(|m| m.name)
            .collect()
    }

    /// Waits until a primary that is not `exclude` takes a write (a commit
    /// within 5 s); returns its name.
    pub fn wait_for_primary(&self, exclude: Option<&str>, timeout: Duration) -> Result<String> {
        self.poll(timeout, "a writable primary", || {
            let status = self.status()?;
            let leader = leader_of(&status)?;
            if Some(leader.name.as_str()) == exclude {
                bail!("{} still holds the leader lock", leader.name);
            }
            let m = self.member(&leader.name)?;
            self.probe_writes(m)?;
            Ok(leader.name.clone())
        })
    }

    /// Waits until the primary has a synchronous standby that streams
    /// from it (Patroni's `/sync` key names it and `pg_stat_replication`
    /// says `sync`, `streaming`); returns its name.
    pub fn wait_for_sync_standby(&self, timeout: Duration) -> Result<String> {
        self.poll(timeout, "a synchronous standby", || {
            let status = self.status()?;
            let leader = leader_of(&status)?;
            let rows = self.replication(self.member(&leader.name)?)?;
            let sync = (status.iter())
                .filter(|s| s.is_sync_standby())
                .find(|s| {
                    rows.iter()
                        .any(|r| r.0 == s.name && r.1 == "streaming" && is_sync(&r.2))
                })
                .with_context(|| {
                    format!(
                        "no synchronous standby streams from {}: {rows:?}",
                        leader.name
                    )
                })?;
            Ok(sync.name.clone())
        })
    }

    /// Waits until `member` is a standby that runs on the primary's
    /// timeline and streams from it.
    pub fn wait_for_standby(&self, member: &str, timeout: Duration) -> Result<()> {
        self.member(member)?;
        self.poll(timeout, &format!("{member} streaming as a standby"), || {
            let status = self.status()?;
            let leader = leader_of(&status)?;
            let me = (status.iter())
                .find(|s| s.name == member)
                .with_context(|| format!("{member} is not in the cluster (yet)"))?;
            if me.is_leader() {
                bail!("{member} is the leader");
            }
            if !me.is_running() || me.timeline != leader.timeline {
                bail!(
                    "{member} is {} on timeline {:?} (the leader's: {:?})",
                    me.state,
                    me.timeline,
                    leader.timeline
                );
            }
            let rows = self.replication(self.member(&leader.name)?)?;
            if !rows.iter().any(|r| r.0 == member && r.1 == "streaming") {
                bail!(
                    "{member} does not stream from {} yet: {rows:?}",
                    leader.name
                );
            }
            Ok(())
        })
    }

    /// Waits until a primary takes writes and every member not killed by
    /// [`kill_member`](Self::kill_member) streams from it, one of them
    /// synchronously (with more than one member).
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        self.poll(timeout, "the cluster to be ready", || {
            let status = self.status()?;
            let leader = leader_of(&status)?;
            let primary = self.member(&leader.name)?;
            self.probe_writes(primary)?;
            let rows = self.replication(primary)?;
            for m in &self.members {
                if m.name == leader.name || m.lock().is_none() {
                    continue;
                }
                if !rows.iter().any(|r| r.0 == m.name && r.1 == "streaming") {
                    let state = (status.iter().find(|s| s.name == m.name))
                        .map(|s| s.state.as_str())
                        .unwrap_or("not registered");
                    bail!(
                        "{} ({state}) does not stream from {} yet",
                        m.name,
                        leader.name
                    );
                }
            }
            let standbys = self
                .members
                .iter()
                .filter(|m| m.name != leader.name && m.lock().is_some())
                .count();
            if standbys > 0 {
                let synced = (status.iter()).any(|s| {
                    s.is_sync_standby() && rows.iter().any(|r| r.0 == s.name && is_sync(&r.2))
                });
                if !synced {
                    bail!("no synchronous standby yet: {rows:?}");
                }
            }
            Ok(())
        })
    }

    /// Polls `check` every 200 ms until it succeeds; past `timeout`, the
    /// error quotes its last failure and the logs. Fails at once when a
    /// member's Patroni (not killed by us) or etcd has exited.
    fn poll<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let t0 = Instant::now();
        let deadline = t0 + timeout;
        loop {
            self.check_processes()?;
            let last = match check() {
                Ok(v) => return Ok(v),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "Patroni cluster {} ({}): no {what} within {timeout:?}; last: {last}\n{}",
                    self.opts.scope,
                    self.root.display(),
                    self.logs_excerpt(25)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// An error when etcd or a member's Patroni exited on its own.
    fn check_processes(&self) -> Result<()> {
        if let Some(p) = self.etcd.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            if let Some(status) = p.exited() {
                let log = self.root.join(ETCD_LOG_FILE);
                bail!(
                    "etcd of Patroni cluster {} exited ({status}); last lines of {}:\n{}",
                    self.opts.scope,
                    log.display(),
                    file_tail(&log, 30)
                );
            }
        }
        for m in &self.members {
            if let Some(p) = m.lock().as_mut() {
                if let Some(status) = p.exited() {
                    bail!(
                        "Patroni of member {} exited ({status}); last lines of {}:\n{}",
                        m.name,
                        m.log_file().display(),
                        file_tail(&m.log_file(), 40)
                    );
                }
            }
        }
        Ok(())
    }

    /// The last `lines` of every log, for error messages.
    pub fn logs_excerpt(&self, lines: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let _ = write!(
                out,
                "--- last lines of {}:\n{}\n",
                m.log_file().display(),
                file_tail(&m.log_file(), lines)
            );
        }
        let etcd = self.root.join(ETCD_LOG_FILE);
        let _ = write!(
            out,
            "--- last lines of {}:\n{}",
            etcd.display(),
            file_tail(&etcd, lines.min(10))
        );
        out
    }

    /// Connects to member `m` as the superuser and runs `f` on a private
    /// runtime.
    fn on_member<T: Send>(
        &self,
        m: &Member,
        f: impl for<'c> FnOnce(
                &'c tokio_postgres::Client,
            )
                -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>> + 'c>>
            + Send,
    ) -> Result<T> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(m.host.addr.to_string())
            .port(m.pg_port)
            .user(SUPERUSER)
            .password(&self.password)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(3));
        let name = m.name.clone();
        block_on_private_runtime(move || async move {
            let (client, connection) =
                tokio::time::timeout(Duration::from_secs(5), config.connect(NoTls))
                    .await
                    .map_err(|_| anyhow!("connecting to {name}: timed out"))?
                    .with_context(|| format!("connecting to {name}"))?;
            let conn = tokio::spawn(connection);
            let result = f(&client).await;
            drop(client);
            conn.abort();
            result
        })
    }

    /// Ok when member `m` is a primary that commits a transaction with an
    /// xid (so waits for its synchronous standby) within 5 s.
    fn probe_writes(&self, m: &Member) -> Result<()> {
        let name = m.name.clone();
        self.on_member(m, move |c| {
            Box::pin(async move {
                let recovery: bool = c.query_one("SELECT pg_is_in_recovery()", &[]).await?.get(0);
                if recovery {
                    bail!("{name} is still in recovery");
                }
                tokio::time::timeout(
                    WRITE_PROBE_TIMEOUT,
                    c.batch_execute("SELECT txid_current()"),
                )
                .await
                .map_err(|_| anyhow!("a commit on {name} took over {WRITE_PROBE_TIMEOUT:?}"))?
                .with_context(|| format!("a commit on {name}"))?;
                Ok(())
            })
        })
    }

    /// `pg_stat_replication` on member `m`: (application_name, state, sync_state).
    fn replication(&self, m: &Member) -> Result<Vec<(String, String, String)>> {
        self.on_member(m, |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT coalesce(application_name, ''), coalesce(state, ''), \
                         coalesce(sync_state, '') FROM pg_stat_replication",
                        &[],
                    )
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect())
            })
        })
    }

    /// SIGKILLs member `member`'s postmaster alone (its backends follow);
    /// Patroni notices, and starts it again or fails over. Returns the pid.
    pub fn kill_postgres(&self, member: &str) -> Result<i32> {
        let m = self.member(member)?;
        let pid = postmaster_of(&m.data_dir())
            .with_context(|| format!("{member}'s PostgreSQL is not running"))?;
        // SAFETY: a plain signal to a postmaster of ours.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(member, pid, "killed the member's postmaster");
        Ok(pid)
    }

    /// SIGKILLs member `member`'s Patroni and its PostgreSQL, as if its
    /// host died; waits until they are gone. Its data stays for
    /// [`restart_member`](Self::restart_member).
    pub fn kill_member(&self, member: &str) -> Result<()> {
        let m = self.member(member)?;
        let proc = m.lock().take();
        let Some(mut proc) = proc else {
            bail!("member {member} is not running (killed already?)");
        };
        proc.signal_kill();
        proc.wait(Duration::from_secs(15));
        // Should the supervisor have failed us, the postmaster must go all the same.
        if let Some(pid) = postmaster_of(&m.data_dir()) {
            // SAFETY: a plain signal to a postmaster of ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        tracing::info!(member, "killed the member (Patroni and PostgreSQL)");
        Ok(())
    }

    /// Starts member `member`'s Patroni again (after
    /// [`kill_member`](Self::kill_member)); it rejoins as a standby, with
    /// pg_rewind when its timeline diverged. Does not wait: see
    /// [`wait_for_standby`](Self::wait_for_standby).
    pub fn restart_member(&self, member: &str) -> Result<()> {
        let m = self.member(member)?;
        let mut slot = m.lock();
        if let Some(p) = slot.as_mut() {
            if p.exited().is_none() {
                bail!("member {member} is running; kill it first");
            }
        }
        *slot = Some(self.spawn_member(m)?);
        tracing::info!(member, "started the member again");
        Ok(())
    }

    /// Whether member `member`'s Patroni runs (it was not killed by
    /// [`kill_member`](Self::kill_member), nor has it exited).
    pub fn is_member_running(&self, member: &str) -> bool {
        let Ok(m) = self.member(member) else {
            return false;
        };
        let mut slot = m.lock();
        match slot.as_mut() {
            Some(p) => p.exited().is_none(),
            None => false,
        }
    }

    /// Keeps the directory (logs, data) when dropped.
    pub fn keep_dir(&mut self) {
        self.keep = true;
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "Patroni cluster {} ({}) dropped while panicking:\n{}",
                self.opts.scope,
                self.root.display(),
                self.logs_excerpt(30)
            );
        }
        let mut procs: Vec<Supervised> = (self.members.iter_mut())
            .filter_map(|m| m.proc.get_mut().unwrap_or_else(|e| e.into_inner()).take())
            .collect();
        procs.extend(
            self.etcd
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        for p in &mut procs {
            p.signal_kill();
        }
        for p in &mut procs {
            p.wait(Duration::from_secs(15));
        }
        for m in &self.members {
            if let Some(pid) = postmaster_of(&m.data_dir()) {
                // SAFETY: a plain signal to a postmaster of ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if !self.keep {
            if let Err(e) = std::fs::remove_dir_all(&self.root) {
                tracing::warn!(root = %self.root.display(), error = %e, "removing the Patroni cluster's directory");
            }
        }
    }
}

fn leader_of(status: &[MemberStatus]) -> Result<&MemberStatus> {
    let leader = (status.iter())
        .find(|m| m.is_leader())
        .with_context(|| format!("no leader yet ({})", describe(status)))?;
    if !leader.is_running() {
        bail!("leader {} is {}", leader.name, leader.state);
    }
    Ok(leader)
}

fn describe(status: &[MemberStatus]) -> String {
    (status.iter())
        .map(|m| format!("{} {} {}", m.name, m.role, m.state))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_sync(sync_state: &str) -> bool {
    sync_state == "sync" || sync_state == "quorum"
}

/// The live postmaster of data directory `data`, from its postmaster.pid.
fn postmaster_of(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    if pid <= 0 || !process_alive(pid) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    (comm.trim() == "postgres").then_some(pid)
}

/// Alive and not a zombie.
fn process_alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// `$env`, else `name` on PATH, else `/usr/bin/<name>`.
fn find_program(env: &str, name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "{env}={} is not a file: {PATRONI_INSTALL_HINT}",
            p.display()
        );
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    let fallback = Path::new("/usr/bin").join(name);
    on_path
        .or_else(|| fallback.is_file().then_some(fallback))
        .with_context(|| {
            format!("`{name}` is not on PATH nor in /usr/bin, and a Patroni cluster needs it: {PATRONI_INSTALL_HINT}")
        })
}

/// The interpreter of Patroni's `#!` line (Debian's: /usr/bin/python3),
/// for our supervisor; else /usr/bin/python3.
fn python_of(patroni: &Path) -> PathBuf {
    let mut first = String::new();
    if let Ok(f) = std::fs::File::open(patroni) {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(f.take(512)), &mut first);
    }
    let mut words = first.strip_prefix("#!").unwrap_or("").split_whitespace();
    let found = match words.next() {
        Some(p) if p.ends_with("/env") => words.next().and_then(|name| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        }),
        Some(p) => Some(PathBuf::from(p)),
        None => None,
    };
    found
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"))
}

/// A new random password (128 bits, hex).
fn new_password() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A YAML double-quoted string (JSON's escapes are YAML's).
fn q(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `GET path` on `ip`:`port` (plain HTTP/1.0), within `timeout` in all:
/// (status, body).
fn http_get(ip: Ipv4Addr, port: u16, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::from((ip, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((status, body)) = complete_response(&buf)? {
            return Ok((status, body));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("GET {path} on {addr}: no complete answer within {timeout:?}");
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("GET {path} on {addr}")),
        }
        if buf.len() > 8 << 20 {
            bail!("GET {path} on {addr}: answer over 8 MiB");
        }
    }
    // The server closed the connection: what came is all there is.
    let (status, headers, body) = split_response(&buf)?;
    if headers.contains("transfer-encoding: chunked") {
        let body = dechunk(body).context("a truncated chunked answer")?;
        return Ok((status, body));
    }
    Ok((status, String::from_utf8_lossy(body).into_owned()))
}

/// (status, lower-cased headers, body) of a response whose head is whole.
fn split_response(buf: &[u8]) -> Result<(u16, String, &[u8])> {
    let end = (buf.windows(4).position(|w| w == b"\r\n\r\n"))
        .ok_or_else(|| anyhow!("an HTTP answer without a complete head"))?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status = (head.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("a malformed HTTP status line"))?;
    Ok((status, head, &buf[end + 4..]))
}

/// The response in `buf` when it is complete by its own account
/// (Content-Length, or the last chunk), else `None`.
fn complete_response(buf: &[u8]) -> Result<Option<(u16, String)>> {
    if !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        return Ok(None);
    }
    let (status, head, body) = split_response(buf)?;
    if head.contains("transfer-encoding: chunked") {
        return Ok(dechunk(body).map(|b| (status, b)));
    }
    let length = (head.lines())
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    match length {
        Some(n) if body.len() >= n => Ok(Some((
            status,
            String::from_utf8_lossy(&body[..n]).into_owned(),
        ))),
        _ => Ok(None),
    }
}

/// A chunked body, decoded; `None` while incomplete.
fn dechunk(mut body: &[u8]) -> Option<String> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
        if body.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Patroni's `GET /cluster` answer.
fn parse_cluster(body: &str) -> Result<Vec<MemberStatus>> {
    let json = Json::parse(body)?;
    let members = (json.get("members"))
        .and_then(Json::as_array)
        .ok_or_else(|| anyhow!("no `members` array"))?;
    members
        .iter()
        .map(|m| {
            let text = |k: &str| m.get(k).and_then(Json::as_str).unwrap_or("").to_string();
            let name = text("name");
            if name.is_empty() {
                bail!("a member without a name");
            }
            Ok(MemberStatus {
                name,
                role: text("role"),
                state: text("state"),
                port: (m.get("port").and_then(Json::as_u64)).and_then(|p| u16::try_from(p).ok()),
                timeline: m.get("timeline").and_then(Json::as_u64),
                lag: m.get("lag").and_then(Json::as_u64),
            })
        })
        .collect()
}

/// Just enough JSON for Patroni's REST answers.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Result<Json> {
        let mut p = JsonParser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            bail!("trailing characters after JSON at byte {}", p.i);
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 && *n < 1.8e19 => Some(*n as u64),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(a) => Some(a),
            _ => None,
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T> {
        bail!("invalid JSON at byte {}: {what}", self.i)
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json> {
        if depth > 64 {
            return self.err("nested too deeply");
        }
        self.ws();
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.eat("}") {
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return self.err("expected `:`");
                    }
                    fields.push((key, self.value(depth + 1)?));
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat("}") {
                        return Ok(Json::Obj(fields));
                    }
                    return self.err("expected `,` or `}`");
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat("]") {
                        return Ok(Json::Arr(items));
                    }
                    return self.err("expected `,` or `]`");
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') if self.eat("true") => Ok(Json::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(Json::Bool(false)),
            Some(b'n') if self.eat("null") => Ok(Json::Null),
            Some(c) if *c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                match text.parse() {
                    Ok(n) => Ok(Json::Num(n)),
                    Err(_) => self.err("a malformed number"),
                }
            }
            Some(_) => self.err("unexpected character"),
        }
    }

    fn string(&mut self) -> Result<String> {
        if !self.eat("\"") {
            return self.err("expected a string");
        }
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return self.err("an unterminated string");
            };
            self.i += 1;
            match c {
                b'"' => return Ok(String::from_utf8_lossy(&out).into_owned()),
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return self.err("an unterminated escape");
                    };
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) && self.eat("\\u") {
                                let lo = self.hex4()?;
                                0x10000 + ((hi - 0xd800) << 10) + (lo.wrapping_sub(0xdc00) & 0x3ff)
                            } else {
                                hi
                            };
                            char::from_u32(code).unwrap_or('\u{fffd}')
                        }
                        _ => return self.err("an unknown escape"),
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                c => out.push(c),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        match digits.and_then(|d| u32::from_str_radix(d, 16).ok()) {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => self.err("a malformed \\u escape"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_patronis_cluster_answer() {
        let body = r#"{"members": [{"name": "g-db1", "role": "replica", "state": "running", "api_url": "http://127.0.0.1:13001/patroni", "host": "127.0.0.1", "port": 13101, "timeline": 1, "lag": 0}, {"name": "g-db2", "role": "leader", "state": "running", "host": "127.0.0.1", "port": 13102, "timeline": 2}, {"name": "g-db3", "role": "sync_standby", "state": "creating replica", "lag": "unknown", "tags": {"x": [1, 2.5e3, null, true, "\u00e9\"\\"]}}]}"#;
        let members = parse_cluster(body).unwrap();
        assert_eq!(members.len(), 3);
        assert_eq!(
            members[1],
            MemberStatus {
                name: "g-db2".into(),
                role: "leader".into(),
                state: "running".into(),
                port: Some(13102),
                timeline: Some(2),
                lag: None,
            }
        );
        assert!(members[1].is_leader() && members[1].is_running());
        assert_eq!(members[0].lag, Some(0));
        assert!(members[2].is_sync_standby() && !members[2].is_running());
        assert_eq!(members[2].lag, None);
        assert_eq!(
            Json::parse(r#"{"x": [1, 2.5e3, null, true, "\u00e9\"\\\ud83d\ude00"]}"#)
                .unwrap()
                .get("x")
                .unwrap()
                .as_array()
                .unwrap()[4],
            Json::Str("é\"\\😀".into())
        );
        for bad in ["", "{", "{\"a\" 1}", "[1,]", "\"abc", "{} x", "tru"] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reads_http_answers() {
        let plain = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\nabcdEXTRA";
        assert_eq!(
            complete_response(plain).unwrap(),
            Some((200, "abcd".into()))
        );
        let short = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nabc";
        assert_eq!(complete_response(short).unwrap(), None);
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            complete_response(chunked).unwrap(),
            Some((200, "abcde".into()))
        );
        assert_eq!(complete_response(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
        assert!(complete_response(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn quotes_yaml_and_urls() {
        assert_eq!(q("a\"b\\c\nd\u{1}"), r#""a\"b\\c\nd\u0001""#);
        assert_eq!(percent_encode("my db/é"), "my%20db%2F%C3%A9");
    }

    #[test]
    fn finds_the_interpreter_of_a_script() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("tool");
        std::fs::write(&script, "#!/bin/sh -e\necho\n").unwrap();
        assert_eq!(python_of(&script), PathBuf::from("/bin/sh"));
        std::fs::write(&script, "no shebang\n").unwrap();
        assert_eq!(python_of(&script), PathBuf::from("/usr/bin/python3"));
    }

    #[test]
    fn missing_programs_say_how_to_install() {
        let err = find_program("GANGWAY_TEST_NO_SUCH_VAR", "gangway-no-such-program")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("apt-get install -y patroni etcd-server"),
            "{err}"
        );
    }
}
