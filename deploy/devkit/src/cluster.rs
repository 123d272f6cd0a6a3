//! [`PgCluster`]: one PostgreSQL data directory and the server running on it.

use std::collections::BTreeSet;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use crate::binaries::PgBinaries;
use crate::user::{check_traversable, chown_recursive, die_with_spawning_thread, RunAs};

/// Name of the server log, inside the data directory.
pub const LOG_FILE_NAME: &str = "postgres.log";

/// The superuser that `initdb -U postgres` creates; connections use it.
pub const SUPERUSER: &str = "postgres";

/// The superuser's password, in the data directory (root's, 0600): TCP
/// connections need it (SCRAM), since anything on the machine can reach
/// 127.0.0.1, a job of a tenant included. The unix socket, in the data
/// directory, is reachable by the server's user and root alone.
pub const PASSWORD_FILE: &str = "gangway-superuser.password";

/// Longest data-directory path usable as a unix socket directory
/// (`<dir>/.s.PGSQL.<port>` must fit in `sun_path`, 108 bytes).
const MAX_SOCKET_DIR_LEN: usize = 90;

/// Environment variables that would change what pg_ctl/postgres do.
const SCRUBBED_ENV: [&str; 8] = [
    "PGDATA",
    "PGPORT",
    "PGHOST",
    "PGHOSTADDR",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
    "PGCTLTIMEOUT",
];

/// How a cluster is set up and started.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// TCP port on 127.0.0.1; `None` picks a free one at every start.
    pub port: Option<u16>,
    /// Tests only: `fsync=off`, `synchronous_commit=off`, `full_page_writes=off`
    /// and `initdb --no-sync`. Data may be lost on a crash of the machine.
    pub fast: bool,
    /// Also listen on a unix socket in the data directory (skipped when the
    /// path is too long for a socket address).
    pub unix_socket: bool,
    pub max_connections: u32,
    /// How long [`PgCluster::start`] waits for the server to accept connections.
    pub start_timeout: Duration,
    /// Start the postmaster as a child of a dedicated thread of this process,
    /// with `PR_SET_PDEATHSIG`, so that it shuts down when this process exits
    /// by any means (even SIGKILL). When false it is started by
    /// `pg_ctl start` as a daemon and outlives this process if not stopped
    /// (use this with [`PgCluster::detach`]).
    pub die_with_parent: bool,
    /// Further `name=value` server settings, passed as `-c name=value`.
    pub extra_settings: Vec<(String, String)>,
    /// Serve TLS with this certificate chain and key (PEM files): they are
    /// copied into the data directory, readable by the server's user alone,
    /// and `ssl=on` names them. Clients may still connect in plain text
    /// unless they ask for TLS (`sslmode`).
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// Where [`PgOptions::tls`]'s files are kept, in the data directory.
const TLS_CERT: &str = "gangway-server.crt";
const TLS_KEY: &str = "gangway-server.key";

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            port: None,
            fast: false,
            unix_socket: true,
            max_connections: 200,
            start_timeout: Duration::from_secs(60),
            die_with_parent: true,
            extra_settings: Vec::new(),
            tls: None,
        }
    }
}

impl PgOptions {
    /// Throwaway clusters for tests: durability off, free port, dies with the process.
    pub fn for_tests() -> Self {
        Self {
            fast: true,
            ..Self::default()
        }
    }
}

#[derive(Debug, Default)]
struct ChildExit {
    done: AtomicBool,
    status: Mutex<Option<String>>,
}

#[derive(Debug)]
struct ChildServer {
    pid: i32,
    exit: Arc<ChildExit>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
enum Server {
    Stopped,
    /// Started by `pg_ctl start`; reparented away from us.
    Daemon {
        pid: i32,
    },
    /// Our child, reaped by `ChildServer::thread`.
    Child(ChildServer),
}

/// A PostgreSQL data directory, and the server on it once started.
///
/// Dropping it stops the server (`pg_ctl stop -m fast`, synchronously, best
/// effort) unless [`detach`](Self::detach) was called.
#[derive(Debug)]
pub struct PgCluster {
    data_dir: PathBuf,
    opts: PgOptions,
    bins: PgBinaries,
    run_as: Option<RunAs>,
    port: Option<u16>,
    server: Server,
    detached: bool,
    /// `None`: a cluster made before passwords, which trusts 127.0.0.1.
    password: Option<String>,
}

/// Writes `text` to a new file at `path` that only its owner may read
/// (replacing one left there).
fn write_private(path: &Path, text: &str) -> Result<()> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

/// A new random password (128 bits, hex).
fn new_password() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl PgCluster {
    /// Opens the cluster in `data_dir`, creating it with `initdb` first when
    /// it holds no `PG_VERSION` (so a restart on the same directory keeps the
    /// data). Does not start it.
    pub fn init_or_open(data_dir: &Path, opts: PgOptions) -> Result<Self> {
        Self::init_or_open_with(data_dir, opts, PgBinaries::find()?)
    }

    /// [`init_or_open`](Self::init_or_open) with given binaries.
    pub fn init_or_open_with(data_dir: &Path, opts: PgOptions, bins: PgBinaries) -> Result<Self> {
        let data_dir = std::path::absolute(data_dir)
            .with_context(|| format!("resolving {}", data_dir.display()))?;
        let name = data_dir
            .file_name()
            .with_context(|| format!("{} is not a usable data directory", data_dir.display()))?
            .to_owned();
        let parent = data_dir.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let parent = parent
            .canonicalize()
            .with_context(|| format!("resolving {}", parent.display()))?;
        let data_dir = parent.join(name);
        let run_as = RunAs::for_current_process()?;
        if let Some(user) = &run_as {
            check_traversable(&parent, user)?;
        }
        let mut cluster = Self {
            data_dir,
            opts,
            bins,
            run_as,
            port: None,
            server: Server::Stopped,
            detached: false,
            password: None,
        };
        if cluster.data_dir.join("PG_VERSION").exists() {
            cluster.check_existing()?;
            let file = cluster.data_dir.join(PASSWORD_FILE);
            cluster.password = match std::fs::read_to_string(&file) {
                Ok(p) => Some(p.trim().to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
            };
        } else {
            cluster.password = Some(new_password()?);
            cluster.initdb()?;
        }
        Ok(cluster)
    }

    fn check_existing(&self) -> Result<()> {
        let dir_version = std::fs::read_to_string(self.data_dir.join("PG_VERSION"))?;
        let dir_version = dir_version.trim();
        let bin_version = self.bins.major_version()?;
        if dir_version != bin_version.to_string() {
            bail!(
                "{} was created by PostgreSQL {dir_version}, but the server binaries in {} are \
                 version {bin_version}; use matching binaries (GANGWAY_PG_BIN_DIR) or remove the \
                 directory to start afresh",
                self.data_dir.display(),
                self.bins.bin_dir.display()
            );
        }
        if let Some(user) = &self.run_as {
            let meta = std::fs::metadata(&self.data_dir)?;
            if meta.uid() != user.uid {
                chown_recursive(&self.data_dir, user.uid, user.gid)?;
            }
        }
        Ok(())
    }

    fn initdb(&self) -> Result<()> {
        let data = &self.data_dir;
        if data.exists() {
            let empty = std::fs::read_dir(data)
                .with_context(|| format!("reading {}", data.display()))?
                .next()
                .is_none();
            if !empty {
                bail!(
                    "{} exists, is not empty and has no PG_VERSION, so it is not a PostgreSQL \
                     data directory; remove it or choose another directory",
                    data.display()
                );
            }
        }
        // initdb into a sibling directory and rename it into place, so an
        // interrupted initdb never leaves a half-made cluster behind.
        let parent = data.parent().unwrap_or(Path::new("/"));
        let tmp = parent.join(format!(
            ".{}.initdb-{}",
            data.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        let made = self
            .run_initdb(&tmp)
            .and_then(|()| std::fs::rename(&tmp, data).map_err(Into::into));
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&tmp);
            if data.join("PG_VERSION").exists() {
                return Err(e);
            }
            // A mount point cannot be renamed over: initdb in place.
            tracing::debug!(error = %format!("{e:#}"), "initdb via a sibling directory failed; initdb in place");
            self.run_initdb(data)?;
        }
        if let Some(password) = &self.password {
            write_private(&data.join(PASSWORD_FILE), password)?;
        }
        tracing::info!(data_dir = %data.display(), "initialised PostgreSQL cluster");
        Ok(())
    }

    fn run_initdb(&self, dir: &Path) -> Result<()> {
        if !dir.exists() {
            DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {} to {}", dir.display(), user.name))?;
        }
        // The password, for initdb (run as the server's user) to read once.
        let pwfile = dir.with_extension(format!("pwfile-{}", std::process::id()));
        write_private(&pwfile, self.password.as_deref().unwrap_or_default())?;
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(&pwfile, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {} to {}", pwfile.display(), user.name))?;
        }
        let mut cmd = self.pg_command(&self.bins.initdb);
        cmd.arg("-D").arg(dir).args([
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-U",
            SUPERUSER,
            "--encoding=UTF8",
            "--no-locale",
        ]);
        cmd.arg(format!("--pwfile={}", pwfile.display()));
        if self.opts.fast {
            cmd.arg("--no-sync");
        }
        let ran = run_checked(cmd, "initdb");
        let _ = std::fs::remove_file(&pwfile);
        ran?;
        Ok(())
    }

    /// A command running `program` as the server user, from `/`, with the
    /// PG* environment that would redirect it removed.
    fn pg_command(&self, program: &Path) -> Command {
        let mut cmd = match &self.run_as {
            Some(user) => user.command(program),
            None => Command::new(program),
        };
        cmd.current_dir("/").stdin(Stdio::null());
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd
    }

    /// Starts the server and waits until it accepts connections. Does nothing
    /// when it is already running. A `postmaster.pid` left by a killed server
    /// is cleared; a server from an earlier run still running on this data
    /// directory is stopped first.
    pub fn start(&mut self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.forget_dead_server();
        self.clear_stale_pid_file()?;
        self.install_tls()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match self.opts.port {
                Some(port) => port,
                None => free_port(),
            };
            let log_offset = self.prepare_log()?;
            let started = if self.opts.die_with_parent {
                self.start_child(port, log_offset)
            } else {
                self.start_daemon(port, log_offset)
            };
            match started {
                Ok(()) => {
                    self.port = Some(port);
                    tracing::info!(
                        data_dir = %self.data_dir.display(),
                        port,
                        "PostgreSQL is accepting connections"
                    );
                    return Ok(());
                }
                Err(e) => {
                    self.forget_dead_server();
                    let log = self.log_since(log_offset);
                    let port_taken = self.opts.port.is_none()
                        && (log.contains("could not bind")
                            || log.contains("Address already in use"));
                    let shmem_busy = log.contains("pre-existing shared memory block");
                    if attempt < 8 && (port_taken || shmem_busy) {
                        tracing::debug!(
                            attempt,
                            port,
                            port_taken,
                            shmem_busy,
                            "retrying PostgreSQL start"
                        );
                        std::thread::sleep(Duration::from_millis(100 * attempt));
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    fn server_settings(&self, port: u16) -> Vec<(String, String)> {
        let mut s: Vec<(String, String)> = vec![
            ("listen_addresses".into(), "127.0.0.1".into()),
            ("port".into(), port.to_string()),
            ("unix_socket_directories".into(), self.socket_dir_setting()),
            (
                "max_connections".into(),
                self.opts.max_connections.to_string(),
            ),
            ("logging_collector".into(), "off".into()),
        ];
        if self.opts.fast {
            for name in ["fsync", "synchronous_commit", "full_page_writes"] {
                s.push((name.into(), "off".into()));
            }
        }
        if self.opts.tls.is_some() {
            let at = |f: &str| self.data_dir.join(f).to_string_lossy().into_owned();
            s.push(("ssl".into(), "on".into()));
            s.push(("ssl_cert_file".into(), at(TLS_CERT)));
            s.push(("ssl_key_file".into(), at(TLS_KEY)));
        }
        s.extend(self.opts.extra_settings.iter().cloned());
        s
    }

    /// Copies [`PgOptions::tls`]'s files into the data directory, owned by
    /// the server's user, the key readable by it alone (the server refuses
    /// a key others may read).
    fn install_tls(&self) -> Result<()> {
        let Some((cert, key)) = &self.opts.tls else {
            return Ok(());
        };
        use std::os::unix::fs::PermissionsExt;
        for (from, to, mode) in [(cert, TLS_CERT, 0o644), (key, TLS_KEY, 0o600)] {
            let to = self.data_dir.join(to);
            std::fs::copy(from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
            if let Some(user) = &self.run_as {
                std::os::unix::fs::chown(&to, Some(user.uid), Some(user.gid))
                    .with_context(|| format!("chown {} to {}", to.display(), user.name))?;
            }
        }
        Ok(())
    }

    fn socket_dir_setting(&self) -> String {
        let dir = self.data_dir.to_string_lossy();
        if !self.opts.unix_socket {
            return String::new();
        }
        if dir.len() > MAX_SOCKET_DIR_LEN || dir.contains([',', '"', '\'', ' ']) {
            tracing::warn!(
                data_dir = %dir,
                "data directory path is unusable as a unix socket directory; TCP only"
            );
            return String::new();
        }
        dir.into_owned()
    }

    fn server_args(&self, port: u16) -> Vec<String> {
        let mut args = Vec::new();
        for (name, value) in self.server_settings(port) {
            args.push("-c".to_owned());
            args.push(format!("{name}={value}"));
        }
        args
    }

    /// Creates the log file (owned by the server user) and returns its length.
    fn prepare_log(&self) -> Result<u64> {
        let path = self.log_file();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        }
        Ok(file.metadata()?.len())
    }

    fn start_child(&mut self, port: u16, log_offset: u64) -> Result<()> {
        let log = OpenOptions::new().append(true).open(self.log_file())?;
        let mut cmd = Command::new(&self.bins.postgres);
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(self.server_args(port))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Keep terminal signals (Ctrl-C) away: we stop it ourselves.
            .process_group(0);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        // Immediate shutdown for throwaway clusters, fast (clean) otherwise.
        let signal = if self.opts.fast {
            libc::SIGQUIT
        } else {
            libc::SIGINT
        };
        match &self.run_as {
            Some(user) => user.drop_privileges_in_child(&mut cmd, Some(signal)),
            None => die_with_spawning_thread(&mut cmd, signal),
        }

        // PR_SET_PDEATHSIG fires when the *thread* that forked dies, so fork
        // from a thread that lives exactly as long as the server.
        let exit = Arc::new(ChildExit::default());
        let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<u32>>();
        let thread_exit = exit.clone();
        let thread = std::thread::Builder::new()
            .name("gangway-postgres".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    let status = child.wait();
                    *thread_exit.status.lock().unwrap() = Some(match status {
                        Ok(s) => s.to_string(),
                        Err(e) => format!("wait failed: {e}"),
                    });
                    thread_exit.done.store(true, Ordering::SeqCst);
                }
                Err(e) => {
                    thread_exit.done.store(true, Ordering::SeqCst);
                    let _ = tx.send(Err(e));
                }
            })
            .context("spawning the postgres supervisor thread")?;
        let pid = rx
            .recv()
            .map_err(|_| anyhow!("postgres supervisor thread died"))?
            .with_context(|| format!("spawning {}", self.bins.postgres.display()))?
            as i32;
        self.server = Server::Child(ChildServer {
            pid,
            exit: exit.clone(),
            thread: Some(thread),
        });

        let deadline = Instant::now() + self.opts.start_timeout;
        loop {
            if exit.done.load(Ordering::SeqCst) {
                let status = exit.status.lock().unwrap().clone().unwrap_or_default();
                bail!(
                    "PostgreSQL ({}) exited during startup ({status}); {}",
                    self.data_dir.display(),
                    self.log_excerpt(log_offset)
                );
            }
            if let Some(info) = read_pid_file(&self.data_dir) {
                if info.pid == pid && info.status == "ready" && self.accepts_tcp(port) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid, libc::SIGQUIT) };
                self.wait_child_exit(Duration::from_secs(10));
                bail!(
                    "PostgreSQL ({}) did not accept connections on 127.0.0.1:{port} within {:?}; {}",
                    self.data_dir.display(),
                    self.opts.start_timeout,
                    self.log_excerpt(log_offset)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn start_daemon(&mut self, port: u16, log_offset: u64) -> Result<()> {
        let server_opts = self
            .server_args(port)
            .iter()
            .map(|a| sh_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = self.pg_command(&self.bins.pg_ctl);
        cmd.arg("start")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.log_file())
            .arg("-o")
            .arg(server_opts)
            .arg("-w")
            .arg("-t")
            .arg(self.opts.start_timeout.as_secs().max(1).to_string())
            .arg("-s")
            .process_group(0);
        let out = cmd
            .output()
            .with_context(|| format!("running {}", self.bins.pg_ctl.display()))?;
        if !out.status.success() {
            bail!(
                "pg_ctl start on {} failed ({}): {}{}; {}",
                self.data_dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim(),
                self.log_excerpt(log_offset)
            );
        }
        let info = read_pid_file(&self.data_dir)
            .context("pg_ctl start succeeded but postmaster.pid is unreadable")?;
        self.server = Server::Daemon { pid: info.pid };
        if !self.accepts_tcp(port) {
            bail!(
                "PostgreSQL ({}) started but does not accept TCP connections on 127.0.0.1:{port}; {}",
                self.data_dir.display(),
                self.log_excerpt(log_offset)
            );
        }
        Ok(())
    }

    fn accepts_tcp(&self, port: u16) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
    }

    /// Stops the server (`pg_ctl stop -m fast`) and waits for it to exit.
    /// Does nothing when it is not running.
    pub fn stop(&mut self) -> Result<()> {
        if !self.is_running() {
            self.forget_dead_server();
            return Ok(());
        }
        let mut cmd = self.pg_command(&self.bins.pg_ctl);
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "60", "-s"]);
        let result = match cmd.output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(_) if !self.data_dir.join("postmaster.pid").exists() => Ok(()),
            Ok(out) => Err(anyhow!(
                "pg_ctl stop on {} failed ({}): {}{}",
                self.data_dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            )),
            Err(e) => Err(anyhow!("running {}: {e}", self.bins.pg_ctl.display())),
        };
        if let Server::Child(child) = &self.server {
            if result.is_err() && !child.exit.done.load(Ordering::SeqCst) {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(child.pid, libc::SIGQUIT) };
            }
            if !self.wait_child_exit(Duration::from_secs(30)) {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(child.pid, libc::SIGKILL) };
                self.wait_child_exit(Duration::from_secs(5));
            }
        }
        self.forget_dead_server();
        tracing::info!(data_dir = %self.data_dir.display(), "PostgreSQL stopped");
        result
    }

    /// Waits for our child postmaster to exit; true when it has (or there is none).
    fn wait_child_exit(&self, timeout: Duration) -> bool {
        let Server::Child(child) = &self.server else {
            return true;
        };
        let deadline = Instant::now() + timeout;
        while !child.exit.done.load(Ordering::SeqCst) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Resets `server` to `Stopped` when the process it names is gone.
    fn forget_dead_server(&mut self) {
        if !self.is_running() {
            if let Server::Child(child) = &mut self.server {
                if let Some(thread) = child.thread.take() {
                    let _ = thread.join();
                }
            }
            self.server = Server::Stopped;
        }
    }

    /// Whether the server this handle started is still running.
    pub fn is_running(&self) -> bool {
        match &self.server {
            Server::Stopped => false,
            Server::Daemon { pid } => process_alive(*pid),
            // The flag lags the reaping by a moment; /proc does not.
            Server::Child(child) => {
                !child.exit.done.load(Ordering::SeqCst) && process_alive(child.pid)
            }
        }
    }

    /// Deals with a `postmaster.pid` left behind: removes it when its process
    /// is gone (or is not a postmaster on this directory); stops the server
    /// when it is one from an earlier run, still alive.
    fn clear_stale_pid_file(&self) -> Result<()> {
        let path = self.data_dir.join("postmaster.pid");
        let Some(info) = read_pid_file(&self.data_dir) else {
            if path.exists() {
                let _ = std::fs::remove_file(&path);
            }
            return Ok(());
        };
        if !self.is_postmaster_here(info.pid) {
            tracing::debug!(pid = info.pid, "removing stale postmaster.pid");
            let _ = std::fs::remove_file(&path);
            return Ok(());
        }
        tracing::warn!(
            pid = info.pid,
            data_dir = %self.data_dir.display(),
            "a PostgreSQL server from an earlier run still runs on this data directory; stopping it"
        );
        let mut cmd = self.pg_command(&self.bins.pg_ctl);
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "60", "-s"]);
        let out = cmd.output()?;
        if !out.status.success() && process_alive(info.pid) {
            bail!(
                "PostgreSQL (pid {}) still runs on {} and pg_ctl stop failed: {}",
                info.pid,
                self.data_dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn is_postmaster_here(&self, pid: i32) -> bool {
        if pid <= 0 || !process_alive(pid) {
            return false;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "postgres" {
            return false;
        }
        match std::fs::read_link(format!("/proc/{pid}/cwd")) {
            Ok(cwd) => {
                let here = self
                    .data_dir
                    .canonicalize()
                    .unwrap_or(self.data_dir.clone());
                cwd == here
            }
            // Cannot tell: assume it is ours and let pg_ctl decide.
            Err(_) => true,
        }
    }

    /// Marks the server as not ours to stop: Drop leaves it running. With
    /// [`PgOptions::die_with_parent`] it still shuts down when this process
    /// exits; use `die_with_parent: false` for a server that outlives it.
    pub fn detach(&mut self) {
        self.detached = true;
    }

    /// The TCP port on 127.0.0.1 (the last one the server listened on).
    ///
    /// # Panics
    /// When the cluster was never started and no port is configured.
    pub fn port(&self) -> u16 {
        self.port
            .or(self.opts.port)
            .expect("PgCluster::port() called before start() with no port configured")
    }

    /// libpq key/value connection string, e.g.
    /// `host=127.0.0.1 port=N user=postgres password=… dbname=DB`. It holds
    /// the superuser's password: give it to processes in their environment
    /// or a file, not on a command line others can read.
    pub fn connection_string(&self, db: &str) -> String {
        let password = (self.password.as_deref())
            .map(|p| format!(" password={p}"))
            .unwrap_or_default();
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER}{password} dbname={}",
            self.port(),
            conn_value(db)
        )
    }

    /// The superuser's password (`None` for a cluster made before
    /// passwords, which trusts connections from 127.0.0.1).
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// URL form: `postgres://postgres@127.0.0.1:N/DB` (DB percent-encoded).
    pub fn connection_url(&self, db: &str) -> String {
        let mut encoded = String::new();
        for b in db.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                encoded.push(b as char);
            } else {
                encoded.push_str(&format!("%{b:02X}"));
            }
        }
        let password = (self.password.as_deref())
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        format!(
            "postgres://{SUPERUSER}{password}@127.0.0.1:{}/{encoded}",
            self.port()
        )
    }

    /// A fresh connection to `db` whose connection task runs on the current
    /// tokio runtime (so it never outlives the runtime it was made on).
    pub async fn connect(&self, db: &str) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.connection_string(db), NoTls)
            .await
            .with_context(|| format!("connecting to {}", self.connection_string(db)))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "devkit postgres connection ended");
            }
        });
        Ok(client)
    }

    /// `CREATE DATABASE name`; already existing is fine.
    pub async fn create_database(&self, name: &str) -> Result<()> {
        let client = self.connect("postgres").await?;
        match client
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(name)))
            .await
        {
            Ok(()) => Ok(()),
            Err(e)
                if e.code() == Some(&SqlState::DUPLICATE_DATABASE)
                    // Two concurrent creators race on pg_database's unique index.
                    || e.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
            {
                Ok(())
            }
            Err(e) => Err(e).with_context(|| format!("CREATE DATABASE {name}")),
        }
    }

    /// `DROP DATABASE IF EXISTS name WITH (FORCE)`.
    pub async fn drop_database(&self, name: &str) -> Result<()> {
        let client = self.connect("postgres").await?;
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(name)
            ))
            .await
            .with_context(|| format!("DROP DATABASE {name}"))
    }

    /// [`create_database`](Self::create_database) from synchronous code (runs
    /// on a private runtime in a scoped thread; fine inside a runtime too).
    pub fn create_database_blocking(&self, name: &str) -> Result<()> {
        block_on_private_runtime(|| self.create_database(name))
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log (`postgres.log` in the data directory).
    pub fn log_file(&self) -> PathBuf {
        self.data_dir.join(LOG_FILE_NAME)
    }

    pub fn binaries(&self) -> &PgBinaries {
        &self.bins
    }

    pub fn options(&self) -> &PgOptions {
        &self.opts
    }

    /// PID of the postmaster this handle started, while it runs.
    pub fn postmaster_pid(&self) -> Option<i32> {
        match &self.server {
            Server::Daemon { pid } if process_alive(*pid) => Some(*pid),
            Server::Child(c) if self.is_running() => Some(c.pid),
            _ => None,
        }
    }

    /// Last lines of the server log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log_file(), lines)
    }

    fn log_since(&self, offset: u64) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(self.log_file()) {
            if f.seek(SeekFrom::Start(offset)).is_ok() {
                let mut bytes = Vec::new();
                let _ = f.read_to_end(&mut bytes);
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        text
    }

    fn log_excerpt(&self, offset: u64) -> String {
        let tail = tail_lines(&self.log_since(offset), 30);
        if tail.trim().is_empty() {
            format!("log {} is empty", self.log_file().display())
        } else {
            format!("last lines of {}:\n{tail}", self.log_file().display())
        }
    }

    /// Immediate shutdown (SIGQUIT, no pg_ctl, no waiting on locks), for
    /// process exit and throwaway clusters.
    pub fn kill_for_exit(&self, timeout: Duration) {
        if let Some(pid) = self.postmaster_pid() {
            // SAFETY: plain signal to the postmaster we started.
            unsafe { libc::kill(pid, libc::SIGQUIT) };
            let deadline = Instant::now() + timeout;
            while self.postmaster_pid().is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if let Err(e) = self.stop() {
            tracing::warn!(error = %format!("{e:#}"), "stopping PostgreSQL on drop failed");
        }
    }
}

/// Runs `f`'s future to completion on a fresh current-thread runtime in a
/// scoped thread, so it works from sync code and from inside a runtime.
pub(crate) fn block_on_private_runtime<'a, F, Fut, T>(f: F) -> Result<T>
where
    F: FnOnce() -> Fut + Send + 'a,
    Fut: std::future::Future<Output = Result<T>> + 'a,
    T: Send + 'a,
{
    std::thread::scope(|s| {
        s.spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building a tokio runtime")?
                .block_on(f())
        })
        .join()
        .map_err(|_| anyhow!("database helper thread panicked"))?
    })
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// Chosen below the kernel's ephemeral range where there is room (10000 up
/// to it): the port is handed out now and bound later, by another process,
/// and a port in the ephemeral range can meanwhile be taken as the local
/// end of any outgoing connection (a cloud of a dozen processes opens
/// hundreds), which makes that bind fail. Ports below the range are only
/// ever taken by an explicit bind.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    // Never the same port twice in one process: a port handed out may not
    // be bound yet when the next is asked for.
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let lowest = 10_000u16;
    let ephemeral = ephemeral_ports_start();
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0u32..10_000 {
        let port = if ephemeral > lowest + 1_000 {
            let mut h = random.build_hasher();
            h.write_u32(attempt);
            lowest + (h.finish() % u64::from(ephemeral - lowest)) as u16
        } else {
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("binding 127.0.0.1:0 to find a free port")
        };
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port)
            && std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            given.insert(port);
            return port;
        }
    }
    panic!("no free TCP port on 127.0.0.1 after 10,000 tries");
}

/// The first port of the kernel's ephemeral range (Linux's default when it
/// cannot be read).
fn ephemeral_ports_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

struct PidFile {
    pid: i32,
    status: String,
}

/// postmaster.pid: pid, data dir, start time, port, socket dir, listen
/// address, shmem key, status (`starting`/`ready`/`stopping`).
fn read_pid_file(data_dir: &Path) -> Option<PidFile> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let pid = lines.first()?.trim().parse().ok()?;
    let status = lines
        .get(7)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    Some(PidFile { pid, status })
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

fn run_checked(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `n` lines of the file at `path`, for error messages: read from
/// its last 64 KiB only (a log can be large); empty if it cannot be read.
pub fn file_tail(path: &Path, n: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))
            .is_ok()
        {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    tail_lines(&text, n)
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `"ident"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A libpq key/value value, quoted when needed.
fn conn_value(v: &str) -> String {
    if !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        return v.to_owned();
    }
    format!("'{}'", v.replace('\\', r"\\").replace('\'', r"\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(conn_value("plain"), "plain");
        assert_eq!(conn_value("a b'c"), r"'a b\'c'");
        assert_eq!(conn_value(""), "''");
    }

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        let ephemeral = ephemeral_ports_start();
        for &p in ports.iter().filter(|_| ephemeral > 11_000) {
            assert!(
                (10_000..ephemeral).contains(&p),
                "{p} (ephemeral from {ephemeral})"
            );
        }
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, ports[0])).unwrap();
    }
}
